// deepseek2's multi-head latent attention on the CPU, in the order llama.cpp's llm_build_deepseek2
// computes it with its MLA cache:
//   q = attn_q(x), or attn_q_b(norm(attn_q_a(x)));  each head: q_nope (head_dim - n_rot), q_pe (n_rot)
//   [c | k_pe] = attn_kv_a_mqa(x);  c = norm(c);  RoPE on q_pe and k_pe;  the cache keeps [c | k_pe]
//   q_abs[h] = k_b[h] q_nope[h]  (the key up-projection absorbed into the query)
//   score[h][p] = kq_scale * ([q_abs[h] | q_pe[h]] . [c_p | k_pe_p]);  o[h] = softmax(score[h]) . c
//   out[h] = v_b[h] o[h]  (the value up-projection after attention), then attn_output.
// The attention itself is multi-query attention on the tiled kernels (cpu/attention.hpp): every query
// head of every token attends to the one latent row per position, key [c | k_pe] and value c. Per KV
// chunk a work item lays the chunk's rows out as blocked keys in its own scratch (shared by all its
// query rows) and reads the values in place. Prompts: items are query tiles folding every chunk in
// order; decode: items are chunks (and row groups), merged afterwards in chunk order. Like
// attention_runner's, a token's output is bitwise the same whatever the batch, slices or workers.
#include <algorithm>
#include <cstring>

#include <spdlog/fmt/fmt.h>

#include "model/forward.hpp"
#include "model/parallel.hpp"

