// Internal: the per-ISA kernel table behind kernels/cpu/kernels.hpp, and the kernels each
// format x ISA file defines. Included by the kernel sources and the tests, never by users.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <utility>

#include "cpu/attention.hpp"
#include "cpu/kernels.hpp"
#include "formats/blocks.hpp"

namespace strata::kernels::cpu::detail {

// Most activations one dot call handles (per kernel: isa_table::dot_tokens, 4 for the AVX2 kernels'
// 16 registers, 8 for AVX-512's 32); callers split larger token counts into groups of that size.
inline constexpr int max_dot_tokens = 8;
// One past the largest ggml type id (MXFP4 = 39).
inline constexpr size_t n_type_ids = 40;

// Dot products of one weight row (n elements of the entry's weight type) with n_tok activation
// rows (1 <= n_tok <= the entry's dot_tokens): out[t] = w . a[t], each a[t] in vec_dot_type(type).
// Every kernel computes token t's result with the same operation sequence whatever n_tok is,
// which is what makes multi-token calls bitwise equal to single-token ones.
using dot_fn = void (*)(int64_t n, const void* w, const void* const* a, int n_tok, float* out);
// GEMM on the rows16 layout: n_groups groups of 16 rows (group g at w + g * group_bytes) times n_tok
// activation rows (1 <= n_tok <= the entry's gemm_tokens): y[t * y_stride + 16 * g + r] = row 16g + r
// . a[t]. As with dot_fn, a token's result does not depend on n_tok or on the other tokens.
using gemm16_fn = void (*)(int64_t n, const void* w, size_t group_bytes, int64_t n_groups, const void* const* a, int n_tok,
                           float* y, int64_t y_stride);
// Prompt GEMM on the GGUF layout (the code book and float formats, which have no rows16 form): n_rows rows
// (row r at w + r * row_stride) times n_tok activation rows (1 <= n_tok <= max_gemm_rows_tokens):
// y[t * y_stride + r] = row r . a[t]. Each weight block is decoded once for several tokens, then goes
// through the dot kernel's own per-token operations, so every result is bitwise the dot kernel's.
inline constexpr int max_gemm_rows_tokens = 64;
using gemm_rows_fn = void (*)(int64_t n, const void* w, size_t row_stride, int64_t n_rows, const void* const* a, int n_tok,
                              float* y, int64_t y_stride);
// Quantizes n floats (a whole number of blocks) into an activation format.
using quantize_fn = void (*)(const float* x, void* dst, int64_t n);
// attn_tile of cpu/attention.hpp, per ISA.
using attn_tile_fn = void (*)(const kv_tile& kv, int64_t head_dim, const float* q, int n_rows, const int64_t* last_pos,
                              float scale, const attn_state& st);

// One V head's token buffers for the delta rule (cpu/delta_net.hpp): row t of each at ptr + t * stride.
struct delta_io {
    int d_k, d_v;
    const float* q; ptrdiff_t q_stride;  // [n_tok][d_k]
    const float* k; ptrdiff_t k_stride;  // [n_tok][d_k]
    const float* v; ptrdiff_t v_stride;  // [n_tok][d_v]
    const float* g; ptrdiff_t g_stride;  // [n_tok] scalars
    const float* beta; ptrdiff_t beta_stride;
    float* o; ptrdiff_t o_stride;        // [n_tok][d_v], written
    // The same buffers from token t on.
    delta_io from(int64_t t) const {
        delta_io r = *this;
        r.q += t * q_stride, r.k += t * k_stride, r.v += t * v_stride;
        r.g += t * g_stride, r.beta += t * beta_stride, r.o += t * o_stride;
        return r;
    }
};
// The sequential form over n_tok tokens; one chunk (1 <= n_tok <= chunk) of the chunked form, with
// scratch laid out as delta_net/layout.hpp says. S: [d_k][d_v].
using delta_seq_fn = void (*)(float* S, const delta_io& io, int n_tok);
using delta_chunk_fn = void (*)(float* S, const delta_io& io, int n_tok, int chunk, float* scratch);

struct isa_table {
    isa id = isa::scalar;
    dot_fn dot[n_type_ids] = {};        // indexed by ggml type id; nullptr: no kernel
    int dot_tokens[n_type_ids] = {};    // the most tokens dot[type] takes per call (<= max_dot_tokens)
    gemm16_fn gemm16[n_type_ids] = {};  // rows16 layout; nullptr: no kernel (never repacked)
    int gemm16_tokens[n_type_ids] = {};
    bool gemm16_fast[n_type_ids] = {};  // a SIMD kernel: repacking pays on this ISA
    gemm_rows_fn gemm_rows[n_type_ids] = {};  // GGUF layout, more tokens than dot_tokens; nullptr: dot only
    bool avx_vnni = false;              // the avx2 table's GEMM kernels use AVX-VNNI where they have a form for it
    quantize_fn quantize_q8_0 = nullptr;
    quantize_fn quantize_q8_1 = nullptr;
    quantize_fn quantize_q8_K = nullptr;
    void (*rms_norm)(const float* x, const float* weight, float eps, int64_t n, float* out) = nullptr;
    void (*silu_mul)(const float* gate, const float* up, int64_t n, float* out) = nullptr;
    void (*softmax)(float* x, int64_t n) = nullptr;
    void (*to_fp16)(const float* x, uint16_t* out, int64_t n) = nullptr;  // IEEE half, nearest-even
    void (*from_fp16)(const uint16_t* x, float* out, int64_t n) = nullptr;  // exact
    void (*qsa_scores)(const float* q, int n_head, int dim, const float* keys, int64_t n_groups, float scale,
                       float* scores) = nullptr;
    attn_tile_fn attn_tile = nullptr;
    delta_seq_fn delta_seq = nullptr;
    delta_chunk_fn delta_chunk = nullptr;
};

// The table of one ISA (built once, immutable afterwards). Throws std::runtime_error naming the
// ISAs this CPU has when it lacks `which`.
const isa_table& table_for(isa which);

// The table of the ISA chosen for this process (STRATA_FORCE_ISA or CPUID; logged once).
const isa_table& active_table();

// Parses a STRATA_FORCE_ISA value and checks the CPU has it; nullptr/empty means "best available".
// Throws std::runtime_error listing the valid names (and the ones this CPU supports).
isa choose_isa(const char* forced);

// The row loop behind matvec / matvec_multi / matmul, on an explicit table (tests use it per ISA).
// Tokens go to the dot kernel in groups of dot_tokens[type], tiles of 64 tokens per pass over the rows.
void run_rows(const isa_table& t, const matrix& w, int64_t row_begin, int64_t row_end, const void* act,
              size_t act_stride, int64_t n_tok, float* y, int64_t y_stride);

// Calls fn.template operator()<NT>() with NT = n_tok, for 1 <= n_tok <= Max: a kernel template's
// instantiation for a runtime token count.
template <int Max, class Fn>
inline void with_tokens(int n_tok, Fn&& fn) {
    [&]<int... I>(std::integer_sequence<int, I...>) {
        (void)((n_tok == I + 1 && (fn.template operator()<I + 1>(), true)) || ...);
    }(std::make_integer_sequence<int, Max>{});
}

// The dot kernels' form: K<n_tok>::run(n, w, a, out).
template <template <int> class K, int Max = 4>
inline void call_with_tokens(int64_t n, const void* w, const void* const* a, int n_tok, float* out) {
    with_tokens<Max>(n_tok, [&]<int NT>() { K<NT>::run(n, w, a, out); });
}

// ---- kernels per file (format first, ISA second) ----
#define STRATA_DOT(name) void name(int64_t n, const void* w, const void* const* a, int n_tok, float* out)

STRATA_DOT(dot_q4_k_avx2);
STRATA_DOT(dot_q4_k_avx512);
STRATA_DOT(dot_q6_k_avx2);
STRATA_DOT(dot_q6_k_avxvnni);
STRATA_DOT(dot_q6_k_avx512);
STRATA_DOT(dot_q8_0_avx2);
STRATA_DOT(dot_q8_0_avx512);
STRATA_DOT(dot_iq4_xs_avx2);
STRATA_DOT(dot_iq4_xs_avx512);
// The code book formats (iq/avx2.cpp).
STRATA_DOT(dot_iq2_xxs_avx2);
STRATA_DOT(dot_iq2_xs_avx2);
STRATA_DOT(dot_iq2_s_avx2);
STRATA_DOT(dot_iq3_xxs_avx2);
STRATA_DOT(dot_iq3_s_avx2);
STRATA_DOT(dot_iq1_s_avx2);
STRATA_DOT(dot_iq1_m_avx2);
STRATA_DOT(dot_mxfp4_avx2);
// The code book formats, AVX-512 (iq/avx512.cpp).
STRATA_DOT(dot_iq2_xxs_avx512);
STRATA_DOT(dot_iq2_xs_avx512);
STRATA_DOT(dot_iq2_s_avx512);
STRATA_DOT(dot_iq3_xxs_avx512);
STRATA_DOT(dot_iq3_s_avx512);
STRATA_DOT(dot_iq1_s_avx512);
STRATA_DOT(dot_iq1_m_avx512);
STRATA_DOT(dot_q5_k_avx2);
STRATA_DOT(dot_q5_k_avx512);
STRATA_DOT(dot_q2_k_avx2);
STRATA_DOT(dot_q3_k_avx2);
STRATA_DOT(dot_q4_0_avx2);
STRATA_DOT(dot_q4_1_avx2);
STRATA_DOT(dot_q5_0_avx2);
STRATA_DOT(dot_q5_1_avx2);
STRATA_DOT(dot_iq4_nl_avx2);
STRATA_DOT(dot_q4_0_avx512);
STRATA_DOT(dot_q4_1_avx512);
STRATA_DOT(dot_q5_0_avx512);
STRATA_DOT(dot_q5_1_avx512);
STRATA_DOT(dot_iq4_nl_avx512);
STRATA_DOT(dot_f32_avx2);
STRATA_DOT(dot_f16_avx2);
STRATA_DOT(dot_bf16_avx2);
STRATA_DOT(dot_f32_avx512);
STRATA_DOT(dot_f16_avx512);
STRATA_DOT(dot_bf16_avx512);
#undef STRATA_DOT

#define STRATA_GEMM16(name)                                                                                           \
    void name(int64_t n, const void* w, size_t group_bytes, int64_t n_groups, const void* const* a, int n_tok, float* y, \
              int64_t y_stride)
STRATA_GEMM16(gemm16_q4_k_scalar);
STRATA_GEMM16(gemm16_q8_0_scalar);
STRATA_GEMM16(gemm16_q4_k_avx512);
STRATA_GEMM16(gemm16_q8_0_avx512);
STRATA_GEMM16(gemm16_q5_k_scalar);
STRATA_GEMM16(gemm16_q6_k_scalar);
STRATA_GEMM16(gemm16_q5_k_avx512);
STRATA_GEMM16(gemm16_q6_k_avx512);
STRATA_GEMM16(gemm16_q4_0_scalar);
STRATA_GEMM16(gemm16_q4_1_scalar);
STRATA_GEMM16(gemm16_q5_0_scalar);
STRATA_GEMM16(gemm16_q5_1_scalar);
STRATA_GEMM16(gemm16_iq4_nl_scalar);
STRATA_GEMM16(gemm16_q4_0_avx512);
STRATA_GEMM16(gemm16_q4_1_avx512);
STRATA_GEMM16(gemm16_q5_0_avx512);
STRATA_GEMM16(gemm16_q5_1_avx512);
STRATA_GEMM16(gemm16_iq4_nl_avx512);
STRATA_GEMM16(gemm16_q4_k_avx2);
STRATA_GEMM16(gemm16_q5_k_avx2);
STRATA_GEMM16(gemm16_q6_k_avx2);
STRATA_GEMM16(gemm16_q6_k_avxvnni);
STRATA_GEMM16(gemm16_q8_0_avx2);
STRATA_GEMM16(gemm16_q4_0_avx2);
STRATA_GEMM16(gemm16_q4_1_avx2);
STRATA_GEMM16(gemm16_q5_0_avx2);
STRATA_GEMM16(gemm16_q5_1_avx2);
STRATA_GEMM16(gemm16_iq4_nl_avx2);
STRATA_GEMM16(gemm16_mxfp4_scalar);
STRATA_GEMM16(gemm16_mxfp4_avx2);
STRATA_GEMM16(gemm16_mxfp4_avx512);
STRATA_GEMM16(gemm16_q4_0_avxvnni);
STRATA_GEMM16(gemm16_q4_1_avxvnni);
STRATA_GEMM16(gemm16_q5_0_avxvnni);
STRATA_GEMM16(gemm16_q5_1_avxvnni);
STRATA_GEMM16(gemm16_iq4_nl_avxvnni);
STRATA_GEMM16(gemm16_mxfp4_avxvnni);
STRATA_GEMM16(gemm16_q4_k_avxvnni);
STRATA_GEMM16(gemm16_q5_k_avxvnni);
STRATA_GEMM16(gemm16_q8_0_avxvnni);
STRATA_GEMM16(gemm16_iq4_xs_scalar);
STRATA_GEMM16(gemm16_iq4_xs_avx2);
STRATA_GEMM16(gemm16_iq4_xs_avxvnni);
STRATA_GEMM16(gemm16_iq4_xs_avx512);
STRATA_GEMM16(gemm16_q2_k_scalar);
STRATA_GEMM16(gemm16_q3_k_scalar);
STRATA_GEMM16(gemm16_q2_k_avx2);
STRATA_GEMM16(gemm16_q3_k_avx2);
STRATA_GEMM16(gemm16_q2_k_avxvnni);
STRATA_GEMM16(gemm16_q3_k_avxvnni);
STRATA_GEMM16(gemm16_q2_k_avx512);
STRATA_GEMM16(gemm16_q3_k_avx512);
#undef STRATA_GEMM16

// The code book formats' prompt GEMM on the GGUF layout (iq/avx2.cpp, iq/avx512.cpp).
#define STRATA_GEMM_ROWS(name)                                                                                  \
    void name(int64_t n, const void* w, size_t row_stride, int64_t n_rows, const void* const* a, int n_tok, float* y, \
              int64_t y_stride)
STRATA_GEMM_ROWS(gemm_rows_iq2_xxs_avx2);
STRATA_GEMM_ROWS(gemm_rows_f32_avx512);
STRATA_GEMM_ROWS(gemm_rows_f16_avx512);
STRATA_GEMM_ROWS(gemm_rows_bf16_avx512);
STRATA_GEMM_ROWS(gemm_rows_iq2_xs_avx2);
STRATA_GEMM_ROWS(gemm_rows_iq2_s_avx2);
STRATA_GEMM_ROWS(gemm_rows_iq3_xxs_avx2);
STRATA_GEMM_ROWS(gemm_rows_iq3_s_avx2);
STRATA_GEMM_ROWS(gemm_rows_iq1_s_avx2);
STRATA_GEMM_ROWS(gemm_rows_iq1_m_avx2);
STRATA_GEMM_ROWS(gemm_rows_mxfp4_avx2);
STRATA_GEMM_ROWS(gemm_rows_iq2_xxs_avx512);
STRATA_GEMM_ROWS(gemm_rows_iq2_xs_avx512);
STRATA_GEMM_ROWS(gemm_rows_iq2_s_avx512);
STRATA_GEMM_ROWS(gemm_rows_iq3_xxs_avx512);
STRATA_GEMM_ROWS(gemm_rows_iq3_s_avx512);
STRATA_GEMM_ROWS(gemm_rows_iq1_s_avx512);
STRATA_GEMM_ROWS(gemm_rows_iq1_m_avx512);
#undef STRATA_GEMM_ROWS

// The rows16 layouts (kernels/cpu/repack.cpp). A Q4_K group block covers 256 columns of 16 rows:
//   d[16], dmin[16] (f16), sc[8][16], m[8][16] (sub-block j's 6-bit scale and min of row r, one byte each),
//   qs[32][16][4]: dword q of row r's GGUF qs (elements 64k + 4v + i in the low nibbles, 64k + 32 + 4v + i
//   in the high ones, q = 8k + v), so a 64-byte load gives 4 columns of 16 rows in both nibble halves.
// A Q8_0 group block covers 32 columns: d[16] (f16), qs[8][16][4] (dword v of row r, each byte + 128:
// unsigned for vpdpbusd; the kernels subtract 128 * sum(a) again).
struct block_q4_Kx16 {
    formats::fp16_t d[16], dmin[16];
    uint8_t sc[8][16], m[8][16];
    uint8_t qs[32][16][4];
};
static_assert(sizeof(block_q4_Kx16) == 16 * 148);
// Q5_K: Q4_K's group block plus qh[8][16][4]: dword v of row r's GGUF qh (bit j of byte 4v + i: the
// fifth bit of element 32j + 4v + i).
struct block_q5_Kx16 {
    formats::fp16_t d[16], dmin[16];
    uint8_t sc[8][16], m[8][16];
    uint8_t qh[8][16][4];
    uint8_t qs[32][16][4];
};
static_assert(sizeof(block_q5_Kx16) == 16 * 180);
// Q6_K: d[16] (f16), sc[16][16] (sub-block j's int8 scale of row r), ql[32][16][4] and qh[16][16][4]:
// dword q of row r's GGUF ql / qh, so ql dwords 16c + v and 16c + 8 + v with qh dword 8c + v give 4
// columns of 16 rows in the four quarters of the 128-element chunk c.
struct block_q6_Kx16 {
    formats::fp16_t d[16];
    int8_t sc[16][16];
    uint8_t ql[32][16][4];
    uint8_t qh[16][16][4];
};
static_assert(sizeof(block_q6_Kx16) == 16 * 210);
// IQ4_XS: d[16] (f16), sc[8][16] (sub-block j's scale of row r, the 6-bit code less 32), qs[32][16][4]:
// dword q of row r's GGUF qs (sub-block q / 4: elements 4 (q % 4) + i in the low nibbles, 16 + 4 (q % 4) + i
// in the high ones).
struct block_iq4_xsx16 {
    formats::fp16_t d[16];
    int8_t sc[8][16];
    uint8_t qs[32][16][4];
};
static_assert(sizeof(block_iq4_xsx16) == 16 * 138);
// Q2_K: d[16], dmin[16] (f16), scales[16][16] (sub-block j's GGUF scale byte of row r: scale in the low
// nibble, min in the high one), qs[16][16][4]: dword q of row r's GGUF qs (codes of elements
// 128 (q / 8) + 32k + 4 (q % 8) + i in bits 2k, 2k + 1 of byte i). The same bytes as the GGUF blocks.
struct block_q2_Kx16 {
    formats::fp16_t d[16], dmin[16];
    uint8_t scales[16][16];
    uint8_t qs[16][16][4];
};
static_assert(sizeof(block_q2_Kx16) == 16 * 84);
// Q3_K: d[16] (f16), sc[16][16] (sub-block j's scale of row r, the 6-bit code less 32), hmask[8][16][4]:
// dword v of row r's GGUF hmask (bit 4c + k of byte i: the third bit of element 128c + 32k + 4v + i),
// qs[16][16][4] as Q2_K's.
struct block_q3_Kx16 {
    formats::fp16_t d[16];
    int8_t sc[16][16];
    uint8_t hmask[8][16][4];
    uint8_t qs[16][16][4];
};
static_assert(sizeof(block_q3_Kx16) == 16 * 114);
struct block_q8_0x16 {
    formats::fp16_t d[16];
    uint8_t qs[8][16][4];
};
static_assert(sizeof(block_q8_0x16) == 16 * 34);
// The 32-element formats with nibbles (Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL): a group block covers 32 columns:
//   d[16] (f16), for the _1 formats m[16] (f16), for the 5-bit ones qh[8][8]: qh[2v + h] is a 64-bit
//   mask, bit 4r + i = the fifth bit of row r's element 16h + 4v + i,
//   qs[4][16][4]: dword v of row r's GGUF qs (elements 4v + i in the low nibbles, 16 + 4v + i in the
//   high ones), so a 64-byte load gives 4 columns of 16 rows in both nibble halves.
// Same bytes as the GGUF blocks. IQ4_NL shares Q4_0's layout (its codes index kvalues_iq4nl).
struct block_q4_0x16 {
    formats::fp16_t d[16];
    uint8_t qs[4][16][4];
};
static_assert(sizeof(block_q4_0x16) == 16 * 18);
struct block_q4_1x16 {
    formats::fp16_t d[16], m[16];
    uint8_t qs[4][16][4];
};
static_assert(sizeof(block_q4_1x16) == 16 * 20);
struct block_q5_0x16 {
    formats::fp16_t d[16];
    uint8_t qh[8][8];
    uint8_t qs[4][16][4];
};
static_assert(sizeof(block_q5_0x16) == 16 * 22);
struct block_q5_1x16 {
    formats::fp16_t d[16], m[16];
    uint8_t qh[8][8];
    uint8_t qs[4][16][4];
};
static_assert(sizeof(block_q5_1x16) == 16 * 24);
// MXFP4: e[16] (row r's E8M0 exponent), qs[4][16][4] as block_q4_0x16's (the codes index kvalues_mxfp4).
// Same bytes as the GGUF blocks.
struct block_mxfp4x16 {
    uint8_t e[16];
    uint8_t qs[4][16][4];
};
static_assert(sizeof(block_mxfp4x16) == 16 * 17);

void fill_scalar(isa_table& t);
void quantize_q8_0_avx2(const float* x, void* dst, int64_t n);
void quantize_q8_1_avx2(const float* x, void* dst, int64_t n);
void quantize_q8_K_avx2(const float* x, void* dst, int64_t n);
void rms_norm_avx2(const float* x, const float* weight, float eps, int64_t n, float* out);
void silu_mul_avx2(const float* gate, const float* up, int64_t n, float* out);
void softmax_avx2(float* x, int64_t n);
void to_fp16_avx2(const float* x, uint16_t* out, int64_t n);
void from_fp16_avx2(const uint16_t* x, float* out, int64_t n);
void qsa_scores_avx2(const float* q, int n_head, int dim, const float* keys, int64_t n_groups, float scale,
                     float* scores);

// Attention: every ISA's attn_tile computes a row's tile state from empty, then folds it in with this
// one merge (compiled once), which is what makes tile-by-tile and merged-later results bitwise equal.
void attn_merge_row(int64_t v_dim, float* max_a, float* sum_a, float* acc_a, float max_b, float sum_b,
                    const float* acc_b);
void attn_tile_scalar(const kv_tile& kv, int64_t head_dim, const float* q, int n_rows, const int64_t* last_pos,
                      float scale, const attn_state& st);
void attn_tile_avx2(const kv_tile& kv, int64_t head_dim, const float* q, int n_rows, const int64_t* last_pos,
                    float scale, const attn_state& st);
void attn_tile_avx512(const kv_tile& kv, int64_t head_dim, const float* q, int n_rows, const int64_t* last_pos,
                      float scale, const attn_state& st);

// Delta rule (delta_net/): the SIMD kernels take d_v a multiple of their vector width (8 / 16 floats) and
// pass other shapes to the scalar ones.
void delta_seq_scalar(float* S, const delta_io& io, int n_tok);
void delta_chunk_scalar(float* S, const delta_io& io, int n_tok, int chunk, float* scratch);
void delta_seq_avx2(float* S, const delta_io& io, int n_tok);
void delta_chunk_avx2(float* S, const delta_io& io, int n_tok, int chunk, float* scratch);
void delta_seq_avx512(float* S, const delta_io& io, int n_tok);
void delta_chunk_avx512(float* S, const delta_io& io, int n_tok, int chunk, float* scratch);

}  // namespace strata::kernels::cpu::detail
