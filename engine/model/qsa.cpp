#include "model/qsa.hpp"

#include <algorithm>
#include <cmath>
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
    if (!p->stores.empty()) stores = p->stores;
}

size_t indexer_keys::parked_bytes() const {
    size_t n = 0;
    for (const std::vector<float>& k : stores) n += k.size() * sizeof(float);
    return n;
}

namespace {

constexpr int64_t kScoreGrain = 256;   // indexer blocks per work item of the block scoring
constexpr int64_t kGatherGrain = 64;   // chosen positions per work item of the sparse attention
constexpr int64_t kValueGrain = 16;    // value elements per work item of the weighted sum
constexpr int kMaxHeadDim = 1024;      // a value row's scratch on the stack

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
    if (f.hp_.head_dim > kMaxHeadDim)
        throw std::invalid_argument("QSA attention takes heads of at most " + std::to_string(kMaxHeadDim) +
                                    " values, this model's are " + std::to_string(f.hp_.head_dim));
}

void sparse_attention_mixer::eval(int il, std::span<const step_segment> segs, int n_tok) {
    const step_segment& g = segs[0];
    const int r = f_.hp_.qsa_ratio[static_cast<size_t>(il)];
    // A lone query that leaves blocks out needs no dense pass: its cost is the budget's.
    const bool sparse_only = n_tok == 1 && (g.pos0 + 1) / r > f_.hp_.idx_top_k / r;
    dense_.run(f_.w_.layers[static_cast<size_t>(il)], f_.hp_.kv_layer(il), segs, n_tok, !sparse_only);
    select(il, n_tok, g.pos0, *g.kv);
}

std::vector<float>& sparse_attention_mixer::store(kv_cache& kv, int il, bool blocks) const {
    auto& stores = kv.state<indexer_keys>().stores;
    const size_t slot = static_cast<size_t>(slot_[static_cast<size_t>(il)]);
    if (stores.size() < 2 * slot + 2) stores.resize(2 * slot + 2);
    return stores[2 * slot + (blocks ? 1 : 0)];
}

void sparse_attention_mixer::complete_blocks(int il, const std::vector<float>& keys, std::vector<float>& bk,
                                             int n_blocks) const {
    const hparams& hp = f_.hp_;
    const layer_weights& l = f_.w_.layers[static_cast<size_t>(il)];
    const int r = hp.qsa_ratio[static_cast<size_t>(il)], d = hp.idx_head_dim;
    std::vector<float> cs(static_cast<size_t>(hp.n_rot));
    for (int b = static_cast<int>(bk.size() / static_cast<size_t>(d)); b < n_blocks; ++b) {
        bk.resize(static_cast<size_t>(b + 1) * d, 0.0f);
        float* k = bk.data() + static_cast<size_t>(b) * d;
        for (int j = 0; j < r; ++j)
            for (int i = 0; i < d; ++i) k[i] += keys[static_cast<size_t>(b * r + j) * d + i];
        for (int i = 0; i < d; ++i) k[i] /= static_cast<float>(r);
        cpu::rms_norm(k, l.idx_k_norm, hp.rms_eps, d, k);
        cpu::rope_angles(hp.n_rot, static_cast<int64_t>(b) * r, hp.rope, cs.data());
        cpu::rope_apply(k, 1, d, hp.n_rot, cs.data(), hp.arch.rope);
    }
}

void sparse_attention_mixer::fill_keys(kv_cache& kv, int il, std::vector<float> raw_keys, int n_pos) {
    std::vector<float>& keys = store(kv, il, false);
    std::vector<float>& bk = store(kv, il, true);
    keys = std::move(raw_keys);
    keys.resize(static_cast<size_t>(n_pos) * f_.hp_.idx_head_dim);
    bk.clear();
    complete_blocks(il, keys, bk, n_pos / f_.hp_.qsa_ratio[static_cast<size_t>(il)]);
}

void sparse_attention_mixer::score_blocks(const float* q, const float* bk, int n_blocks, float* scores) {
    const int d = f_.hp_.idx_head_dim, n_h = f_.hp_.idx_n_head;
    const size_t row_bytes = sizeof(float) * static_cast<size_t>(d);
    // The block keys as an f32 matrix and the heads' queries as its activation rows: every dot on the
    // kernels' f32 path, the blocks split over the pool.
    const cpu::matrix keys{formats::ggml_type::F32, bk, d, row_bytes};
    dots_.resize(static_cast<size_t>(n_h) * static_cast<size_t>(n_blocks));
    const float inv_sqrt_d = 1.0f / std::sqrt(static_cast<float>(d));
    float* const dots = dots_.data();
    parallel_rows(f_.pool_, n_blocks, kScoreGrain, [&](int64_t b0, int64_t b1) {
        cpu::matmul(keys, b0, b1, q, row_bytes, n_h, dots + b0, n_blocks);
        for (int64_t b = b0; b < b1; ++b) {
            float s = 0;
            for (int h = 0; h < n_h; ++h) s += std::max(dots[static_cast<size_t>(h) * n_blocks + b], 0.0f);
            scores[b] = s * inv_sqrt_d;
        }
    });
    f_.add_bytes(phase_clock::indexer, static_cast<uint64_t>(n_blocks) * row_bytes);
}

