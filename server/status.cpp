#include "status.hpp"

#include <algorithm>
#include <chrono>
#include <numeric>

#include <spdlog/fmt/fmt.h>

#include "openai_response.hpp"

namespace strata::server {

using json = nlohmann::json;

static std::string state_name(const server_state& s, bool loaded) {
    if (s.shutting_down.load()) return "shutting_down";
    if (s.draining.load()) return "draining";
    return loaded ? "ready" : "loading";
}

json model_json(const server_state& state, const model& m) {
    const model_info& i = m.info();
    return {{"id", state.model_id()},
            {"object", "model"},
            {"created", state.model_created()},
            {"owned_by", "strata"},
            {"meta", {{"architecture", i.architecture}, {"n_ctx", i.n_ctx}, {"n_ctx_train", i.n_ctx_train},
                      {"n_vocab", i.n_vocab}, {"n_expert", i.n_expert}, {"n_expert_used", i.n_expert_used},
                      {"size", i.file_bytes}}}};
}

json models_json(const server_state& state) {
    json data = json::array();
    if (const auto m = state.loaded_model()) data.push_back(model_json(state, *m));
    return {{"object", "list"}, {"data", std::move(data)}};
}

static json model_section(const server_state& state, const model_info& i) {
    return {{"id", state.model_id()},     {"path", i.path},
            {"name", i.name},             {"architecture", i.architecture},
            {"n_layer", i.n_layer},       {"n_embd", i.n_embd},
            {"n_head", i.n_head},         {"n_head_kv", i.n_head_kv},
            {"head_dim", i.head_dim},     {"n_expert", i.n_expert},
            {"n_expert_used", i.n_expert_used}, {"n_ff_exp", i.n_ff_exp},
            {"n_vocab", i.n_vocab},       {"file_bytes", i.file_bytes},
            {"chat_format", i.chat_format}};
}

static json pool_section(const model_info& i) {
    json slices = json::array();
    int workers = 0;
    for (const pool_slice_info& s : i.pool_slices) {
        slices.push_back({{"node", s.node}, {"threads", s.threads}, {"cores", s.cores}});
        workers += s.threads;
    }
    return {{"split", i.pool_split}, {"test_mode", i.pool_test_mode}, {"reason", i.pool_reason},
            {"threads", workers},    {"slices", std::move(slices)}};
}

// Where the resident routed experts landed, per pool slice and NUMA node (shares sampled at load).
static json placement_section(const model_info& i) {
    json nodes = json::array();
    for (const model_info::node_share& n : i.placement_nodes)
        nodes.push_back({{"slice", n.slice}, {"node", n.node}, {"bytes", n.bytes}, {"share", n.share}, {"ok", n.ok}});
    return {{"mode", i.placement_mode},
            {"summary", i.placement},
            {"expert_bytes", i.expert_bytes},
            {"nodes", std::move(nodes)},
            {"region_map", i.region_map_path}};
}

// GPU hybrid: routed expert lookups and those served from VRAM (zeros CPU-only).
static json vram_json(uint64_t lookups, uint64_t hits) {
    return {{"lookups", lookups}, {"hits", hits}, {"hit_rate", lookups ? double(hits) / double(lookups) : 0.0}};
}

// Per layer: tokens routed and the experts routed to most, hottest first.
static json expert_section(const model_info& i, const std::optional<server_state::engine_snapshot>& snap) {
    if (!snap)
        return {{"as_of_request", nullptr},
                {"tokens", 0},
                {"vram", {{"lookups", 0}, {"hits", 0}, {"hit_rate", 0.0}}},
                {"layers", json::array()}};
    const expert_stats& st = snap->experts;
    json layers = json::array();
    const size_t n_expert = static_cast<size_t>(std::max(i.n_expert, 1));
    for (size_t l = 0; l * n_expert < st.counts.size(); ++l) {
        const auto first = st.counts.begin() + static_cast<ptrdiff_t>(l * n_expert);
        std::vector<uint64_t> counts(first, first + static_cast<ptrdiff_t>(n_expert));
        std::vector<int> order(n_expert);
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return counts[size_t(a)] > counts[size_t(b)]; });
        json hottest = json::array();
        for (size_t k = 0; k < std::min<size_t>(8, n_expert); ++k)
            hottest.push_back({{"expert", order[k]}, {"count", counts[size_t(order[k])]}});
        layers.push_back({{"layer", l}, {"counts", counts}, {"hottest", std::move(hottest)}});
    }
    return {{"as_of_request", snap->as_of_request},
            {"tokens", st.tokens},
            {"vram", vram_json(st.expert_lookups, st.vram_hits)},
            {"layers", std::move(layers)}};
}

