#include "connection.hpp"

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

namespace strata::server {
namespace {

thread_local connection_scope* current = nullptr;

int peer_port(int fd) {
    sockaddr_storage a{};
    socklen_t len = sizeof a;
    if (getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) return -1;
    if (a.ss_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in&>(a).sin_port);
    if (a.ss_family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6&>(a).sin6_port);
    return -1;
}

}  // namespace

connection_scope::connection_scope(int fd) : fd_(fd), remote_port_(peer_port(fd)), outer_(current) { current = this; }

connection_scope::~connection_scope() { current = outer_; }

int current_connection_socket(int remote_port) {
    return current && current->remote_port_ == remote_port ? current->fd_ : -1;
}

void close_after_answer() {
    if (current) current->close_ = true;
}

bool peer_closed(int fd) {
    if (fd < 0) return false;
    pollfd p{fd, POLLRDHUP, 0};
    return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

}  // namespace strata::server
