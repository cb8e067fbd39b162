#include "model/kv_cache.hpp"

#include <cmath>
#include <cstring>
#include <stdexcept>

#include "formats/quant.hpp"

namespace strata::engine {

using formats::ggml_type;
namespace cpu = kernels::cpu;

kv_type parse_kv_type(const std::string& name) {
    if (name == "f16") return kv_type::f16;
    if (name == "int8") return kv_type::int8;
    throw std::invalid_argument("KV cache type '" + name + "' is not one of: f16, int8");
}

const char* kv_type_name(kv_type t) { return t == kv_type::f16 ? "f16" : "int8"; }

kv_cache::kv_cache(int n_layer, int n_ctx, int n_head_kv, int head_dim, kv_type type)
    : n_layer_(n_layer), n_ctx_(n_ctx), n_head_kv_(n_head_kv), head_dim_(head_dim), type_(type) {
    if (type == kv_type::int8 && head_dim % formats::QK8_0 != 0)
        throw std::invalid_argument("an int8 KV cache needs a head size that is a multiple of 32, this model's is " +
                                    std::to_string(head_dim));
    const size_t per_layer = static_cast<size_t>(n_ctx) * k_row_bytes();
    k_.assign(static_cast<size_t>(n_layer), std::vector<uint8_t>(per_layer));
    v_.assign(static_cast<size_t>(n_layer), std::vector<uint8_t>(per_layer));
}

size_t kv_cache::k_row_bytes() const {
    const int64_t n_kv = int64_t{n_head_kv_} * head_dim_;
    return formats::row_size(type_ == kv_type::f16 ? ggml_type::F16 : ggml_type::Q8_0, n_kv);
}

size_t kv_cache::bytes() const { return bytes_needed(n_layer_, n_ctx_, n_head_kv_, head_dim_, type_); }

size_t kv_cache::bytes_needed(int n_layer, int n_ctx, int n_head_kv, int head_dim, kv_type type) {
    const int64_t n_kv = int64_t{n_head_kv} * head_dim;
    const size_t row = formats::row_size(type == kv_type::f16 ? ggml_type::F16 : ggml_type::Q8_0, n_kv);
    return 2 * static_cast<size_t>(n_layer) * static_cast<size_t>(n_ctx) * row;
}

void kv_cache::store(int layer, int pos, const float* k, const float* v) {
    const int64_t n_kv = int64_t{n_head_kv_} * head_dim_;
    uint8_t* k_row = k_[static_cast<size_t>(layer)].data() + static_cast<size_t>(pos) * k_row_bytes();
    if (type_ == kv_type::f16) {
        formats::quantize_row(ggml_type::F16, k, k_row, n_kv);
        auto* vt = reinterpret_cast<formats::fp16_t*>(v_[static_cast<size_t>(layer)].data());
        for (int64_t i = 0; i < n_kv; ++i) vt[i * n_ctx_ + pos] = formats::fp32_to_fp16(v[i]);
    } else {
        formats::quantize_row(ggml_type::Q8_0, k, k_row, n_kv);
        formats::quantize_row(ggml_type::Q8_0, v, v_[static_cast<size_t>(layer)].data() +
                                                      static_cast<size_t>(pos) * k_row_bytes(), n_kv);
    }
}

void kv_cache::attend(int layer, const float* q, int n_head, int head_begin, int head_end, int n_pos, float scale,
                      float* out, float* scratch) const {
    const int group = n_head / n_head_kv_;
    const size_t row = k_row_bytes();
    const size_t head_bytes = row / static_cast<size_t>(n_head_kv_);
    const uint8_t* k_base = k_[static_cast<size_t>(layer)].data();
    const uint8_t* v_base = v_[static_cast<size_t>(layer)].data();
    const ggml_type k_type = type_ == kv_type::f16 ? ggml_type::F16 : ggml_type::Q8_0;
    std::vector<uint8_t> q_act(cpu::activation_row_size(k_type, head_dim_));
    for (int h = head_begin; h < head_end; ++h) {
        const int g = h / group;
        const float* qh = q + static_cast<size_t>(h) * head_dim_;
        float* oh = out + static_cast<size_t>(h) * head_dim_;
        // scores[t] = K[t, g, :] . q_h: a matvec over the cache's rows for kv head g.
        cpu::quantize_activation(k_type, qh, q_act.data(), head_dim_);
        const cpu::matrix k_rows{k_type, k_base + static_cast<size_t>(g) * head_bytes, head_dim_, row};
        cpu::matvec(k_rows, 0, n_pos, q_act.data(), scratch);
        for (int t = 0; t < n_pos; ++t) scratch[t] *= scale;
        cpu::softmax(scratch, n_pos);
        if (type_ == kv_type::f16) {
            // out[d] = V^T[g * head_dim + d, 0:n_pos] . p
            const cpu::matrix vt{ggml_type::F16, v_base + static_cast<size_t>(g) * head_dim_ * n_ctx_ * 2, n_pos,
                                 static_cast<size_t>(n_ctx_) * 2};
            cpu::matvec(vt, 0, head_dim_, scratch, oh);
        } else {
            std::memset(oh, 0, sizeof(float) * static_cast<size_t>(head_dim_));
            for (int t = 0; t < n_pos; ++t) {
                const auto* blocks = reinterpret_cast<const formats::block_q8_0*>(
                    v_base + static_cast<size_t>(t) * row + static_cast<size_t>(g) * head_bytes);
                for (int b = 0; b < head_dim_ / formats::QK8_0; ++b) {
                    const float w = scratch[t] * formats::fp16_to_fp32(blocks[b].d);
                    for (int j = 0; j < formats::QK8_0; ++j) oh[b * formats::QK8_0 + j] += w * blocks[b].qs[j];
                }
            }
        }
    }
}

}  // namespace strata::engine
