// CPU kernels: quantized matvec / matmul per weight format, float matvec, and the small vector ops
// of a forward pass. One ISA path (scalar, AVX2, AVX-512) is chosen once per process from CPUID, or
// forced with STRATA_FORCE_ISA=scalar|avx2|avx512 (an exception names the valid ISAs if the CPU lacks
// the forced one); the choice is logged once on the "kernels" logger. STRATA_MAX_ISA=scalar|avx2 makes
// cpu_supports() report every path above the one named as missing (tests of a narrower CPU).
//
// Paths per weight format:
//   avx512 (F, BW, VL, DQ, VNNI): Q4_K, Q5_K, Q6_K, Q8_0, IQ4_XS, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, F32, F16,
//           BF16; the other formats (Q2_K, Q3_K, the IQ1 / IQ2 / IQ3 code book formats, MXFP4), the
//           activation quantizers and the vector ops use their AVX2 kernels on an AVX-512 CPU;
//   avx2 (+ FMA, F16C): Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_0, IQ4_XS, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, F32, F16, BF16,
//           IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, MXFP4,
//           Q8_0 / Q8_1 / Q8_K activation quantizers, rms_norm, silu_mul, softmax;
//   scalar: everything, through the formats' reference code.
// rope is scalar on every path (it is a few thousand floats per token).
// Prompt GEMM on repacked weights (weight_layout::rows16, repack_rows): AVX-512 VNNI and AVX2 kernels
// (the latter with AVX-VNNI's vpdpbusd for Q2_K, Q3_K, Q4_K, Q5_K, Q8_0 and IQ4_XS where CPUID has it, unless
// STRATA_NO_AVX_VNNI is set) for Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, IQ4_XS
// and MXFP4 (AVX-512: all but IQ4_XS, which takes the AVX2 table's kernel), all giving the same bits; the scalar
// path reads that layout through scalar kernels (can_repack says no there). On
// AVX2, can_repack says no for Q6_K: a repacked matrix also decodes through the GEMM kernel, which is
// slower there than the per-row one for a single token.
// The code book formats (IQ1_S .. IQ3_S, and MXFP4 where not repacked) have a prompt GEMM on the GGUF
// layout instead (AVX2 and AVX-512): each weight block decoded once per 64 tokens, bitwise the matvec's results.
//
// Threading: every function is single-threaded, reentrant and safe to call concurrently from many
// threads on disjoint outputs. Callers parallelise by row ranges (a pool slice owns [row_begin, row_end)).
//
// Shapes: a weight matrix has n_rows rows of n_cols elements of `type`; row r starts at
// data + r * row_stride bytes (row_stride >= formats::row_size(type, n_cols)). Activations are rows
// of n_cols elements in activation_type(type), act_stride bytes apart. Outputs are f32.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "formats/types.hpp"
#include "rope_params.hpp"

