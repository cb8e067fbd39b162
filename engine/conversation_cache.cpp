#include "conversation_cache.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <new>
#include <string>
#include <type_traits>
#include <vector>

#include <spdlog/fmt/fmt.h>

#include "log.hpp"
#include "numa_policy.hpp"

namespace strata::engine {

namespace {

constexpr uint64_t mib = uint64_t{1} << 20;
constexpr uint64_t map_granule = uint64_t{2} << 20;  // node_buffer maps whole 2 MiB pages

double unix_seconds() {
    return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

uint64_t mapped_bytes(size_t bytes) { return (bytes + map_granule - 1) / map_granule * map_granule; }

// The snapshot layout (see the header) of n tokens: where each tile's rows start in the stream.
struct stream_layout {
    size_t n_tokens;
    int n_layer;
    int n_tiles;        // 2 * n_head_kv
    size_t head_row;    // bytes of one position of one kv head

    size_t total() const { return static_cast<size_t>(n_layer) * n_tokens * static_cast<size_t>(n_tiles) * head_row; }

    // Calls fn(layer, chunk, tile, row_begin, row_end, stream offset of row_begin) for rows of
    // positions [from, to), chunk-relative.
    template <class Fn>
    void for_each_piece(size_t from, size_t to, Fn&& fn) const {
        const size_t ct = kv_cache::chunk_tokens;
        const size_t layer_bytes = n_tokens * static_cast<size_t>(n_tiles) * head_row;
        for (int l = 0; l < n_layer; ++l)
            for (size_t c = from / ct; c * ct < to; ++c) {
                const size_t rows = std::min(ct, n_tokens - c * ct);
                const size_t r0 = std::max(from, c * ct) - c * ct, r1 = std::min(to, (c + 1) * ct) - c * ct;
                const size_t chunk_at = static_cast<size_t>(l) * layer_bytes + c * ct * static_cast<size_t>(n_tiles) * head_row;
                for (int t = 0; t < n_tiles; ++t)
                    fn(l, static_cast<int>(c), t, r0, r1, chunk_at + (static_cast<size_t>(t) * rows + r0) * head_row);
            }
    }
};

}  // namespace

struct conversation_cache::snapshot {
    uint64_t id = 0;
    std::string scope;                            // who may restore it (see find())
    std::vector<int32_t> tokens;
    std::vector<arenas::placed_buffer> segments;  // full segment_bytes each but the last
    uint64_t bytes = 0;                           // mapped
    uint64_t last_use = 0;                        // the cache's use counter
    double last_use_s = 0;
    stream_layout layout{};
    parked_state state;                           // the sequence's state beside the rows, at tokens.size()
    stream_layout mtp_layout{};                   // the MTP cache's rows of positions [0, mtp_layout.n_tokens)
    std::vector<uint8_t> mtp_rows;

    // The newest position at or before n this snapshot can be restored at.
    size_t usable(size_t n) const { return state.usable(n); }

