// The route table: every endpoint with its methods, authentication, the shutdown gate, 404/405 for
// everything else, and the guard that turns any failure into an OpenAI-style error object.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "api_error.hpp"
#include "server_state.hpp"

namespace httplib {
class Server;
}

namespace strata::server {

void add_routes(httplib::Server& http, server_state& state);

// True when `method path` is served without the API key (health checks and CORS preflights).
bool route_is_open(std::string_view method, std::string_view path);

// Why a request with these headers may not use the API (no key, a wrong one); nothing when it may.
// The key is compared in constant time and never logged.
std::optional<api_error> api_key_problem(const server_state& state, std::optional<std::string_view> authorization,
                                         std::optional<std::string_view> x_api_key);
// The same against any key (the admin key); nothing when `key` is empty.
std::optional<api_error> key_problem(const std::string& key, std::optional<std::string_view> authorization,
                                     std::optional<std::string_view> x_api_key);

// The Access-Control-Allow-Origin value for a request's Origin: "*", the origin itself, or nothing.
std::optional<std::string> cors_origin_for(const server_state& state, std::optional<std::string_view> origin);

}  // namespace strata::server
