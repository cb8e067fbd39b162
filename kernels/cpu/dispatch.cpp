// ISA choice (once, from CPUID or STRATA_FORCE_ISA), the per-ISA kernel tables, and the row loops
// that every matvec / matmul shape goes through.
#include <cpuid.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

#include "cpu/detail/kernel_table.hpp"
#include "formats/quant.hpp"
#include "log.hpp"

namespace strata::kernels::cpu {
namespace detail {

using formats::ggml_type;

static void set_dot(isa_table& t, ggml_type type, dot_fn fn, int tokens = 4) {
    t.dot[static_cast<size_t>(type)] = fn;
    t.dot_tokens[static_cast<size_t>(type)] = tokens;
}

// The rows16 GEMM kernels: `fast` marks a SIMD kernel (repacking at load pays); the scalar ones on
// every ISA keep a repacked matrix usable whatever the ISA.
static void set_gemm16(isa_table& t, ggml_type type, gemm16_fn fn, int tokens, bool fast) {
    t.gemm16[static_cast<size_t>(type)] = fn;
    t.gemm16_tokens[static_cast<size_t>(type)] = tokens;
    t.gemm16_fast[static_cast<size_t>(type)] = fast;
}

// AVX-VNNI (CPUID leaf 7 subleaf 1, EAX bit 4), unless STRATA_NO_AVX_VNNI is set (to measure the AVX2
// CPUs without it on one that has it).
static bool use_avx_vnni() {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    const char* off = std::getenv("STRATA_NO_AVX_VNNI");
    return (off == nullptr || *off == '\0') && __get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) && (eax & (1u << 4)) != 0;
}

// The AVX2 prompt GEMM kernels (4 tokens per call: 16 registers; 8 for plain AVX2's Q4_K, Q5_K, Q8_0,
// Q5_0, Q5_1, IQ4_NL, MXFP4, IQ4_XS, Q2_K and Q3_K, which hold decoded codes while the tokens pass over
// them; Q4_0 and Q4_1 decode so cheaply that 8 tokens' accumulators beside their codes measured slower);
// where the CPU has AVX-VNNI, its vpdpbusd for the formats where it saves the most and for the 32-element
// nibble formats and MXFP4, where it measured at par or faster, and its vpdpwssd for Q6_K (the same bits
// either way). A repacked matrix also decodes through its GEMM kernel (one token), so a format is
// repacked only where that form reads DRAM as fast as the per-row kernel: every format here, Q6_K
// included (its GEMM form's compute ceiling is above the dot kernel's, and its prompts run a third faster).
static void fill_avx2_gemm(isa_table& t) {
    const bool vnni = use_avx_vnni();
    set_gemm16(t, ggml_type::Q4_K, gemm16_q4_k_avx2, 8, true);
    set_gemm16(t, ggml_type::Q5_K, gemm16_q5_k_avx2, 8, true);
    set_gemm16(t, ggml_type::Q6_K, gemm16_q6_k_avx2, 4, true);
    set_gemm16(t, ggml_type::Q8_0, gemm16_q8_0_avx2, 8, true);
    set_gemm16(t, ggml_type::Q4_0, gemm16_q4_0_avx2, 4, true);
    set_gemm16(t, ggml_type::Q4_1, gemm16_q4_1_avx2, 4, true);
    set_gemm16(t, ggml_type::Q5_0, gemm16_q5_0_avx2, 8, true);
    set_gemm16(t, ggml_type::Q5_1, gemm16_q5_1_avx2, 8, true);
    set_gemm16(t, ggml_type::IQ4_NL, gemm16_iq4_nl_avx2, 8, true);
    set_gemm16(t, ggml_type::MXFP4, gemm16_mxfp4_avx2, 8, true);
    set_gemm16(t, ggml_type::IQ4_XS, gemm16_iq4_xs_avx2, 8, true);
    set_gemm16(t, ggml_type::Q2_K, gemm16_q2_k_avx2, 8, true);
    set_gemm16(t, ggml_type::Q3_K, gemm16_q3_k_avx2, 8, true);
    if (!vnni) return;
    t.avx_vnni = true;
    set_dot(t, ggml_type::Q6_K, dot_q6_k_avxvnni);  // vpdpwssd: the scale step and its sum in one (same bits)
    set_gemm16(t, ggml_type::Q4_K, gemm16_q4_k_avxvnni, 4, true);
    set_gemm16(t, ggml_type::Q5_K, gemm16_q5_k_avxvnni, 4, true);
    set_gemm16(t, ggml_type::Q6_K, gemm16_q6_k_avxvnni, 4, true);
    set_gemm16(t, ggml_type::Q8_0, gemm16_q8_0_avxvnni, 4, true);
    set_gemm16(t, ggml_type::IQ4_XS, gemm16_iq4_xs_avxvnni, 4, true);
    set_gemm16(t, ggml_type::Q2_K, gemm16_q2_k_avxvnni, 4, true);
    set_gemm16(t, ggml_type::Q3_K, gemm16_q3_k_avxvnni, 4, true);
    set_gemm16(t, ggml_type::Q4_0, gemm16_q4_0_avxvnni, 4, true);
    set_gemm16(t, ggml_type::Q4_1, gemm16_q4_1_avxvnni, 4, true);
    set_gemm16(t, ggml_type::Q5_0, gemm16_q5_0_avxvnni, 8, true);
    set_gemm16(t, ggml_type::Q5_1, gemm16_q5_1_avxvnni, 8, true);
    set_gemm16(t, ggml_type::IQ4_NL, gemm16_iq4_nl_avxvnni, 8, true);
    set_gemm16(t, ggml_type::MXFP4, gemm16_mxfp4_avxvnni, 8, true);
}

// The code book formats' prompt GEMM on the GGUF layout (each weight block decoded once per 64 tokens).
static void fill_avx2_gemm_rows(isa_table& t) {
    t.gemm_rows[static_cast<size_t>(ggml_type::IQ2_XXS)] = gemm_rows_iq2_xxs_avx2;
    t.gemm_rows[static_cast<size_t>(ggml_type::IQ2_XS)] = gemm_rows_iq2_xs_avx2;
    t.gemm_rows[static_cast<size_t>(ggml_type::IQ2_S)] = gemm_rows_iq2_s_avx2;
    t.gemm_rows[static_cast<size_t>(ggml_type::IQ3_XXS)] = gemm_rows_iq3_xxs_avx2;
    t.gemm_rows[static_cast<size_t>(ggml_type::IQ3_S)] = gemm_rows_iq3_s_avx2;
    t.gemm_rows[static_cast<size_t>(ggml_type::IQ1_S)] = gemm_rows_iq1_s_avx2;
    t.gemm_rows[static_cast<size_t>(ggml_type::IQ1_M)] = gemm_rows_iq1_m_avx2;
    t.gemm_rows[static_cast<size_t>(ggml_type::MXFP4)] = gemm_rows_mxfp4_avx2;
}

// The same for the code book formats on AVX-512, and the float formats' (4 rows at a time, each weight step
// loaded once for 3 tokens; on AVX2 a 2-row form measured no faster than the dot kernel, so it keeps that).
static void fill_avx512_gemm_rows(isa_table& t) {
    t.gemm_rows[static_cast<size_t>(ggml_type::IQ2_XXS)] = gemm_rows_iq2_xxs_avx512;
    t.gemm_rows[static_cast<size_t>(ggml_type::IQ2_XS)] = gemm_rows_iq2_xs_avx512;
    t.gemm_rows[static_cast<size_t>(ggml_type::IQ2_S)] = gemm_rows_iq2_s_avx512;
    t.gemm_rows[static_cast<size_t>(ggml_type::IQ3_XXS)] = gemm_rows_iq3_xxs_avx512;
    t.gemm_rows[static_cast<size_t>(ggml_type::IQ3_S)] = gemm_rows_iq3_s_avx512;
    t.gemm_rows[static_cast<size_t>(ggml_type::IQ1_S)] = gemm_rows_iq1_s_avx512;
    t.gemm_rows[static_cast<size_t>(ggml_type::IQ1_M)] = gemm_rows_iq1_m_avx512;
    t.gemm_rows[static_cast<size_t>(ggml_type::F32)] = gemm_rows_f32_avx512;
    t.gemm_rows[static_cast<size_t>(ggml_type::F16)] = gemm_rows_f16_avx512;
    t.gemm_rows[static_cast<size_t>(ggml_type::BF16)] = gemm_rows_bf16_avx512;
}

static void fill_avx2(isa_table& t) {
    set_dot(t, ggml_type::Q4_K, dot_q4_k_avx2);
    set_dot(t, ggml_type::Q6_K, dot_q6_k_avx2);
    set_dot(t, ggml_type::Q8_0, dot_q8_0_avx2);
    set_dot(t, ggml_type::IQ4_XS, dot_iq4_xs_avx2);
    set_dot(t, ggml_type::Q5_K, dot_q5_k_avx2);
    set_dot(t, ggml_type::Q2_K, dot_q2_k_avx2);
    set_dot(t, ggml_type::Q3_K, dot_q3_k_avx2);
    set_dot(t, ggml_type::Q4_0, dot_q4_0_avx2);
    set_dot(t, ggml_type::Q4_1, dot_q4_1_avx2);
    set_dot(t, ggml_type::Q5_0, dot_q5_0_avx2);
    set_dot(t, ggml_type::Q5_1, dot_q5_1_avx2);
    set_dot(t, ggml_type::IQ4_NL, dot_iq4_nl_avx2);
    set_dot(t, ggml_type::F32, dot_f32_avx2);
    set_dot(t, ggml_type::F16, dot_f16_avx2);
    set_dot(t, ggml_type::BF16, dot_bf16_avx2);
    // The code book formats and MXFP4 (MXFP4's also on AVX-512 CPUs: a 512-bit form measured no faster).
    set_dot(t, ggml_type::IQ2_XXS, dot_iq2_xxs_avx2);
    set_dot(t, ggml_type::IQ2_XS, dot_iq2_xs_avx2);
    set_dot(t, ggml_type::IQ2_S, dot_iq2_s_avx2);
    set_dot(t, ggml_type::IQ3_XXS, dot_iq3_xxs_avx2);
    set_dot(t, ggml_type::IQ3_S, dot_iq3_s_avx2);
    set_dot(t, ggml_type::IQ1_S, dot_iq1_s_avx2);
    set_dot(t, ggml_type::IQ1_M, dot_iq1_m_avx2);
    set_dot(t, ggml_type::MXFP4, dot_mxfp4_avx2);
    fill_avx2_gemm_rows(t);
    t.quantize_q8_0 = quantize_q8_0_avx2;
    t.quantize_q8_1 = quantize_q8_1_avx2;
    t.quantize_q8_K = quantize_q8_K_avx2;
    t.rms_norm = rms_norm_avx2;
    t.silu_mul = silu_mul_avx2;
    t.softmax = softmax_avx2;
    t.to_fp16 = to_fp16_avx2;
    t.from_fp16 = from_fp16_avx2;
    t.qsa_scores = qsa_scores_avx2;
    t.attn_tile = attn_tile_avx2;
    t.delta_seq = delta_seq_avx2;
    t.delta_chunk = delta_chunk_avx2;
    fill_avx2_gemm(t);
}

// AVX-512 overrides the formats where 512-bit code pays (8 tokens per dot call with 32 registers); the other formats,
// the activation quantizers and the vector ops keep their AVX2 kernels.
static void fill_avx512(isa_table& t) {
    set_dot(t, ggml_type::Q4_K, dot_q4_k_avx512, 8);
    set_dot(t, ggml_type::Q5_K, dot_q5_k_avx512, 8);
    set_dot(t, ggml_type::Q6_K, dot_q6_k_avx512, 8);
    set_dot(t, ggml_type::Q8_0, dot_q8_0_avx512, 8);
    set_dot(t, ggml_type::IQ4_XS, dot_iq4_xs_avx512, 8);
    set_dot(t, ggml_type::Q4_0, dot_q4_0_avx512, 8);
    set_dot(t, ggml_type::Q4_1, dot_q4_1_avx512, 8);
    set_dot(t, ggml_type::Q5_0, dot_q5_0_avx512, 8);
    set_dot(t, ggml_type::Q5_1, dot_q5_1_avx512, 8);
    set_dot(t, ggml_type::IQ4_NL, dot_iq4_nl_avx512, 8);
    set_dot(t, ggml_type::F32, dot_f32_avx512, 8);
    set_dot(t, ggml_type::F16, dot_f16_avx512, 8);
    set_dot(t, ggml_type::BF16, dot_bf16_avx512, 8);
    set_dot(t, ggml_type::IQ2_XXS, dot_iq2_xxs_avx512, 8);
    set_dot(t, ggml_type::IQ2_XS, dot_iq2_xs_avx512, 8);
    set_dot(t, ggml_type::IQ2_S, dot_iq2_s_avx512, 8);
    set_dot(t, ggml_type::IQ3_XXS, dot_iq3_xxs_avx512, 8);
    set_dot(t, ggml_type::IQ3_S, dot_iq3_s_avx512, 8);
    set_dot(t, ggml_type::IQ1_S, dot_iq1_s_avx512, 8);
    set_dot(t, ggml_type::IQ1_M, dot_iq1_m_avx512, 8);
    fill_avx512_gemm_rows(t);
    set_gemm16(t, ggml_type::Q4_K, gemm16_q4_k_avx512, 8, true);
    set_gemm16(t, ggml_type::Q5_K, gemm16_q5_k_avx512, 8, true);
    set_gemm16(t, ggml_type::Q6_K, gemm16_q6_k_avx512, 8, true);
    set_gemm16(t, ggml_type::Q8_0, gemm16_q8_0_avx512, 8, true);
    set_gemm16(t, ggml_type::Q4_0, gemm16_q4_0_avx512, 8, true);
    set_gemm16(t, ggml_type::Q4_1, gemm16_q4_1_avx512, 8, true);
    set_gemm16(t, ggml_type::Q5_0, gemm16_q5_0_avx512, 8, true);
    set_gemm16(t, ggml_type::Q5_1, gemm16_q5_1_avx512, 8, true);
    set_gemm16(t, ggml_type::IQ4_NL, gemm16_iq4_nl_avx512, 8, true);
    set_gemm16(t, ggml_type::MXFP4, gemm16_mxfp4_avx512, 8, true);
    set_gemm16(t, ggml_type::Q2_K, gemm16_q2_k_avx512, 8, true);
    set_gemm16(t, ggml_type::Q3_K, gemm16_q3_k_avx512, 8, true);
    set_gemm16(t, ggml_type::IQ4_XS, gemm16_iq4_xs_avx512, 8, true);
    t.attn_tile = attn_tile_avx512;
    t.delta_seq = delta_seq_avx512;
    t.delta_chunk = delta_chunk_avx512;
}

static isa_table build_table(isa which) {
    isa_table t;
    t.id = which;
    fill_scalar(t);
    set_gemm16(t, ggml_type::Q4_K, gemm16_q4_k_scalar, max_dot_tokens, false);
    set_gemm16(t, ggml_type::Q5_K, gemm16_q5_k_scalar, max_dot_tokens, false);
    set_gemm16(t, ggml_type::Q6_K, gemm16_q6_k_scalar, max_dot_tokens, false);
    set_gemm16(t, ggml_type::Q8_0, gemm16_q8_0_scalar, max_dot_tokens, false);
    set_gemm16(t, ggml_type::Q4_0, gemm16_q4_0_scalar, max_dot_tokens, false);
    set_gemm16(t, ggml_type::Q4_1, gemm16_q4_1_scalar, max_dot_tokens, false);
    set_gemm16(t, ggml_type::Q5_0, gemm16_q5_0_scalar, max_dot_tokens, false);
    set_gemm16(t, ggml_type::Q5_1, gemm16_q5_1_scalar, max_dot_tokens, false);
    set_gemm16(t, ggml_type::IQ4_NL, gemm16_iq4_nl_scalar, max_dot_tokens, false);
    set_gemm16(t, ggml_type::MXFP4, gemm16_mxfp4_scalar, max_dot_tokens, false);
    set_gemm16(t, ggml_type::IQ4_XS, gemm16_iq4_xs_scalar, max_dot_tokens, false);
    set_gemm16(t, ggml_type::Q2_K, gemm16_q2_k_scalar, max_dot_tokens, false);
    set_gemm16(t, ggml_type::Q3_K, gemm16_q3_k_scalar, max_dot_tokens, false);
    if (which == isa::avx2 || which == isa::avx512) fill_avx2(t);
    if (which == isa::avx512) fill_avx512(t);
    return t;
}

static std::string supported_list() {
    std::string s;
    for (isa i : {isa::scalar, isa::avx2, isa::avx512})
        if (cpu_supports(i)) s += (s.empty() ? "" : ", ") + std::string(isa_name(i));
    return s;
}

const isa_table& table_for(isa which) {
    static const isa_table tables[3] = {build_table(isa::scalar), build_table(isa::avx2), build_table(isa::avx512)};
    if (!cpu_supports(which))
        throw std::runtime_error("CPU kernels: this CPU lacks the " + std::string(isa_name(which)) +
                                 " path; it supports: " + supported_list() + ".");
    return tables[static_cast<int>(which)];
}

isa choose_isa(const char* forced) {
    if (forced == nullptr || *forced == '\0') {
        for (isa i : {isa::avx512, isa::avx2})
            if (cpu_supports(i)) return i;
        return isa::scalar;
    }
    for (isa i : {isa::scalar, isa::avx2, isa::avx512}) {
        if (isa_name(i) != forced) continue;
        if (!cpu_supports(i))
            throw std::runtime_error("STRATA_FORCE_ISA=" + std::string(forced) +
                                     " but this CPU lacks it (or STRATA_MAX_ISA excludes it); valid here: " +
                                     supported_list() + ".");
        return i;
    }
    throw std::runtime_error("STRATA_FORCE_ISA=" + std::string(forced) +
                             " is not an ISA strata knows; use one of scalar, avx2, avx512 (this CPU supports: " +
                             supported_list() + ").");
}

const isa_table& active_table() {
    static const isa_table* const table = [] {
        const char* forced = std::getenv("STRATA_FORCE_ISA");
        const isa chosen = choose_isa(forced);
        const isa_table& t = table_for(chosen);
        logger("kernels")->info("CPU kernels use the {} path{} ({}; this CPU supports: {}).", isa_name(chosen),
                                chosen == isa::avx2 && t.avx_vnni ? " with AVX-VNNI prompt GEMM kernels" : "",
                                forced && *forced ? "forced by STRATA_FORCE_ISA" : "chosen from CPUID",
                                supported_list());
        return &t;
    }();
    return *table;
}

static dot_fn dot_for(const isa_table& t, const matrix& w) {
    const auto id = static_cast<size_t>(w.type);
    if (id >= n_type_ids || t.dot[id] == nullptr)
        throw std::invalid_argument("CPU kernels: no matvec for weight type " +
                                    std::string(formats::info(w.type).name) + ".");
    if (w.n_cols % formats::info(w.type).block_size != 0)
        throw std::invalid_argument("CPU kernels: n_cols " + std::to_string(w.n_cols) + " is not a multiple of " +
                                    std::string(formats::info(w.type).name) + "'s block size " +
                                    std::to_string(formats::info(w.type).block_size) + ".");
    return t.dot[id];
}

// Tiling of the row loop (for several tokens; one token simply streams the rows):
//   token tile: 64 activation rows, ~300 KiB for 4096 columns of Q8_K, stay in L2;
//   row tile:   ~128 KiB of weight rows stay in L2 while every group of dot_tokens[type] tokens of the
//               token tile passes over them, and each group's activations (~19 KiB) stay in L1.
// The dot call for a (row, token group) pair is the same whatever the tiling, so results are bitwise
// independent of it (and of n_tok).
static constexpr int64_t token_tile = 64;
static constexpr size_t row_tile_bytes = size_t{128} << 10;
static constexpr int64_t min_tile_groups = 4;

// The rows16 layout: the same token tiles, row tiles of whole groups, the GEMM kernel over the row
// tile's groups for each group of gemm16_tokens[type] tokens. A tile has at least min_tile_groups groups:
// a kernel call prepares its tokens' activation terms once (Q8_0's and the legacy formats' block sums),
// which a call over a single group of wide rows would spend much of its time on.
static void run_groups(const isa_table& t, const matrix& w, int64_t row_begin, int64_t row_end, const void* act,
                       size_t act_stride, int64_t n_tok, float* y, int64_t y_stride) {
    const auto id = static_cast<size_t>(w.type);
    if (id >= n_type_ids || t.gemm16[id] == nullptr)
        throw std::invalid_argument("CPU kernels: no kernel for repacked " + std::string(formats::info(w.type).name) +
                                    " weights.");
    if (row_begin < 0 || row_begin > row_end || n_tok < 0 || row_begin % repack_group_rows != 0 ||
        row_end % repack_group_rows != 0)
        throw std::invalid_argument("CPU kernels: repacked rows [" + std::to_string(row_begin) + ", " +
                                    std::to_string(row_end) + ") do not start and end on groups of 16, or bad token count " +
                                    std::to_string(n_tok) + ".");
    const gemm16_fn gemm = t.gemm16[id];
    const int group = t.gemm16_tokens[id];
    const size_t group_bytes = repack_group_rows * w.row_stride;
    const auto* base = static_cast<const uint8_t*>(w.data);
    const auto* act_base = static_cast<const uint8_t*>(act);
    const int64_t groups_per_tile = std::max<int64_t>(min_tile_groups, static_cast<int64_t>(row_tile_bytes / group_bytes));
    const void* act_rows[token_tile];
    for (int64_t t0 = 0; t0 < n_tok; t0 += token_tile) {
        const int64_t n_tile = std::min(token_tile, n_tok - t0);
        for (int64_t i = 0; i < n_tile; ++i) act_rows[i] = act_base + (t0 + i) * act_stride;
        for (int64_t g0 = row_begin / repack_group_rows; g0 < row_end / repack_group_rows; g0 += groups_per_tile) {
            const int64_t n_groups = std::min(groups_per_tile, row_end / repack_group_rows - g0);
            for (int64_t g = 0; g < n_tile; g += group) {
                const int k = static_cast<int>(std::min<int64_t>(group, n_tile - g));
                gemm(w.n_cols, base + static_cast<size_t>(g0) * group_bytes, group_bytes, n_groups, act_rows + g, k,
                     y + (t0 + g) * y_stride + (g0 * repack_group_rows - row_begin), y_stride);
            }
        }
    }
}

void run_rows(const isa_table& t, const matrix& w, int64_t row_begin, int64_t row_end, const void* act,
              size_t act_stride, int64_t n_tok, float* y, int64_t y_stride) {
    if (w.layout == weight_layout::rows16) {
        run_groups(t, w, row_begin, row_end, act, act_stride, n_tok, y, y_stride);
        return;
    }
    const dot_fn dot = dot_for(t, w);
    const int group = t.dot_tokens[static_cast<size_t>(w.type)];
    if (row_begin < 0 || row_begin > row_end || n_tok < 0)
        throw std::invalid_argument("CPU kernels: bad row range [" + std::to_string(row_begin) + ", " +
                                    std::to_string(row_end) + ") or token count " + std::to_string(n_tok) + ".");
    const auto* base = static_cast<const uint8_t*>(w.data);
    const auto* act_base = static_cast<const uint8_t*>(act);
    const int64_t row_tile =
        std::max<int64_t>(1, static_cast<int64_t>(row_tile_bytes / std::max<size_t>(1, formats::row_size(w.type, w.n_cols))));
    const void* act_rows[token_tile];  // act_rows[i]: activation row of token t0 + i
    static_assert(token_tile <= max_gemm_rows_tokens);
    const gemm_rows_fn gemm = t.gemm_rows[static_cast<size_t>(w.type)];
    for (int64_t t0 = 0; t0 < n_tok; t0 += token_tile) {
        const int64_t n_tile = std::min(token_tile, n_tok - t0);
        for (int64_t i = 0; i < n_tile; ++i) act_rows[i] = act_base + (t0 + i) * act_stride;
        if (gemm != nullptr && n_tile > group) {  // the same bits as the dot kernel, each block decoded once
            gemm(w.n_cols, base + row_begin * w.row_stride, w.row_stride, row_end - row_begin, act_rows,
                 static_cast<int>(n_tile), y + t0 * y_stride, y_stride);
            continue;
        }
        for (int64_t r0 = row_begin; r0 < row_end; r0 += row_tile) {
            const int64_t r1 = std::min(row_end, r0 + row_tile);
            for (int64_t g = 0; g < n_tile; g += group) {
                const int k = static_cast<int>(std::min<int64_t>(group, n_tile - g));
                // Token t0 + g + i, row r goes to y[(t0 + g + i) * y_stride + (r - row_begin)].
                float* y_group = y + (t0 + g) * y_stride;
                for (int64_t r = r0; r < r1; ++r) {
                    float out[max_dot_tokens];
                    dot(w.n_cols, base + r * w.row_stride, act_rows + g, k, out);
                    for (int i = 0; i < k; ++i) y_group[i * y_stride + (r - row_begin)] = out[i];
                }
            }
        }
    }
}

}  // namespace detail

