// Internal: the scratch layout of one chunk of the chunked delta rule, shared by every ISA's kernel.
// Sizes are rounded up to 16 floats so every buffer starts 64-byte aligned when scratch is.
#pragma once

#include <cstddef>

namespace strata::kernels::cpu::detail {

struct delta_chunk_layout {
    static constexpr size_t round16(size_t n) { return (n + 15) / 16 * 16; }

    size_t c_pad;   // chunk rounded up to 16: the row length of the [chunk][c_pad] matrices and of kt
    size_t G, A, P, U, W, qd, kd, kt, sb, total;  // offsets in floats

    delta_chunk_layout(int d_k, int d_v, int chunk) {
        const size_t c = static_cast<size_t>(chunk), dk = static_cast<size_t>(d_k), dv = static_cast<size_t>(d_v);
        c_pad = round16(c);
        G = 0;                            // [chunk]        cumulative g inside the chunk
        A = G + c_pad;                    // [chunk][c_pad] k_t.k_s, then A of the UT transform (s < t)
        P = A + c * c_pad;                // [chunk][c_pad] q_t.k_s, then exp(G_t - G_s) q_t.k_s (s <= t)
        U = P + c * c_pad;                // [chunk][d_v]   U, then the deltas D = U - W S0
        W = U + round16(c * dv);          // [chunk][d_k]   W
        qd = W + round16(c * dk);         // [chunk][d_k]   exp(G_t) q_t
        kd = qd + round16(c * dk);        // [chunk][d_k]   exp(G_last - G_s) k_s
        kt = kd + round16(c * dk);        // [d_k][c_pad]   k transposed (zero past the chunk's tokens)
        sb = kt + dk * c_pad;             // S0 in column blocks of up to 64: [ceil(d_v / 64)][d_k][64] at most
        total = sb + dk * ((dv + 63) / 64 * 64);
    }
};

}  // namespace strata::kernels::cpu::detail
