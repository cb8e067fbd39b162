#include "server_state.hpp"

#include <filesystem>

#include "log.hpp"

namespace strata::server {

server_state::server_state(server_options o) : options(std::move(o)), log(logger("server")) {}

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
    std::lock_guard lock(model_mutex_);
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
    engine_snapshot s{m->statistics(), request_id, engine_session().cached_tokens(),
                      engine_session().kv_bytes()};
    std::lock_guard lock(snapshot_mutex_);
    snapshot_ = std::move(s);
}

std::optional<server_state::engine_snapshot> server_state::snapshot() const {
    std::lock_guard lock(snapshot_mutex_);
    return snapshot_;
}

double server_state::uptime_s() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
}

}  // namespace strata::server
