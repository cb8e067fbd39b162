// The server's listening socket and its accept loop, which hands every connection to the HTTP front.
// stop() works at any time, also before run() has started: run() then returns at once, so a stop
// signal that arrives while the server starts is never lost.
#pragma once

#include <atomic>
#include <functional>
#include <string>

namespace strata::server {

class listener {
public:
    listener();
    ~listener();
    listener(const listener&) = delete;
    listener& operator=(const listener&) = delete;

    // Binds host:port (0: any free port) with a full backlog; returns the port. Throws
    // std::runtime_error naming both when it cannot.
    int bind(const std::string& host, int port);
    // Accepts until stop(), handing each connected socket (non-blocking, TCP_NODELAY) to `adopt`.
    void run(const std::function<void(int)>& adopt);
    // Any thread, any time; idempotent.
    void stop();
    // The listening socket (-1 before bind()).
    int fd() const { return fd_; }

private:
    int fd_ = -1;
    int wake_fd_ = -1;
    std::atomic<bool> stopped_{false};
};

}  // namespace strata::server
