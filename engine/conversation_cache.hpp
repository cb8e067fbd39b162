// The conversation cache: sessions' KV states parked as snapshots in segments from the hot node's
// cold allocator (the cold NUMA node under --numa-hot-node, anonymous memory otherwise; each segment
// listed in the region map), found again by longest token prefix, evicted least recently used first
// under a byte budget.
//
// A snapshot of n tokens stores, layer after layer and chunk after chunk, each of the chunk's
// 2 * n_head_kv tiles (keys of every kv head, then values) cut to the rows it holds:
//   [n_layer][chunks of n][2 * n_head_kv][rows of that chunk][head_row]
// in one byte stream cut into segments of at most segment_bytes. The rows are the cache's bytes
// verbatim, so a restored prefix is the same as one evaluated again. A hybrid model's snapshot also
// keeps its recurrent state at the parked position and the session's checkpoints before it (on the
// heap; their bytes count against the budget): it can be restored only at one of those positions.
// A qwen4exp snapshot keeps the QSA indexer's key stores too (heap, counted the same way). With MTP
// speculation a snapshot also keeps the rows of the session's MTP cache (one layer) for the positions it
// had filled, in the same layout (heap, counted the same way), restored with the KV rows.
//
// Thread-safety: every member locks; park() and restore() run on the engine thread (they read and
// write a session's cache), stats() from any thread.
#pragma once

#include <cstdint>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "hot_node.hpp"
#include "memory_budget.hpp"
#include "model/kv_cache.hpp"
#include "strata/engine.hpp"

namespace strata::engine {

class conversation_cache {
public:
    static constexpr size_t segment_bytes = size_t{16} << 20;
    // Tails shorter than this are not worth keeping apart: a session's state is parked only when a
    // prompt would discard at least this many of its tokens, and a new snapshot replaces one that
    // differs from it only in its last (fewer than this) tokens, such as an answer the client sent
    // back tokenized differently.
    static constexpr size_t min_tail_tokens = 32;

    // budget_bytes 0: off (park() and find() do nothing). `hot`, and `shared` when given (the engine's
    // memory budget, which the snapshots also draw from), must outlive the cache.
    conversation_cache(uint64_t budget_bytes, const arenas::hot_node& hot, memory_budget* shared = nullptr);
    ~conversation_cache();

    bool enabled() const { return budget_ > 0; }

    struct match {
        uint64_t id = 0;
        size_t n_tokens = 0;  // prefix shared with the prompt (capped)
    };
    // The snapshot sharing the longest prefix with `prompt`, cut to `limit` tokens (and, with a recurrent
    // state, back to its newest state at or before that), when longer than `better_than`; ties go to
    // the most recently used. Only snapshots parked under `scope` are considered (callers that must not
    // see each other's prompts use different scopes). Counts a hit or a miss.
    std::optional<match> find(std::span<const int32_t> prompt, size_t limit, size_t better_than,
                              std::string_view scope = {});

    // Copies positions [from, to) of snapshot `id` into `kv` (which has room for them) and marks the
    // snapshot used. The caller's positions [0, from) must hold the same tokens as the snapshot's. With
    // a recurrent state, `to` must be a position find() gave: the state there and the checkpoints
    // before it replace kv's.
    // mtp (unless null): the session's MTP cache, whose positions [0, mtp_from) hold this prefix's entries;
    // the snapshot's MTP rows of positions [mtp_from, to) that it has are copied in. Returns the positions
    // of mtp now holding entries, [0, n) (mtp_from when the snapshot has none past it).
    size_t restore(uint64_t id, size_t from, size_t to, kv_cache& kv, kv_cache* mtp = nullptr, size_t mtp_from = 0);

    // Parks `tokens` with their rows of `kv`. A snapshot that these extend (all but fewer than
    // min_tail_tokens of its tokens are a prefix of these) is replaced; when these are a prefix of a
    // snapshot's, that one is only marked used. Returns the id
    // of the snapshot holding them, or 0 when none (off, larger than the budget, out of memory). Only
    // snapshots of the same `scope` are replaced or reused.
    // mtp (unless null): the session's MTP cache, its rows of positions [0, mtp_n) parked too.
    uint64_t park(std::span<const int32_t> tokens, const kv_cache& kv, std::string_view scope = {},
                  const kv_cache* mtp = nullptr, size_t mtp_n = 0);

    // Evicts snapshots, least recently used first and never snapshot `keep`, until the shared memory
    // budget has room for `more` bytes. Returns whether it has.
    bool make_room(uint64_t more, uint64_t keep = 0);

    conversation_cache_stats stats() const;

private:
    struct snapshot;

    uint64_t park_locked(std::span<const int32_t> tokens, const kv_cache& kv, std::string_view scope,
                         const kv_cache* mtp, size_t mtp_n);
    void touch(snapshot& s);
    void evict_for(uint64_t bytes);
    void evict_lru(uint64_t keep, const char* why);
    void add_bytes(uint64_t before, uint64_t after);  // bytes_ and the shared budget follow

    const uint64_t budget_;
    const arenas::hot_node& hot_;
    memory_budget* shared_;
    mutable std::mutex mutex_;
    std::vector<snapshot> snapshots_;
    uint64_t next_id_ = 1;
    uint64_t clock_ = 0;  // use counter: larger is more recent
    uint64_t bytes_ = 0;
    conversation_cache_stats counters_;  // the counters only; stats() adds the rest
};

// --cache-ram: MiB -> bytes; -1: the smaller of 25 % of what the system (and this process's cgroup) can
// still give and 8 GiB.
uint64_t conversation_cache_budget(int cache_ram_mib);

}  // namespace strata::engine
