#include "metrics.hpp"

#include <spdlog/fmt/fmt.h>

namespace strata::server {

void metrics::count_request(const std::string& route, int status) {
    std::lock_guard lock(mutex_);
    ++requests_[{route, status}];
}

void metrics::count_generation(const generation_record& r) {
    std::lock_guard lock(mutex_);
    ++generations_[r.stopped_by];
    prompt_tokens_ += static_cast<uint64_t>(r.time.prompt_n);
    cached_tokens_ += static_cast<uint64_t>(r.time.cache_n);
    completion_tokens_ += static_cast<uint64_t>(r.time.predicted_n);
    prompt_seconds_ += r.time.prompt_ms / 1000.0;
    decode_seconds_ += r.time.predicted_ms / 1000.0;
    for (size_t i = 0; i < duration_buckets.size(); ++i)
        if (r.total_s <= duration_buckets[i]) ++duration_counts_[i];
    ++duration_count_;
    duration_sum_ += r.total_s;
    last_ = r;
}

std::optional<generation_record> metrics::last() const {
    std::lock_guard lock(mutex_);
    return last_;
}

// Label values escape backslash, double quote and newline (exposition format 0.0.4).
static std::string label_value(const std::string& v) {
    std::string out;
    for (char c : v) {
        if (c == '\\' || c == '"') out += '\\', out += c;
        else if (c == '\n') out += "\\n";
        else out += c;
    }
    return out;
}

static void family(std::string& out, const char* name, const char* type, const char* help) {
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
}

// The memory budget (--mem-budget) and what draws from it.
static void render_memory_budget(std::string& out, const memory_budget_stats& b) {
    family(out, "strata_memory_budget_bytes", "gauge",
           "The memory budget that sessions' KV caches, checkpoints and snapshots share (0: none).");
    out += fmt::format("strata_memory_budget_bytes {}\n", b.budget_bytes);
    family(out, "strata_memory_budget_used_bytes", "gauge", "Bytes drawn from the memory budget, by use.");
    out += fmt::format("strata_memory_budget_used_bytes{{use=\"kv\"}} {}\n", b.kv_bytes);
    out += fmt::format("strata_memory_budget_used_bytes{{use=\"checkpoints\"}} {}\n", b.checkpoint_bytes);
    out += fmt::format("strata_memory_budget_used_bytes{{use=\"snapshots\"}} {}\n", b.snapshot_bytes);
    family(out, "strata_memory_budget_evictions_total", "counter",
           "Conversation snapshots evicted to make room in the memory budget.");
    out += fmt::format("strata_memory_budget_evictions_total {}\n", b.evictions);
    family(out, "strata_memory_budget_refusals_total", "counter",
           "KV cache growths refused because the memory budget was full.");
    out += fmt::format("strata_memory_budget_refusals_total {}\n", b.refusals);
}

// The conversation cache's counters and size (--cache-ram).
static void render_conversation_cache(std::string& out, const conversation_cache_stats& c) {
    family(out, "strata_conversation_cache_hits_total", "counter", "Prompts that restored a parked conversation snapshot.");
    out += fmt::format("strata_conversation_cache_hits_total {}\n", c.hits);
    family(out, "strata_conversation_cache_misses_total", "counter",
           "Prompts for which no parked snapshot shared a longer prefix than the session's own KV cache.");
    out += fmt::format("strata_conversation_cache_misses_total {}\n", c.misses);
    family(out, "strata_conversation_cache_tokens_restored_total", "counter", "Tokens copied back from snapshots.");
    out += fmt::format("strata_conversation_cache_tokens_restored_total {}\n", c.tokens_restored);
    family(out, "strata_conversation_cache_parked_total", "counter", "Conversation snapshots parked.");
    out += fmt::format("strata_conversation_cache_parked_total {}\n", c.parked);
    family(out, "strata_conversation_cache_evictions_total", "counter", "Snapshots evicted to stay within --cache-ram.");
    out += fmt::format("strata_conversation_cache_evictions_total {}\n", c.evictions);
    family(out, "strata_conversation_cache_entries", "gauge", "Conversation snapshots held.");
    out += fmt::format("strata_conversation_cache_entries {}\n", c.entries.size());
    family(out, "strata_conversation_cache_bytes", "gauge", "Bytes of the snapshots' segments.");
    out += fmt::format("strata_conversation_cache_bytes {}\n", c.bytes);
    family(out, "strata_conversation_cache_budget_bytes", "gauge", "The conversation cache's budget (0: off).");
    out += fmt::format("strata_conversation_cache_budget_bytes {}\n", c.budget_bytes);
    family(out, "strata_conversation_cache_state_checkpoints", "gauge",
           "Recurrent states (hybrid models) the snapshots keep.");
    out += fmt::format("strata_conversation_cache_state_checkpoints {}\n", c.state_checkpoints);
}

// Hybrid models' recurrent state: its size per session and the session's checkpoints.
static void render_recurrent_state(std::string& out, const metrics::gauges& g) {
    family(out, "strata_state_bytes_per_session", "gauge",
           "Bytes of one session's recurrent state (gated DeltaNet layers; 0 for pure-attention models).");
    out += fmt::format("strata_state_bytes_per_session {}\n", g.state_bytes_per_session);
    family(out, "strata_state_checkpoints", "gauge", "Checkpoints of the recurrent state the session keeps.");
    out += fmt::format("strata_state_checkpoints {}\n", g.state_checkpoints);
    family(out, "strata_state_checkpoint_bytes", "gauge", "Bytes of those checkpoints.");
    out += fmt::format("strata_state_checkpoint_bytes {}\n", g.state_checkpoint_bytes);
}

std::string metrics::render(const gauges& g) const {
    std::lock_guard lock(mutex_);
    std::string out;
    family(out, "strata_http_requests_total", "counter", "HTTP requests answered, by route and status code.");
    for (const auto& [key, n] : requests_)
        out += fmt::format("strata_http_requests_total{{route=\"{}\",code=\"{}\"}} {}\n", label_value(key.first),
                           key.second, n);
    family(out, "strata_generations_total", "counter", "Generations finished, by what stopped them.");
    for (const auto& [why, n] : generations_)
        out += fmt::format("strata_generations_total{{stopped_by=\"{}\"}} {}\n", label_value(why), n);
    family(out, "strata_prompt_tokens_total", "counter", "Prompt tokens evaluated (reused tokens excluded).");
    out += fmt::format("strata_prompt_tokens_total {}\n", prompt_tokens_);
    family(out, "strata_prompt_tokens_cached_total", "counter", "Prompt tokens reused from the KV cache.");
    out += fmt::format("strata_prompt_tokens_cached_total {}\n", cached_tokens_);
    family(out, "strata_completion_tokens_total", "counter", "Tokens generated.");
    out += fmt::format("strata_completion_tokens_total {}\n", completion_tokens_);
    family(out, "strata_prompt_seconds_total", "counter", "Time spent evaluating prompts.");
    out += fmt::format("strata_prompt_seconds_total {:.6f}\n", prompt_seconds_);
    family(out, "strata_decode_seconds_total", "counter", "Time spent generating tokens.");
    out += fmt::format("strata_decode_seconds_total {:.6f}\n", decode_seconds_);
    family(out, "strata_prompt_tokens_per_second", "gauge", "Prompt speed of the last generation.");
    out += fmt::format("strata_prompt_tokens_per_second {:.3f}\n", last_ ? last_->time.prompt_per_second() : 0.0);
    family(out, "strata_decode_tokens_per_second", "gauge", "Decode speed of the last generation.");
    out += fmt::format("strata_decode_tokens_per_second {:.3f}\n", last_ ? last_->time.predicted_per_second() : 0.0);
    family(out, "strata_request_duration_seconds", "histogram",
           "Generation requests from arrival to the last byte, queue wait included.");
    for (size_t i = 0; i < duration_buckets.size(); ++i)
        out += fmt::format("strata_request_duration_seconds_bucket{{le=\"{}\"}} {}\n", duration_buckets[i],
                           duration_counts_[i]);
    out += fmt::format("strata_request_duration_seconds_bucket{{le=\"+Inf\"}} {}\n", duration_count_);
    out += fmt::format("strata_request_duration_seconds_sum {:.6f}\n", duration_sum_);
    out += fmt::format("strata_request_duration_seconds_count {}\n", duration_count_);
    family(out, "strata_queue_waiting", "gauge", "Generation requests waiting for the engine.");
    out += fmt::format("strata_queue_waiting {}\n", g.queue.waiting.size());
    family(out, "strata_queue_running", "gauge", "Generation requests holding a slot (at most --parallel).");
    out += fmt::format("strata_queue_running {}\n", g.queue.running.size());
    family(out, "strata_slots", "gauge", "Slots: generations that may run at once (--parallel).");
    out += fmt::format("strata_slots {}\n", g.queue.slots);
    family(out, "strata_active_slots", "gauge", "Slots whose generation is in the engine's batched steps.");
    out += fmt::format("strata_active_slots {}\n", g.batching.active);
    family(out, "strata_batch_steps_total", "counter", "Forward passes the step batcher ran for generations.");
    out += fmt::format("strata_batch_steps_total {}\n", g.batching.steps);
    family(out, "strata_batch_rows_total", "counter", "Tokens those passes evaluated (rows / steps: mean batch size).");
    out += fmt::format("strata_batch_rows_total {}\n", g.batching.rows);
    family(out, "strata_batch_size", "gauge", "Tokens in the last step.");
    out += fmt::format("strata_batch_size {}\n", g.batching.last_step_rows);
    family(out, "strata_requests_in_flight", "gauge",
           "Generation requests admitted and not yet answered (waiting, generating or streaming).");
    out += fmt::format("strata_requests_in_flight {}\n", g.in_flight);
    family(out, "strata_prompt_cache_hit_ratio", "gauge",
           "Share of all prompt tokens so far that were reused from the KV cache or a parked snapshot.");
    const uint64_t all_prompt = prompt_tokens_ + cached_tokens_;
    out += fmt::format("strata_prompt_cache_hit_ratio {:.6f}\n",
                       all_prompt ? double(cached_tokens_) / double(all_prompt) : 0.0);
    family(out, "strata_expert_routed_tokens_total", "counter",
           "Tokens the engine routed through the MoE layers (as of the last finished generation).");
    out += fmt::format("strata_expert_routed_tokens_total {}\n", g.expert_tokens);
    family(out, "strata_model_loaded", "gauge", "1 once the model is loaded and requests are served.");
    out += fmt::format("strata_model_loaded {}\n", g.model_loaded ? 1 : 0);
    family(out, "strata_shutting_down", "gauge", "1 once a graceful shutdown has begun.");
    out += fmt::format("strata_shutting_down {}\n", g.shutting_down ? 1 : 0);
    family(out, "strata_ready", "gauge", "1 while /health/ready answers 200 (loaded, not draining, queue short).");
    out += fmt::format("strata_ready {}\n", g.ready ? 1 : 0);
    family(out, "strata_draining", "gauge", "1 once a drain (SIGTERM, POST /admin/drain) has begun.");
    out += fmt::format("strata_draining {}\n", g.draining ? 1 : 0);
    family(out, "strata_drain_seconds", "gauge", "Seconds since the drain began (0 when not draining).");
    out += fmt::format("strata_drain_seconds {:.3f}\n", g.drain_s);
    family(out, "strata_uptime_seconds", "gauge", "Seconds since the server started.");
    out += fmt::format("strata_uptime_seconds {:.3f}\n", g.uptime_s);
    family(out, "strata_expert_vram_lookups_total", "counter",
           "GPU hybrid: routed expert lookups (as of the last finished generation; 0 CPU-only).");
    out += fmt::format("strata_expert_vram_lookups_total {}\n", g.expert_lookups);
    family(out, "strata_expert_vram_hits_total", "counter", "GPU hybrid: lookups served by experts resident in VRAM.");
    out += fmt::format("strata_expert_vram_hits_total {}\n", g.vram_hits);
    family(out, "strata_placement_share", "gauge",
           "Share of a slice's resident expert pages found on its intended NUMA node (sampled at load).");
    for (const auto& n : g.placement)
        out += fmt::format("strata_placement_share{{slice=\"{}\",node=\"{}\"}} {:.4f}\n", n.slice, n.node, n.share);
    family(out, "strata_placement_bytes", "gauge", "Bytes of resident experts placed for a slice.");
    for (const auto& n : g.placement)
        out += fmt::format("strata_placement_bytes{{slice=\"{}\",node=\"{}\"}} {}\n", n.slice, n.node, n.bytes);
    render_conversation_cache(out, g.conversations);
    render_memory_budget(out, g.memory);
    render_recurrent_state(out, g);
    return out;
}

}  // namespace strata::server
