// What the request handlers share: the model and its one session, the queue, the counters, and the
// snapshots taken after each generation.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <spdlog/spdlog.h>

#include "metrics.hpp"
#include "request_queue.hpp"
#include "strata/engine.hpp"
#include "strata/server.hpp"

namespace strata::server {

struct server_state {
    explicit server_state(server_options o);

    const server_options options;
    const std::chrono::steady_clock::time_point started = std::chrono::steady_clock::now();
    std::shared_ptr<spdlog::logger> log;
    std::atomic<bool> shutting_down{false};
    // Draining: not ready, new generations refused at admission, the admitted ones finish (set once).
    std::atomic<bool> draining{false};
    std::atomic<int64_t> drain_began_ms{0};     // steady-clock milliseconds since `started`
    std::atomic<uint64_t> next_request_id{1};
    std::atomic<int> in_flight{0};
    request_queue queue;
    metrics counters;

    // Null while loading.
    std::shared_ptr<model> loaded_model() const;

    // One slot per generation at once: its session, and what it runs (for /v1/status).
    struct slot_view {
        int index = 0;
        std::string state;          // "idle" | "prompt" | "decoding"
        uint64_t request = 0;       // 0 when idle
        size_t cached_tokens = 0;
        size_t prompt_tokens = 0;
    };
    // Takes the free slot whose cache shares the longest prefix with `prompt` (the caller holds a queue
    // turn, so one is free) and returns its index; release_slot gives it back.
    int take_slot(uint64_t request_id, std::span<const int32_t> prompt);
    void release_slot(int index);
    session& slot_session(int index);
    std::vector<slot_view> slots() const;
    void set_model(std::shared_ptr<model> m);
    std::string model_id() const;
    // The model file's modification time in Unix seconds (0 while loading): /v1/models' "created".
    int64_t model_created() const;

    // "chatcmpl-" + 24 random hex digits: unique across requests and restarts.
    std::string new_response_id(std::string_view prefix);

    // Origins allowed to call from a browser, resolved from options.cors_origin: {"*"}, a list, or none.
    const std::vector<std::string> cors_origins;

    // Taken by the request holding the engine right after its generation (model::statistics() runs on
    // the engine thread, so reading it while a generation runs would wait for that generation).
    struct engine_snapshot {
        expert_stats experts;
        uint64_t as_of_request = 0;
        size_t cached_tokens = 0;
        size_t kv_bytes = 0;     // the session's KV cache, allocated so far
        size_t state_checkpoints = 0, state_checkpoint_bytes = 0;  // hybrid models: the recurrent state's
    };
    void take_snapshot(uint64_t request_id, int slot);
    std::optional<engine_snapshot> snapshot() const;

    double uptime_s() const;

    // Starts draining; false when it already was.
    bool begin_drain();
    // POST /admin/drain: starts draining and, when it was not yet, runs the hook (the binary's way to
    // finish the drain and exit). False when already draining.
    bool request_drain();
    void set_drain_hook(std::function<void()> fn);
    // Why /health/ready answers 503 ("loading", "draining", "shutting_down", "busy"), or "" when ready.
    std::string_view not_ready_reason() const;

private:
    mutable std::mutex model_mutex_;
    std::shared_ptr<model> model_;
    struct slot {
        std::unique_ptr<session> s;
        uint64_t request = 0;
        size_t prompt_tokens = 0;
        std::vector<int32_t> last_prompt;  // the prompt of its last request: what its cache starts with
    };
    std::vector<slot> slots_;  // guarded by model_mutex_
    std::string model_id_;
    int64_t model_created_ = 0;
    std::mutex id_mutex_;
    std::mt19937_64 id_rng_;
    std::mutex drain_hook_mutex_;
    std::function<void()> drain_hook_;
    mutable std::mutex snapshot_mutex_;
    std::optional<engine_snapshot> snapshot_;
};

}  // namespace strata::server