void prefetch_rows(const matrix& w, int64_t row_begin, int64_t row_end) {
    if (row_end <= row_begin) return;
    // Both layouts keep a row range contiguous (rows16: ranges start and end on whole groups).
    const auto* p = static_cast<const char*>(w.data) + static_cast<size_t>(row_begin) * w.row_stride;
    const size_t n = std::min(static_cast<size_t>(row_end - row_begin) * w.row_stride, static_cast<size_t>(weight_prefetch_bytes));
    for (size_t offset = 0; offset < n; offset += 64) __builtin_prefetch(p + offset, 0, 3);
}

std::string_view isa_name(isa which) {
    switch (which) {
        case isa::scalar: return "scalar";
        case isa::avx2: return "avx2";
        case isa::avx512: return "avx512";
    }
    return "unknown";
}

// F16C from CPUID leaf 1 (ECX bit 29): clang 14's __builtin_cpu_supports does not know "f16c".
static bool cpu_has_f16c() {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    return __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C) != 0;
}

// STRATA_MAX_ISA=scalar|avx2|avx512 caps what cpu_supports reports (read once), so a wide CPU runs
// what a narrower one runs: the ISAs above it are missing, not merely unchosen (STRATA_FORCE_ISA).
static isa max_isa() {
    static const isa cap = [] {
        const char* v = std::getenv("STRATA_MAX_ISA");
        if (v == nullptr || *v == '\0') return isa::avx512;
        for (isa i : {isa::scalar, isa::avx2, isa::avx512})
            if (isa_name(i) == v) return i;
        throw std::runtime_error("STRATA_MAX_ISA=" + std::string(v) +
                                 " is not an ISA strata knows; use one of scalar, avx2, avx512.");
    }();
    return cap;
}