namespace strata::engine {

namespace {

class latent_attention_kind final : public mixer_kind {
public:
    const char* name() const override { return "latent attention"; }
    kv_rows rows(const hparams& hp) const override { return {1, hp.n_lora_kv + hp.n_rot, true}; }
    std::string gpu_unsupported(const hparams& hp) const override {
        return fmt::format("the GPU hybrid does not run {}'s multi-head latent attention yet", hp.arch.name);
    }
};

}  // namespace

const mixer_kind& latent_attention_mixer::layer_kind() {
    static const latent_attention_kind k;
    return k;
}

namespace cpu = kernels::cpu;

namespace {

constexpr int kQueryTokens = 16;  // prompt: tokens per query tile (their n_head rows share each packed chunk)
constexpr int kDecodeTokens = 8;  // batches up to this many tokens split the cache into chunks instead
constexpr int kMinGroupRows = 8;  // decode splits a chunk's rows into groups of at least this many
constexpr int kDecodeWindow = 32;  // decode computes at most this many chunks' states before folding them

// The state of `rows` rows laid out as [rows][v_dim] acc, then [rows] max, then [rows] sum.
cpu::attn_state state_at(float* base, int rows, int64_t v_dim) {
    float* max = base + static_cast<size_t>(rows) * v_dim;
    return {max, max + rows, base};
}

cpu::attn_state rows_of(const cpu::attn_state& st, int first, int64_t v_dim) {
    return {st.max + first, st.sum + first, st.acc + static_cast<size_t>(first) * v_dim};
}

}  // namespace

void latent_attention_mixer::matmul_heads(const weight_matrix& w, int64_t step, int64_t row0, int64_t n_rows,
                                          int n_tok, const float* in, float* y) {
    forward_pass& f = f_;
    const hparams& hp = f.hp_;
    const cpu::matrix& m = w.m;  // per-head row ranges of the file's layout (these are never repacked)
    const int n_head = hp.n_head;
    const size_t act_bytes = cpu::activation_row_size(m.type, m.n_cols);
    uint8_t* act = grown(f.act_, act_bytes * static_cast<size_t>(n_tok) * n_head);
    // Activations per head, then per token: [n_head][n_tok].
    for (int t = 0; t < n_tok; ++t)
        for (int h = 0; h < n_head; ++h)
            cpu::quantize_activation(m.type, in + (static_cast<size_t>(t) * n_head + h) * m.n_cols,
                                     act + (static_cast<size_t>(h) * n_tok + t) * act_bytes, m.n_cols);
    parallel_rows(f.pool_, n_head, 1, [&](int64_t h0, int64_t h1) {
        for (int64_t h = h0; h < h1; ++h) {
            cpu::matrix head = m;
            head.data = static_cast<const uint8_t*>(m.data) + static_cast<size_t>(h * step + row0) * m.row_stride;
            cpu::matmul(head, 0, n_rows, act + static_cast<size_t>(h) * n_tok * act_bytes, act_bytes, n_tok,
                        y + h * n_rows, n_head * n_rows);
        }
    });
}

void latent_attention_mixer::eval(int il, std::span<const step_segment> segs, int n_tok) {
    run(f_.w_.layers[static_cast<size_t>(il)], il, segs, n_tok);
}

void latent_attention_mixer::eval_weights(const layer_weights& l, int kvl, std::span<const step_segment> segs,
                                          int n_tok) {
    run(l, kvl, segs, n_tok);
}

void latent_attention_mixer::run(const layer_weights& l, int il, std::span<const step_segment> segs, int n_tok) {
    forward_pass& f = f_;
    const hparams& hp = f.hp_;
    const int n_head = hp.n_head, hd = hp.head_dim, n_rot = hp.n_rot, nope = hd - n_rot;
    const int lora = hp.n_lora_kv, row = lora + n_rot, n_q = hp.n_q();
    const size_t nt = static_cast<size_t>(n_tok), items = nt * n_head;
    float* kv_a = grown(kv_a_, nt * row);
    float* q_nope = grown(q_nope_, items * nope);
    float* q_lat = grown(q_lat_, items * row);
    float* o_lat = grown(o_lat_, items * lora);
    {
        arenas::scoped_seconds t(f.seconds(phase_clock::attn_proj));
        if (l.wq_a.present()) {
            const int lq = hp.n_lora_q;
            float* q_a = grown(q_a_, nt * lq);
            f.matmul(l.wq_a, n_tok, f.xn_.data(), q_a);
            for (size_t t = 0; t < nt; ++t) cpu::rms_norm(q_a + t * lq, l.q_a_norm, hp.rms_eps, lq, q_a + t * lq);
            f.matmul(l.wq_b, n_tok, q_a, f.q_.data());
        } else {
            f.matmul(l.wq, n_tok, f.xn_.data(), f.q_.data());
        }
        f.matmul(l.wkv_a, n_tok, f.xn_.data(), kv_a);
    }
    arenas::scoped_seconds timer(f.seconds(phase_clock::attention));
    // The per-head up-projections applied inside attention, then each segment's latent rows read.
    f.add_bytes(phase_clock::attention, l.wk_b.bytes() + l.wv_b.bytes());
    for (int row0 = 0; const step_segment& g : segs) {
        kv_cache& kv = *g.kv;
        f.add_bytes(phase_clock::attention,
                    kv_cache::bytes_per_token(1, 1, row, kv.type(), true) * static_cast<uint64_t>(g.pos0 + g.n_tok));
        for (int t = row0; t < row0 + g.n_tok; ++t) {
            float* c = kv_a + static_cast<size_t>(t) * row;
            cpu::rms_norm(c, l.kv_a_norm, hp.rms_eps, lora, c);
            const float* cs = f.rope_cs_.data() + static_cast<size_t>(t) * n_rot;
            cpu::rope_apply(c + lora, 1, n_rot, n_rot, cs, hp.arch.rope);
            kv.store_latent(il, g.pos0 + t - row0, c);
            float* q = f.q_.data() + static_cast<size_t>(t) * n_q;
            cpu::rope_apply(q + nope, n_head, hd, n_rot, cs, hp.arch.rope);  // each head's last n_rot dims
            for (int h = 0; h < n_head; ++h) {
                const size_t item = static_cast<size_t>(t) * n_head + h;
                std::memcpy(q_nope + item * nope, q + static_cast<size_t>(h) * hd, sizeof(float) * nope);
                std::memcpy(q_lat + item * row + lora, q + static_cast<size_t>(h) * hd + nope, sizeof(float) * n_rot);
            }
        }
        row0 += g.n_tok;
    }
    // The absorbed query, through o_lat as scratch: [n_tok][n_head][lora].
    matmul_heads(l.wk_b, lora, 0, lora, n_tok, q_nope, o_lat);
    for (size_t item = 0; item < items; ++item)
        std::memcpy(q_lat + item * row, o_lat + item * lora, sizeof(float) * lora);

    for (int row0 = 0; const step_segment& g : segs) {
        const size_t at = static_cast<size_t>(row0) * n_head;
        attend(*g.kv, il, g.n_tok, g.pos0, q_lat + at * row, o_lat + at * lora);
        row0 += g.n_tok;
    }
    matmul_heads(l.wv_b, l.v_b_step, l.v_b_row0, hp.head_dim_v, n_tok, o_lat, f.att_.data());
}

// Lanes: one per pool thread, each a work item with its own key scratch, taking its share of the
// query tiles (prompt) or of the (chunk, row group) units (decode) in a fixed order.
void latent_attention_mixer::attend(const kv_cache& kv, int il, int n_tok, int pos0, const float* q, float* out) {
    forward_pass& f = f_;
    const hparams& hp = f.hp_;
    const int n_head = hp.n_head, lora = hp.n_lora_kv, row = lora + hp.n_rot;
    const size_t key_bytes = static_cast<size_t>(kv_cache::chunk_tokens) * kv.head_row_bytes();
    const int n_lanes = std::max(1, f.pool_.plan().total_threads());
    const float scale = hp.kq_scale;
    int64_t* last = grown(mla_last_, static_cast<size_t>(n_tok) * n_head);
    for (int t = 0; t < n_tok; ++t) std::fill_n(last + static_cast<size_t>(t) * n_head, n_head, int64_t{pos0} + t);
    if (n_tok > kDecodeTokens) {
        const int n_tiles = (n_tok + kQueryTokens - 1) / kQueryTokens, lanes = std::min(n_lanes, n_tiles);
        const size_t state_floats = static_cast<size_t>(kQueryTokens) * n_head * (lora + 2);
        uint8_t* keys = grown(mla_keys_, static_cast<size_t>(lanes) * key_bytes);
        float* states = grown(mla_state_, static_cast<size_t>(lanes) * state_floats);
        parallel_rows(f.pool_, lanes, 1, [&](int64_t l0, int64_t l1) {
            for (int64_t lane = l0; lane < l1; ++lane)
                for (int i = static_cast<int>(lane); i < n_tiles; i += lanes) {
                    const int tile = n_tiles - 1 - i;  // the last tiles see the most positions: first
                    const int t0 = tile * kQueryTokens, t1 = std::min(n_tok, t0 + kQueryTokens);
                    const int rows = (t1 - t0) * n_head, n_pos = pos0 + t1;
                    const cpu::attn_state st = state_at(states + lane * state_floats, rows, lora);
                    cpu::attn_clear(st, lora, rows);
                    for (int c = 0; c * kv_cache::chunk_tokens < n_pos; ++c)
                        cpu::attn_tile(kv.latent_tile(il, c, n_pos, lora, keys + lane * key_bytes), row,
                                       q + static_cast<size_t>(t0) * n_head * row, rows,
                                       last + static_cast<size_t>(t0) * n_head, scale, st);
                    cpu::attn_finish(st, lora, rows, out + static_cast<size_t>(t0) * n_head * lora, lora);
                }
        });
        return;
    }
    // Decode, a window of chunks at a time (so the states stay bounded at long contexts): unit (c, g) is
    // chunk c's state for row group g; the window's states are then folded in chunk order into acc.
    const int rows = n_tok * n_head, n_pos = pos0 + n_tok;
    const int n_chunks = (n_pos + kv_cache::chunk_tokens - 1) / kv_cache::chunk_tokens;
    const int window = std::min(n_chunks, kDecodeWindow);
    const int n_groups = std::clamp((n_lanes + window - 1) / window, 1, std::max(1, rows / kMinGroupRows));
    const int group_rows = (rows + n_groups - 1) / n_groups;
    const size_t state_floats = static_cast<size_t>(rows) * (lora + 2);
    uint8_t* keys = grown(mla_keys_, static_cast<size_t>(std::min(n_lanes, window * n_groups)) * key_bytes);
    float* states = grown(mla_state_, static_cast<size_t>(window + 1) * state_floats);  // the window's, then acc
    const cpu::attn_state acc = state_at(states + window * state_floats, rows, lora);
    cpu::attn_clear(acc, lora, rows);
    for (int w0 = 0; w0 < n_chunks; w0 += window) {
        const int w1 = std::min(n_chunks, w0 + window);
        const int n_units = (w1 - w0) * n_groups, lanes = std::min(n_lanes, n_units);
        parallel_rows(f.pool_, lanes, 1, [&](int64_t l0, int64_t l1) {
            for (int64_t lane = l0; lane < l1; ++lane) {
                int packed = -1;  // the chunk whose keys the lane's scratch holds
                cpu::kv_tile tile{};
                const int u0 = static_cast<int>(lane * n_units / lanes), u1 = static_cast<int>((lane + 1) * n_units / lanes);
                for (int u = u0; u < u1; ++u) {
                    const int c = w0 + u / n_groups, r0 = (u % n_groups) * group_rows, nr = std::min(group_rows, rows - r0);
                    if (nr <= 0) continue;
                    if (c != packed) {
                        tile = kv.latent_tile(il, c, n_pos, lora, keys + lane * key_bytes);
                        packed = c;
                    }
                    const cpu::attn_state st = rows_of(state_at(states + (c - w0) * state_floats, rows, lora), r0, lora);
                    cpu::attn_clear(st, lora, nr);
                    cpu::attn_tile(tile, row, q + static_cast<size_t>(r0) * row, nr, last + r0, scale, st);
                }
            }
        });
        const bool finish = w1 == n_chunks;
        parallel_rows(f.pool_, rows, kMinGroupRows, [&](int64_t r0, int64_t r1) {
            const int first = static_cast<int>(r0), nr = static_cast<int>(r1 - r0);
            const cpu::attn_state a = rows_of(acc, first, lora);
            for (int c = w0; c < w1; ++c)
                cpu::attn_merge(lora, nr, a, rows_of(state_at(states + (c - w0) * state_floats, rows, lora), first, lora));
            if (finish) cpu::attn_finish(a, lora, nr, out + static_cast<size_t>(first) * lora, lora);
        });
    }
}

}  // namespace strata::engine
