#include "connection.hpp"

#include <dirent.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <charconv>
#include <cstring>

namespace strata::server {

static int port_of(const sockaddr_storage& a) {
    if (a.ss_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in&>(a).sin_port);
    if (a.ss_family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6&>(a).sin6_port);
    return -1;
}

// The numeric host as cpp-httplib writes Request::remote_addr (getnameinfo with NI_NUMERICHOST).
static std::string host_of(const sockaddr_storage& a, socklen_t len) {
    char host[NI_MAXHOST];
    if (getnameinfo(reinterpret_cast<const sockaddr*>(&a), len, host, sizeof host, nullptr, 0, NI_NUMERICHOST) != 0)
        return {};
    return host;
}

static bool matches(int fd, const std::string& remote_addr, int remote_port, int local_port) {
    struct stat st {};
    if (fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) return false;
    sockaddr_storage peer{}, local{};
    socklen_t peer_len = sizeof peer, local_len = sizeof local;
    if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_len) != 0) return false;
    if (port_of(peer) != remote_port) return false;
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &local_len) != 0) return false;
    if (port_of(local) != local_port) return false;
    return host_of(peer, peer_len) == remote_addr;
}

int find_connection_socket(const std::string& remote_addr, int remote_port, int local_port) {
    if (remote_port <= 0 || local_port <= 0) return -1;
    DIR* dir = opendir("/proc/self/fd");
    if (!dir) return -1;
    int found = -1;
    while (const dirent* e = readdir(dir)) {
        int fd = -1;
        const char* end = e->d_name + std::strlen(e->d_name);
        if (std::from_chars(e->d_name, end, fd).ptr != end || fd == dirfd(dir)) continue;
        if (matches(fd, remote_addr, remote_port, local_port)) {
            found = fd;
            break;
        }
    }
    closedir(dir);
    return found;
}

bool peer_closed(int fd) {
    if (fd < 0) return false;
    pollfd p{fd, POLLRDHUP, 0};
    return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

}  // namespace strata::server
