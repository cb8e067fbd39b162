// The plain residual kind: one n_embd stream per row, RMS-normed before each block (attn_norm,
// ffn_norm), each block's output added to it; after the last layer the output norm and head.
#include <cstring>

#include "formats/quant.hpp"
#include "model/forward.hpp"

namespace strata::engine {

namespace cpu = kernels::cpu;

void plain_residual::begin(std::span<const step_segment> segs, int n_tok) {
    (void)segs;
    forward_pass& f = f_;
    const size_t n_embd = static_cast<size_t>(f.hp_.n_embd);
    const cpu::matrix& embd = f.w_.tok_embd.m;
    for (int t = 0; t < n_tok; ++t) {
        const auto* row = static_cast<const uint8_t*>(embd.data) + static_cast<size_t>(f.tok_[t]) * embd.row_stride;
        formats::dequantize_row(embd.type, row, f.x_.data() + t * n_embd, f.hp_.n_embd);
    }
}

void plain_residual::block_input(const layer_weights& l, bool ffn, int n_tok) {
    forward_pass& f = f_;
    const size_t n_embd = static_cast<size_t>(f.hp_.n_embd);
    const float* norm = ffn ? l.ffn_norm : l.attn_norm;
    f.each_row(n_tok, [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t)
            cpu::rms_norm(f.x_.data() + t * n_embd, norm, f.hp_.rms_eps, f.hp_.n_embd, f.xn_.data() + t * n_embd);
    });
}

void plain_residual::add(const float* y, bool first, int n_tok) {
    (void)first;
    float* x = f_.x_.data();
    const size_t n_embd = static_cast<size_t>(f_.hp_.n_embd);
    f_.each_row(n_tok, [&](int64_t t0, int64_t t1) {
        for (size_t i = static_cast<size_t>(t0) * n_embd; i < static_cast<size_t>(t1) * n_embd; ++i) x[i] += y[i];
    });
}

void plain_residual::finish(std::span<const step_segment> segs, int n_tok) {
    (void)n_tok;
    forward_pass& f = f_;
    const size_t n_embd = static_cast<size_t>(f.hp_.n_embd);
    for (size_t row = 0; const step_segment& g : segs) {
        if (g.hidden)
            std::memcpy(g.hidden, f.x_.data() + row * n_embd, sizeof(float) * n_embd * static_cast<size_t>(g.n_tok));
        row += static_cast<size_t>(g.n_tok);
    }
    f.output_head(segs);
}

}  // namespace strata::engine
