// Counters behind /metrics (Prometheus text format 0.0.4) and the record of a finished generation
// that /v1/status and the request log line report.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "request_queue.hpp"
#include "strata/engine.hpp"

namespace strata::server {

struct generation_record {
    uint64_t id = 0;
    std::string endpoint;          // "chat" | "completions"
    std::string finish_reason;     // what the client saw: "stop" | "length" | "cancelled"
    std::string stopped_by;        // "end of generation" | "stop string" | "max_tokens" | "context" |
                                   // "client disconnected" | "timeout" | "shutdown"
    int prompt_tokens = 0;         // the whole prompt (reused tokens included)
    timings time;
    double queue_s = 0;            // waiting for the engine
    double total_s = 0;            // arrival to the last byte handed to the client
};

class metrics {
public:
    void count_request(const std::string& route, int status);
    void count_generation(const generation_record& r);

    struct gauges {
        request_queue::snapshot queue;
        bool model_loaded = false;
        bool shutting_down = false;
        bool draining = false, ready = false;
        double drain_s = 0;            // seconds since the drain began (0: not draining)
        int in_flight = 0;             // generation requests admitted and not yet answered
        uint64_t expert_tokens = 0;
        uint64_t expert_lookups = 0, vram_hits = 0;
        std::vector<model_info::node_share> placement;
        double uptime_s = 0;
        conversation_cache_stats conversations;
        memory_budget_stats memory;  // --mem-budget and its use
        // Hybrid models: one session's recurrent state, and the checkpoints of it the session keeps.
        uint64_t state_bytes_per_session = 0, state_checkpoints = 0, state_checkpoint_bytes = 0;
        batch_stats batching;       // the engine's step batcher
    };
    std::string render(const gauges& g) const;
    std::optional<generation_record> last() const;

private:
    // Upper bounds of the request duration histogram, in seconds (+Inf implied).
    static constexpr std::array<double, 12> duration_buckets{0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300};

    mutable std::mutex mutex_;
    std::map<std::pair<std::string, int>, uint64_t> requests_;   // (route, status) -> count
    std::map<std::string, uint64_t> generations_;                // stopped_by -> count
    uint64_t prompt_tokens_ = 0, cached_tokens_ = 0, completion_tokens_ = 0;
    double prompt_seconds_ = 0, decode_seconds_ = 0;
    std::optional<generation_record> last_;
    std::array<uint64_t, duration_buckets.size()> duration_counts_{};  // requests within each bound (cumulative)
    uint64_t duration_count_ = 0;
    double duration_sum_ = 0;
};

}  // namespace strata::server