bool cpu_supports(isa which) {
    if (static_cast<int>(which) > static_cast<int>(max_isa())) return false;
    switch (which) {
        case isa::scalar: return true;
        case isa::avx2:
            return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_has_f16c();
        case isa::avx512:
            return cpu_supports(isa::avx2) && __builtin_cpu_supports("avx512f") &&
                   __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
                   __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vnni") &&
                   __builtin_cpu_supports("bmi2");
    }
    return false;
}

isa active_isa() { return detail::active_table().id; }

bool has_matvec(ggml_type type) {
    const auto id = static_cast<size_t>(type);
    return id < detail::n_type_ids && detail::table_for(isa::scalar).dot[id] != nullptr;
}

ggml_type activation_type(ggml_type weight_type) { return formats::vec_dot_type(weight_type); }

size_t activation_row_size(ggml_type weight_type, int64_t n_cols) {
    return formats::row_size(activation_type(weight_type), n_cols);
}

void quantize_activation(ggml_type weight_type, const float* x, void* dst, int64_t n_cols) {
    const auto& t = detail::active_table();
    switch (activation_type(weight_type)) {
        case ggml_type::Q8_0: t.quantize_q8_0(x, dst, n_cols); break;
        case ggml_type::Q8_1: t.quantize_q8_1(x, dst, n_cols); break;
        case ggml_type::Q8_K: t.quantize_q8_K(x, dst, n_cols); break;
        case ggml_type::F32: std::memcpy(dst, x, static_cast<size_t>(n_cols) * sizeof(float)); break;
        default:
            throw std::invalid_argument("CPU kernels: no activation quantizer for weight type " +
                                        std::string(formats::info(weight_type).name) + ".");
    }
}

