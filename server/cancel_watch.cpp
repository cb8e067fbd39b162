#include "cancel_watch.hpp"

namespace strata::server {

cancel_watch::cancel_watch(std::function<bool()> should_stop, std::function<void()> cancel,
                           std::chrono::milliseconds period) {
    thread_ = std::thread([this, should_stop = std::move(should_stop), cancel = std::move(cancel), period] {
        std::unique_lock lock(mutex_);
        while (!wake_.wait_for(lock, period, [this] { return done_; })) {
            lock.unlock();
            if (should_stop()) cancel();
            lock.lock();
        }
    });
}

cancel_watch::~cancel_watch() {
    {
        std::lock_guard lock(mutex_);
        done_ = true;
    }
    wake_.notify_one();
    thread_.join();
}

}  // namespace strata::server
