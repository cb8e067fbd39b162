// Internal: the row and token loops of the code book formats' prompt GEMM on the GGUF layout (one copy per
// including file: anonymous namespace, each file's own ISA flags). A format's GEMM parts K give
//   block, act_block, block_elems: the weight and activation blocks and the elements of one;
//   group: the dot kernel's tokens per call; rows, chunk: `chunk` blocks of `rows` rows are decoded at a time;
//   dec: one weight block decoded (grid entries, signs, scales, d), acc_t: one token's accumulator;
//   decode(x, i, dec&), apply<NT>(dec, y, i, acc): block i of the row into acc[t < NT] (acc[group]),
//   finish<NT>(acc, out): the accumulators to results.
// apply and finish compute the dot kernel's integer lanes and float steps for a token, and the GEMM goes
// through the tokens in the dot kernel's groups, so its results are bitwise the dot kernel's.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "cpu/detail/kernel_table.hpp"
#include "cpu/detail/x86.hpp"

namespace strata::kernels::cpu::detail {
namespace {

// f(std::integral_constant<int, k>{}) for a runtime 1 <= k <= Max (4 or 8).
template <int Max, class F>
inline void with_token_count(int k, F&& f) {
    static_assert(Max == 4 || Max == 8);
    switch (k) {
        case 1: f(std::integral_constant<int, 1>{}); return;
        case 2: f(std::integral_constant<int, 2>{}); return;
        case 3: f(std::integral_constant<int, 3>{}); return;
        case 4: f(std::integral_constant<int, 4>{}); return;
    }
    if constexpr (Max == 8) {
        switch (k) {
            case 5: f(std::integral_constant<int, 5>{}); return;
            case 6: f(std::integral_constant<int, 6>{}); return;
            case 7: f(std::integral_constant<int, 7>{}); return;
            case 8: f(std::integral_constant<int, 8>{}); return;
        }
    }
}

template <class K>
inline const typename K::block* row_blocks(const void* w, size_t row_stride, int64_t r) {
    return reinterpret_cast<const typename K::block*>(static_cast<const uint8_t*>(w) + static_cast<size_t>(r) * row_stride);
}

// The GEMM over rows [0, n_rows) and n_tok <= max_gemm_rows_tokens tokens: K::rows rows at a time, their
// next K::chunk blocks decoded once, then every token group passes over those rows, so a group's activation
// blocks are read from L1 by all of them.
template <class K>
inline void gemm_rows(int64_t n, const void* w, size_t row_stride, int64_t n_rows, const void* const* a, int n_tok,
                      float* y, int64_t y_stride) {
    using acc_t = typename K::acc_t;
    typename K::dec buf[K::rows][K::chunk];
    acc_t acc[K::rows][max_gemm_rows_tokens];
    const typename K::act_block* ya[max_gemm_rows_tokens];
    for (int t = 0; t < n_tok; ++t) ya[t] = static_cast<const typename K::act_block*>(a[t]);
    const int64_t nb = n / K::block_elems;
    for (int64_t r0 = 0; r0 < n_rows; r0 += K::rows) {
        const int nr = static_cast<int>(std::min<int64_t>(K::rows, n_rows - r0));
        for (int r = 0; r < nr; ++r)
            for (int t = 0; t < n_tok; ++t) acc[r][t] = K::zero();
        for (int64_t i0 = 0; i0 < nb; i0 += K::chunk) {
            const int nc = static_cast<int>(std::min<int64_t>(K::chunk, nb - i0));
            for (int r = 0; r < nr; ++r) {
                const auto* x = row_blocks<K>(w, row_stride, r0 + r);
                for (int c = 0; c < nc; ++c) {
                    prefetch_weights<sizeof(typename K::block)>(x + i0 + c);
                    K::decode(x, i0 + c, buf[r][c]);
                }
            }
            for (int g = 0; g < n_tok; g += K::group)
                with_token_count<K::group>(std::min(K::group, n_tok - g), [&](auto nt) {
                    constexpr int NT = decltype(nt)::value;
                    for (int r = 0; r < nr; ++r) {
                        acc_t part[K::group];
                        for (int t = 0; t < K::group; ++t) part[t] = t < NT ? acc[r][g + t] : K::zero();
                        for (int c = 0; c < nc; ++c) K::template apply<NT>(buf[r][c], ya + g, i0 + c, part);
                        for (int t = 0; t < NT; ++t) acc[r][g + t] = part[t];
                    }
                });
        }
        for (int r = 0; r < nr; ++r)
            for (int g = 0; g < n_tok; g += K::group)
                with_token_count<K::group>(std::min(K::group, n_tok - g), [&](auto nt) {
                    constexpr int NT = decltype(nt)::value;
                    acc_t part[K::group];
                    for (int t = 0; t < K::group; ++t) part[t] = t < NT ? acc[r][g + t] : K::zero();
                    float out[K::group];
                    K::template finish<NT>(part, out);
                    for (int t = 0; t < NT; ++t) y[(g + t) * y_stride + r0 + r] = out[t];
                });
    }
}

}  // namespace
}  // namespace strata::kernels::cpu::detail