void matvec(const matrix& w, int64_t row_begin, int64_t row_end, const void* act, float* y) {
    detail::run_rows(detail::active_table(), w, row_begin, row_end, act, 0, 1, y, 0);
}

void matvec_multi(const matrix& w, int64_t row_begin, int64_t row_end, const void* act, size_t act_stride,
                  int n_tok, float* y, int64_t y_stride) {
    if (n_tok < 1 || n_tok > max_matvec_tokens)
        throw std::invalid_argument("CPU kernels: matvec_multi takes 1 to 16 tokens, got " +
                                    std::to_string(n_tok) + ".");
    detail::run_rows(detail::active_table(), w, row_begin, row_end, act, act_stride, n_tok, y, y_stride);
}

void matmul(const matrix& w, int64_t row_begin, int64_t row_end, const void* act, size_t act_stride,
            int64_t n_tok, float* y, int64_t y_stride) {
    detail::run_rows(detail::active_table(), w, row_begin, row_end, act, act_stride, n_tok, y, y_stride);
}

void rms_norm(const float* x, const float* weight, float eps, int64_t n, float* out) {
    detail::active_table().rms_norm(x, weight, eps, n, out);
}
void silu_mul(const float* gate, const float* up, int64_t n, float* out) {
    detail::active_table().silu_mul(gate, up, n, out);
}
void softmax(float* x, int64_t n) { detail::active_table().softmax(x, n); }
void to_fp16(const float* x, uint16_t* out, int64_t n) { detail::active_table().to_fp16(x, out, n); }
void from_fp16(const uint16_t* x, float* out, int64_t n) { detail::active_table().from_fp16(x, out, n); }
void qsa_scores(const float* q, int n_head, int dim, const float* keys, int64_t n_groups, float scale, float* scores) {
    detail::active_table().qsa_scores(q, n_head, dim, keys, n_groups, scale, scores);
}

}  // namespace strata::kernels::cpu
