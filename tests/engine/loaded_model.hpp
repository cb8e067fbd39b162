// What the engine tests load a GGUF file into without the public API: the reader, its hyper-parameters
// and bound weights, and the expert rows read in place; plus the pool they run on.
#pragma once

#include <algorithm>
#include <memory>
#include <optional>
#include <span>
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

// The same file with its tensors' bytes computed once: copies and edits of the result write without
// running the generator's fill callbacks (quantization) again.
inline gguf::writer baked(const gguf::writer& w) {
    auto file = std::make_shared<const gguf::reader>(gguf::reader::from_bytes(w.write_to_memory()));
    gguf::writer out;
    for (const auto& [key, v] : file->metadata()) out.set(key, v);
    for (size_t i = 0; i < file->tensors().size(); ++i) {
        const gguf::tensor_info& t = file->tensors()[i];
        out.add_tensor(t.name, t.type, t.ne, [file, i](std::span<uint8_t> dst) {
            const std::span<const uint8_t> src = file->tensor_data(file->tensors()[i]);
            std::copy_n(src.begin(), dst.size(), dst.begin());
        });
    }
    return out;
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