// Parked conversation snapshots (--cache-ram), most recently used first.
static json conversation_cache_section(const conversation_cache_stats& c) {
    const double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    json entries = json::array();
    for (const conversation_cache_entry& e : c.entries)
        entries.push_back({{"id", e.id}, {"tokens", e.tokens}, {"bytes", e.bytes},
                           {"last_use", static_cast<int64_t>(e.last_use_s)}, {"idle_s", std::max(0.0, now - e.last_use_s)}});
    return {{"enabled", c.enabled},
            {"budget_bytes", c.budget_bytes},
            {"bytes", c.bytes},
            {"segments", c.segments},
            {"node", c.node >= 0 ? json(c.node) : json(nullptr)},
            {"node_share", c.node >= 0 ? json(c.node_share) : json(nullptr)},
            {"placement", c.node >= 0 ? fmt::format("cold node {}", c.node) : std::string("anonymous memory")},
            {"hits", c.hits},
            {"misses", c.misses},
            {"tokens_restored", c.tokens_restored},
            {"parked", c.parked},
            {"evictions", c.evictions},
            {"state_checkpoints", c.state_checkpoints},
            {"state_bytes", c.state_bytes},
            {"entries", std::move(entries)}};
}

// The memory budget (--mem-budget) and what draws from it.
static json memory_budget_section(const memory_budget_stats& b) {
    return {{"budget_bytes", b.budget_bytes}, {"used_bytes", b.used()},  {"kv_bytes", b.kv_bytes},
            {"checkpoint_bytes", b.checkpoint_bytes}, {"snapshot_bytes", b.snapshot_bytes},
            {"evictions", b.evictions}, {"refusals", b.refusals}};
}

static json last_request_section(const server_state& state) {
    const std::optional<generation_record> r = state.counters.last();
    if (!r) return nullptr;
    return {{"id", r->id},
            {"endpoint", r->endpoint},
            {"finish_reason", r->finish_reason},
            {"stopped_by", r->stopped_by},
            {"queue_s", r->queue_s},
            {"total_s", r->total_s},
            {"usage", usage_json(r->prompt_tokens, r->time)},
            {"timings", timings_json(r->time)},
            {"vram", vram_json(r->time.expert_lookups, r->time.vram_hits)}};
}

static json batching_json(const batch_stats& b) {
    return {{"steps", b.steps}, {"rows", b.rows}, {"active", b.active}, {"last_step_rows", b.last_step_rows},
            {"max_step_rows", b.max_step_rows}, {"sequences_in_one_pass", b.sequences_in_one_pass}};
}

static json queue_section(const server_state& state) {
    const request_queue::snapshot q = state.queue.state();
    const auto m = state.loaded_model();
    json slots = json::array();
    for (const server_state::slot_view& v : state.slots())
        slots.push_back({{"slot", v.index}, {"state", v.state}, {"request", v.request ? json(v.request) : json(nullptr)},
                         {"cached_tokens", v.cached_tokens}, {"prompt_tokens", v.prompt_tokens}});
    return {{"policy", fmt::format("fifo: generation requests take one of {} slots in arrival order; the slots' "
                                   "generations advance together in batched steps", q.slots)},
            {"parallel", q.slots},
            {"budget", m ? json(m->info().n_batch) : json(nullptr)},
            {"batching", m ? batching_json(m->batching()) : json(nullptr)},
            {"running", q.running.empty() ? json(nullptr) : json(q.running.front())},
            {"running_all", q.running},
            {"slots", slots},
            {"waiting", q.waiting},
            {"n_waiting", q.waiting.size()},
            {"served", q.served}};
}

