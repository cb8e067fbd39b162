#include "server_state.hpp"

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
    : options(std::move(o)), log(logger("server")), cors_origins(resolve_cors(options)), id_rng_(random_seed()) {}

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

session& server_state::engine_session() {
    std::lock_guard lock(model_mutex_);
    return *session_;
}

void server_state::set_model(std::shared_ptr<model> m) {
    auto s = std::make_unique<session>(m);
    std::string id = options.model_id.empty() ? std::filesystem::path(m->info().path).filename().string()
                                              : options.model_id;
    struct stat st {};
    const int64_t created = ::stat(m->info().path.c_str(), &st) == 0 ? static_cast<int64_t>(st.st_mtime) : 0;
    std::lock_guard lock(model_mutex_);
    model_created_ = created;
    model_ = std::move(m);
    session_ = std::move(s);
    model_id_ = std::move(id);
}

std::string server_state::model_id() const {
    std::lock_guard lock(model_mutex_);
    return model_id_;
}

void server_state::take_snapshot(uint64_t request_id) {
    const std::shared_ptr<model> m = loaded_model();
    if (!m) return;
    engine_snapshot s{m->statistics(), request_id, engine_session().cached_tokens(), engine_session().kv_bytes(),
                      engine_session().state_checkpoints(), engine_session().state_checkpoint_bytes()};
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
