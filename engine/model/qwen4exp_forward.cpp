// qwen4exp's layer kinds (transformers' modeling_qwen4_exp.py, llama.cpp's src/models/qwen4exp.cpp),
// run by forward_pass's layer loop: the hc residual (hc_residual: before each token mixer and MoE a
// hyper-connection mixer makes the block input from the streams, and the block output goes back into
// every stream with the mixer's inject weights) and the PLE block, the add-on of one DeltaNet layer
// (hashed n-gram rows of a cold table). Its QSA attention is sparse_attention_mixer (qsa.cpp); its MTP
// block is mtp_qwen4 below.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "formats/quant.hpp"
#include "model/forward.hpp"
#include "model/ple.hpp"

namespace strata::engine {

namespace cpu = kernels::cpu;

namespace {

float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
float silu(float x) { return x / (1.0f + std::exp(-x)); }

// Grouped RMSNorm: each n-wide stream of x [hc][n] normalised on its own, then scaled by w [hc * n].
void grouped_norm(const float* x, const float* w, float eps, int hc, int n, float* out) {
    for (int s = 0; s < hc; ++s)
        cpu::rms_norm(x + static_cast<size_t>(s) * n, w + static_cast<size_t>(s) * n, eps, n, out + static_cast<size_t>(s) * n);
}

}  // namespace

void forward_pass::hc_mix(const hc_mixer& m, int n_tok, float* inj, phase_clock::part part) {
    const int hc = hp_.hc, n = hp_.n_embd, dim = hp_.hc_dim(), rank = hp_.hc_rank;
    add_bytes(part, m.down.bytes() + m.up.bytes() + (inj ? m.inject.bytes() : 0));
    const size_t nt = static_cast<size_t>(n_tok);
    hc_xn_.resize(nt * dim);
    hc_lo_.resize(nt * rank);
    hc_gate_.resize(nt * dim);
    for (size_t t = 0; t < nt; ++t) grouped_norm(hc_x_.data() + t * dim, m.norm, hp_.rms_eps, hc, n, hc_xn_.data() + t * dim);
    matmul(m.down, n_tok, hc_xn_.data(), hc_lo_.data());
    for (float& v : hc_lo_) v = silu(v / static_cast<float>(hc));
    matmul(m.up, n_tok, hc_lo_.data(), hc_gate_.data());
    for (size_t t = 0; t < nt; ++t) {
        float* out = xn_.data() + t * n;
        const float* xn = hc_xn_.data() + t * dim;
        const float* g = hc_gate_.data() + t * dim;
        for (int i = 0; i < n; ++i) {
            float sum = 0;
            for (int s = 0; s < hc; ++s) sum += sigmoid(g[s * n + i]) * xn[s * n + i];
            out[i] = sum / static_cast<float>(hc);
        }
    }
    if (!inj) return;
    matmul(m.inject, n_tok, hc_xn_.data(), inj);
    for (size_t i = 0; i < nt * hc; ++i) inj[i] = 2.0f * sigmoid(inj[i] / static_cast<float>(hc));
}

void forward_pass::hc_add(int n_tok, const float* y, const float* inj) {
    const int hc = hp_.hc, n = hp_.n_embd;
    for (size_t t = 0; t < static_cast<size_t>(n_tok); ++t)
        for (int s = 0; s < hc; ++s) {
            float* x = hc_x_.data() + (t * hc + s) * n;
            const float w = inj[t * hc + s];
            for (int i = 0; i < n; ++i) x[i] += y[t * n + i] * w;
        }
}

void forward_pass::ple_block(const layer_weights& l, std::span<const step_segment> segs, int n_tok) {
    const int hc = hp_.hc, n = hp_.n_embd, dim = hp_.hc_dim(), n_heads = hp_.ple_n_heads(), hd = hp_.ple_head_dim;
    const size_t nt = static_cast<size_t>(n_tok);
    const ple_table& table = w_.ple;
    ple_emb_.resize(nt * hp_.ple_dim());
    std::vector<int64_t> rows(static_cast<size_t>(n_heads));
    {
        arenas::scoped_seconds timer(seconds(phase_clock::ple_gather));
        const uint64_t faults0 = table.reads ? thread_major_faults() : 0;
        for (int row0 = 0; const step_segment& g : segs) {
            recurrent_state& st = g.kv->state<recurrent_state>();
            for (int t = 0; t < g.n_tok; ++t) {
                ple_rows_of(hp_, st.ple_window(), g.tokens, t, rows.data());
                for (int h = 0; h < n_heads; ++h)
                    formats::dequantize_row(table.type, table.data + static_cast<size_t>(rows[static_cast<size_t>(h)]) * table.row_stride,
                                            ple_emb_.data() + (static_cast<size_t>(row0 + t) * n_heads + h) * hd, hd);
            }
            row0 += g.n_tok;
        }
        const uint64_t n_rows = nt * static_cast<uint64_t>(n_heads);
        add_bytes(phase_clock::ple_gather, n_rows * table.row_stride);
        if (table.reads) {
            table.reads->tokens += nt;
            table.reads->rows += n_rows;
            table.reads->faults += thread_major_faults() - faults0;
        }
    }
    for (const step_segment& g : segs) {
        recurrent_state& st = g.kv->state<recurrent_state>();
        if (st.traced(st.pos(), st.ple_window())) {
            // A speculative verification keeps the window after each token.
            const int n_prev = hp_.ple_ngram - 1;
            std::vector<float> window(st.ple_window(), st.ple_window() + n_prev);
            for (int t = 0; t < g.n_tok; ++t) {
                ple_push_window(hp_, window.data(), g.tokens + t, 1);
                if (float* copy = st.traced(st.pos() + t, st.ple_window())) std::copy(window.begin(), window.end(), copy);
            }
        }
        ple_push_window(hp_, st.ple_window(), g.tokens, g.n_tok);
    }
    ple_k_.resize(nt * dim);
    ple_v_.resize(nt * n);
    add_bytes(phase_clock::other, l.ple.key.bytes() + l.ple.value.bytes());
    const weight_matrix* const w[] = {&l.ple.key, &l.ple.value};
    float* const y[] = {ple_k_.data(), ple_v_.data()};
    matmul_same_input(w, n_tok, ple_emb_.data(), y);

    // gated [n_tok][dim]: the value through each stream's gate; hc_gate_ holds its norm, the conv's input.
    hc_xn_.resize(nt * dim);
    hc_gate_.resize(nt * dim);
    std::vector<float> gated(nt * dim), q(static_cast<size_t>(dim));
    for (size_t t = 0; t < nt; ++t) {
        float* k = ple_k_.data() + t * dim;
        grouped_norm(k, l.ple.norm_key, hp_.rms_eps, hc, n, k);
        grouped_norm(hc_x_.data() + t * dim, l.ple.norm_query, hp_.rms_eps, hc, n, q.data());
        for (int s = 0; s < hc; ++s) {
            float dot = 0;
            for (int i = 0; i < n; ++i) dot += k[s * n + i] * q[static_cast<size_t>(s * n + i)];
            const float g = dot / std::sqrt(static_cast<float>(n));
            const float signed_root = g == 0.0f ? 0.0f : std::copysign(std::sqrt(std::max(std::abs(g), 1e-6f)), g);
            const float a = sigmoid(signed_root);
            for (int i = 0; i < n; ++i) gated[t * dim + s * n + i] = a * ple_v_[t * n + i];
        }
        grouped_norm(gated.data() + t * dim, l.ple.norm_conv, hp_.rms_eps, hc, n, hc_gate_.data() + t * dim);
    }
    // Per sequence: the depthwise causal conv dilated by ngram_size over [its state's inputs | its rows],
    // then SiLU.
    const int kern = hp_.ple_conv_kernel, dil = hp_.ple_ngram, hist = (kern - 1) * dil;
    for (int row0 = 0; const step_segment& g : segs) {
        recurrent_state& st = g.kv->state<recurrent_state>();
        float* state = st.ple_conv();
        const float* gate = hc_gate_.data() + static_cast<size_t>(row0) * dim;
        const auto input = [&](int j) -> const float* {  // j: position in [-hist, g.n_tok)
            return j < 0 ? state + static_cast<size_t>(hist + j) * dim : gate + static_cast<size_t>(j) * dim;
        };
        for (int t = 0; t < g.n_tok; ++t)
            for (int c = 0; c < dim; ++c) {
                const float* wc = l.ple.conv1d + static_cast<size_t>(c) * kern;
                float acc = 0;
                for (int k = 0; k < kern; ++k) acc += wc[k] * input(t - (kern - 1 - k) * dil)[c];
                const size_t at = static_cast<size_t>(row0 + t) * dim + static_cast<size_t>(c);
                hc_x_[at] += gated[at] + silu(acc);
            }
        row0 += g.n_tok;
        if (hist == 0) continue;
        for (int t = 0; t < g.n_tok; ++t)  // a speculative verification's copies: the last hist inputs after token t
            if (float* copy = st.traced(st.pos() + t, state))
                for (int j = 0; j < hist; ++j)
                    std::memcpy(copy + static_cast<size_t>(j) * dim, input(t + 1 - hist + j), sizeof(float) * dim);
        // Keep the last hist inputs, oldest first: the state's newest ones slide to the front, this
        // segment's rows follow.
        const int kept = std::max(hist - g.n_tok, 0), fresh = hist - kept;
        std::memmove(state, state + static_cast<size_t>(hist - kept) * dim, sizeof(float) * static_cast<size_t>(kept) * dim);
        std::memcpy(state + static_cast<size_t>(kept) * dim, input(g.n_tok - fresh), sizeof(float) * static_cast<size_t>(fresh) * dim);
    }
}

void hc_residual::begin(std::span<const step_segment> segs, int n_tok) {
    (void)segs;
    forward_pass& f = f_;
    const hparams& hp = f.hp_;
    const size_t n_embd = static_cast<size_t>(hp.n_embd), nt = static_cast<size_t>(n_tok);
    const size_t dim = static_cast<size_t>(hp.hc_dim()), hc = static_cast<size_t>(hp.hc);
    f.blk_out_.resize(nt * n_embd);
    f.hc_x_.resize(nt * dim);
    f.hc_inj_.resize(nt * hc);
    // The wide residual starts as hc copies of the embedding.
    const cpu::matrix& embd = f.w_.tok_embd.m;
    for (size_t t = 0; t < nt; ++t) {
        const auto* row = static_cast<const uint8_t*>(embd.data) + static_cast<size_t>(f.tok_[t]) * embd.row_stride;
        formats::dequantize_row(embd.type, row, f.x_.data() + t * n_embd, hp.n_embd);
        for (size_t s = 0; s < hc; ++s)
            std::memcpy(f.hc_x_.data() + (t * hc + s) * n_embd, f.x_.data() + t * n_embd, n_embd * sizeof(float));
    }
}

void hc_residual::block_input(const layer_weights& l, bool ffn, int n_tok) {
    f_.hc_mix(ffn ? l.hc_ffn : l.hc_attn, n_tok, f_.hc_inj_.data());
}

void hc_residual::add(const float* y, bool first, int n_tok) {
    aligned_vector<float>& out = f_.blk_out_;
    const size_t n = static_cast<size_t>(n_tok) * static_cast<size_t>(f_.hp_.n_embd);
    if (first) {
        std::memcpy(out.data(), y, n * sizeof(float));
        return;
    }
    for (size_t i = 0; i < n; ++i) out[i] += y[i];
}

void hc_residual::end_block(int n_tok) { f_.hc_add(n_tok, f_.blk_out_.data(), f_.hc_inj_.data()); }

void hc_residual::finish(std::span<const step_segment> segs, int) {
    forward_pass& f = f_;
    const hparams& hp = f.hp_;
    const size_t dim = static_cast<size_t>(hp.hc_dim());
    // Each segment's hidden rows and its state's last wide residual (and a verification's copies).
    for (size_t row = 0; const step_segment& g : segs) {
        const size_t nt = static_cast<size_t>(g.n_tok);
        const float* rows = f.hc_x_.data() + row * dim;
        recurrent_state& st = g.kv->state<recurrent_state>();
        if (g.hidden) std::memcpy(g.hidden, rows, nt * dim * sizeof(float));
        std::memcpy(st.hc_last(), rows + (nt - 1) * dim, dim * sizeof(float));
        for (int t = 0; t < g.n_tok; ++t)
            if (float* copy = st.traced(st.pos() + t, st.hc_last()))
                std::memcpy(copy, rows + static_cast<size_t>(t) * dim, dim * sizeof(float));
        row += nt;
    }
    // The rows that want logits, packed at the front of hc_x_ (a row never moves past its own place).
    const int n_out = forward_pass::for_logit_rows(segs, [&](int row, int k) {
        if (k != row)
            std::memmove(f.hc_x_.data() + static_cast<size_t>(k) * dim, f.hc_x_.data() + static_cast<size_t>(row) * dim,
                         dim * sizeof(float));
    });
    if (n_out == 0) return;
    arenas::scoped_seconds t_head(f.seconds(phase_clock::head));
    // The output mixer (no inject) is the output norm.
    f.hc_mix(f.w_.hc_head, n_out, nullptr, phase_clock::head);
    f.head_logits(segs, n_out);
}

// llama.cpp's qwen4exp MTP graph (transformers has no MTP block): the hidden input is the trunk's wide
// residual, each stream grouped-normed by hnorm and projected with the shared enorm(embedding) by
// eh_proj into one stream of the block's own wide residual; then a trunk-style block (mixer, dense gated
// attention, mixer, MoE and shared expert) and the draft head's own output mixer before the LM head.
void forward_pass::mtp_qwen4(const int32_t* tokens, const float* h, int n_tok, int pos0, kv_cache& kv, float* h_out,
                             float* logits, bool all_logits) {
    const nextn_weights& nw = w_.nextn[0];
    const layer_weights& l = nw.layer;
    const size_t n_embd = static_cast<size_t>(hp_.n_embd), nt = static_cast<size_t>(n_tok);
    const size_t hc = static_cast<size_t>(hp_.hc), dim = static_cast<size_t>(hp_.hc_dim());
    kv.reserve(pos0 + n_tok);
    x_.resize(nt * n_embd);
    xn_.resize(nt * n_embd);
    q_.resize(nt * hp_.n_q());
    att_.resize(nt * hp_.n_q());
    k_.resize(nt * hp_.n_kv());
    v_.resize(nt * hp_.n_kv());
    tmp_.resize(nt * n_embd);
    blk_out_.resize(nt * n_embd);
    tmp2_.resize(nt * static_cast<size_t>(std::max(hp_.n_ff_shexp, 1)));
    router_.resize(nt * hp_.n_expert);
    ids_.resize(nt * hp_.n_expert_used);
    weights_.resize(nt * hp_.n_expert_used);
    hc_x_.resize(nt * dim);
    hc_inj_.resize(nt * hc);
    rope_cs_.resize(nt * static_cast<size_t>(hp_.n_rot));
    mtp_in_.resize(nt * hc * 2 * n_embd);

    // Row (t, s) of the projection's input: [enorm(embed(token t)) | stream s of hnorm(h[t])].
    const cpu::matrix& embd = w_.tok_embd.m;
    for (size_t t = 0; t < nt; ++t) {
        cpu::rope_angles(hp_.n_rot, pos0 + static_cast<int>(t), hp_.rope, rope_cs_.data() + t * hp_.n_rot);
        const auto* row = static_cast<const uint8_t*>(embd.data) + static_cast<size_t>(tokens[t]) * embd.row_stride;
        formats::dequantize_row(embd.type, row, tmp_.data(), hp_.n_embd);
        for (size_t s = 0; s < hc; ++s) {
            float* in = mtp_in_.data() + (t * hc + s) * 2 * n_embd;
            if (s == 0)
                cpu::rms_norm(tmp_.data(), nw.enorm, hp_.rms_eps, hp_.n_embd, in);
            else
                std::memcpy(in, mtp_in_.data() + t * hc * 2 * n_embd, n_embd * sizeof(float));
            if (h)
                cpu::rms_norm(h + t * dim + s * n_embd, nw.hnorm + s * n_embd, hp_.rms_eps, hp_.n_embd, in + n_embd);
            else
                std::fill_n(in + n_embd, n_embd, 0.0f);
        }
    }
    matmul(nw.eh_proj, static_cast<int>(nt * hc), mtp_in_.data(), hc_x_.data());

    hc_mix(l.hc_attn, n_tok, hc_inj_.data());
    const step_segment seg{tokens, n_tok, pos0, &kv, nullptr, false, nullptr};
    mtp_mixer_->eval_weights(l, 0, std::span(&seg, 1), n_tok);  // dense: the block's indexer is not run (llama.cpp)
    matmul(l.wo, n_tok, att_.data(), tmp_.data());
    hc_add(n_tok, tmp_.data(), hc_inj_.data());

    hc_mix(l.hc_ffn, n_tok, hc_inj_.data());
    moe(l, *mtp_moe_, mtp_moe_layers_, 0, nullptr, n_tok);
    std::memcpy(blk_out_.data(), tmp_.data(), nt * n_embd * sizeof(float));
    if (l.shexp_gate.present()) {
        shared_expert(l, n_tok);
        for (size_t i = 0; i < nt * n_embd; ++i) blk_out_[i] += tmp_[i];
    }
    hc_add(n_tok, blk_out_.data(), hc_inj_.data());
    if (h_out) std::memcpy(h_out, hc_x_.data(), nt * dim * sizeof(float));
    if (!logits) return;
    const size_t first = all_logits ? 0 : nt - 1;
    if (first > 0) std::memmove(hc_x_.data(), hc_x_.data() + first * dim, dim * sizeof(float));
    hc_mix(nw.hc_head, static_cast<int>(nt - first), nullptr);
    matmul(w_.output, static_cast<int>(nt - first), xn_.data(), logits);
}

}  // namespace strata::engine
