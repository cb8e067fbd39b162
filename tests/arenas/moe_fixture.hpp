// Synthetic routed experts for the arenas tests: random weights quantized with formats::quantize_row,
// random routing (with skipped slots), and a plain float reference of one MoE layer.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "formats/quant.hpp"
#include "formats/types.hpp"
#include "moe_phases.hpp"

namespace strata::arenas::testing {

using formats::ggml_type;

// Types of gate, up and down of one layer.
using layer_types = std::array<ggml_type, 3>;

struct synthetic_moe {
    moe_shape shape;
    std::vector<moe_layer> layers;
    std::vector<std::vector<uint8_t>> storage;  // [layer * 3 + part]: n_expert matrices back to back
};

inline expert_tensor make_expert_tensor(std::vector<uint8_t>& bytes, const char* name, ggml_type type, int64_t n_cols,
                                        int64_t n_rows, int n_expert, std::mt19937& rng) {
    expert_tensor t;
    t.name = name;
    t.type = type;
    t.n_cols = n_cols;
    t.n_rows = n_rows;
    t.row_stride = formats::row_size(type, n_cols);
    const size_t expert_bytes = t.row_stride * static_cast<size_t>(n_rows);
    bytes.assign(expert_bytes * static_cast<size_t>(n_expert), 0);
    std::normal_distribution<float> value(0.0f, 0.05f);
    std::vector<float> f(static_cast<size_t>(n_cols * n_rows));
    for (int e = 0; e < n_expert; ++e) {
        for (auto& v : f) v = value(rng);
        formats::quantize_row(type, f.data(), bytes.data() + static_cast<size_t>(e) * expert_bytes, n_cols * n_rows);
        t.experts.push_back(bytes.data() + static_cast<size_t>(e) * expert_bytes);
    }
    return t;
}

inline synthetic_moe make_synthetic_moe(moe_shape shape, const std::vector<layer_types>& types, uint32_t seed) {
    synthetic_moe m;
    m.shape = shape;
    m.storage.resize(types.size() * 3);
    std::mt19937 rng(seed);
    for (size_t l = 0; l < types.size(); ++l) {
        moe_layer layer;
        layer.gate = make_expert_tensor(m.storage[l * 3 + 0], "ffn_gate_exps", types[l][0], shape.n_embd, shape.n_ff, shape.n_expert, rng);
        layer.up = make_expert_tensor(m.storage[l * 3 + 1], "ffn_up_exps", types[l][1], shape.n_embd, shape.n_ff, shape.n_expert, rng);
        layer.down = make_expert_tensor(m.storage[l * 3 + 2], "ffn_down_exps", types[l][2], shape.n_ff, shape.n_embd, shape.n_expert, rng);
        m.layers.push_back(std::move(layer));
    }
    return m;
}

struct routing {
    int n_tok = 0;
    std::vector<float> x;        // [n_tok][n_embd]
    std::vector<int32_t> ids;    // [n_tok][n_expert_used], distinct per token, -1 = skipped
    std::vector<float> weights;  // [n_tok][n_expert_used]
};

// Expert 0 is routed to about 60 % of the tokens, so batches of more than max_matvec_tokens tokens
// give it more slots than one matvec_multi call takes; `p_skip` of the slots are -1.
inline routing make_routing(const moe_shape& shape, int n_tok, std::mt19937& rng, double p_skip = 0.15) {
    routing r;
    r.n_tok = n_tok;
    const int k = shape.n_expert_used;
    std::normal_distribution<float> value(0.0f, 1.0f);
    std::uniform_real_distribution<float> unit(0.0f, 1.0f);
    r.x.resize(static_cast<size_t>(n_tok) * shape.n_embd);
    for (auto& v : r.x) v = value(rng);
    for (int t = 0; t < n_tok; ++t) {
        std::vector<int32_t> order(static_cast<size_t>(shape.n_expert));
        for (int e = 0; e < shape.n_expert; ++e) order[static_cast<size_t>(e)] = e;
        std::shuffle(order.begin(), order.end(), rng);
        const auto zero = std::find(order.begin(), order.end(), 0);
        if (unit(rng) < 0.6f && zero - order.begin() >= k) std::iter_swap(order.begin(), zero);
        for (int j = 0; j < k; ++j) {
            r.ids.push_back(unit(rng) < p_skip ? -1 : order[static_cast<size_t>(j)]);
            r.weights.push_back(0.05f + unit(rng));
        }
    }
    return r;
}

inline std::vector<float> dequantize_expert(const expert_tensor& t, int e) {
    std::vector<float> f(static_cast<size_t>(t.n_rows * t.n_cols));
    formats::dequantize_row(t.type, t.experts[static_cast<size_t>(e)], f.data(), t.n_rows * t.n_cols);
    return f;
}

// out[t] = sum_j w[t,j] * down_e(silu(gate_e x_t) * up_e x_t), accumulated in double in routing
// order. emulate_activations = false: dequantized weights times float x and h (the mathematics the
// phases approximate). true: every dot product is formats::vec_dot_ref of the weight row with x or h
// quantized to the weight's activation format, as the kernels compute it, so only the summation order
// inside a dot product differs from the pool's result.
inline std::vector<float> reference_moe(const synthetic_moe& m, int layer, const routing& r, bool emulate_activations) {
    const moe_shape& s = m.shape;
    const moe_layer& l = m.layers[static_cast<size_t>(layer)];
    std::vector<float> out(static_cast<size_t>(r.n_tok) * s.n_embd, 0.0f);
    std::vector<double> out_d(out.size(), 0.0);
    std::vector<float> h(static_cast<size_t>(s.n_ff));
    std::vector<uint8_t> act;
    auto quantized = [&](ggml_type weight_type, const float* v, int64_t n) {
        const ggml_type at = formats::vec_dot_type(weight_type);
        act.assign(formats::row_size(at, n), 0);
        formats::quantize_row(at, v, act.data(), n);
        return act;
    };
    auto dots = [&](const expert_tensor& t, int e, const std::vector<float>& dense, const float* v, std::vector<double>& y) {
        y.assign(static_cast<size_t>(t.n_rows), 0.0);
        if (emulate_activations) {
            const auto a = quantized(t.type, v, t.n_cols);
            const auto* base = static_cast<const uint8_t*>(t.experts[static_cast<size_t>(e)]);
            for (int64_t i = 0; i < t.n_rows; ++i)
                y[static_cast<size_t>(i)] = formats::vec_dot_ref(t.type, t.n_cols, base + static_cast<size_t>(i) * t.row_stride, a.data());
            return;
        }
        for (int64_t i = 0; i < t.n_rows; ++i) {
            double acc = 0;
            for (int64_t c = 0; c < t.n_cols; ++c) acc += double(dense[static_cast<size_t>(i * t.n_cols + c)]) * v[c];
            y[static_cast<size_t>(i)] = acc;
        }
    };
    std::vector<double> g, u, y;
    for (int t = 0; t < r.n_tok; ++t)
        for (int j = 0; j < s.n_expert_used; ++j) {
            const size_t slot = static_cast<size_t>(t * s.n_expert_used + j);
            const int e = r.ids[slot];
            if (e < 0) continue;
            std::vector<float> gate, up, down;
            if (!emulate_activations) gate = dequantize_expert(l.gate, e), up = dequantize_expert(l.up, e), down = dequantize_expert(l.down, e);
            const float* x = r.x.data() + static_cast<size_t>(t) * s.n_embd;
            dots(l.gate, e, gate, x, g);
            dots(l.up, e, up, x, u);
            for (int i = 0; i < s.n_ff; ++i) {
                const float gf = static_cast<float>(g[static_cast<size_t>(i)]);
                h[static_cast<size_t>(i)] = gf / (1.0f + std::exp(-gf)) * static_cast<float>(u[static_cast<size_t>(i)]);
            }
            dots(l.down, e, down, h.data(), y);
            for (int row = 0; row < s.n_embd; ++row)
                out_d[static_cast<size_t>(t) * s.n_embd + row] += double(r.weights[slot]) * y[static_cast<size_t>(row)];
        }
    for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<float>(out_d[i]);
    return out;
}

}  // namespace strata::arenas::testing
