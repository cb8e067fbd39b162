// Tiled attention (cpu/attention.hpp) on every ISA this CPU has: against a plain softmax attention in
// double over the cache's decoded values, over ragged shapes (head sizes, tile sizes, several tiles
// folded, causal rows that see none of a tile, F16 and Q8_0); and bitwise: a row's state whatever the
// number of rows it is computed with, and tiles folded one by one == tile states merged afterwards.
// Latent shapes (deepseek2) take each value as the first v_dim elements of the key's own row, read in
// place (v_dim < head_dim, rows wider than a value), with keys laid out by attn_pack_keys.
//
// Tolerance: |out - ref| <= 1e-5 * (1 + max_t |v_t|) per element. The kernels round each score and each
// weighted sum once per term in f32 (a few hundred terms here, each ~1e-7 relative) and exp to ~1 ulp;
// a wrong position or a dropped tile moves the output by ~1 / n_visible of a value, far above it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cpu/attention.hpp"
#include "cpu/detail/kernel_table.hpp"
#include "formats/blocks.hpp"
#include "formats/quant.hpp"

namespace {

using namespace strata::kernels::cpu;
using strata::formats::ggml_type;
namespace formats = strata::formats;

// One kv head's cache: n_pos positions in tiles of tile_n, and their decoded values. Each tile has
// its own storage of whole key blocks (keys blocked and transposed as attention.hpp lays them out, values
// rows); the slots past a tile's last position hold NaN, which no kernel may let through. A latent
// cache (v_dim > 0) keeps rows [n_pos][row_bytes] (v: the values are their first v_dim elements) and
// lays each tile's keys out from them with attn_pack_keys.
struct cache {
    ggml_type type;
    int64_t head_dim, v_dim;
    int n_pos, tile_n;
    size_t row_bytes;
    int tile_slots;               // tile_n rounded up to whole key blocks
    std::vector<uint8_t> k, v;    // [n_tiles][tile_slots][row_bytes]
    std::vector<float> kf, vf;    // [n_pos][head_dim], decoded (latent: both the rows)

    cache(ggml_type type_, int64_t head_dim_, int n_pos_, int tile_n_, uint32_t seed, int64_t v_dim_ = 0)
        : type(type_), head_dim(head_dim_), v_dim(v_dim_), n_pos(n_pos_), tile_n(tile_n_),
          row_bytes(formats::row_size(type_, head_dim_)),
          tile_slots((tile_n_ + attn_key_block - 1) / attn_key_block * attn_key_block),
          k(row_bytes * tile_slots * n_tiles()), v(k.size()), kf(n_pos_ * head_dim_), vf(n_pos_ * head_dim_) {
        const uint16_t nan_half = 0x7E00;
        for (auto* bytes : {&k, &v})
            for (size_t i = 0; i + 1 < bytes->size(); i += 2) std::memcpy(bytes->data() + i, &nan_half, 2);
        std::mt19937 rng(seed);
        std::normal_distribution<float> dist(0.0f, 1.0f);
        std::vector<float> x(head_dim);
        std::vector<uint8_t> row(row_bytes);
        for (int t = 0; t < n_pos; ++t)
            for (auto [bytes, decoded] : {std::pair{&k, &kf}, std::pair{&v, &vf}}) {
                for (auto& e : x) e = dist(rng);
                formats::quantize_row(type, x.data(), row.data(), head_dim);
                formats::dequantize_row(type, row.data(), decoded->data() + t * head_dim, head_dim);
                uint8_t* tile = bytes->data() + static_cast<size_t>(t / tile_n) * tile_slots * row_bytes;
                const int in_tile = t % tile_n;
                if (bytes == &k) {  // blocked keys: each element (and Q8_0 scale) to its slot
                    for (int64_t j = 0; j < head_dim; ++j) {
                        if (type == ggml_type::F16) {
                            std::memcpy(tile + attn_key_offset(type, row_bytes, in_tile, j), row.data() + 2 * j, 2);
                            continue;
                        }
                        const auto& b = reinterpret_cast<const formats::block_q8_0*>(row.data())[j / formats::QK8_0];
                        std::memcpy(tile + attn_key_offset(type, row_bytes, in_tile, j), &b.qs[j % formats::QK8_0], 1);
                        std::memcpy(tile + attn_key_scale_offset(head_dim, row_bytes, in_tile, j), &b.d, 2);
                    }
                } else {
                    std::memcpy(tile + in_tile * row_bytes, row.data(), row_bytes);
                }
            }
        if (v_dim == 0) return;
        // Latent: rows made from the keys (kf, vf: the rows decoded); each tile's keys packed from them.
        for (int t = 0; t < n_pos; ++t) {
            formats::quantize_row(type, kf.data() + t * head_dim, v.data() + t * row_bytes, head_dim);
            formats::dequantize_row(type, v.data() + t * row_bytes, kf.data() + t * head_dim, head_dim);
            std::copy_n(kf.data() + t * head_dim, head_dim, vf.data() + t * head_dim);
        }
        for (int i = 0; i < n_tiles(); ++i)
            attn_pack_keys(type, head_dim, v.data() + static_cast<size_t>(i) * tile_n * row_bytes, row_bytes,
                           std::min(tile_n, n_pos - i * tile_n), k.data() + static_cast<size_t>(i) * tile_slots * row_bytes);
    }
    int64_t value_dim() const { return v_dim > 0 ? v_dim : head_dim; }
    int n_tiles() const { return (n_pos + tile_n - 1) / tile_n; }
    kv_tile tile(int i) const {
        const size_t at = static_cast<size_t>(i) * tile_slots * row_bytes;
        kv_tile t{type, k.data() + at, v.data() + at, row_bytes, int64_t{i} * tile_n, std::min(tile_n, n_pos - i * tile_n)};
        if (i + 1 < n_tiles()) t.next_k = k.data() + at + static_cast<size_t>(tile_slots) * row_bytes;  // as decode passes it
        if (v_dim > 0) {
            t.v = v.data() + static_cast<size_t>(i) * tile_n * row_bytes;
            t.v_dim = v_dim;
            t.v_row_bytes = row_bytes;
        }
        return t;
    }
};

// A state of n_rows rows with its own storage.
struct state_buf {
    std::vector<float> max, sum, acc;
    state_buf(int n_rows, int64_t head_dim) : max(n_rows), sum(n_rows), acc(n_rows * head_dim) {
        attn_clear(view(), head_dim, n_rows);
    }
    attn_state view() { return {max.data(), sum.data(), acc.data()}; }
    attn_state rows_from(int r, int64_t head_dim) { return {max.data() + r, sum.data() + r, acc.data() + r * head_dim}; }
};

bool bitwise_equal(const state_buf& a, const state_buf& b) {
    auto same = [](const std::vector<float>& x, const std::vector<float>& y) {
        return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
    };
    return same(a.max, b.max) && same(a.sum, b.sum) && same(a.acc, b.acc);
}

struct shape {
    ggml_type type;
    int64_t head_dim;
    int n_pos, tile_n, n_rows;
    int64_t v_dim = 0;  // latent: values the first v_dim elements of the key rows; 0: a separate value
};

std::string shape_name(const shape& s) {
    return std::string(formats::info(s.type).name) + "_hd" + std::to_string(s.head_dim) + "_pos" +
           std::to_string(s.n_pos) + "_tile" + std::to_string(s.tile_n) + "_rows" + std::to_string(s.n_rows) +
           (s.v_dim > 0 ? "_latent_v" + std::to_string(s.v_dim) : "");
}

struct problem {
    cache kv;
    std::vector<float> q;         // [n_rows][head_dim]
    std::vector<int64_t> last;    // [n_rows]
    float scale;

