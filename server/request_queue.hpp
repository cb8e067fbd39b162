// FIFO admission for generations: requests join in arrival order and up to `slots` run at once (each
// holds one slot, a session of its own). A waiting request can give up (its client left, the server is shutting down, its deadline passed) and leaves
// the queue without disturbing the order of the others.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <vector>

namespace strata::server {

class request_queue {
public:
    struct snapshot {
        std::vector<uint64_t> running;     // the requests holding a slot, in the order they got it
        std::vector<uint64_t> waiting;     // in the order they will run
        uint64_t served = 0;               // requests that held a slot and released it
        int slots = 1;
    };

    // A place in the queue; leaving scope releases the engine or the place.
    class ticket {
    public:
        ticket(request_queue& q, uint64_t id) : queue_(&q), id_(id) {}
        ticket(ticket&& o) noexcept : queue_(o.queue_), id_(o.id_) { o.queue_ = nullptr; }
        ticket(const ticket&) = delete;
        ticket& operator=(const ticket&) = delete;
        ticket& operator=(ticket&&) = delete;
        ~ticket();
        uint64_t id() const { return id_; }

    private:
        request_queue* queue_;
        uint64_t id_;
    };

    explicit request_queue(int slots = 1) : slots_(slots < 1 ? 1 : slots) {}

    ticket enter(uint64_t id);
    void set_slots(int slots);

    // Blocks until `t` is first among the waiting and a slot is free (true, the slot is then its own
    // until the ticket goes) or
    // until give_up() returns true (false); give_up is polled every `poll` while waiting.
    bool wait_turn(const ticket& t, const std::function<bool()>& give_up,
                   std::chrono::milliseconds poll = std::chrono::milliseconds(20));

    snapshot state() const;

private:
    void leave(uint64_t id);

    mutable std::mutex mutex_;
    std::condition_variable turn_changed_;
    int slots_;
    std::deque<uint64_t> order_;      // waiting, front: next to run
    std::vector<uint64_t> running_;
    uint64_t served_ = 0;
};

}  // namespace strata::server
