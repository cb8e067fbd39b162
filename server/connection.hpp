// The client connection behind a request, so a generation can stop at the next token when its
// client goes away. cpp-httplib 0.11 hands handlers no socket and keeps its connection loop private;
// the connection is found by its TCP 4-tuple (unique per connection) among this process's sockets.
// The descriptor stays valid while the handler (or its content provider) runs: cpp-httplib closes it
// only after both have returned.
#pragma once

#include <string>

namespace strata::server {

// The descriptor of the server-side socket connected to remote_addr:remote_port on local_port, or -1
// when none is found (then a disconnect shows only as a failed write).
int find_connection_socket(const std::string& remote_addr, int remote_port, int local_port);

// True once the peer has closed or reset the connection (POLLRDHUP/POLLHUP/POLLERR); never blocks.
bool peer_closed(int fd);

}  // namespace strata::server
