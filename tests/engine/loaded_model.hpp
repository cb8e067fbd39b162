// What the engine tests load a GGUF file into without the public API: the reader, its hyper-parameters
// and bound weights, and the expert rows read in place; plus the pool they run on.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "expert_pool.hpp"
#include "gguf/gguf_reader.hpp"
#include "gguf/gguf_writer.hpp"
#include "model/forward.hpp"
#include "model/hparams.hpp"
#include "model/weights.hpp"
#include "topology.hpp"

namespace strata::engine::test {

struct loaded {
    gguf::reader file;
    hparams hp;
    model_weights w;
    std::vector<arenas::moe_layer> layers;
    std::unique_ptr<arenas::mapped_expert_rows> rows;
};

inline std::unique_ptr<loaded> load(gguf::reader file) {
    auto m = std::make_unique<loaded>(loaded{std::move(file), {}, {}, {}, {}});
    m->hp = read_hparams(m->file);
    m->w = bind_weights(m->file, m->hp);
    m->layers = moe_layers(m->w);
    m->rows = std::make_unique<arenas::mapped_expert_rows>(m->layers);
    return m;
}

// A generated model, written to memory and loaded from there.
inline std::unique_ptr<loaded> load(const gguf::writer& w) { return load(gguf::reader::from_bytes(w.write_to_memory())); }

// A pool of `workers` threads in --numa-pool `mode`, with no environment overrides.
inline std::unique_ptr<arenas::expert_pool> make_pool(const std::string& mode, int workers) {
    arenas::pool_flags flags;
    flags.numa_pool = mode;
    flags.pool_workers = workers;
    const auto env = [](std::string_view) -> std::optional<std::string> { return std::nullopt; };
    return arenas::expert_pool::create(arenas::load_machine_topology(), arenas::read_pool_requests(env, flags));
}

}  // namespace strata::engine::test
