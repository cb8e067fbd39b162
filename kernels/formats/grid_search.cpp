// Nearest-entry search in the IQ code books, and the importance-free encoders of groups of 8 built on
// it. Each element rounds to its nearest grid level; the resulting lattice point carries a list of the
// code book entries nearest to it (computed once per code book), and the candidate with the smallest
// exact squared error wins. Off-grid points thus still find a close entry without a full scan.
#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <numeric>
#include <vector>

#include "formats/detail.hpp"
#include "formats/iq_grids.hpp"
#include "formats/quant.hpp"

namespace strata::formats::detail {

struct grid_book {
    int dim = 0, n_entries = 0, n_levels = 0;
    std::array<float, 8> levels{};   // the distinct values of the code book, ascending
    std::vector<int8_t> values;      // [n_entries][dim]
    std::vector<uint16_t> near;      // [lattice point][kNear]: entries by distance to the point
};

namespace {

constexpr int kNear = 8;

template <typename Entry>
grid_book make_book(const Entry* table, int n_entries, int dim, bool is_signed) {
    grid_book b;
    b.dim = dim;
    b.n_entries = n_entries;
    b.values.resize(static_cast<size_t>(n_entries) * dim);
    std::vector<int> distinct;
    for (int e = 0; e < n_entries; ++e)
        for (int j = 0; j < dim; ++j) {
            const int v = is_signed ? grid_value_signed(table[e], j) : grid_value(table[e], j);
            b.values[static_cast<size_t>(e) * dim + j] = static_cast<int8_t>(v);
            if (std::find(distinct.begin(), distinct.end(), v) == distinct.end()) distinct.push_back(v);
        }
    std::sort(distinct.begin(), distinct.end());
    b.n_levels = static_cast<int>(distinct.size());
    for (int l = 0; l < b.n_levels; ++l) b.levels[static_cast<size_t>(l)] = static_cast<float>(distinct[static_cast<size_t>(l)]);

    int points = 1;
    for (int j = 0; j < dim; ++j) points *= b.n_levels;
    b.near.resize(static_cast<size_t>(points) * kNear);
    std::vector<int> dist(static_cast<size_t>(n_entries));
    std::vector<uint16_t> order(static_cast<size_t>(n_entries));
    for (int p = 0; p < points; ++p) {
        int coord[8];
        for (int j = 0, rest = p; j < dim; ++j, rest /= b.n_levels) coord[j] = distinct[static_cast<size_t>(rest % b.n_levels)];
        for (int e = 0; e < n_entries; ++e) {
            int d2 = 0;
            for (int j = 0; j < dim; ++j) {
                const int diff = b.values[static_cast<size_t>(e) * dim + j] - coord[j];
                d2 += diff * diff;
            }
            dist[static_cast<size_t>(e)] = d2;
        }
        std::iota(order.begin(), order.end(), uint16_t{0});
        std::partial_sort(order.begin(), order.begin() + kNear, order.end(),
                          [&](uint16_t a, uint16_t c) { return dist[a] != dist[c] ? dist[a] < dist[c] : a < c; });
        std::copy_n(order.begin(), kNear, b.near.begin() + static_cast<ptrdiff_t>(p) * kNear);
    }
    return b;
}

int nearest_level(const grid_book& b, float v) {
    int best = 0;
    for (int l = 1; l < b.n_levels; ++l)
        if (std::fabs(v - b.levels[static_cast<size_t>(l)]) < std::fabs(v - b.levels[static_cast<size_t>(best)])) best = l;
    return best;
}

}  // namespace

const grid_book& book(grid_kind kind) {
    // Built on first use (a few hundred ms for the largest): quantizing is the only caller.
    switch (kind) {
        case grid_kind::iq2xxs: { static const grid_book b = make_book(iq2xxs_grid, 256, 8, false); return b; }
        case grid_kind::iq2xs: { static const grid_book b = make_book(iq2xs_grid, 512, 8, false); return b; }
        case grid_kind::iq2s: { static const grid_book b = make_book(iq2s_grid, 1024, 8, false); return b; }
        case grid_kind::iq3xxs: { static const grid_book b = make_book(iq3xxs_grid, 256, 4, false); return b; }
        case grid_kind::iq3s: { static const grid_book b = make_book(iq3s_grid, 512, 4, false); return b; }
        case grid_kind::iq1s: break;
    }
    static const grid_book b = make_book(iq1s_grid, 2048, 8, true);
    return b;
}

int book_dim(const grid_book& b) { return b.dim; }
float book_max_level(const grid_book& b) { return b.levels[static_cast<size_t>(b.n_levels - 1)]; }
int book_value(const grid_book& b, int entry, int j) { return b.values[static_cast<size_t>(entry) * b.dim + j]; }

int nearest_entry(const grid_book& b, const float* v, float* err) {
    int point = 0;
    for (int j = b.dim - 1; j >= 0; --j) point = point * b.n_levels + nearest_level(b, v[j]);
    int best = 0;
    float best_err = INFINITY;
    for (int k = 0; k < kNear; ++k) {
        const int e = b.near[static_cast<size_t>(point) * kNear + k];
        float e2 = 0.0f;
        for (int j = 0; j < b.dim; ++j) {
            const float diff = v[j] - static_cast<float>(b.values[static_cast<size_t>(e) * b.dim + j]);
            e2 += diff * diff;
        }
        if (e2 < best_err) {
            best_err = e2;
            best = e;
        }
    }
    if (err) *err = best_err;
    return best;
}

void encode_signed8(const grid_book& b, bool even, const float* x, float scale, signed_group& g, float& xq, float& qq) {
    float v[8];
    unsigned signs = 0;
    int smallest = 0;
    const float inv = scale > 0.0f ? 1.0f / scale : 0.0f;
    for (int j = 0; j < 8; ++j) {
        if (x[j] < 0.0f) signs |= 1u << j;
        v[j] = std::fabs(x[j]) * inv;
        if (std::fabs(x[j]) < std::fabs(x[smallest])) smallest = j;
    }
    if (even && (std::popcount(signs) & 1)) {
        signs ^= 1u << smallest;  // the wrong sign costs least here; aim that element at the smallest value
        v[smallest] = 0.0f;
    }
    g.signs = static_cast<uint8_t>(signs);
    for (int k = 0; k < 8 / b.dim; ++k) {
        const int e = nearest_entry(b, v + k * b.dim, nullptr);
        g.entry[k] = static_cast<uint16_t>(e);
        for (int j = 0; j < b.dim; ++j) {
            const int i = k * b.dim + j;
            const float q = static_cast<float>(book_value(b, e, j)) * ((signs >> i) & 1 ? -1.0f : 1.0f);
            xq += x[i] * q;
            qq += q * q;
        }
    }
}

float fit_signed(const grid_book& b, bool even, const float* x, int n) {
    const float amax = max_abs(n, x);
    if (amax == 0.0f) return 0.0f;
    float best_score = -1.0f, best_scale = 0.0f;
    signed_group g;
    // A sweep with the largest magnitude near the top level, then one candidate per lower level (flat
    // blocks fit those best).
    constexpr int sweep = 8;
    for (int k = 0; k < sweep + b.n_levels - 1; ++k) {
        const float scale = k < sweep ? amax / (book_max_level(b) * (0.7f + 0.08f * static_cast<float>(k)))
                                      : amax / std::max(1.0f, b.levels[static_cast<size_t>(k - sweep)]);
        float xq = 0.0f, qq = 0.0f;
        for (int i = 0; i < n; i += 8) encode_signed8(b, even, x + i, scale, g, xq, qq);
        if (qq > 0.0f && xq > 0.0f && xq * xq / qq > best_score) {
            best_score = xq * xq / qq;
            best_scale = xq / qq;
        }
    }
    return best_scale;
}

int encode_iq1_group(const float* x, float scale, float delta, float& xq, float& qq) {
    const grid_book& b = book(grid_kind::iq1s);
    float v[8];
    const float inv = scale > 0.0f ? 1.0f / scale : 0.0f;
    for (int j = 0; j < 8; ++j) v[j] = x[j] * inv - delta;
    const int e = nearest_entry(b, v, nullptr);
    for (int j = 0; j < 8; ++j) {
        const float q = static_cast<float>(book_value(b, e, j)) + delta;
        xq += x[j] * q;
        qq += q * q;
    }
    return e;
}

float odd_scales(const float* scales, int n, int max_code, float unit, int* ls) {
    float smax = 0.0f;
    for (int i = 0; i < n; ++i) smax = std::max(smax, scales[i]);
    const float d = fp16_to_fp32(fp32_to_fp16(smax / (unit * static_cast<float>(2 * max_code + 1))));
    for (int i = 0; i < n; ++i)
        ls[i] = d > 0.0f ? std::clamp(nearest_int((scales[i] / (d * unit) - 1.0f) / 2.0f), 0, max_code) : 0;
    return d;
}

}  // namespace strata::formats::detail