    explicit problem(const shape& s)
        : kv(s.type, s.head_dim, s.n_pos, s.tile_n, 7u + static_cast<uint32_t>(s.head_dim), s.v_dim),
          q(s.n_rows * s.head_dim), scale(1.0f / std::sqrt(static_cast<float>(s.head_dim))) {
        std::mt19937 rng(11u + static_cast<uint32_t>(s.n_pos));
        std::normal_distribution<float> dist(0.0f, 2.0f);  // peaked enough that the max matters
        for (auto& x : q) x = dist(rng);
        // Causal rows spread over the cache: the first sees nothing, some end inside a tile, some see
        // none of the later tiles, the last sees everything.
        std::uniform_int_distribution<int> pos(0, s.n_pos - 1);
        for (int r = 0; r < s.n_rows; ++r)
            last.push_back(r == 0 ? -1 : r == s.n_rows - 1 ? s.n_pos - 1 : pos(rng));
    }

    // All tiles folded in order into one state, the rows [r0, r0 + n) at a time.
    state_buf fold(const detail::isa_table& t, int rows_per_call) const {
        const int n_rows = static_cast<int>(last.size());
        state_buf st(n_rows, kv.value_dim());
        for (int i = 0; i < kv.n_tiles(); ++i)
            for (int r0 = 0; r0 < n_rows; r0 += rows_per_call)
                t.attn_tile(kv.tile(i), kv.head_dim, q.data() + r0 * kv.head_dim, std::min(rows_per_call, n_rows - r0),
                            last.data() + r0, scale, st.rows_from(r0, kv.value_dim()));
        return st;
    }

    // Each tile's state from empty, merged afterwards in tile order (the engine's decode).
    state_buf merged_later(const detail::isa_table& t) const {
        const int n_rows = static_cast<int>(last.size());
        state_buf acc(n_rows, kv.value_dim());
        for (int i = 0; i < kv.n_tiles(); ++i) {
            state_buf one(n_rows, kv.value_dim());
            t.attn_tile(kv.tile(i), kv.head_dim, q.data(), n_rows, last.data(), scale, one.view());
            attn_merge(kv.value_dim(), n_rows, acc.view(), one.view());
        }
        return acc;
    }

