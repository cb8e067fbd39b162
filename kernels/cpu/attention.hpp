// Tiled attention (flash-attention style, online softmax) over a KV cache stored in tiles of
// consecutive positions. The engine calls attn_tile once per (query rows, tile) and folds tiles in
// position order with attn_merge, so a query's result depends only on its own row and the tiles,
// never on how many rows were processed together, which threads ran them, or how tiles were split
// between work items: prompts (many rows per tile) and decode (one tile per work item, merged
// afterwards) give bitwise identical outputs on one ISA.
//
// Threading: like kernels.hpp, single-threaded and safe to call concurrently on disjoint states.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cpu/kernels.hpp"

namespace strata::kernels::cpu {

// Positions per tile at most (the KV cache's chunk size).
inline constexpr int attn_tile_max = 256;

// Keys are stored transposed in blocks of attn_key_block positions, so one SIMD load gives consecutive
// positions and scoring needs no register transposes. A block is attn_key_block * row_bytes bytes:
//   F16:  [head_dim][attn_key_block] halves (one load: one dimension of 16 positions);
//   Q8_0: [head_dim / 4][attn_key_block][4] int8 quants (one 64-byte load: 4 consecutive dimensions of
//         16 positions, the operand of a 4-way int8 dot product), then [head_dim / 32][attn_key_block]
//         f16 scales (the scale of elements 32 b .. 32 b + 31 of a key, as in its Q8_0 row).
// A tile's k holds ceil(n / attn_key_block) whole blocks; slots past n are never let through. Values
// are rows: v is [n][v_row_bytes] (kv_tile).
//
// Scores against Q8_0 keys are int8 dot products, as llama.cpp's CPU flash attention computes them:
// the query row is quantized to Q8_0 (formats::quantize_row), and
//   score = scale * sum_b float(sum_{j in b} qq_j kq_j) * (d_k,b * d_q,b)
// over the blocks b of 32 dimensions in order. F16 keys are scored against the f32 query.
inline constexpr int attn_key_block = 32;
static_assert(attn_tile_max % attn_key_block == 0);

// Byte offset in a tile's k of element j of key t: a half (F16) or an int8 quant (Q8_0).
inline constexpr size_t attn_key_offset(ggml_type type, size_t row_bytes, int64_t t, int64_t j) {
    const size_t block = static_cast<size_t>(t / attn_key_block) * attn_key_block * row_bytes;
    if (type == ggml_type::F16) return block + 2 * static_cast<size_t>(j * attn_key_block + t % attn_key_block);
    return block + static_cast<size_t>((j / 4 * attn_key_block + t % attn_key_block) * 4 + j % 4);
}

// Byte offset in a Q8_0 tile's k of the f16 scale of element j of key t.
inline constexpr size_t attn_key_scale_offset(int64_t head_dim, size_t row_bytes, int64_t t, int64_t j) {
    const size_t block = static_cast<size_t>(t / attn_key_block) * attn_key_block * row_bytes;
    return block + static_cast<size_t>(head_dim * attn_key_block) +
           2 * static_cast<size_t>(j / 32 * attn_key_block + t % attn_key_block);
}

// One kv head's keys and values for positions [pos0, pos0 + n), laid out as above; each key head_dim
// elements of `type` (F16, or Q8_0 blocks of 32), each value the first v_dim of its row's elements.
// Values may be narrower than keys and their rows wider than v_dim elements (deepseek2's latent
// attention: the key is a cache row [c | k_pe], the value its first part c, read in place).
struct kv_tile {
    ggml_type type;
    const void* k;
    const void* v;
    size_t row_bytes;    // one key of one head (a key block is attn_key_block of them)
    int64_t pos0;
    int n;               // 1..attn_tile_max
    // The keys of the tile the caller folds next with the same layout, or null: decode prefetches
    // their first rows while it computes this tile's values, so the memory is not idle between tiles.
    const void* next_k = nullptr;
    int64_t v_dim = 0;         // elements of a value, 1..head_dim; 0: head_dim
    size_t v_row_bytes = 0;    // bytes from one value row to the next; 0: row_bytes
};

// The value size and value row stride of a tile (its defaults resolved).
inline constexpr int64_t attn_value_dim(const kv_tile& kv, int64_t head_dim) { return kv.v_dim > 0 ? kv.v_dim : head_dim; }
inline constexpr size_t attn_value_stride(const kv_tile& kv) { return kv.v_row_bytes > 0 ? kv.v_row_bytes : kv.row_bytes; }

// The online-softmax state of n_rows query rows over the positions folded in so far:
// max[r] the largest score, sum[r] = sum exp(s - max[r]), acc[r][v_dim] = sum exp(s - max[r]) * v.
// Empty (no position yet): max = -inf, sum = 0, acc = 0.
struct attn_state {
    float* max;          // [n_rows]
    float* sum;          // [n_rows]
    float* acc;          // [n_rows][v_dim]
};

// Sets n_rows rows of `st` to empty.
void attn_clear(const attn_state& st, int64_t v_dim, int n_rows);

// Folds one tile into `st`: row r of q ([n_rows][head_dim] f32, RoPE applied) attends to the tile's
// positions t <= last_pos[r] with scores scale * (q_r . k_t). Equivalent, bitwise, to computing the
// tile's own state from empty and then attn_merge-ing it into `st`.
void attn_tile(const kv_tile& kv, int64_t head_dim, const float* q, int n_rows, const int64_t* last_pos, float scale,
               const attn_state& st);

// Folds state b into state a (n_rows rows each), in place in a.
void attn_merge(int64_t v_dim, int n_rows, const attn_state& a, const attn_state& b);

// out[r][0..v_dim) = acc[r] / sum[r]  (rows with an empty state give zeros). out: [n_rows][out_stride].
void attn_finish(const attn_state& st, int64_t v_dim, int n_rows, float* out, int64_t out_stride);

// Lays out n (1..attn_tile_max) keys given as rows (head_dim elements of `type` each, rows row_stride
// bytes apart, as a latent cache keeps them) in a tile's blocked key layout above: k receives
// ceil(n / attn_key_block) blocks of attn_key_block * row_size(type, head_dim) bytes; slots past n are
// zero. Deterministic (a copy), so tiles built from it score exactly like a cache's own key tiles.
void attn_pack_keys(ggml_type type, int64_t head_dim, const void* rows, size_t row_stride, int n, void* k);

}  // namespace strata::kernels::cpu
