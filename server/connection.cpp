#include "connection.hpp"

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <mutex>
#include <unordered_map>

namespace strata::server {
namespace {

thread_local connection_scope* current = nullptr;

// The connections being answered, by descriptor: whether their answer started and whether their
// client was probed after it half-closed.
struct answering {
    bool http10 = false;
    bool started = false;
    bool probed = false;
};
std::mutex registry_mutex;
std::unordered_map<int, answering> registry;

int peer_port(int fd) {
    sockaddr_storage a{};
    socklen_t len = sizeof a;
    if (getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) return -1;
    if (a.ss_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in&>(a).sin_port);
    if (a.ss_family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6&>(a).sin6_port);
    return -1;
}

}  // namespace

connection_scope::connection_scope(int fd, bool http10) : fd_(fd), remote_port_(peer_port(fd)), outer_(current) {
    current = this;
    std::lock_guard lock(registry_mutex);
    registry[fd] = answering{http10, false, false};
}

connection_scope::~connection_scope() {
    current = outer_;
    std::lock_guard lock(registry_mutex);
    registry.erase(fd_);
}

void answer_starts(int fd) {
    std::lock_guard lock(registry_mutex);
    const auto it = registry.find(fd);
    if (it != registry.end()) it->second.started = true;
}

int current_connection_socket(int remote_port) {
    return current && current->remote_port_ == remote_port ? current->fd_ : -1;
}

void close_after_answer() {
    if (current) current->close_ = true;
}

bool peer_closed(int fd) {
    if (fd < 0) return false;
    pollfd p{fd, POLLRDHUP, 0};
    if (poll(&p, 1, 0) <= 0) return false;
    if (p.revents & (POLLHUP | POLLERR | POLLNVAL)) return true;
    if (!(p.revents & POLLRDHUP)) return false;
    std::lock_guard lock(registry_mutex);
    const auto it = registry.find(fd);
    if (it == registry.end()) return true;  // not a connection being answered: nothing to wait for
    answering& a = it->second;
    if (!a.http10 && !a.started && !a.probed) {
        static constexpr char probe[] = "HTTP/1.1 100 Continue\r\n\r\n";
        a.probed = ::send(fd, probe, sizeof probe - 1, MSG_NOSIGNAL | MSG_DONTWAIT) == ssize_t(sizeof probe - 1);
        return !a.probed;
    }
    return false;
}

}  // namespace strata::server