void sparse_attention_mixer::select(int il, int n_tok, int pos0, kv_cache& kv) {
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
        f.matmul(l.idx_k, n_tok, f.xn_.data(), idx_k_.data());
        std::copy(idx_k_.begin(), idx_k_.end(), keys.begin() + static_cast<std::ptrdiff_t>(pos0) * d);
        bk.resize(std::min(bk.size(), static_cast<size_t>(pos0 / r) * d));
        complete_blocks(il, keys, bk, n_blocks);
    }
    // Queries whose complete blocks all fit the budget attend densely: attention() has done them.
    if (n_blocks <= budget) return;

    {
        arenas::scoped_seconds t(f.seconds(phase_clock::indexer));
        idx_q_.resize(static_cast<size_t>(n_tok) * n_h * d);
        f.matmul(l.idx_q, n_tok, f.xn_.data(), idx_q_.data());
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
            cpu::rope_apply(q, n_h, d, hp.n_rot, f.rope_cs_.data() + static_cast<size_t>(t) * hp.n_rot, hp.arch.rope);
            scores.resize(static_cast<size_t>(nb));
            score_blocks(q, bk.data(), nb, scores.data());
            for (int b : qsa_pick_blocks(scores.data(), nb, budget))
                for (int j = 0; j < r; ++j) positions.push_back(b * r + j);
            for (int j = nb * r; j <= pos; ++j) positions.push_back(j);
        }
        arenas::scoped_seconds timer(f.seconds(phase_clock::attention));
        if (n_tok == 1)  // a lone query's attention reads the chosen rows only (a prompt's is counted dense)
            f.add_bytes(phase_clock::attention, kv_cache::bytes_per_token(1, hp.n_head_kv, hp.head_dim, kv.type()) *
                                                    static_cast<uint64_t>(positions.size()));
        attend(il, t, positions, kv);
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
    values_t_.resize(static_cast<size_t>(n_kv * np) * hd);
    probs_.resize(static_cast<size_t>(hp.n_head * np));
    raw_.resize(static_cast<size_t>(2 * n_kv * np) * row_bytes);
    // Item (g, j): kv head g's key of the j-th chosen position as an f32 row, its value into column j of
    // values_t_ [g][head_dim][np] (the values as rows over the positions, for the weighted sum); then
    // the item range's scores for kv head g's query heads: probs_ [n_head][np].
    const float* q = f.q_.data() + static_cast<size_t>(t) * n_q;
    parallel_rows(f.pool_, n_kv * np, kGatherGrain, [&](int64_t i0, int64_t i1) {
        float value[kMaxHeadDim];
        for (int64_t i = i0; i < i1; ++i) {
            const int g = static_cast<int>(i / np);
            const int64_t j = i % np;
            const int pos = positions[static_cast<size_t>(j)];
            const int chunk = pos / kv_cache::chunk_tokens, r = pos % kv_cache::chunk_tokens;
            uint8_t* raw = raw_.data() + static_cast<size_t>(2 * i) * row_bytes;
            kv.read_rows(kvl, chunk, g, r, r + 1, raw);
            formats::dequantize_row(row_type, raw, keys_.data() + static_cast<size_t>(i) * hd, hd);
            kv.read_rows(kvl, chunk, n_kv + g, r, r + 1, raw + row_bytes);
            formats::dequantize_row(row_type, raw + row_bytes, value, hd);
            float* vt = values_t_.data() + static_cast<size_t>(g) * hd * np + j;
            for (int e = 0; e < hd; ++e) vt[static_cast<size_t>(e) * np] = value[e];
        }
        while (i0 < i1) {  // a range may hold the end of one kv head's positions and the start of the next's
            const int g = static_cast<int>(i0 / np);
            const int64_t end = std::min<int64_t>(i1, int64_t{g + 1} * np), j0 = i0 - int64_t{g} * np;
            const cpu::matrix keys{formats::ggml_type::F32, keys_.data() + static_cast<size_t>(g) * np * hd, hd, f32_row};
            cpu::matmul(keys, j0, end - int64_t{g} * np, q + static_cast<size_t>(g) * group * hd, f32_row, group,
                        probs_.data() + static_cast<size_t>(g) * group * np + j0, np);
            i0 = end;
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
    const size_t prob_row = sizeof(float) * static_cast<size_t>(np);
    parallel_rows(f.pool_, int64_t{n_kv} * hd, kValueGrain, [&](int64_t i0, int64_t i1) {
        while (i0 < i1) {
            const int g = static_cast<int>(i0 / hd);
            const int64_t end = std::min<int64_t>(i1, int64_t{g + 1} * hd), e0 = i0 - int64_t{g} * hd;
            const cpu::matrix values{formats::ggml_type::F32, values_t_.data() + static_cast<size_t>(g) * hd * np, np,
                                     prob_row};
            float* o = out + static_cast<size_t>(g) * group * hd;
            cpu::matmul(values, e0, end - int64_t{g} * hd, probs_.data() + static_cast<size_t>(g) * group * np,
                        prob_row, group, o + e0, hd);
            for (int k = 0; k < group; ++k)
                for (int64_t e = e0; e < end - int64_t{g} * hd; ++e) {
                    const size_t at = static_cast<size_t>(k) * hd + static_cast<size_t>(e);
                    o[at] /= 1.0f + std::exp(-gate[static_cast<size_t>(g) * group * hd + at]);
                }
            i0 = end;
        }
    });
}

}  // namespace strata::engine
