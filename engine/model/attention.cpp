#include "model/attention.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "model/parallel.hpp"

namespace strata::engine {

namespace cpu = kernels::cpu;

namespace {

constexpr int kQueryTile = 16;     // tokens per prompt work item
constexpr int kDecodeTokens = 8;   // batches up to this many tokens split the cache into chunks instead
constexpr int kBlocksPerThread = 4;  // decode: blocks of consecutive (kv head, chunk) items per pool thread

// The state of `rows` rows laid out as [rows][head_dim] acc, then [rows] max, then [rows] sum.
cpu::attn_state state_at(float* base, int rows, int64_t head_dim) {
    float* acc = base;
    float* max = acc + static_cast<size_t>(rows) * head_dim;
    return {max, max + rows, acc};
}

cpu::attn_state rows_of(const cpu::attn_state& st, int first, int64_t head_dim) {
    return {st.max + first, st.sum + first, st.acc + static_cast<size_t>(first) * head_dim};
}

}  // namespace

attention_runner::attention_runner(arenas::expert_pool& pool, const hparams& hp)
    : pool_(pool),
      hp_(hp),
      group_(hp.n_head / hp.n_head_kv),
      scale_(1.0f / std::sqrt(static_cast<float>(hp.head_dim))) {}

void attention_runner::run(int layer, std::span<const job> jobs) {
    decode_jobs_.clear();
    for (const job& j : jobs) {
        if (j.n_tok <= kDecodeTokens)
            decode_jobs_.push_back(j);
        else
            run_query_tiles(*j.kv, layer, j.q, j.n_tok, j.pos0, j.out);
    }
    if (!decode_jobs_.empty()) run_chunks(layer, decode_jobs_);
}

void attention_runner::run_query_tiles(const kv_cache& kv, int layer, const float* q, int n_tok, int pos0, float* out) {
    const int64_t hd = hp_.head_dim;
    const int n_q = hp_.n_q(), n_head_kv = hp_.n_head_kv;
    const int n_tiles = (n_tok + kQueryTile - 1) / kQueryTile;
    const int max_rows = kQueryTile * group_;
    const int64_t n_items = int64_t{n_tiles} * n_head_kv;
    float* q_rows = grown(q_rows_, static_cast<size_t>(n_items * max_rows * hd));
    float* states = grown(state_, static_cast<size_t>(n_items * max_rows * (hd + 2)));
    int64_t* lasts = grown(last_, static_cast<size_t>(n_items * max_rows));
    parallel_rows(pool_, n_items, 1, [&](int64_t i0, int64_t i1) {
        for (int64_t item = i0; item < i1; ++item) {
            // The last query tiles see the most positions: hand them out first.
            const int tile = n_tiles - 1 - static_cast<int>(item / n_head_kv);
            const int g = static_cast<int>(item % n_head_kv);
            const int t0 = tile * kQueryTile, t1 = std::min(n_tok, t0 + kQueryTile);
            const int rows = (t1 - t0) * group_;
            float* qr = q_rows + item * max_rows * hd;
            int64_t* last = lasts + item * max_rows;
            for (int t = t0; t < t1; ++t) {
                const float* src = q + static_cast<size_t>(t) * n_q + static_cast<size_t>(g) * group_ * hd;
                std::memcpy(qr + static_cast<size_t>(t - t0) * group_ * hd, src, sizeof(float) * group_ * hd);
                std::fill_n(last + (t - t0) * group_, group_, int64_t{pos0} + t);
            }
            const cpu::attn_state st = state_at(states + item * max_rows * (hd + 2), rows, hd);
            cpu::attn_clear(st, hd, rows);
            const int n_pos = pos0 + t1;
            for (int c = 0; c * kv_cache::chunk_tokens < n_pos; ++c)
                cpu::attn_tile(kv.tile(layer, g, c, n_pos), hd, qr, rows, last, scale_, st);
            for (int t = t0; t < t1; ++t)
                cpu::attn_finish(rows_of(st, (t - t0) * group_, hd), hd, group_,
                                 out + static_cast<size_t>(t) * n_q + static_cast<size_t>(g) * group_ * hd, hd);
        }
    });
}

void attention_runner::run_chunks(int layer, std::span<const job> jobs) {
    const int64_t hd = hp_.head_dim;
    const int n_q = hp_.n_q(), n_head_kv = hp_.n_head_kv;
    // Job j's items (g, c) are numbered first_item + g * n_chunks + c; chunk c's state for kv head g is
    // at states + (g * n_chunks + c) * its state floats.
    layout_.resize(jobs.size());
    int64_t n_items = 0;
    size_t q_floats = 0, state_floats = 0, lasts = 0;
    for (size_t j = 0; j < jobs.size(); ++j) {
        const int rows = jobs[j].n_tok * group_;
        const int n_chunks = (jobs[j].pos0 + jobs[j].n_tok + kv_cache::chunk_tokens - 1) / kv_cache::chunk_tokens;
        layout_[j] = {n_items, n_chunks, q_floats, state_floats, lasts};
        n_items += int64_t{n_chunks} * n_head_kv;
        q_floats += static_cast<size_t>(n_head_kv) * rows * hd;
        state_floats += static_cast<size_t>(n_chunks) * n_head_kv * rows * (hd + 2);
        lasts += static_cast<size_t>(rows);
    }
    float* q_rows = grown(q_rows_, q_floats);
    float* states = grown(state_, state_floats);
    int64_t* last = grown(last_, lasts);
    const size_t n_counters = jobs.size() * static_cast<size_t>(n_head_kv);
    if (chunks_left_size_ < n_counters) {
        chunks_left_ = std::make_unique<std::atomic<int>[]>(n_counters);
        chunks_left_size_ = n_counters;
    }
    for (size_t j = 0; j < jobs.size(); ++j) {
        const job& jb = jobs[j];
        const job_layout& lo = layout_[j];
        const int rows = jb.n_tok * group_;
        // Rows of kv head g: (token t, query head g * group + j), contiguous per head.
        for (int g = 0; g < n_head_kv; ++g)
            for (int t = 0; t < jb.n_tok; ++t)
                std::memcpy(q_rows + lo.q_rows + (static_cast<size_t>(g) * rows + static_cast<size_t>(t) * group_) * hd,
                            jb.q + static_cast<size_t>(t) * n_q + static_cast<size_t>(g) * group_ * hd,
                            sizeof(float) * group_ * hd);
        for (int t = 0; t < jb.n_tok; ++t) std::fill_n(last + lo.last + t * group_, group_, int64_t{jb.pos0} + t);
        for (int g = 0; g < n_head_kv; ++g)
            chunks_left_[j * n_head_kv + static_cast<size_t>(g)].store(lo.n_chunks, std::memory_order_relaxed);
    }

    struct where {
        size_t job;
        int g, c;
    };
    const auto locate = [&](int64_t item) {
        size_t j = 0;
        while (j + 1 < jobs.size() && layout_[j + 1].first_item <= item) ++j;
        const int64_t i = item - layout_[j].first_item;
        return where{j, static_cast<int>(i / layout_[j].n_chunks), static_cast<int>(i % layout_[j].n_chunks)};
    };
    const auto tile_of = [&](const where& w) {
        const job& jb = jobs[w.job];
        return jb.kv->tile(layer, w.g, w.c, jb.pos0 + jb.n_tok);
    };
    // The thread that finishes a kv head's last chunk folds its chunks in order into the chunk-0 state
    // and normalises: the same order whoever does it, and no second phase. Blocks of consecutive items,
    // a few per thread: within a block each tile prefetches the next one's keys, so the memory never
    // waits for a block's first tile more than a few times per phase.
    const int threads = std::max(1, pool_.plan().total_threads());
    const int64_t grain = std::max<int64_t>(1, n_items / (kBlocksPerThread * threads));
    parallel_rows(pool_, n_items, grain, [&](int64_t i0, int64_t i1) {
        for (int64_t item = i0; item < i1; ++item) {
            const where w = locate(item);
            const job& jb = jobs[w.job];
            const job_layout& lo = layout_[w.job];
            const int rows = jb.n_tok * group_;
            const size_t sf = static_cast<size_t>(rows) * (hd + 2);
            float* job_states = states + lo.states;
            const cpu::attn_state st = state_at(job_states + (int64_t{w.g} * lo.n_chunks + w.c) * sf, rows, hd);
            cpu::attn_clear(st, hd, rows);
            cpu::kv_tile tile = tile_of(w);
            if (item + 1 < i1) tile.next_k = tile_of(locate(item + 1)).k;
            cpu::attn_tile(tile, hd, q_rows + lo.q_rows + static_cast<size_t>(w.g) * rows * hd, rows, last + lo.last,
                           scale_, st);
            // acq_rel: the last finisher sees every other chunk's state of this head.
            if (chunks_left_[w.job * n_head_kv + static_cast<size_t>(w.g)].fetch_sub(1, std::memory_order_acq_rel) != 1)
                continue;
            const cpu::attn_state acc = state_at(job_states + int64_t{w.g} * lo.n_chunks * sf, rows, hd);
            for (int c2 = 1; c2 < lo.n_chunks; ++c2)
                cpu::attn_merge(hd, rows, acc, state_at(job_states + (int64_t{w.g} * lo.n_chunks + c2) * sf, rows, hd));
            for (int t = 0; t < jb.n_tok; ++t)
                cpu::attn_finish(rows_of(acc, t * group_, hd), hd, group_,
                                 jb.out + static_cast<size_t>(t) * n_q + static_cast<size_t>(w.g) * group_ * hd, hd);
        }
    });
}

}  // namespace strata::engine
