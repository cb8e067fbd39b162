// One budget for the host memory that requests make the engine hold: every session's KV cache, the
// sessions' recurrent-state checkpoints and the conversation cache's parked snapshots. Each holder
// reports its bytes as they change; before a session's cache grows the session asks fits(), and the
// conversation cache evicts snapshots (least recently used first) to make room before growth is
// refused with kv_cache_full.
//
// Thread-safety: the counters are atomics, readable from any thread; holders change them on the
// engine thread, which also does every check-then-grow, so a check and its growth are not raced.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <string>

#include "strata/engine.hpp"

namespace strata::engine {

class memory_budget {
public:
    enum class use { kv, checkpoints, snapshots };

    // limit_bytes 0: no budget (every growth fits; the counters still count).
    explicit memory_budget(uint64_t limit_bytes) : limit_(limit_bytes) {}

    uint64_t limit() const { return limit_; }
    uint64_t of(use u) const { return bytes_[index(u)].load(std::memory_order_relaxed); }
    uint64_t used() const { return of(use::kv) + of(use::checkpoints) + of(use::snapshots); }
    // Bytes past the limit were `more` bytes added now (0: they fit).
    uint64_t over_by(uint64_t more) const {
        const uint64_t want = used() + more;
        return limit_ == 0 || want <= limit_ ? 0 : want - limit_;
    }
    bool fits(uint64_t more) const { return over_by(more) == 0; }

    // A holder's bytes went from `before` to `after`.
    void change(use u, uint64_t before, uint64_t after) {
        bytes_[index(u)].fetch_add(after - before, std::memory_order_relaxed);  // modular: a decrease wraps back
    }
    void count_eviction() { evictions_.fetch_add(1, std::memory_order_relaxed); }
    void count_refusal() { refusals_.fetch_add(1, std::memory_order_relaxed); }

    // "the memory budget of X MiB holds Y MiB: KV caches A MiB, ..." for error messages and logs.
    std::string describe() const;
    memory_budget_stats stats() const;

private:
    static size_t index(use u) { return static_cast<size_t>(u); }

    const uint64_t limit_;
    std::array<std::atomic<uint64_t>, 3> bytes_{};
    std::atomic<uint64_t> evictions_{0}, refusals_{0};
};

// Memory this process can still commit: the system's MemAvailable and the room under the limit of its
// cgroup and each cgroup above it (v2 memory.max or v1 memory.limit_in_bytes; reclaimable file pages
// count as room). UINT64_MAX when nothing says.
uint64_t committable_memory();

// --mem-budget: MiB -> bytes; -1: 90 % of committable_memory() now (after the weights are loaded);
// 0: no budget.
uint64_t memory_budget_bytes(int mem_budget_mib);

}  // namespace strata::engine