    // Row r's attention in double over the decoded values; zeros when it sees no position. Against Q8_0
    // keys the query is the row quantized to Q8_0 and decoded (attention.hpp's int8 scores).
    std::vector<double> reference(int r) const {
        const int64_t hd = kv.head_dim, vd = kv.value_dim();
        const int n_vis = static_cast<int>(std::min<int64_t>(kv.n_pos, last[r] + 1));
        std::vector<double> s(std::max(n_vis, 0)), out(vd, 0.0);
        std::vector<float> qr(q.begin() + r * hd, q.begin() + (r + 1) * hd);
        if (kv.type == ggml_type::Q8_0) {
            std::vector<formats::block_q8_0> blocks(static_cast<size_t>(hd / formats::QK8_0));
            formats::quantize_row(ggml_type::Q8_0, qr.data(), blocks.data(), hd);
            formats::dequantize_row(ggml_type::Q8_0, blocks.data(), qr.data(), hd);
        }
        double max = -INFINITY, sum = 0;
        for (int t = 0; t < n_vis; ++t) {
            double dot = 0;
            for (int64_t j = 0; j < hd; ++j) dot += double{qr[j]} * kv.kf[t * hd + j];
            s[t] = dot * scale;
            max = std::max(max, s[t]);
        }
        for (int t = 0; t < n_vis; ++t) {
            const double p = std::exp(s[t] - max);
            sum += p;
            for (int64_t j = 0; j < vd; ++j) out[j] += p * kv.vf[t * hd + j];
        }
        if (sum > 0)
            for (auto& o : out) o /= sum;
        return out;
    }
};

class AttentionTest : public ::testing::TestWithParam<shape> {};

TEST_P(AttentionTest, EveryIsaMatchesDoubleReferenceAndIsBitwiseStable) {
    const shape s = GetParam();
    const problem pb(s);
    const int64_t vd = pb.kv.value_dim();
    double v_max = 0;
    for (float x : pb.kv.vf) v_max = std::max(v_max, double{std::fabs(x)});
    const double tol = 1e-5 * (1 + v_max);
    std::vector<std::vector<double>> ref;
    for (int r = 0; r < s.n_rows; ++r) ref.push_back(pb.reference(r));

    for (isa which : {isa::scalar, isa::avx2, isa::avx512}) {
        if (!cpu_supports(which)) {
            std::printf("[ skipped  ] %s: this CPU lacks it\n", std::string(isa_name(which)).c_str());
            continue;
        }
        SCOPED_TRACE(std::string(isa_name(which)));
        const auto& t = detail::table_for(which);
        const state_buf all = pb.fold(t, s.n_rows);

        std::vector<float> out(s.n_rows * vd);
        state_buf copy = all;
        attn_finish(copy.view(), vd, s.n_rows, out.data(), vd);
        double worst = 0;
        for (int r = 0; r < s.n_rows; ++r)
            for (int64_t j = 0; j < vd; ++j) worst = std::max(worst, std::fabs(out[r * vd + j] - ref[r][j]));
        EXPECT_LE(worst, tol) << "largest |out - ref| over all rows";

        for (int rows_per_call : {1, 3, 5, 8, 16})
            EXPECT_TRUE(bitwise_equal(all, pb.fold(t, rows_per_call))) << rows_per_call << " rows per call";
        EXPECT_TRUE(bitwise_equal(all, pb.merged_later(t))) << "tile states merged afterwards";
    }
}

std::vector<shape> shapes() {
    std::vector<shape> v;
    // Several 256-position tiles and a ragged last one; tiles of 37; tiles of 1.
    for (ggml_type type : {ggml_type::F16, ggml_type::Q8_0})
        for (int64_t hd : {64, 128}) {
            v.push_back({type, hd, 549, 256, 19});
            v.push_back({type, hd, 100, 37, 12});
            v.push_back({type, hd, 5, 1, 6});
        }
    // Odd but legal head sizes: 40 and 80 for F16 (AVX-512 takes its AVX2 kernel for 40, a 16-wide
    // tail for 80), 96 for Q8_0, and 320 past the SIMD kernels' converted tiles (streamed whatever the rows).
    v.push_back({ggml_type::F16, 40, 300, 256, 9});
    v.push_back({ggml_type::F16, 80, 256, 256, 17});
    v.push_back({ggml_type::Q8_0, 96, 300, 256, 9});
    v.push_back({ggml_type::F16, 320, 70, 37, 5});
    // Latent attention, deepseek2's shape (key 512 + 64, value 512) over several tiles with more rows than
    // one streamed call takes; a small one through the converted-tile kernels (more rows than kFewRows);
    // values AVX-512 cannot take whole (48: its AVX2 kernel) or that end inside a Q8_0 block.
    for (ggml_type type : {ggml_type::F16, ggml_type::Q8_0}) {
        v.push_back({type, 576, 549, 256, 37, 512});
        v.push_back({type, 96, 300, 256, 21, 64});
        v.push_back({type, 64, 100, 37, 9, 48});
    }
    return v;
}

INSTANTIATE_TEST_SUITE_P(Shapes, AttentionTest, ::testing::ValuesIn(shapes()),
                         [](const auto& info) { return shape_name(info.param); });

}  // namespace