json status_json(const server_state& state) {
    const auto m = state.loaded_model();
    json s = {{"state", state_name(state, m != nullptr)},
              {"version", STRATA_VERSION},
              {"uptime_s", state.uptime_s()},
              {"queue", queue_section(state)},
              {"last_request", last_request_section(state)}};
    if (!m) return s;
    const model_info& i = m->info();
    const auto snap = state.snapshot();
    s["model"] = model_section(state, i);
    s["context"] = {{"n_ctx", i.n_ctx}, {"n_ctx_train", i.n_ctx_train}, {"n_batch", i.n_batch}, {"kv_type", i.kv_type},
                    {"kv_bytes_per_session", i.kv_bytes_per_session}, {"kv_bytes_max", i.kv_bytes_per_session},
                    {"kv_bytes_allocated", snap ? json(snap->kv_bytes) : json(0)},
                    {"kv_chunk_tokens", i.kv_chunk_tokens},
                    {"cached_tokens", snap ? json(snap->cached_tokens) : json(0)},
                    {"recurrent_layers", i.n_recurrent_layers},
                    {"state_bytes_per_session", i.state_bytes_per_session},
                    {"state_checkpoint_interval", i.state_checkpoint_interval},
                    {"state_checkpoints", snap ? json(snap->state_checkpoints) : json(0)},
                    {"state_checkpoint_bytes", snap ? json(snap->state_checkpoint_bytes) : json(0)}};
    s["pool"] = pool_section(i);
    s["placement"] = placement_section(i);
    s["experts"] = expert_section(i, snap);
    s["conversation_cache"] = conversation_cache_section(m->conversation_statistics());
    s["cold_regions"] = json::array();
    for (const cold_region_stats& c : m->cold_regions())
        s["cold_regions"].push_back({{"name", c.name}, {"where", c.where}, {"bytes_mapped", c.bytes_mapped},
                                     {"bytes_resident", c.bytes_resident}, {"tokens", c.tokens},
                                     {"rows_read", c.rows_read}, {"page_faults", c.page_faults}});
    s["memory_budget"] = memory_budget_section(m->memory_statistics());
    return s;
}

std::string metrics_text(const server_state& state) {
    metrics::gauges g;
    g.queue = state.queue.state();
    g.model_loaded = state.loaded_model() != nullptr;
    g.shutting_down = state.shutting_down.load();
    g.draining = state.draining.load();
    g.ready = state.not_ready_reason().empty();
    if (g.draining) g.drain_s = std::max(0.0, state.uptime_s() - double(state.drain_began_ms.load()) / 1000.0);
    g.in_flight = state.in_flight.load();
    if (const auto snap = state.snapshot()) {
        g.expert_tokens = snap->experts.tokens;
        g.expert_lookups = snap->experts.expert_lookups;
        g.vram_hits = snap->experts.vram_hits;
        g.state_checkpoints = snap->state_checkpoints;
        g.state_checkpoint_bytes = snap->state_checkpoint_bytes;
    }
    if (const auto m = state.loaded_model()) {
        g.placement = m->info().placement_nodes;
        g.conversations = m->conversation_statistics();
        g.memory = m->memory_statistics();
        g.state_bytes_per_session = m->info().state_bytes_per_session;
    }
    if (const auto m = state.loaded_model()) g.batching = m->batching();
    g.uptime_s = state.uptime_s();
    return state.counters.render(g);
}

}  // namespace strata::server
