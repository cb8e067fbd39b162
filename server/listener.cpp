#include "listener.hpp"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

#include <spdlog/fmt/fmt.h>

namespace strata::server {

listener::listener() : wake_fd_(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {
    if (wake_fd_ < 0) throw std::runtime_error(fmt::format("cannot create an eventfd: {}", std::strerror(errno)));
}

listener::~listener() {
    if (fd_ >= 0) ::close(fd_);
    ::close(wake_fd_);
}

int listener::bind(const std::string& host, int port) {
    const auto fail = [&](const std::string& why) {
        return std::runtime_error(fmt::format("cannot listen on {}:{}: {}", host, port, why));
    };
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    addrinfo* found = nullptr;
    if (const int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found); rc != 0)
        throw fail(gai_strerror(rc));
    std::string why = "no address";
    for (addrinfo* a = found; a && fd_ < 0; a = a->ai_next) {
        const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) continue;
        const int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, SOMAXCONN) == 0) fd_ = fd;
        else why = std::strerror(errno), ::close(fd);
    }
    freeaddrinfo(found);
    if (fd_ < 0) throw fail(why);
    sockaddr_storage bound{};
    socklen_t len = sizeof bound;
    getsockname(fd_, reinterpret_cast<sockaddr*>(&bound), &len);
    return bound.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6&>(bound).sin6_port)
                                       : ntohs(reinterpret_cast<sockaddr_in&>(bound).sin_port);
}

void listener::run(const std::function<void(int)>& adopt) {
    while (!stopped_.load()) {
        pollfd p[2] = {{fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
        if (poll(p, 2, -1) < 0 && errno != EINTR) break;
        if (stopped_.load()) break;
        if (!(p[0].revents & POLLIN)) continue;
        const int fd = accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) {
            // Out of descriptors or memory: wait a little instead of spinning on the same error.
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) poll(p + 1, 1, 50);
            continue;
        }
        const int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        adopt(fd);
    }
}

void listener::stop() {
    stopped_.store(true);
    const uint64_t one = 1;
    (void)!::write(wake_fd_, &one, sizeof one);
}

}  // namespace strata::server
