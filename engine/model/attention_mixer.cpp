// The attention token mixer: q, k, v projections (as one pool phase), biases, QK norms, RoPE, the keys
// and values stored in the sequence's KV rows, attention_runner over them, the optional output gate.
#include <cmath>
#include <cstring>

#include "model/forward.hpp"

namespace strata::engine {

namespace {

class attention_kind final : public mixer_kind {
public:
    const char* name() const override { return "attention"; }
    kv_rows rows(const hparams& hp) const override { return {hp.n_head_kv, hp.head_dim, false}; }
};

}  // namespace

const mixer_kind& attention_mixer::layer_kind() {
    static const attention_kind k;
    return k;
}

namespace cpu = kernels::cpu;

namespace {

float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

}  // namespace

void attention_mixer::eval(int il, std::span<const step_segment> segs, int n_tok) {
    run(f_.w_.layers[static_cast<size_t>(il)], f_.hp_.kv_layer(il), segs, n_tok);
}

void attention_mixer::run(const layer_weights& l, int kvl, std::span<const step_segment> segs, int n_tok,
                          std::span<const uint8_t> dense_of) {
    forward_pass& f = f_;
    const hparams& hp = f.hp_;
    const int hd = hp.head_dim, n_q = hp.n_q(), n_kv = hp.n_kv();
    const bool gated = hp.attn_gate();
    if (gated) {
        qg_.resize(static_cast<size_t>(n_tok) * 2 * n_q);
        gate_.resize(static_cast<size_t>(n_tok) * n_q);
    }
    {
        arenas::scoped_seconds t(f.seconds(phase_clock::attn_proj));
        const weight_matrix* const w[] = {&l.wq, &l.wk, &l.wv};
        float* const y[] = {gated ? qg_.data() : f.q_.data(), f.k_.data(), f.v_.data()};
        f.matmul_same_input(w, n_tok, f.xn_.data(), y);
    }
    if (gated)  // per head [query | gate] -> q_, gate_
        for (size_t t = 0; t < static_cast<size_t>(n_tok); ++t)
            for (int h = 0; h < hp.n_head; ++h) {
                const float* src = qg_.data() + (t * hp.n_head + h) * 2 * hd;
                std::memcpy(f.q_.data() + t * n_q + static_cast<size_t>(h) * hd, src, sizeof(float) * hd);
                std::memcpy(gate_.data() + t * n_q + static_cast<size_t>(h) * hd, src + hd, sizeof(float) * hd);
            }
    arenas::scoped_seconds t(f.seconds(phase_clock::attention));
    jobs_.clear();
    for (int row0 = 0, i = 0; const step_segment& g : segs) {
        kv_cache& kv = *g.kv;
        const bool dense = dense_of.empty() || dense_of[static_cast<size_t>(i++)] != 0;
        if (dense)  // else the caller counts what it reads
            f.add_bytes(phase_clock::attention, kv_cache::bytes_per_token(1, hp.n_head_kv, hd, kv.type()) *
                                                    static_cast<uint64_t>(g.pos0 + g.n_tok));
        // Each row writes only its own position of the cache.
        f.each_row(g.n_tok, [&](int64_t i0, int64_t i1) {
            for (int t = row0 + static_cast<int>(i0); t < row0 + static_cast<int>(i1); ++t) {
                float* q = f.q_.data() + static_cast<size_t>(t) * n_q;
                float* k = f.k_.data() + static_cast<size_t>(t) * n_kv;
                float* v = f.v_.data() + static_cast<size_t>(t) * n_kv;
                if (l.bq)
                    for (int i = 0; i < n_q; ++i) q[i] += l.bq[i];
                if (l.bk)
                    for (int i = 0; i < n_kv; ++i) k[i] += l.bk[i];
                if (l.bv)
                    for (int i = 0; i < n_kv; ++i) v[i] += l.bv[i];
                if (l.q_norm) {
                    for (int h = 0; h < hp.n_head; ++h) cpu::rms_norm(q + h * hd, l.q_norm, hp.rms_eps, hd, q + h * hd);
                    for (int h = 0; h < hp.n_head_kv; ++h) cpu::rms_norm(k + h * hd, l.k_norm, hp.rms_eps, hd, k + h * hd);
                }
                const float* cs = f.rope_cs_.data() + static_cast<size_t>(t) * hp.n_rot;
                cpu::rope_apply(q, hp.n_head, hd, hp.n_rot, cs, hp.arch.rope);
                cpu::rope_apply(k, hp.n_head_kv, hd, hp.n_rot, cs, hp.arch.rope);
                kv.store(kvl, g.pos0 + t - row0, k, v);
            }
        });
        if (dense)
            jobs_.push_back({&kv, f.q_.data() + static_cast<size_t>(row0) * n_q, g.n_tok, g.pos0,
                             f.att_.data() + static_cast<size_t>(row0) * n_q});
        row0 += g.n_tok;
    }
    f.attn_.run(kvl, jobs_);
    if (gated)
        for (size_t i = 0; i < static_cast<size_t>(n_tok) * n_q; ++i) f.att_[i] *= sigmoid(gate_[i]);
}

}  // namespace strata::engine
