#include "model/qsa.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <stdexcept>
#include <string>

#include <spdlog/fmt/fmt.h>

#include "formats/quant.hpp"
#include "model/forward.hpp"
#include "model/parallel.hpp"

namespace strata::engine {

namespace cpu = kernels::cpu;

void indexer_keys::restore(const state_part& parked, int to) {
    (void)to;  // the stores hold every parked position; those past `to` are rewritten before they are read
    const auto* p = dynamic_cast<const indexer_keys*>(&parked);
    if (!p) throw std::logic_error(fmt::format("QSA indexer keys restored from a parked {}", parked.kind()));
    if (!p->stores.empty()) {
        stores = p->stores;
        blocks = p->blocks;
    }
}

size_t indexer_keys::parked_bytes() const {
    size_t n = 0;
    for (const std::vector<float>& k : stores) n += k.size() * sizeof(float);
    return n;
}

namespace {

constexpr int64_t kScoreGrain = 16;    // indexer block groups (of qsa_group) per work item of the block scoring
constexpr int64_t kGatherGrain = 16;   // runs of chosen positions per work item of the sparse attention
constexpr int64_t kValueGrain = 32;    // value elements per work item of the weighted sum

}  // namespace

std::vector<int> qsa_pick_blocks(const float* scores, int n_blocks, int k) {
    std::vector<int> order(static_cast<size_t>(n_blocks));
    std::iota(order.begin(), order.end(), 0);
    if (n_blocks > k) {
        std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int a, int b) {
            return scores[a] > scores[b] || (scores[a] == scores[b] && a < b);
        });
        order.resize(static_cast<size_t>(k));
        std::sort(order.begin(), order.end());
    }
    return order;
}

namespace {

// Its part of the state: the indexer's key stores, which grow with the positions.
class sparse_attention_kind final : public mixer_kind {
public:
    const char* name() const override { return "sparse attention"; }
    kv_rows rows(const hparams& hp) const override { return attention_mixer::layer_kind().rows(hp); }
    std::unique_ptr<state_part> make_state(const hparams& hp) const override {
        (void)hp;
        return std::make_unique<indexer_keys>();
    }
};

}  // namespace

const mixer_kind& sparse_attention_mixer::layer_kind() {
    static const sparse_attention_kind k;
    return k;
}

sparse_attention_mixer::sparse_attention_mixer(forward_pass& f, attention_mixer& dense) : token_mixer(f), dense_(dense) {
    for (int il = 0, r = 0; il < f.hp_.n_layer; ++il)
        slot_.push_back(f.hp_.qsa_ratio[static_cast<size_t>(il)] > 0 ? r++ : -1);
}

void sparse_attention_mixer::eval(int il, std::span<const step_segment> segs, int n_tok) {
    const int r = f_.hp_.qsa_ratio[static_cast<size_t>(il)];
    // A lone query that leaves blocks out needs no dense pass: its cost is the budget's.
    dense_of_.clear();
    for (const step_segment& g : segs) dense_of_.push_back(g.n_tok != 1 || (g.pos0 + 1) / r <= f_.hp_.idx_top_k / r);
    dense_.run(f_.w_.layers[static_cast<size_t>(il)], f_.hp_.kv_layer(il), segs, n_tok, dense_of_);
    for (int row0 = 0; const step_segment& g : segs) {
        select(il, row0, g.n_tok, g.pos0, *g.kv);
        row0 += g.n_tok;
    }
}

std::vector<float>& sparse_attention_mixer::store(kv_cache& kv, int il, bool blocks) const {
    auto& stores = kv.state<indexer_keys>().stores;
    const size_t slot = static_cast<size_t>(slot_[static_cast<size_t>(il)]);
    if (stores.size() < 2 * slot + 2) stores.resize(2 * slot + 2);
    return stores[2 * slot + (blocks ? 1 : 0)];
}

