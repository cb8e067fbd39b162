// The rows16 layouts (detail/kernel_table.hpp): repacking at load, the way back (for the scalar
// kernels), and the scalar GEMM on it, which unpacks each group and calls the formats' references.
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "cpu/detail/kernel_table.hpp"
#include "formats/quant.hpp"

namespace strata::kernels::cpu {
namespace detail {
namespace {

using formats::block_q4_K;
using formats::block_q8_0;
using formats::QK8_0;
using formats::QK_K;
constexpr int G = static_cast<int>(repack_group_rows);

// Q4_K's 6-bit scale and min of sub-block j (0..7) from the 12 packed bytes.
void k4_scale_min(int j, const uint8_t* q, uint8_t& sc, uint8_t& m) {
    if (j < 4) {
        sc = q[j] & 63;
        m = q[j + 4] & 63;
    } else {
        sc = static_cast<uint8_t>((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        m = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

void pack_q4_k(const block_q4_K* const rows[G], block_q4_Kx16& out) {
    for (int r = 0; r < G; ++r) {
        const block_q4_K& b = *rows[r];
        out.d[r] = b.d;
        out.dmin[r] = b.dmin;
        for (int j = 0; j < 8; ++j) k4_scale_min(j, b.scales, out.sc[j][r], out.m[j][r]);
        for (int q = 0; q < 32; ++q) std::memcpy(out.qs[q][r], b.qs + 4 * q, 4);
    }
}

// Row r's 8 scales and mins (bytes, sc[j][r] and m[j][r]) -> the 12 packed bytes of Q4_K / Q5_K.
void k4_pack_scales(const uint8_t (&sc)[8][16], const uint8_t (&m)[8][16], int r, uint8_t* q) {
    for (int j = 0; j < 4; ++j) {
        q[j] = static_cast<uint8_t>(sc[j][r] | (sc[j + 4][r] >> 4) << 6);
        q[j + 4] = static_cast<uint8_t>(m[j][r] | (m[j + 4][r] >> 4) << 6);
        q[j + 8] = static_cast<uint8_t>((sc[j + 4][r] & 0xF) | (m[j + 4][r] & 0xF) << 4);
    }
}

// The inverse of pack_q4_k (re-packing the 6-bit scales).
void unpack_q4_k(const block_q4_Kx16& in, block_q4_K* const rows[G]) {
    for (int r = 0; r < G; ++r) {
        block_q4_K& b = *rows[r];
        b.d = in.d[r];
        b.dmin = in.dmin[r];
        k4_pack_scales(in.sc, in.m, r, b.scales);
        for (int q = 0; q < 32; ++q) std::memcpy(b.qs + 4 * q, in.qs[q][r], 4);
    }
}

void pack_q5_k(const formats::block_q5_K* const rows[G], block_q5_Kx16& out) {
    for (int r = 0; r < G; ++r) {
        const formats::block_q5_K& b = *rows[r];
        out.d[r] = b.d;
        out.dmin[r] = b.dmin;
        for (int j = 0; j < 8; ++j) k4_scale_min(j, b.scales, out.sc[j][r], out.m[j][r]);
        for (int v = 0; v < 8; ++v) std::memcpy(out.qh[v][r], b.qh + 4 * v, 4);
        for (int q = 0; q < 32; ++q) std::memcpy(out.qs[q][r], b.qs + 4 * q, 4);
    }
}

// The inverse of pack_q5_k.
void unpack_q5_k(const block_q5_Kx16& in, formats::block_q5_K* const rows[G]) {
    for (int r = 0; r < G; ++r) {
        formats::block_q5_K& b = *rows[r];
        b.d = in.d[r];
        b.dmin = in.dmin[r];
        k4_pack_scales(in.sc, in.m, r, b.scales);
        for (int v = 0; v < 8; ++v) std::memcpy(b.qh + 4 * v, in.qh[v][r], 4);
        for (int q = 0; q < 32; ++q) std::memcpy(b.qs + 4 * q, in.qs[q][r], 4);
    }
}

void pack_q6_k(const formats::block_q6_K* const rows[G], block_q6_Kx16& out) {
    for (int r = 0; r < G; ++r) {
        const formats::block_q6_K& b = *rows[r];
        out.d[r] = b.d;
        for (int j = 0; j < 16; ++j) out.sc[j][r] = b.scales[j];
        for (int q = 0; q < 32; ++q) std::memcpy(out.ql[q][r], b.ql + 4 * q, 4);
        for (int q = 0; q < 16; ++q) std::memcpy(out.qh[q][r], b.qh + 4 * q, 4);
    }
}

void unpack_q6_k(const block_q6_Kx16& in, formats::block_q6_K* const rows[G]) {
    for (int r = 0; r < G; ++r) {
        formats::block_q6_K& b = *rows[r];
        b.d = in.d[r];
        for (int j = 0; j < 16; ++j) b.scales[j] = in.sc[j][r];
        for (int q = 0; q < 32; ++q) std::memcpy(b.ql + 4 * q, in.ql[q][r], 4);
        for (int q = 0; q < 16; ++q) std::memcpy(b.qh + 4 * q, in.qh[q][r], 4);
    }
}

void pack_q2_k(const formats::block_q2_K* const rows[G], block_q2_Kx16& out) {
    for (int r = 0; r < G; ++r) {
        const formats::block_q2_K& b = *rows[r];
        out.d[r] = b.d;
        out.dmin[r] = b.dmin;
        for (int j = 0; j < 16; ++j) out.scales[j][r] = b.scales[j];
        for (int q = 0; q < 16; ++q) std::memcpy(out.qs[q][r], b.qs + 4 * q, 4);
    }
}

void unpack_q2_k(const block_q2_Kx16& in, formats::block_q2_K* const rows[G]) {
    for (int r = 0; r < G; ++r) {
        formats::block_q2_K& b = *rows[r];
        b.d = in.d[r];
        b.dmin = in.dmin[r];
        for (int j = 0; j < 16; ++j) b.scales[j] = in.scales[j][r];
        for (int q = 0; q < 16; ++q) std::memcpy(b.qs + 4 * q, in.qs[q][r], 4);
    }
}

// Q3_K's 6-bit scale j (0..15) from the 12 packed bytes: low nibble from byte j % 8 (j < 8: low, else
// high nibble), top two bits from byte 8 + j % 4, bits 2 (j / 4).
int k3_scale(int j, const uint8_t* q) {
    const int low = j < 8 ? q[j] & 0xF : q[j - 8] >> 4;
    return low | ((q[8 + j % 4] >> (2 * (j / 4))) & 3) << 4;
}

void pack_q3_k(const formats::block_q3_K* const rows[G], block_q3_Kx16& out) {
    for (int r = 0; r < G; ++r) {
        const formats::block_q3_K& b = *rows[r];
        out.d[r] = b.d;
        for (int j = 0; j < 16; ++j) out.sc[j][r] = static_cast<int8_t>(k3_scale(j, b.scales) - 32);
        for (int v = 0; v < 8; ++v) std::memcpy(out.hmask[v][r], b.hmask + 4 * v, 4);
        for (int q = 0; q < 16; ++q) std::memcpy(out.qs[q][r], b.qs + 4 * q, 4);
    }
}

void unpack_q3_k(const block_q3_Kx16& in, formats::block_q3_K* const rows[G]) {
    for (int r = 0; r < G; ++r) {
        formats::block_q3_K& b = *rows[r];
        b.d = in.d[r];
        std::memset(b.scales, 0, sizeof(b.scales));
        for (int j = 0; j < 16; ++j) {
            const int ls = in.sc[j][r] + 32;
            b.scales[j % 8] = static_cast<uint8_t>(b.scales[j % 8] | (ls & 0xF) << (j < 8 ? 0 : 4));
            b.scales[8 + j % 4] = static_cast<uint8_t>(b.scales[8 + j % 4] | (ls >> 4) << (2 * (j / 4)));
        }
        for (int v = 0; v < 8; ++v) std::memcpy(b.hmask + 4 * v, in.hmask[v][r], 4);
        for (int q = 0; q < 16; ++q) std::memcpy(b.qs + 4 * q, in.qs[q][r], 4);
    }
}

void pack_iq4_xs(const formats::block_iq4_xs* const rows[G], block_iq4_xsx16& out) {
    for (int r = 0; r < G; ++r) {
        const formats::block_iq4_xs& b = *rows[r];
        out.d[r] = b.d;
        for (int j = 0; j < 8; ++j) {
            const int ls = ((b.scales_l[j / 2] >> (4 * (j % 2))) & 0xF) | (((b.scales_h >> (2 * j)) & 3) << 4);
            out.sc[j][r] = static_cast<int8_t>(ls - 32);
        }
        for (int q = 0; q < 32; ++q) std::memcpy(out.qs[q][r], b.qs + 4 * q, 4);
    }
}

void unpack_iq4_xs(const block_iq4_xsx16& in, formats::block_iq4_xs* const rows[G]) {
    for (int r = 0; r < G; ++r) {
        formats::block_iq4_xs& b = *rows[r];
        b.d = in.d[r];
        b.scales_h = 0;
        for (int k = 0; k < 4; ++k) b.scales_l[k] = 0;
        for (int j = 0; j < 8; ++j) {
            const int ls = in.sc[j][r] + 32;
            b.scales_l[j / 2] = static_cast<uint8_t>(b.scales_l[j / 2] | (ls & 0xF) << (4 * (j % 2)));
            b.scales_h = static_cast<uint16_t>(b.scales_h | (ls >> 4) << (2 * j));
        }
        for (int q = 0; q < 32; ++q) std::memcpy(b.qs + 4 * q, in.qs[q][r], 4);
    }
}

void pack_q8_0(const block_q8_0* const rows[G], block_q8_0x16& out) {
    for (int r = 0; r < G; ++r) {
        out.d[r] = rows[r]->d;
        for (int v = 0; v < 8; ++v)
            for (int i = 0; i < 4; ++i) out.qs[v][r][i] = static_cast<uint8_t>(rows[r]->qs[4 * v + i] ^ 0x80);
    }
}

void unpack_q8_0(const block_q8_0x16& in, block_q8_0* const rows[G]) {
    for (int r = 0; r < G; ++r) {
        rows[r]->d = in.d[r];
        for (int v = 0; v < 8; ++v)
            for (int i = 0; i < 4; ++i) rows[r]->qs[4 * v + i] = static_cast<int8_t>(in.qs[v][r][i] ^ 0x80);
    }
}

// The 32-element nibble formats (block_q4_0x16 and its kin): d (MXFP4: its exponent e), m where the format
// has one, the qs dwords, and the fifth bits regrouped into the 64-bit masks of the kernels.
template <class Block, class Packed>
void pack_legacy(const Block* const rows[G], Packed& out) {
    uint64_t masks[8] = {};
    for (int r = 0; r < G; ++r) {
        const Block& b = *rows[r];
        if constexpr (requires { b.e; })
            out.e[r] = b.e;
        else
            out.d[r] = b.d;
        if constexpr (requires { b.m; }) out.m[r] = b.m;
        for (int v = 0; v < 4; ++v) std::memcpy(out.qs[v][r], b.qs + 4 * v, 4);
        if constexpr (requires { b.qh; }) {
            uint32_t qh;
            std::memcpy(&qh, b.qh, sizeof(qh));
            for (int h = 0; h < 2; ++h)
                for (int v = 0; v < 4; ++v)
                    for (int i = 0; i < 4; ++i)
                        masks[2 * v + h] |= static_cast<uint64_t>((qh >> (16 * h + 4 * v + i)) & 1) << (4 * r + i);
        }
    }
    if constexpr (requires { out.qh; }) std::memcpy(out.qh, masks, sizeof(masks));
}

template <class Block, class Packed>
void unpack_legacy(const Packed& in, Block* const rows[G]) {
    uint64_t masks[8] = {};
    if constexpr (requires { in.qh; }) std::memcpy(masks, in.qh, sizeof(masks));
    for (int r = 0; r < G; ++r) {
        Block& b = *rows[r];
        if constexpr (requires { b.e; })
            b.e = in.e[r];
        else
            b.d = in.d[r];
        if constexpr (requires { b.m; }) b.m = in.m[r];
        for (int v = 0; v < 4; ++v) std::memcpy(b.qs + 4 * v, in.qs[v][r], 4);
        if constexpr (requires { b.qh; }) {
            uint32_t qh = 0;
            for (int h = 0; h < 2; ++h)
                for (int v = 0; v < 4; ++v)
                    for (int i = 0; i < 4; ++i)
                        qh |= static_cast<uint32_t>((masks[2 * v + h] >> (4 * r + i)) & 1) << (16 * h + 4 * v + i);
            std::memcpy(b.qh, &qh, sizeof(qh));
        }
    }
}

// Calls fn(block index, pointers to that block of each of the group's 16 rows).
template <class Block, class Fn>
void for_group_blocks(uint8_t* rows, size_t stride, int64_t n_blocks, Fn fn) {
    for (int64_t i = 0; i < n_blocks; ++i) {
        Block* p[G];
        for (int r = 0; r < G; ++r) p[r] = reinterpret_cast<Block*>(rows + r * stride) + i;
        fn(i, p);
    }
}

// y[t * y_stride + 16g + r] = vec_dot_ref of row 16g + r, unpacked to the GGUF layout first.
template <class Block, class Packed, void (*Unpack)(const Packed&, Block* const*)>
void gemm16_reference(ggml_type type, int64_t n, const void* w, size_t group_bytes, int64_t n_groups, const void* const* a,
                      int n_tok, float* y, int64_t y_stride) {
    const int64_t n_blocks = n / formats::info(type).block_size;
    const size_t row_bytes = formats::row_size(type, n);
    std::vector<uint8_t> rows(G * row_bytes);
    for (int64_t g = 0; g < n_groups; ++g) {
        const auto* packed = reinterpret_cast<const Packed*>(static_cast<const uint8_t*>(w) + g * group_bytes);
        for_group_blocks<Block>(rows.data(), row_bytes, n_blocks, [&](int64_t i, Block* const* p) { Unpack(packed[i], p); });
        for (int r = 0; r < G; ++r)
            for (int t = 0; t < n_tok; ++t)
                y[t * y_stride + g * G + r] = formats::vec_dot_ref(type, n, rows.data() + r * row_bytes, a[t]);
    }
}

template <class Block, class Packed>
void gemm16_legacy(ggml_type type, int64_t n, const void* w, size_t group_bytes, int64_t n_groups, const void* const* a,
                   int n_tok, float* y, int64_t y_stride) {
    gemm16_reference<Block, Packed, unpack_legacy<Block, Packed>>(type, n, w, group_bytes, n_groups, a, n_tok, y, y_stride);
}

}  // namespace

void gemm16_q5_k_scalar(int64_t n, const void* w, size_t group_bytes, int64_t n_groups, const void* const* a, int n_tok,
                        float* y, int64_t y_stride) {
    gemm16_reference<formats::block_q5_K, block_q5_Kx16, unpack_q5_k>(ggml_type::Q5_K, n, w, group_bytes, n_groups, a, n_tok,
                                                                      y, y_stride);
}

void gemm16_q6_k_scalar(int64_t n, const void* w, size_t group_bytes, int64_t n_groups, const void* const* a, int n_tok,
                        float* y, int64_t y_stride) {
    gemm16_reference<formats::block_q6_K, block_q6_Kx16, unpack_q6_k>(ggml_type::Q6_K, n, w, group_bytes, n_groups, a, n_tok,
                                                                      y, y_stride);
}

void gemm16_q2_k_scalar(int64_t n, const void* w, size_t group_bytes, int64_t n_groups, const void* const* a, int n_tok,
                        float* y, int64_t y_stride) {
    gemm16_reference<formats::block_q2_K, block_q2_Kx16, unpack_q2_k>(ggml_type::Q2_K, n, w, group_bytes, n_groups, a, n_tok,
                                                                      y, y_stride);
}

void gemm16_q3_k_scalar(int64_t n, const void* w, size_t group_bytes, int64_t n_groups, const void* const* a, int n_tok,
                        float* y, int64_t y_stride) {
    gemm16_reference<formats::block_q3_K, block_q3_Kx16, unpack_q3_k>(ggml_type::Q3_K, n, w, group_bytes, n_groups, a, n_tok,
                                                                      y, y_stride);
}

void gemm16_q4_0_scalar(int64_t n, const void* w, size_t group_bytes, int64_t n_groups, const void* const* a, int n_tok,
                        float* y, int64_t y_stride) {
    gemm16_legacy<formats::block_q4_0, block_q4_0x16>(ggml_type::Q4_0, n, w, group_bytes, n_groups, a, n_tok, y, y_stride);
}

void gemm16_q4_1_scalar(int64_t n, const void* w, size_t group_bytes, int64_t n_groups, const void* const* a, int n_tok,
                        float* y, int64_t y_stride) {
    gemm16_legacy<formats::block_q4_1, block_q4_1x16>(ggml_type::Q4_1, n, w, group_bytes, n_groups, a, n_tok, y, y_stride);
}

void gemm16_q5_0_scalar(int64_t n, const void* w, size_t group_bytes, int64_t n_groups, const void* const* a, int n_tok,
                        float* y, int64_t y_stride) {
    gemm16_legacy<formats::block_q5_0, block_q5_0x16>(ggml_type::Q5_0, n, w, group_bytes, n_groups, a, n_tok, y, y_stride);
}

void gemm16_q5_1_scalar(int64_t n, const void* w, size_t group_bytes, int64_t n_groups, const void* const* a, int n_tok,
                        float* y, int64_t y_stride) {
    gemm16_legacy<formats::block_q5_1, block_q5_1x16>(ggml_type::Q5_1, n, w, group_bytes, n_groups, a, n_tok, y, y_stride);
}

void gemm16_iq4_nl_scalar(int64_t n, const void* w, size_t group_bytes, int64_t n_groups, const void* const* a, int n_tok,
                          float* y, int64_t y_stride) {
    gemm16_legacy<formats::block_iq4_nl, block_q4_0x16>(ggml_type::IQ4_NL, n, w, group_bytes, n_groups, a, n_tok, y, y_stride);
}

void gemm16_mxfp4_scalar(int64_t n, const void* w, size_t group_bytes, int64_t n_groups, const void* const* a, int n_tok,
                         float* y, int64_t y_stride) {
    gemm16_legacy<formats::block_mxfp4, block_mxfp4x16>(ggml_type::MXFP4, n, w, group_bytes, n_groups, a, n_tok, y,
                                                        y_stride);
}

void gemm16_q4_k_scalar(int64_t n, const void* w, size_t group_bytes, int64_t n_groups, const void* const* a, int n_tok,
                        float* y, int64_t y_stride) {
    gemm16_reference<block_q4_K, block_q4_Kx16, unpack_q4_k>(ggml_type::Q4_K, n, w, group_bytes, n_groups, a, n_tok, y,
                                                             y_stride);
}

void gemm16_iq4_xs_scalar(int64_t n, const void* w, size_t group_bytes, int64_t n_groups, const void* const* a, int n_tok,
                          float* y, int64_t y_stride) {
    gemm16_reference<formats::block_iq4_xs, block_iq4_xsx16, unpack_iq4_xs>(ggml_type::IQ4_XS, n, w, group_bytes, n_groups, a,
                                                                          n_tok, y, y_stride);
}

void gemm16_q8_0_scalar(int64_t n, const void* w, size_t group_bytes, int64_t n_groups, const void* const* a, int n_tok,
                        float* y, int64_t y_stride) {
    gemm16_reference<block_q8_0, block_q8_0x16, unpack_q8_0>(ggml_type::Q8_0, n, w, group_bytes, n_groups, a, n_tok, y,
                                                             y_stride);
}

}  // namespace detail

bool can_repack(ggml_type type, int64_t n_rows) {
    const auto id = static_cast<size_t>(type);
    const auto& t = detail::active_table();
    return id < detail::n_type_ids && t.gemm16_fast[id] && n_rows > 0 && n_rows % repack_group_rows == 0;
}

size_t repacked_row_stride(ggml_type type, int64_t n_cols) {
    switch (type) {
        case ggml_type::Q4_K: return static_cast<size_t>(n_cols / formats::QK_K) * (sizeof(detail::block_q4_Kx16) / 16);
        case ggml_type::Q5_K: return static_cast<size_t>(n_cols / formats::QK_K) * (sizeof(detail::block_q5_Kx16) / 16);
        case ggml_type::Q8_0: return static_cast<size_t>(n_cols / formats::QK8_0) * (sizeof(detail::block_q8_0x16) / 16);
        case ggml_type::IQ4_XS: return static_cast<size_t>(n_cols / formats::QK_K) * (sizeof(detail::block_iq4_xsx16) / 16);
        case ggml_type::Q3_K: return static_cast<size_t>(n_cols / formats::QK_K) * (sizeof(detail::block_q3_Kx16) / 16);
        case ggml_type::Q2_K:
        case ggml_type::Q6_K:
        case ggml_type::Q4_0:
        case ggml_type::Q4_1:
        case ggml_type::Q5_0:
        case ggml_type::Q5_1:
        case ggml_type::IQ4_NL:
        case ggml_type::MXFP4: return formats::row_size(type, n_cols);  // the same bytes, regrouped
        default:
            throw std::invalid_argument("CPU kernels: no repacked layout for weight type " +
                                        std::string(formats::info(type).name) + ".");
    }
}

static size_t checked_group_bytes(ggml_type type, int64_t n_rows, int64_t n_cols) {
    const size_t group_bytes = repack_group_rows * repacked_row_stride(type, n_cols);
    if (n_rows % repack_group_rows != 0 || n_cols % formats::info(type).block_size != 0)
        throw std::invalid_argument("CPU kernels: the rows16 layout takes whole groups of 16 rows and whole blocks, got " +
                                    std::to_string(n_rows) + " rows of " + std::to_string(n_cols) + " columns of " +
                                    std::string(formats::info(type).name) + ".");
    return group_bytes;
}

namespace {

// Runs fn(pack, unpack) with the block functions of `type`'s rows16 layout: pack(GGUF blocks of 16 rows,
// packed block), unpack(packed block, GGUF blocks), each pair of block types given through the lambdas.
template <class Fn>
void with_block_layout(ggml_type type, Fn fn) {
    using namespace formats;
    using namespace detail;
    switch (type) {
        case ggml_type::Q4_K: fn.template operator()<block_q4_K, block_q4_Kx16>(pack_q4_k, unpack_q4_k); return;
        case ggml_type::Q5_K: fn.template operator()<block_q5_K, block_q5_Kx16>(pack_q5_k, unpack_q5_k); return;
        case ggml_type::Q6_K: fn.template operator()<block_q6_K, block_q6_Kx16>(pack_q6_k, unpack_q6_k); return;
        case ggml_type::Q2_K: fn.template operator()<block_q2_K, block_q2_Kx16>(pack_q2_k, unpack_q2_k); return;
        case ggml_type::Q3_K: fn.template operator()<block_q3_K, block_q3_Kx16>(pack_q3_k, unpack_q3_k); return;
        case ggml_type::Q8_0: fn.template operator()<block_q8_0, block_q8_0x16>(pack_q8_0, unpack_q8_0); return;
        case ggml_type::IQ4_XS: fn.template operator()<block_iq4_xs, block_iq4_xsx16>(pack_iq4_xs, unpack_iq4_xs); return;
        case ggml_type::Q4_0:
            fn.template operator()<block_q4_0, block_q4_0x16>(pack_legacy<block_q4_0, block_q4_0x16>,
                                                              unpack_legacy<block_q4_0, block_q4_0x16>);
            return;
        case ggml_type::Q4_1:
            fn.template operator()<block_q4_1, block_q4_1x16>(pack_legacy<block_q4_1, block_q4_1x16>,
                                                              unpack_legacy<block_q4_1, block_q4_1x16>);
            return;
        case ggml_type::Q5_0:
            fn.template operator()<block_q5_0, block_q5_0x16>(pack_legacy<block_q5_0, block_q5_0x16>,
                                                              unpack_legacy<block_q5_0, block_q5_0x16>);
            return;
        case ggml_type::Q5_1:
            fn.template operator()<block_q5_1, block_q5_1x16>(pack_legacy<block_q5_1, block_q5_1x16>,
                                                              unpack_legacy<block_q5_1, block_q5_1x16>);
            return;
        case ggml_type::IQ4_NL:
            fn.template operator()<block_iq4_nl, block_q4_0x16>(pack_legacy<block_iq4_nl, block_q4_0x16>,
                                                                unpack_legacy<block_iq4_nl, block_q4_0x16>);
            return;
        case ggml_type::MXFP4:
            fn.template operator()<block_mxfp4, block_mxfp4x16>(pack_legacy<block_mxfp4, block_mxfp4x16>,
                                                                unpack_legacy<block_mxfp4, block_mxfp4x16>);
            return;
        default:
            throw std::invalid_argument("CPU kernels: no repacked layout for weight type " + std::string(info(type).name) + ".");
    }
}

}  // namespace

void repack_rows(ggml_type type, const void* src, size_t src_stride, int64_t n_rows, int64_t n_cols, void* dst) {
    const size_t group_bytes = checked_group_bytes(type, n_rows, n_cols);
    const int64_t n_blocks = n_cols / formats::info(type).block_size;
    with_block_layout(type, [&]<class Block, class Packed>(auto pack, auto) {
        for (int64_t g = 0; g < n_rows / repack_group_rows; ++g) {
            auto* s = const_cast<uint8_t*>(static_cast<const uint8_t*>(src)) + static_cast<size_t>(g * repack_group_rows) * src_stride;
            auto* d = reinterpret_cast<Packed*>(static_cast<uint8_t*>(dst) + static_cast<size_t>(g) * group_bytes);
            detail::for_group_blocks<Block>(s, src_stride, n_blocks, [&](int64_t i, Block* const* p) { pack(p, d[i]); });
        }
    });
}

void unpack_rows(ggml_type type, const void* src, int64_t n_rows, int64_t n_cols, void* dst, size_t dst_stride) {
    const size_t group_bytes = checked_group_bytes(type, n_rows, n_cols);
    const int64_t n_blocks = n_cols / formats::info(type).block_size;
    with_block_layout(type, [&]<class Block, class Packed>(auto, auto unpack) {
        for (int64_t g = 0; g < n_rows / repack_group_rows; ++g) {
            const auto* s = reinterpret_cast<const Packed*>(static_cast<const uint8_t*>(src) + static_cast<size_t>(g) * group_bytes);
            auto* d = static_cast<uint8_t*>(dst) + static_cast<size_t>(g * repack_group_rows) * dst_stride;
            detail::for_group_blocks<Block>(d, dst_stride, n_blocks, [&](int64_t i, Block* const* p) { unpack(s[i], p); });
        }
    });
}

}  // namespace strata::kernels::cpu
