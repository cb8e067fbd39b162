// deepseek2's multi-head latent attention on the CPU, in the order llama.cpp's llm_build_deepseek2
// computes it with its MLA cache:
//   q = attn_q(x), or attn_q_b(norm(attn_q_a(x)));  each head: q_nope (head_dim - n_rot), q_pe (n_rot)
//   [c | k_pe] = attn_kv_a_mqa(x);  c = norm(c);  RoPE on q_pe and k_pe;  the cache keeps [c | k_pe]
//   q_abs[h] = k_b[h] q_nope[h]  (the key up-projection absorbed into the query)
//   score[h][p] = kq_scale * ([q_abs[h] | q_pe[h]] . [c_p | k_pe_p]);  o[h] = softmax(score[h]) . c
//   out[h] = v_b[h] o[h]  (the value up-projection after attention), then attn_output.
// Plain loops: every (token, head) item reads the cache's rows in position order on its own, so a
// token's output is bitwise the same whatever the batch, the pool's slices or its worker count.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "model/forward.hpp"
#include "model/parallel.hpp"

namespace strata::engine {

namespace cpu = kernels::cpu;

namespace {

uint64_t bytes_of(const weight_matrix& w) { return static_cast<uint64_t>(w.n_rows) * w.m.row_stride; }

template <class T>
T* grown(std::vector<T>& v, size_t n) {
    if (v.size() < n) v.resize(std::max(n, v.size() * 2));
    return v.data();
}

// a . b over n floats in eight fixed lanes (vectorisable, and the same sum on every call).
float dot(const float* a, const float* b, int n) {
    float lane[8] = {};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; ++j) lane[j] += a[i + j] * b[i + j];
    for (; i < n; ++i) lane[0] += a[i] * b[i];
    return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}

}  // namespace

void forward_pass::matmul_heads(const weight_matrix& w, int64_t step, int64_t row0, int64_t n_rows, int n_tok,
                                const float* in, float* y) {
    const cpu::matrix& m = w.m;  // per-head row ranges of the file's layout (these are never repacked)
    const int n_head = hp_.n_head;
    const size_t act_bytes = cpu::activation_row_size(m.type, m.n_cols);
    uint8_t* act = grown(act_, act_bytes * static_cast<size_t>(n_tok) * n_head);
    // Activations per head, then per token: [n_head][n_tok].
    for (int t = 0; t < n_tok; ++t)
        for (int h = 0; h < n_head; ++h)
            cpu::quantize_activation(m.type, in + (static_cast<size_t>(t) * n_head + h) * m.n_cols,
                                     act + (static_cast<size_t>(h) * n_tok + t) * act_bytes, m.n_cols);
    parallel_rows(pool_, n_head, 1, [&](int64_t h0, int64_t h1) {
        for (int64_t h = h0; h < h1; ++h) {
            cpu::matrix head = m;
            head.data = static_cast<const uint8_t*>(m.data) + static_cast<size_t>(h * step + row0) * m.row_stride;
            cpu::matmul(head, 0, n_rows, act + static_cast<size_t>(h) * n_tok * act_bytes, act_bytes, n_tok,
                        y + h * n_rows, n_head * n_rows);
        }
    });
}