int& sparse_attention_mixer::block_count(kv_cache& kv, int il) const {
    auto& blocks = kv.state<indexer_keys>().blocks;
    const size_t slot = static_cast<size_t>(slot_[static_cast<size_t>(il)]);
    if (blocks.size() < slot + 1) blocks.resize(slot + 1, 0);
    return blocks[slot];
}

void sparse_attention_mixer::complete_blocks(int il, const std::vector<float>& keys, std::vector<float>& bk,
                                             int from, int n_blocks) const {
    const hparams& hp = f_.hp_;
    const layer_weights& l = f_.w_.layers[static_cast<size_t>(il)];
    const int r = hp.qsa_ratio[static_cast<size_t>(il)], d = hp.idx_head_dim;
    constexpr int G = cpu::qsa_group;
    const size_t need = static_cast<size_t>((n_blocks + G - 1) / G) * G * d;
    if (bk.size() < need) bk.resize(need, 0.0f);
    std::vector<float> cs(static_cast<size_t>(hp.n_rot)), k(static_cast<size_t>(d));
    for (int b = from; b < n_blocks; ++b) {
        std::fill(k.begin(), k.end(), 0.0f);
        for (int j = 0; j < r; ++j)
            for (int i = 0; i < d; ++i) k[static_cast<size_t>(i)] += keys[static_cast<size_t>(b * r + j) * d + i];
        for (int i = 0; i < d; ++i) k[static_cast<size_t>(i)] /= static_cast<float>(r);
        cpu::rms_norm(k.data(), l.idx_k_norm, hp.rms_eps, d, k.data());
        cpu::rope_angles(hp.n_rot, static_cast<int64_t>(b) * r, hp.rope, cs.data());
        cpu::rope_apply(k.data(), 1, d, hp.n_rot, cs.data(), hp.arch.rope);
        float* group = bk.data() + static_cast<size_t>(b / G) * G * d + b % G;
        for (int i = 0; i < d; ++i) group[static_cast<size_t>(i) * G] = k[static_cast<size_t>(i)];
    }
}

void sparse_attention_mixer::fill_keys(kv_cache& kv, int il, std::vector<float> raw_keys, int n_pos) {
    std::vector<float>& keys = store(kv, il, false);
    std::vector<float>& bk = store(kv, il, true);
    keys = std::move(raw_keys);
    keys.resize(static_cast<size_t>(n_pos) * f_.hp_.idx_head_dim);
    bk.clear();
    const int n_blocks = n_pos / f_.hp_.qsa_ratio[static_cast<size_t>(il)];
    complete_blocks(il, keys, bk, 0, n_blocks);
    block_count(kv, il) = n_blocks;
}

void sparse_attention_mixer::score_blocks(const float* q, const float* bk, int n_blocks, float* scores) {
    const int d = f_.hp_.idx_head_dim, n_h = f_.hp_.idx_n_head;
    const int64_t n_groups = (n_blocks + cpu::qsa_group - 1) / cpu::qsa_group;
    const float inv_sqrt_d = 1.0f / std::sqrt(static_cast<float>(d));
    const size_t group_floats = static_cast<size_t>(cpu::qsa_group) * d;
    // Each block's score is one kernel lane's, whatever the split: the groups over the pool.
    parallel_rows(f_.pool_, n_groups, kScoreGrain, [&](int64_t g0, int64_t g1) {
        cpu::qsa_scores(q, n_h, d, bk + static_cast<size_t>(g0) * group_floats, g1 - g0, inv_sqrt_d,
                        scores + g0 * cpu::qsa_group);
    });
    f_.add_bytes(phase_clock::indexer, static_cast<uint64_t>(n_groups) * group_floats * sizeof(float));
}

