#include "server_state.hpp"

#include <algorithm>

#include <sys/stat.h>

#include <filesystem>

#include <spdlog/fmt/fmt.h>

#include "log.hpp"
#include "text.hpp"

namespace strata::server {

namespace {

std::vector<std::string> resolve_cors(const server_options& o) {
    if (!o.cors_origin) {
        if (is_loopback_host(o.host) && o.api_key.empty()) return {"*"};
        return {};
    }
    std::vector<std::string> out;
    std::string_view rest = *o.cors_origin;
    while (!rest.empty()) {
        const size_t comma = rest.find(',');
        std::string_view item = rest.substr(0, comma);
        rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
        while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
        while (!item.empty() && item.back() == ' ') item.remove_suffix(1);
        while (!item.empty() && item.back() == '/') item.remove_suffix(1);  // browsers send no trailing slash
        if (!item.empty()) out.emplace_back(item);
    }
    return out;
}

uint64_t random_seed() {
    std::random_device rd;
    return (uint64_t{rd()} << 32) ^ rd();
}

}  // namespace

server_state::server_state(server_options o)
    : options(std::move(o)), log(logger("server")), queue(options.parallel), cors_origins(resolve_cors(options)), id_rng_(random_seed()) {}

std::string server_state::new_response_id(std::string_view prefix) {
    std::lock_guard lock(id_mutex_);
    const uint64_t a = id_rng_(), b = id_rng_();
    return fmt::format("{}-{:016x}{:08x}", prefix, a, static_cast<uint32_t>(b));
}

int64_t server_state::model_created() const {
    std::lock_guard lock(model_mutex_);
    return model_created_;
}

std::shared_ptr<model> server_state::loaded_model() const {
    std::lock_guard lock(model_mutex_);
    return model_;
}

session& server_state::slot_session(int index) {
    std::lock_guard lock(model_mutex_);
    return *slots_.at(static_cast<size_t>(index)).s;
}

int server_state::take_slot(uint64_t request_id, std::span<const int32_t> prompt) {
    std::lock_guard lock(model_mutex_);
    int best = -1;
    size_t best_shared = 0;
    for (size_t i = 0; i < slots_.size(); ++i) {
        const slot& sl = slots_[i];
        if (sl.request != 0) continue;
        const size_t shared = static_cast<size_t>(
            std::mismatch(sl.last_prompt.begin(), sl.last_prompt.end(), prompt.begin(), prompt.end()).first -
            sl.last_prompt.begin());
        if (best < 0 || shared > best_shared) {
            best = static_cast<int>(i);
            best_shared = shared;
        }
    }
    if (best < 0) throw std::logic_error("take_slot: every slot is busy");
    slot& sl = slots_[static_cast<size_t>(best)];
    sl.request = request_id;
    sl.prompt_tokens = prompt.size();
    sl.last_prompt.assign(prompt.begin(), prompt.end());
    return best;
}

void server_state::release_slot(int index) {
    std::lock_guard lock(model_mutex_);
    slots_.at(static_cast<size_t>(index)).request = 0;
}

std::vector<server_state::slot_view> server_state::slots() const {
    std::lock_guard lock(model_mutex_);
    std::vector<slot_view> out;
    for (size_t i = 0; i < slots_.size(); ++i) {
        const slot& sl = slots_[i];
        slot_view v{static_cast<int>(i), "idle", sl.request, sl.s->cached_tokens(), sl.prompt_tokens};
        if (sl.request != 0) v.state = v.cached_tokens < sl.prompt_tokens ? "prompt" : "decoding";
        out.push_back(v);
    }
    return out;
}

void server_state::set_model(std::shared_ptr<model> m) {
    int n_slots = std::max(1, options.parallel);
    if (n_slots > 1 && m->info().gpu_hybrid) {
        log->warn("--parallel {} runs as 1: the GPU hybrid keeps one session's KV cache in VRAM at a time.", n_slots);
        n_slots = 1;
    }
    queue.set_slots(n_slots);
    std::vector<slot> fresh(static_cast<size_t>(n_slots));
    for (slot& sl : fresh) sl.s = std::make_unique<session>(m);
    std::string id = options.model_id.empty() ? std::filesystem::path(m->info().path).filename().string()
                                              : options.model_id;
    struct stat st {};
    const int64_t created = ::stat(m->info().path.c_str(), &st) == 0 ? static_cast<int64_t>(st.st_mtime) : 0;
    std::lock_guard lock(model_mutex_);
    model_created_ = created;
    model_ = std::move(m);
    slots_ = std::move(fresh);
    model_id_ = std::move(id);
}

std::string server_state::model_id() const {
    std::lock_guard lock(model_mutex_);
    return model_id_;
}

void server_state::take_snapshot(uint64_t request_id, int slot) {
    const std::shared_ptr<model> m = loaded_model();
    if (!m) return;
    session& e = slot_session(slot);
    engine_snapshot s{m->statistics(), request_id, e.cached_tokens(), e.kv_bytes(), e.state_checkpoints(),
                      e.state_checkpoint_bytes()};
    std::lock_guard lock(snapshot_mutex_);
    snapshot_ = std::move(s);
}

std::optional<server_state::engine_snapshot> server_state::snapshot() const {
    std::lock_guard lock(snapshot_mutex_);
    return snapshot_;
}

bool server_state::begin_drain() {
    if (draining.exchange(true)) return false;
    drain_began_ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - started)
                         .count();
    log->info("Draining: not ready, new generation requests get 503 with Retry-After; {} admitted request(s) run to "
              "their end.", in_flight.load());
    return true;
}

bool server_state::request_drain() {
    if (!begin_drain()) return false;
    std::function<void()> hook;
    {
        std::lock_guard lock(drain_hook_mutex_);
        hook = drain_hook_;
    }
    if (hook) hook();
    return true;
}

void server_state::set_drain_hook(std::function<void()> fn) {
    std::lock_guard lock(drain_hook_mutex_);
    drain_hook_ = std::move(fn);
}

std::string_view server_state::not_ready_reason() const {
    if (shutting_down.load()) return "shutting_down";
    if (draining.load()) return "draining";
    if (!loaded_model()) return "loading";
    if (options.ready_max_waiting > 0 &&
        queue.state().waiting.size() > static_cast<size_t>(options.ready_max_waiting))
        return "busy";
    return "";
}

double server_state::uptime_s() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
}

}  // namespace strata::server