    // Copies n bytes between the stream at `offset` and `p`, across segment boundaries.
    template <bool ToStream>
    void copy(size_t offset, std::conditional_t<ToStream, const uint8_t*, uint8_t*> p, size_t n) const {
        while (n > 0) {
            const size_t seg = offset / segment_bytes, at = offset % segment_bytes;
            const size_t part = std::min(n, segment_bytes - at);
            std::byte* s = segments[seg].data() + at;
            if constexpr (ToStream) std::memcpy(s, p, part);
            else std::memcpy(p, s, part);
            offset += part;
            p += part;
            n -= part;
        }
    }
};

conversation_cache::conversation_cache(uint64_t budget_bytes, const arenas::hot_node& hot, memory_budget* shared)
    : budget_(budget_bytes), hot_(hot), shared_(shared) {
    counters_.enabled = enabled();
    counters_.budget_bytes = budget_;
}

conversation_cache::~conversation_cache() = default;

void conversation_cache::touch(snapshot& s) {
    s.last_use = ++clock_;
    s.last_use_s = unix_seconds();
}

std::optional<conversation_cache::match> conversation_cache::find(std::span<const int32_t> prompt, size_t limit,
                                                                  size_t better_than, std::string_view scope) {
    std::lock_guard lock(mutex_);
    if (!enabled()) return std::nullopt;
    std::optional<match> best;
    uint64_t best_use = 0;
    for (const snapshot& s : snapshots_) {
        if (s.scope != scope) continue;
        const size_t common = static_cast<size_t>(
            std::mismatch(s.tokens.begin(), s.tokens.end(), prompt.begin(), prompt.end()).first - s.tokens.begin());
        const size_t n = s.usable(std::min(common, limit));
        if (n <= better_than) continue;
        if (!best || n > best->n_tokens || (n == best->n_tokens && s.last_use > best_use)) {
            best = match{s.id, n};
            best_use = s.last_use;
        }
    }
    ++(best ? counters_.hits : counters_.misses);
    return best;
}

size_t conversation_cache::restore(uint64_t id, size_t from, size_t to, kv_cache& kv, kv_cache* mtp, size_t mtp_from) {
    std::lock_guard lock(mutex_);
    const auto it = std::find_if(snapshots_.begin(), snapshots_.end(), [&](const snapshot& s) { return s.id == id; });
    if (it == snapshots_.end() || to > it->tokens.size() || static_cast<int>(to) > kv.capacity())
        throw std::logic_error(fmt::format("conversation cache: snapshot {} cannot give positions {}..{}", id, from, to));
    const snapshot& s = *it;
    std::vector<uint8_t> rows(kv_cache::chunk_tokens * s.layout.head_row);
    s.layout.for_each_piece(from, to, [&](int l, int c, int t, size_t r0, size_t r1, size_t offset) {
        s.copy<false>(offset, rows.data(), (r1 - r0) * s.layout.head_row);
        kv.write_rows(l, c, t, static_cast<int>(r0), static_cast<int>(r1), rows.data());
    });
    try {
        kv.restore_state(s.state, static_cast<int>(to));
    } catch (const std::logic_error& e) {
        throw std::logic_error(fmt::format("conversation cache: snapshot {}: {}", id, e.what()));
    }
    size_t mtp_n = mtp_from;
    const size_t mtp_to = std::min(to, s.mtp_layout.n_tokens);
    if (mtp && mtp_to > mtp_from && static_cast<int>(mtp_to) <= mtp->capacity()) {
        s.mtp_layout.for_each_piece(mtp_from, mtp_to, [&](int l, int c, int t, size_t r0, size_t r1, size_t offset) {
            mtp->write_rows(l, c, t, static_cast<int>(r0), static_cast<int>(r1), s.mtp_rows.data() + offset);
        });
        mtp_n = mtp_to;
    }
    touch(*it);
    counters_.tokens_restored += to - from;
    return mtp_n;
}

uint64_t conversation_cache::park(std::span<const int32_t> tokens, const kv_cache& kv, std::string_view scope,
                                  const kv_cache* mtp, size_t mtp_n) {
    std::lock_guard lock(mutex_);
    if (!enabled() || tokens.empty()) return 0;
    return park_locked(tokens, kv, scope, mtp, mtp_n);
}

uint64_t conversation_cache::park_locked(std::span<const int32_t> tokens, const kv_cache& kv, std::string_view scope,
                                         const kv_cache* mtp, size_t mtp_n) {
    if (kv.state_pos() >= 0 && static_cast<size_t>(kv.state_pos()) != tokens.size())
        throw std::logic_error(fmt::format("conversation cache: parking {} tokens with a sequence state at {}",
                                           tokens.size(), kv.state_pos()));
    for (snapshot& s : snapshots_)
        if (s.scope == scope && s.tokens.size() >= tokens.size() && std::equal(tokens.begin(), tokens.end(), s.tokens.begin()) &&
            s.usable(tokens.size()) == tokens.size()) {
            touch(s);
            return s.id;
        }
    const stream_layout layout{tokens.size(), kv.n_layer(), kv.n_tiles(), kv.head_row_bytes()};
    const size_t total = layout.total();
    uint64_t need = 0;
    for (size_t at = 0; at < total; at += segment_bytes) need += mapped_bytes(std::min(segment_bytes, total - at));
    parked_state state = kv.park_state(static_cast<int>(tokens.size()));
    need += state.bytes();
    const stream_layout mtp_layout{mtp ? std::min(mtp_n, tokens.size()) : 0, mtp ? mtp->n_layer() : 0,
                                   mtp ? mtp->n_tiles() : 0, mtp ? mtp->head_row_bytes() : 0};
    need += mtp_layout.total();
    if (need > budget_) {
        logger("engine")->info("A conversation of {} tokens was not parked: its snapshot needs {:.1f} MiB, the "
                               "conversation cache's budget is {:.1f} MiB (--cache-ram).",
                               tokens.size(), double(need) / mib, double(budget_) / mib);
        return 0;
    }
    // Superseded: snapshots of the same conversation at an earlier turn.
    std::erase_if(snapshots_, [&](const snapshot& s) {
        if (s.scope != scope) return false;
        const size_t common = static_cast<size_t>(
            std::mismatch(s.tokens.begin(), s.tokens.end(), tokens.begin(), tokens.end()).first - s.tokens.begin());
        const bool extended = common + min_tail_tokens > s.tokens.size();
        if (extended) add_bytes(bytes_, bytes_ - s.bytes);
        return extended;
    });
    evict_for(need);
    if (shared_) {
        while (!snapshots_.empty() && !shared_->fits(need)) {
            evict_lru(0, "to make room in the memory budget");
            shared_->count_eviction();
        }
        if (!shared_->fits(need)) {
            logger("engine")->info("A conversation of {} tokens was not parked: its snapshot needs {:.1f} MiB, and {}.",
                                   tokens.size(), double(need) / mib, shared_->describe());
            return 0;
        }
    }
    snapshot s;
    s.id = next_id_;
    s.scope = scope;
    s.tokens.assign(tokens.begin(), tokens.end());
    s.layout = layout;
    s.state = std::move(state);
    try {
        for (size_t at = 0; at < total; at += segment_bytes)
            s.segments.push_back(hot_.allocate_cold(std::min(segment_bytes, total - at),
                                                    fmt::format("conversation snapshot {} segment {}", s.id,
                                                                s.segments.size())));
    } catch (const std::bad_alloc&) {
        logger("engine")->warn("A conversation of {} tokens was not parked: out of memory mapping {:.1f} MiB of "
                               "snapshot segments.", tokens.size(), double(need) / mib);
        return 0;
    }
    ++next_id_;
    std::vector<uint8_t> rows(kv_cache::chunk_tokens * layout.head_row);
    layout.for_each_piece(0, tokens.size(), [&](int l, int c, int t, size_t r0, size_t r1, size_t offset) {
        kv.read_rows(l, c, t, static_cast<int>(r0), static_cast<int>(r1), rows.data());
        s.copy<true>(offset, rows.data(), (r1 - r0) * layout.head_row);
    });
    s.mtp_layout = mtp_layout;
    s.mtp_rows.resize(mtp_layout.total());
    mtp_layout.for_each_piece(0, mtp_layout.n_tokens, [&](int l, int c, int t, size_t r0, size_t r1, size_t offset) {
        mtp->read_rows(l, c, t, static_cast<int>(r0), static_cast<int>(r1), s.mtp_rows.data() + offset);
    });
    s.bytes = need;
    touch(s);
    add_bytes(bytes_, bytes_ + need);
    ++counters_.parked;
    const int node = hot_.active() ? hot_.cold_node() : -1;
    logger("engine")->info("Parked conversation snapshot {}: {} tokens, {:.1f} MiB in {} segment{} ({}){}; the cache "
                           "holds {} snapshots, {:.1f} of {:.1f} MiB.",
                           s.id, tokens.size(), double(need) / mib, s.segments.size(), s.segments.size() == 1 ? "" : "s",
                           node >= 0 ? fmt::format("node {}", node) : std::string("anonymous memory"),
                           s.state.n_states() == 0
                               ? std::string()
                               : fmt::format(", with {} recurrent states of {:.1f} MiB", s.state.n_states(),
                                             double(s.state.state_bytes()) / mib),
                           snapshots_.size() + 1, double(bytes_) / mib, double(budget_) / mib);
    snapshots_.push_back(std::move(s));
    return snapshots_.back().id;
}

void conversation_cache::evict_for(uint64_t bytes) {
    while (!snapshots_.empty() && bytes_ + bytes > budget_)
        evict_lru(0, fmt::format("to stay within the {:.1f} MiB budget (--cache-ram)", double(budget_) / mib).c_str());
}

void conversation_cache::evict_lru(uint64_t keep, const char* why) {
    auto lru = snapshots_.end();
    for (auto it = snapshots_.begin(); it != snapshots_.end(); ++it)
        if (it->id != keep && (lru == snapshots_.end() || it->last_use < lru->last_use)) lru = it;
    if (lru == snapshots_.end()) return;
    logger("engine")->info("Evicted conversation snapshot {} ({} tokens, {:.1f} MiB), the least recently used, {}.",
                           lru->id, lru->tokens.size(), double(lru->bytes) / mib, why);
    add_bytes(bytes_, bytes_ - lru->bytes);
    snapshots_.erase(lru);
    ++counters_.evictions;
}

bool conversation_cache::make_room(uint64_t more, uint64_t keep) {
    std::lock_guard lock(mutex_);
    if (!shared_) return true;
    while (!shared_->fits(more)) {
        const size_t before = snapshots_.size();
        evict_lru(keep, "to make room in the memory budget");
        if (snapshots_.size() == before) return false;
        shared_->count_eviction();
    }
    return true;
}

void conversation_cache::add_bytes(uint64_t before, uint64_t after) {
    bytes_ = after;
    if (shared_) shared_->change(memory_budget::use::snapshots, before, after);
}

conversation_cache_stats conversation_cache::stats() const {
    std::lock_guard lock(mutex_);
    conversation_cache_stats st = counters_;
    st.bytes = bytes_;
    st.node = hot_.active() ? hot_.cold_node() : -1;
    std::vector<const snapshot*> by_use;
    for (const snapshot& s : snapshots_) by_use.push_back(&s);
    std::sort(by_use.begin(), by_use.end(), [](const snapshot* a, const snapshot* b) { return a->last_use > b->last_use; });
    size_t on_node = 0, present = 0;
    for (const snapshot* sp : by_use) {
        const snapshot& s = *sp;
        st.segments += s.segments.size();
        st.state_checkpoints += s.state.n_states();
        st.state_bytes += s.state.n_states() * s.state.state_bytes();
        st.entries.push_back({s.id, static_cast<int>(s.tokens.size()), s.bytes, s.last_use_s});
        if (st.node < 0) continue;
        for (const auto& seg : s.segments) {
            const arenas::page_placement p = arenas::sample_page_placement(seg.data(), seg.size(), 64);
            present += p.present();
            on_node += static_cast<size_t>(p.share_on(st.node) * double(p.present()) + 0.5);
        }
    }
    st.node_share = present ? double(on_node) / double(present) : 0.0;
    return st;
}

uint64_t conversation_cache_budget(int cache_ram_mib) {
    if (cache_ram_mib >= 0) return static_cast<uint64_t>(cache_ram_mib) * mib;
    const uint64_t cap = uint64_t{8} << 30, room = committable_memory();
    return std::min(cap, room / 4);
}

}  // namespace strata::engine
