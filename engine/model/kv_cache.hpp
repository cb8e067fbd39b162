// Per-layer key/value cache for one sequence, in f16 or int8 (Q8_0 blocks along the head dimension).
//
// Layouts (n_kv = n_head_kv * head_dim):
//   K, both types:  [n_ctx][n_kv]    one row per position; f16 values or Q8_0 blocks of 32
//   V, f16:         [n_head_kv * head_dim][n_ctx]   transposed, so attention's weighted sum over
//                   positions is a matvec over rows of V^T
//   V, int8:        [n_ctx][n_kv]    Q8_0 blocks per position (blocks cannot grow along positions)
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cpu/kernels.hpp"

namespace strata::engine {

enum class kv_type { f16, int8 };

kv_type parse_kv_type(const std::string& name);  // "f16" | "int8"; throws listing both
const char* kv_type_name(kv_type t);

class kv_cache {
public:
    kv_cache(int n_layer, int n_ctx, int n_head_kv, int head_dim, kv_type type);

    int n_ctx() const { return n_ctx_; }
    kv_type type() const { return type_; }
    size_t bytes() const;
    static size_t bytes_needed(int n_layer, int n_ctx, int n_head_kv, int head_dim, kv_type type);

    // Writes position pos of a layer: k, v: [n_kv] f32.
    void store(int layer, int pos, const float* k, const float* v);

    // Attention of one query over positions [0, n_pos) for the query heads [head_begin, head_end):
    // q: [n_head][head_dim] (RoPE applied), out: [n_head][head_dim], scratch: >= n_pos floats.
    // Heads are grouped over the kv heads (head h reads kv head h / (n_head / n_head_kv)).
    void attend(int layer, const float* q, int n_head, int head_begin, int head_end, int n_pos, float scale,
                float* out, float* scratch) const;

private:
    size_t k_row_bytes() const;

    int n_layer_, n_ctx_, n_head_kv_, head_dim_;
    kv_type type_;
    std::vector<std::vector<uint8_t>> k_, v_;  // per layer
};

}  // namespace strata::engine