namespace strata::kernels::cpu {

using formats::ggml_type;

enum class isa { scalar, avx2, avx512 };

std::string_view isa_name(isa which);
bool cpu_supports(isa which);
// The ISA every function below uses (chosen at first use, then fixed).
isa active_isa();

// How far ahead of the block being read the kernels prefetch the weight stream: enough to cover DRAM
// latency at a thread's streaming rate (about 250 ns at 30 GB/s) on a loaded server or VM, where the
// hardware prefetchers alone fall well short of the read bandwidth.
inline constexpr int weight_prefetch_bytes = 8192;

// How a matrix's rows lie in memory.
//   rows:    row r at data + r * row_stride, in the GGUF block format;
//   rows16:  repacked (repack_rows below): groups of 16 rows interleaved block by block for the prompt
//            GEMM kernels, group g at data + 16 * g * row_stride; row ranges start and end on groups.
enum class weight_layout : uint8_t { rows, rows16 };
inline constexpr int64_t repack_group_rows = 16;

struct matrix {
    ggml_type type;
    const void* data;    // [n_rows][row_stride] bytes
    int64_t n_cols;      // elements per row, a multiple of the type's block size
    size_t row_stride;   // bytes between rows (rows16: a 16-row group's bytes / 16)
    weight_layout layout = weight_layout::rows;
};

// True where strata has a CPU dot product for weights of `type` (every quantized format that
// formats::vec_dot_ref supports, plus F32, F16, BF16).
bool has_matvec(ggml_type type);

// The activation format that weights of `type` multiply (Q8_0, Q8_1, Q8_K, or F32 for float weights)
// and the bytes of one activation row of n_cols elements.
ggml_type activation_type(ggml_type weight_type);
size_t activation_row_size(ggml_type weight_type, int64_t n_cols);
// x: [n_cols] f32 -> dst: activation_row_size(weight_type, n_cols) bytes. Bitwise equal to
// formats::quantize_row(activation_type(weight_type), ...) on every ISA (F32: a copy).
void quantize_activation(ggml_type weight_type, const float* x, void* dst, int64_t n_cols);

// y[r - row_begin] = W[r, :] . act for r in [row_begin, row_end).
// act: one activation row; y: [row_end - row_begin].
void matvec(const matrix& w, int64_t row_begin, int64_t row_end, const void* act, float* y);

// The same rows times n_tok activations (1 <= n_tok <= 16), reading each weight row once:
// y[t * y_stride + (r - row_begin)] = W[r, :] . act_t, act_t at act + t * act_stride.
// Bitwise equal to n_tok matvec calls on the same ISA.
inline constexpr int max_matvec_tokens = 16;
void matvec_multi(const matrix& w, int64_t row_begin, int64_t row_end, const void* act, size_t act_stride,
                  int n_tok, float* y, int64_t y_stride);

// Starts reading the first weight_prefetch_bytes of rows [row_begin, row_end) (software prefetch). The
// kernels prefetch that far ahead of the block they read, so without it a call's first lines arrive one
// miss at a time; a caller that knows its next rows (an expert's gate and up) starts them together.
void prefetch_rows(const matrix& w, int64_t row_begin, int64_t row_end);

// Prompt processing: any n_tok, same layout as matvec_multi; tiles tokens so a block of weight rows
// stays in cache while every token of the tile passes over it. Bitwise equal to matvec per token.
void matmul(const matrix& w, int64_t row_begin, int64_t row_end, const void* act, size_t act_stride,
            int64_t n_tok, float* y, int64_t y_stride);

// Repacking for prompt batches: true where the active ISA has a GEMM kernel for `type` in the rows16
// layout (AVX-512: Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, IQ4_XS) and n_rows is a
// whole number of groups.
bool can_repack(ggml_type type, int64_t n_rows);
// Bytes per row of the rows16 layout (a group of 16 rows takes 16 times that): Q8_0 the GGUF row size,
// Q4_K 148 bytes per 256 elements instead of 144 (scales and mins unpacked to bytes), Q5_K 180 instead of
// 176, Q3_K 114 instead of 110, IQ4_XS 138 instead of 136, the others the GGUF row size. Throws for a type
// without a rows16 layout.
size_t repacked_row_stride(ggml_type type, int64_t n_cols);
// src: n_rows rows (a multiple of 16) in the GGUF layout, src_stride bytes apart -> dst: n_rows *
// repacked_row_stride(type, n_cols) bytes in the rows16 layout. Exact (no value changes), any ISA.
void repack_rows(ggml_type type, const void* src, size_t src_stride, int64_t n_rows, int64_t n_cols, void* dst);
// The way back: n_rows rows in the rows16 layout at src -> the GGUF layout, row r at dst + r * dst_stride.
void unpack_rows(ggml_type type, const void* src, int64_t n_rows, int64_t n_cols, void* dst, size_t dst_stride);

// out[i] = x[i] / sqrt(mean(x^2) + eps) * weight[i]; weight may be nullptr (no scale). out may be x.
void rms_norm(const float* x, const float* weight, float eps, int64_t n, float* out);
// out[i] = silu(gate[i]) * up[i], silu(g) = g / (1 + exp(-g)). out may alias gate or up.
void silu_mul(const float* gate, const float* up, int64_t n, float* out);
// In place: x = exp(x - max) / sum.
void softmax(float* x, int64_t n);
// out = x as IEEE halves, rounded to nearest even (F16C where the path has it; bitwise the same as
// formats::fp32_to_fp16 on every path, NaN and overflow included).
void to_fp16(const float* x, uint16_t* out, int64_t n);
// out = x (IEEE halves) as floats: exact, bitwise formats::fp16_to_fp32 on every path.
void from_fp16(const uint16_t* x, float* out, int64_t n);
// QSA indexer scores over block keys stored qsa_group blocks to a group, keys [group][dim][qsa_group]:
// scores[g * qsa_group + j] = scale * sum over heads h in order of max(q[h] . key, 0), q [n_head][dim],
// each dot one fused multiply-add chain over the dims in order: bitwise the same on every ISA.
constexpr int qsa_group = 16;
void qsa_scores(const float* q, int n_head, int dim, const float* keys, int64_t n_groups, float scale, float* scores);

// Rotary embedding in place on x: [n_head][head_dim] for token position pos, rotating the first
// n_rot dims of each head (n_rot even, <= head_dim). Pair i turns by theta_i = pos * freq_base^(-2i / n_rot),
// scaled as ggml_rope_ext does: times freq_scale (linear), mixed back towards the unscaled angle on
// YaRN's high-frequency dims (ext_factor), and cos/sin times rope_mscale(p). Default params: plain RoPE.
// normal: pairs (x[2i], x[2i+1]) (GPT-J / LLaMA GGUF layout); neox: pairs (x[i], x[i + n_rot/2]).
enum class rope_style { normal, neox };
void rope(float* x, int64_t n_head, int64_t head_dim, int64_t n_rot, int64_t pos, const rope_params& p,
          rope_style style);
// rope() in two steps, for many heads or layers at one position: rope_angles fills cos_sin[0, n_rot/2)
// with the pairs' scaled cosines and [n_rot/2, n_rot) with their sines; rope_apply turns x by them.
// Bitwise the same as rope().
void rope_angles(int64_t n_rot, int64_t pos, const rope_params& p, float* cos_sin);
void rope_apply(float* x, int64_t n_head, int64_t head_dim, int64_t n_rot, const float* cos_sin, rope_style style);

}  // namespace strata::kernels::cpu
