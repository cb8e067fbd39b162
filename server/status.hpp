// Bodies of the read-only endpoints: /health, /v1/models, /v1/status and /metrics.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "server_state.hpp"

namespace strata::server {

nlohmann::json models_json(const server_state& state);
// One entry of models_json: GET /v1/models/{id}.
nlohmann::json model_json(const server_state& state, const model& m);
nlohmann::json status_json(const server_state& state);
std::string metrics_text(const server_state& state);

}  // namespace strata::server