void sparse_attention_mixer::select(int il, int row0, int n_tok, int pos0, kv_cache& kv) {
    forward_pass& f = f_;
    const hparams& hp = f.hp_;
    const layer_weights& l = f.w_.layers[static_cast<size_t>(il)];
    const int r = hp.qsa_ratio[static_cast<size_t>(il)], d = hp.idx_head_dim, n_h = hp.idx_n_head;
    const int budget = hp.idx_top_k / r;
    // Per QSA layer two stores: the raw key of every position, and the key of every complete block
    // (pooled, normed, rotated), kept as blocks complete and cut back with the positions.
    std::vector<float>& keys = store(kv, il, false);
    std::vector<float>& bk = store(kv, il, true);
    const int last = pos0 + n_tok - 1, n_blocks = (last + 1) / r;
    {
        arenas::scoped_seconds t(f.seconds(phase_clock::indexer));
        const size_t need = static_cast<size_t>(pos0 + n_tok) * d;
        if (keys.size() < need) keys.resize(need);
        idx_k_.resize(static_cast<size_t>(n_tok) * d);
        f.add_bytes(phase_clock::indexer, l.idx_k.bytes());
        f.matmul(l.idx_k, n_tok, f.xn_.data() + static_cast<size_t>(row0) * hp.n_embd, idx_k_.data());
        std::copy(idx_k_.begin(), idx_k_.end(), keys.begin() + static_cast<std::ptrdiff_t>(pos0) * d);
        int& done = block_count(kv, il);
        done = std::min(done, pos0 / r);
        complete_blocks(il, keys, bk, done, n_blocks);
        done = n_blocks;
    }
    // Queries whose complete blocks all fit the budget attend densely: attention() has done them.
    if (n_blocks <= budget) return;

    {
        arenas::scoped_seconds t(f.seconds(phase_clock::indexer));
        idx_q_.resize(static_cast<size_t>(n_tok) * n_h * d);
        f.add_bytes(phase_clock::indexer, l.idx_q.bytes());
        f.matmul(l.idx_q, n_tok, f.xn_.data() + static_cast<size_t>(row0) * hp.n_embd, idx_q_.data());
    }
    std::vector<float> scores;
    for (int t = 0; t < n_tok; ++t) {
        const int pos = pos0 + t, nb = (pos + 1) / r;
        if (nb <= budget) continue;
        std::vector<int> positions;
        {
            arenas::scoped_seconds timer(f.seconds(phase_clock::indexer));
            float* q = idx_q_.data() + static_cast<size_t>(t) * n_h * d;
            for (int h = 0; h < n_h; ++h) cpu::rms_norm(q + h * d, l.idx_q_norm, hp.rms_eps, d, q + h * d);
            cpu::rope_apply(q, n_h, d, hp.n_rot, f.rope_cs_.data() + static_cast<size_t>(row0 + t) * hp.n_rot, hp.arch.rope);
            scores.resize(static_cast<size_t>((nb + cpu::qsa_group - 1) / cpu::qsa_group) * cpu::qsa_group);
            score_blocks(q, bk.data(), nb, scores.data());
            for (int b : qsa_pick_blocks(scores.data(), nb, budget))
                for (int j = 0; j < r; ++j) positions.push_back(b * r + j);
            for (int j = nb * r; j <= pos; ++j) positions.push_back(j);
        }
        arenas::scoped_seconds timer(f.seconds(phase_clock::attention));
        if (n_tok == 1)  // a lone query's attention reads the chosen rows only (a prompt's is counted dense)
            f.add_bytes(phase_clock::attention, kv_cache::bytes_per_token(1, hp.n_head_kv, hp.head_dim, kv.type()) *
                                                    static_cast<uint64_t>(positions.size()));
        attend(il, row0 + t, positions, kv);
    }
}

