// The route table: every endpoint with its methods, authentication, the shutdown gate, 404/405 for
// everything else, and the guard that turns any failure into an OpenAI-style error object.
#pragma once

#include "server_state.hpp"

namespace httplib {
class Server;
}

namespace strata::server {

void add_routes(httplib::Server& http, server_state& state);

}  // namespace strata::server
