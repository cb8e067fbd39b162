#include "request_queue.hpp"

#include <algorithm>

namespace strata::server {

request_queue::ticket::~ticket() {
    if (queue_) queue_->leave(id_);
}

request_queue::ticket request_queue::enter(uint64_t id) {
    std::lock_guard lock(mutex_);
    order_.push_back(id);
    return ticket(*this, id);
}

void request_queue::set_slots(int slots) {
    {
        std::lock_guard lock(mutex_);
        slots_ = slots < 1 ? 1 : slots;
    }
    turn_changed_.notify_all();
}

bool request_queue::wait_turn(const ticket& t, const std::function<bool()>& give_up,
                              std::chrono::milliseconds poll) {
    std::unique_lock lock(mutex_);
    for (;;) {
        // Giving up is checked first, so a request that should leave never takes the engine on its way out.
        lock.unlock();
        const bool quit = give_up && give_up();
        lock.lock();
        if (quit) return false;
        if (!order_.empty() && order_.front() == t.id() && static_cast<int>(running_.size()) < slots_) {
            order_.pop_front();
            running_.push_back(t.id());
            turn_changed_.notify_all();  // the next in line may take another free slot
            return true;
        }
        turn_changed_.wait_for(lock, poll);
    }
}

void request_queue::leave(uint64_t id) {
    {
        std::lock_guard lock(mutex_);
        if (const auto r = std::find(running_.begin(), running_.end(), id); r != running_.end()) {
            running_.erase(r);
            ++served_;
        }
        const auto it = std::find(order_.begin(), order_.end(), id);
        if (it != order_.end()) order_.erase(it);
    }
    turn_changed_.notify_all();
}

request_queue::snapshot request_queue::state() const {
    std::lock_guard lock(mutex_);
    snapshot s;
    s.running = running_;
    s.served = served_;
    s.slots = slots_;
    s.waiting.assign(order_.begin(), order_.end());
    return s;
}

}  // namespace strata::server