void forward_pass::mla_attention(int il, int n_tok, int pos0, kv_cache& kv) {
    const layer_weights& l = w_.layers[static_cast<size_t>(il)];
    const int n_head = hp_.n_head, hd = hp_.head_dim, n_rot = hp_.n_rot, nope = hd - n_rot;
    const int lora = hp_.n_lora_kv, row = lora + n_rot, n_q = hp_.n_q();
    const size_t nt = static_cast<size_t>(n_tok), items = nt * n_head;
    float* kv_a = grown(kv_a_, nt * row);
    float* q_nope = grown(q_nope_, items * nope);
    float* q_lat = grown(q_lat_, items * row);
    float* o_lat = grown(o_lat_, items * lora);
    {
        arenas::scoped_seconds t(seconds(phase_clock::attn_proj));
        if (l.wq_a.present()) {
            const int lq = hp_.n_lora_q;
            float* q_a = grown(q_a_, nt * lq);
            matmul(l.wq_a, n_tok, xn_.data(), q_a);
            for (size_t t = 0; t < nt; ++t) cpu::rms_norm(q_a + t * lq, l.q_a_norm, hp_.rms_eps, lq, q_a + t * lq);
            matmul(l.wq_b, n_tok, q_a, q_.data());
        } else {
            matmul(l.wq, n_tok, xn_.data(), q_.data());
        }
        matmul(l.wkv_a, n_tok, xn_.data(), kv_a);
    }
    arenas::scoped_seconds timer(seconds(phase_clock::attention));
    const int n_pos = pos0 + n_tok;
    // The latent rows read, and the per-head up-projections applied inside attention.
    add_bytes(phase_clock::attention, kv_cache::bytes_per_token(1, 1, row, kv.type(), true) * static_cast<uint64_t>(n_pos) +
                                          bytes_of(l.wk_b) + bytes_of(l.wv_b));
    for (int t = 0; t < n_tok; ++t) {
        float* c = kv_a + static_cast<size_t>(t) * row;
        cpu::rms_norm(c, l.kv_a_norm, hp_.rms_eps, lora, c);
        cpu::rope(c + lora, 1, n_rot, n_rot, pos0 + t, hp_.rope, hp_.arch.rope);
        kv.store_latent(il, pos0 + t, c);
        float* q = q_.data() + static_cast<size_t>(t) * n_q;
        cpu::rope(q + nope, n_head, hd, n_rot, pos0 + t, hp_.rope, hp_.arch.rope);  // each head's last n_rot dims
        for (int h = 0; h < n_head; ++h) {
            const size_t item = static_cast<size_t>(t) * n_head + h;
            std::memcpy(q_nope + item * nope, q + static_cast<size_t>(h) * hd, sizeof(float) * nope);
            std::memcpy(q_lat + item * row + lora, q + static_cast<size_t>(h) * hd + nope, sizeof(float) * n_rot);
        }
    }
    // The absorbed query, through o_lat as scratch: [n_tok][n_head][lora].
    matmul_heads(l.wk_b, lora, 0, lora, n_tok, q_nope, o_lat);
    for (size_t item = 0; item < items; ++item)
        std::memcpy(q_lat + item * row, o_lat + item * lora, sizeof(float) * lora);

    float* lat = grown(lat_, static_cast<size_t>(n_pos) * row);
    parallel_rows(pool_, n_pos, 64, [&](int64_t p0, int64_t p1) {
        kv.read_latent(il, static_cast<int>(p0), static_cast<int>(p1), lat + p0 * row);
    });
    float* scores = grown(scores_, items * static_cast<size_t>(n_pos));
    const float scale = hp_.kq_scale;
    parallel_rows(pool_, static_cast<int64_t>(items), 1, [&](int64_t i0, int64_t i1) {
        for (int64_t item = i0; item < i1; ++item) {
            const int last = pos0 + static_cast<int>(item / n_head);  // causal: positions up to the token's own
            const float* qv = q_lat + item * row;
            float* s = scores + item * n_pos;
            float mx = -INFINITY;
            for (int p = 0; p <= last; ++p) {
                s[p] = dot(qv, lat + static_cast<size_t>(p) * row, row) * scale;
                mx = std::max(mx, s[p]);
            }
            float sum = 0;
            for (int p = 0; p <= last; ++p) {
                s[p] = std::exp(s[p] - mx);
                sum += s[p];
            }
            float* o = o_lat + item * lora;
            std::fill_n(o, lora, 0.0f);
            for (int p = 0; p <= last; ++p) {
                const float* c = lat + static_cast<size_t>(p) * row;
                for (int i = 0; i < lora; ++i) o[i] += s[p] * c[i];
            }
            const float inv = 1.0f / sum;
            for (int i = 0; i < lora; ++i) o[i] *= inv;
        }
    });
    matmul_heads(l.wv_b, l.v_b_step, l.v_b_row0, hp_.head_dim_v, n_tok, o_lat, att_.data());
}

}  // namespace strata::engine
