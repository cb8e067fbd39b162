// POST /v1/chat/completions and /v1/completions: validation, the wait for the engine, generation
// with a per-token check (client still there, deadline, shutdown), and the answer as one JSON body
// or as server-sent events.
#pragma once

#include "openai_schema.hpp"
#include "server_state.hpp"

namespace httplib {
struct Request;
struct Response;
}  // namespace httplib

namespace strata::server {

void handle_completion(server_state& state, const httplib::Request& req, httplib::Response& res, endpoint kind);

}  // namespace strata::server