void sparse_attention_mixer::attend(int il, int t, std::span<const int> positions, const kv_cache& kv) {
    forward_pass& f = f_;
    const hparams& hp = f.hp_;
    const int hd = hp.head_dim, n_q = hp.n_q(), n_kv = hp.n_head_kv, group = hp.n_head / n_kv, kvl = hp.kv_layer(il);
    const int64_t np = static_cast<int64_t>(positions.size());
    const formats::ggml_type row_type = kv.type() == kv_type::f16 ? formats::ggml_type::F16 : formats::ggml_type::Q8_0;
    const size_t row_bytes = kv.head_row_bytes(), f32_row = sizeof(float) * static_cast<size_t>(hd);
    keys_.resize(static_cast<size_t>(n_kv * np) * hd);
    values_.resize(static_cast<size_t>(n_kv * np) * hd);
    probs_.resize(static_cast<size_t>(hp.n_head * np));
    raw_.resize(static_cast<size_t>(2 * n_kv * np) * row_bytes);
    // Runs of consecutive chosen positions within one key block of a tile (a chosen QSA block is one).
    runs_.clear();
    for (int64_t j = 0; j < np; ++j) {
        const int pos = positions[static_cast<size_t>(j)];
        if (!runs_.empty()) {
            gather_run& u = runs_.back();
            if (pos == u.pos + u.n && pos / cpu::attn_key_block == u.pos / cpu::attn_key_block) {
                ++u.n;
                continue;
            }
        }
        runs_.push_back({pos, 1, static_cast<int>(j)});
    }
    const int64_t n_runs = static_cast<int64_t>(runs_.size());
    // Item (g, run): kv head g's keys of the run's positions as f32 rows (the j-th chosen position's at
    // row j of keys_ [g][np][head_dim]) and their values likewise (values_); then those rows' scores for
    // kv head g's query heads: probs_ [n_head][np] (each score one row's dot, whatever the split).
    const float* q = f.q_.data() + static_cast<size_t>(t) * n_q;
    parallel_rows(f.pool_, n_kv * n_runs, kGatherGrain, [&](int64_t i0, int64_t i1) {
        // The lines of run i's keys and values, asked for a run ahead: the runs are scattered over the
        // cache, and each key dimension's halves are a line of their own.
        const auto prefetch = [&](int64_t i) {
            const int g = static_cast<int>(i / n_runs);
            const gather_run& u = runs_[static_cast<size_t>(i % n_runs)];
            const int chunk = u.pos / kv_cache::chunk_tokens, r0 = u.pos % kv_cache::chunk_tokens;
            const cpu::kv_tile tile = kv.tile(kvl, g, chunk, (chunk + 1) * kv_cache::chunk_tokens);
            const auto* k = static_cast<const uint8_t*>(tile.k) + cpu::attn_key_offset(row_type, row_bytes, r0, 0);
            const size_t key_bytes = static_cast<size_t>(cpu::attn_key_block) * row_bytes;
            for (size_t at = 0; at < key_bytes; at += 64) __builtin_prefetch(k + at);
            const auto* v = static_cast<const uint8_t*>(tile.v) + static_cast<size_t>(r0) * row_bytes;
            for (size_t at = 0; at < static_cast<size_t>(u.n) * row_bytes; at += 64) __builtin_prefetch(v + at);
        };
        if (i0 < i1) prefetch(i0);
        for (int64_t i = i0; i < i1; ++i) {
            if (i + 1 < i1) prefetch(i + 1);
            const int g = static_cast<int>(i / n_runs);
            const gather_run& u = runs_[static_cast<size_t>(i % n_runs)];
            const int chunk = u.pos / kv_cache::chunk_tokens, r0 = u.pos % kv_cache::chunk_tokens;
            const int64_t row0 = int64_t{g} * np + u.j;  // the run's first row in keys_ and raw_
            uint8_t* raw = raw_.data() + static_cast<size_t>(2 * row0) * row_bytes;
            float* key = keys_.data() + static_cast<size_t>(row0) * hd;
            const cpu::kv_tile tile = kv.tile(kvl, g, chunk, (chunk + 1) * kv_cache::chunk_tokens);
            if (row_type == formats::ggml_type::F16) {
                // The run's keys out of the tile's blocked layout, one read of each dimension's halves
                // for all of them, converted by the kernels (exactly as dequantize_row converts them).
                const auto* k = static_cast<const uint8_t*>(tile.k);
                auto* halves = reinterpret_cast<uint16_t*>(raw);  // [n][head_dim]
                for (int e = 0; e < hd; ++e) {
                    const uint8_t* h = k + cpu::attn_key_offset(row_type, row_bytes, r0, e);
                    for (int x = 0; x < u.n; ++x) std::memcpy(halves + x * hd + e, h + 2 * x, sizeof(uint16_t));
                }
                cpu::from_fp16(halves, key, int64_t{u.n} * hd);
            } else {
                kv.read_rows(kvl, chunk, g, r0, r0 + u.n, raw);
                for (int x = 0; x < u.n; ++x)
                    formats::dequantize_row(row_type, raw + static_cast<size_t>(x) * row_bytes, key + x * hd, hd);
            }
            // The values are rows in place, converted as rows.
            for (int x = 0; x < u.n; ++x) {
                const uint8_t* v = static_cast<const uint8_t*>(tile.v) + static_cast<size_t>(r0 + x) * row_bytes;
                float* value = values_.data() + static_cast<size_t>(row0 + x) * hd;
                if (row_type == formats::ggml_type::F16)
                    cpu::from_fp16(reinterpret_cast<const uint16_t*>(v), value, hd);
                else
                    formats::dequantize_row(row_type, v, value, hd);
            }
            const cpu::matrix keys{formats::ggml_type::F32, keys_.data() + static_cast<size_t>(g) * np * hd, hd, f32_row};
            cpu::matmul(keys, u.j, u.j + u.n, q + static_cast<size_t>(g) * group * hd, f32_row, group,
                        probs_.data() + static_cast<size_t>(g) * group * np + u.j, np);
        }
    });
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    for (int h = 0; h < hp.n_head; ++h) {
        float* p = probs_.data() + static_cast<size_t>(h) * np;
        for (int64_t j = 0; j < np; ++j) p[j] *= scale;
        cpu::softmax(p, np);
    }
    // Each head's weighted sum of its values, then the output gate as attention() applies it.
    float* out = f.att_.data() + static_cast<size_t>(t) * n_q;
    const float* gate = dense_.gate() + static_cast<size_t>(t) * n_q;
    // Item range [e0, e1) of kv head g: o[k][e] = sum over the chosen positions j in order of p[k][j] v[j][e]
    // for its query heads k (the same sums whatever the split), then gated.
    parallel_rows(f.pool_, int64_t{n_kv} * hd, kValueGrain, [&](int64_t i0, int64_t i1) {
        while (i0 < i1) {
            const int g = static_cast<int>(i0 / hd);
            const int64_t end = std::min<int64_t>(i1, int64_t{g + 1} * hd), e0 = i0 - int64_t{g} * hd,
                          e1 = end - int64_t{g} * hd;
            float* o = out + static_cast<size_t>(g) * group * hd;
            const float* p = probs_.data() + static_cast<size_t>(g) * group * np;
            for (int k = 0; k < group; ++k) std::fill(o + k * hd + e0, o + k * hd + e1, 0.0f);
            for (int64_t j = 0; j < np; ++j) {
                const float* v = values_.data() + static_cast<size_t>(int64_t{g} * np + j) * hd;
                for (int k = 0; k < group; ++k) {
                    const float pj = p[static_cast<size_t>(k) * np + j];
                    float* ok = o + static_cast<size_t>(k) * hd;
                    for (int64_t e = e0; e < e1; ++e) ok[e] += pj * v[e];
                }
            }
            for (int k = 0; k < group; ++k)
                for (int64_t e = e0; e < e1; ++e) {
                    const size_t at = static_cast<size_t>(k) * hd + static_cast<size_t>(e);
                    o[at] /= 1.0f + std::exp(-gate[static_cast<size_t>(g) * group * hd + at]);
                }
            i0 = end;
        }
    });
}

}  // namespace strata::engine
