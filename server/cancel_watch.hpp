// A watch over one running generation: while it lives, a thread of its own asks every `period` whether
// the request should stop (client gone, shutdown, deadline) and, while the answer is yes, cancels the
// session. The token callback alone cannot do this: it is not called while a prompt is evaluated, and
// a 32K-token prompt takes minutes.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

namespace strata::server {

class cancel_watch {
public:
    // `cancel` is called again at every period while should_stop() holds: session::generate() clears a
    // cancellation made before it started, and the next call makes it again.
    cancel_watch(std::function<bool()> should_stop, std::function<void()> cancel,
                 std::chrono::milliseconds period = std::chrono::milliseconds(10));
    ~cancel_watch();
    cancel_watch(const cancel_watch&) = delete;
    cancel_watch& operator=(const cancel_watch&) = delete;

private:
    std::mutex mutex_;
    std::condition_variable wake_;
    bool done_ = false;
    std::thread thread_;
};

}  // namespace strata::server
