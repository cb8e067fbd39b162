// Internals shared by engine.cpp and session.cpp: the loaded model and its engine thread.
#pragma once

#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include "expert_pool.hpp"
#include "expert_store.hpp"
#include "hot_node.hpp"
#include "region_map.hpp"
#include "conversation_cache.hpp"
#include "topology.hpp"
#include "gguf/gguf_reader.hpp"
#include "gpu/hybrid_forward.hpp"
#include "model/forward.hpp"
#include "model/hparams.hpp"
#include "model/kv_cache.hpp"
#include "model/ple.hpp"
#include "model/weights.hpp"
#include "spec/controller.hpp"
#include "strata/engine.hpp"
#include "tokenizer/chat_template.hpp"
#include "tokenizer/tokenizer.hpp"

namespace strata {

class step_batcher;

// Runs tasks one at a time, in submission order, on one thread: the thread that built the expert pool
// (under the NUMA split the pool pins it to the host core and phases must start from it).
class engine_thread {
public:
    engine_thread();
    ~engine_thread();
    // Runs fn on the engine thread and waits; rethrows what fn throws.
    void run(const std::function<void()>& fn);
    // Queues fn without waiting; what it throws is dropped (fn handles its own errors).
    void post(std::function<void()> fn);

private:
    void loop();

    std::mutex mutex_;
    std::condition_variable wake_;
    std::deque<std::packaged_task<void()>> tasks_;
    bool stop_ = false;
    std::thread thread_;
};

struct model::impl {
    // Loads, validates and binds everything but the pool (which engine.cpp builds on `thread`).
    explicit impl(const model_options& o);
    void register_ple_table();  // qwen4exp: the cold region's counters and region map entry

    model_options options;
    gguf::reader file;
    engine::hparams hp;
    engine::model_weights weights;
    std::vector<arenas::moe_layer> moe_layers;
    tok::tokenizer tokenizer;
    std::optional<tok::chat_template> chat;        // none: the model has no template strata knows
    std::string chat_error;                        // why not, for the error when one is needed
    engine::kv_type kv;
    model_info info;

    arenas::region_map regions;                    // published for placement-report --pid
    engine::ple_reads ple_reads;                   // qwen4exp: what passes gather from the cold PLE table
    std::string ple_where;                         // its place in the file, for cold_regions()
    uint64_t dense_copy_bytes = 0;                 // dense weights copied into RAM (repacked or as they are)
    engine_thread thread;                          // declared before what it owns, so it stops last
    std::unique_ptr<step_batcher> batcher;         // generations in flight; steps run on `thread`
    std::unique_ptr<arenas::expert_pool> pool;     // created and used on `thread`
    std::unique_ptr<arenas::hot_node> hot;         // ditto
    std::unique_ptr<engine::memory_budget> budget;  // sessions' KV caches, checkpoints and snapshots draw from it
    std::unique_ptr<engine::conversation_cache> conversations;  // parked KV snapshots, segments from `hot`
    std::unique_ptr<arenas::expert_store> store;   // the resident routed experts the pool reads
    std::unique_ptr<engine::forward_pass> forward; // ditto
    std::unique_ptr<engine::gpu::hybrid_forward> hybrid;  // ditto; when set, sessions evaluate with it
    std::string cpu_only_reason;                   // --gpu given but no hybrid pass: why
    bool ctx_from_file = false;                    // --ctx 0: options.n_ctx is the file's context
    uint64_t tokens_evaluated = 0;                 // changed on `thread` only
    // Speculative decoding: the measured pass costs (written on `thread`, under spec_mutex) and totals.
    mutable std::mutex spec_mutex;
    engine::spec::cost_table spec_costs;
    speculation_stats spec_totals;                 // costs left empty; filled when read
};

}  // namespace strata
