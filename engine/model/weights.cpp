#include "model/weights.hpp"

#include <cstring>
#include <stdexcept>
#include <vector>

#include <spdlog/fmt/fmt.h>

#include "formats/quant.hpp"

namespace strata::engine {

namespace {

std::string shape(const std::vector<int64_t>& ne) {
    std::string s = "[";
    for (size_t i = 0; i < ne.size(); ++i) s += (i ? ", " : "") + std::to_string(ne[i]);
    return s + "]";
}

class binder {
public:
    binder(const gguf::reader& f) : f_(f) {}

    const gguf::tensor_info* find(const std::string& name, bool required) const {
        const gguf::tensor_info* t = f_.find_tensor(name);
        if (!t && required)
            throw std::runtime_error(fmt::format("{}: tensor '{}' is missing", f_.path(), name));
        return t;
    }

    const gguf::tensor_info* checked(const std::string& name, std::vector<int64_t> ne, const char* dims,
                                     bool required = true) const {
        const gguf::tensor_info* t = find(name, required);
        if (t && t->ne != ne)
            throw std::runtime_error(fmt::format("{}: tensor '{}' has shape {}, expected {} ({})", f_.path(), name,
                                                 t->shape_string(), shape(ne), dims));
        return t;
    }

    const float* vec(const std::string& name, int64_t n, const char* dims, bool required = true) const {
        const gguf::tensor_info* t = checked(name, {n}, dims, required);
        if (!t) return nullptr;
        if (t->type != formats::ggml_type::F32)
            throw std::runtime_error(fmt::format("{}: tensor '{}' is {}; strata expects F32 for norms and biases",
                                                 f_.path(), name, formats::info(t->type).name));
        return reinterpret_cast<const float*>(f_.tensor_data(*t).data());
    }

    weight_matrix mat(const std::string& name, int64_t n_cols, int64_t n_rows, const char* dims,
                      bool required = true) const {
        const gguf::tensor_info* t = checked(name, {n_cols, n_rows}, dims, required);
        if (!t) return {};
        need_kernel(*t);
        return {name, {t->type, f_.tensor_data(*t).data(), n_cols, formats::row_size(t->type, n_cols)}, n_rows};
    }

    expert_matrix experts(const std::string& prefix, const std::string& part, int64_t n_cols, int64_t n_rows,
                          int n_expert, const char* dims) const {
        expert_matrix em;
        em.n_cols = n_cols;
        em.n_rows = n_rows;
        const std::string merged = prefix + "ffn_" + part + "_exps.weight";
        if (const gguf::tensor_info* t = checked(merged, {n_cols, n_rows, n_expert}, dims, false)) {
            need_kernel(*t);
            em.name = merged;
            em.type = t->type;
            em.row_stride = formats::row_size(t->type, n_cols);
            const uint8_t* base = f_.tensor_data(*t).data();
            for (int e = 0; e < n_expert; ++e)
                em.experts.push_back(base + static_cast<size_t>(e) * em.row_stride * static_cast<size_t>(n_rows));
            return em;
        }
        // Older Mixtral files: one tensor per expert.
        for (int e = 0; e < n_expert; ++e) {
            const std::string name = fmt::format("{}ffn_{}.{}.weight", prefix, part, e);
            const gguf::tensor_info* t = f_.find_tensor(name);
            if (!t)
                throw std::runtime_error(fmt::format("{}: neither '{}' nor the per-expert tensor '{}' exists",
                                                     f_.path(), merged, name));
            checked(name, {n_cols, n_rows}, dims);
            need_kernel(*t);
            if (e == 0) {
                em.name = name;
                em.type = t->type;
                em.row_stride = formats::row_size(t->type, n_cols);
            } else if (t->type != em.type) {
                throw std::runtime_error(fmt::format("{}: tensor '{}' is {}, but expert 0 of that layer is {}",
                                                     f_.path(), name, formats::info(t->type).name,
                                                     formats::info(em.type).name));
            }
            em.experts.push_back(f_.tensor_data(*t).data());
        }
        return em;
    }

    // llama.cpp's fused ffn_gate_up_exps [n_cols, 2 n_rows, n_expert], when the file has it: per expert
    // n_rows gate rows, then n_rows up rows, bound as two expert matrices over the same bytes.
    bool fused_gate_up(const std::string& prefix, int64_t n_cols, int64_t n_rows, int n_expert, expert_matrix& gate,
                       expert_matrix& up) const {
        const std::string name = prefix + "ffn_gate_up_exps.weight";
        const gguf::tensor_info* t = checked(name, {n_cols, 2 * n_rows, n_expert}, "n_embd, 2 n_ff_exp, n_expert", false);
        if (!t) return false;
        need_kernel(*t);
        const uint8_t* base = f_.tensor_data(*t).data();
        for (expert_matrix* m : {&gate, &up}) {
            *m = {};
            m->name = name;
            m->type = t->type;
            m->n_cols = n_cols;
            m->n_rows = n_rows;
            m->row_stride = formats::row_size(t->type, n_cols);
        }
        const size_t part = gate.row_stride * static_cast<size_t>(n_rows);
        for (int e = 0; e < n_expert; ++e) {
            gate.experts.push_back(base + 2 * static_cast<size_t>(e) * part);
            up.experts.push_back(base + (2 * static_cast<size_t>(e) + 1) * part);
        }
        return true;
    }

    const std::string& path() const { return f_.path(); }

    // An F32 tensor's data (shape already checked).
    const float* f32(const gguf::tensor_info& t) const {
        if (t.type != formats::ggml_type::F32)
            throw std::runtime_error(fmt::format("{}: tensor '{}' is {}; strata expects F32", f_.path(), t.name,
                                                 formats::info(t.type).name));
        return reinterpret_cast<const float*>(f_.tensor_data(t).data());
    }

    // A 3-D tensor already shape-checked, as a 2-D matrix of n_cols columns.
    weight_matrix mat2d(const gguf::tensor_info& t, int64_t n_cols, int64_t n_rows) const {
        need_kernel(t);
        return {t.name, {t.type, f_.tensor_data(t).data(), n_cols, formats::row_size(t.type, n_cols)}, n_rows};
    }

private:
    void need_kernel(const gguf::tensor_info& t) const {
        if (!kernels::cpu::has_matvec(t.type))
            throw std::runtime_error(fmt::format("{}: tensor '{}' has type {}, which strata has no CPU kernel for",
                                                 f_.path(), t.name, formats::info(t.type).name));
    }

    const gguf::reader& f_;
};

// deepseek2's attention tensors of layer i (llama.cpp's names and shapes). attn_kv_b (older files)
// holds per head nope key rows then head_dim_v value rows over the latent; the key rows are turned
// into wk_b's layout (latent rows over nope columns, F32) in w.packed_storage, the value rows used
// in place.
void bind_mla(const binder& b, const hparams& hp, int i, layer_weights& l, model_weights& w) {
    const std::string p = fmt::format("blk.{}.", i);
    const int64_t n_head = hp.n_head, nope = hp.head_dim - hp.n_rot, lora_kv = hp.n_lora_kv, hd_v = hp.head_dim_v;
    if (hp.n_lora_q > 0) {
        l.wq_a = b.mat(p + "attn_q_a.weight", hp.n_embd, hp.n_lora_q, "n_embd, q_lora_rank");
        l.q_a_norm = b.vec(p + "attn_q_a_norm.weight", hp.n_lora_q, "q_lora_rank");
        l.wq_b = b.mat(p + "attn_q_b.weight", hp.n_lora_q, hp.n_q(), "q_lora_rank, n_head * head_dim");
    } else {
        l.wq = b.mat(p + "attn_q.weight", hp.n_embd, hp.n_q(), "n_embd, n_head * head_dim");
    }
    l.wkv_a = b.mat(p + "attn_kv_a_mqa.weight", hp.n_embd, lora_kv + hp.n_rot, "n_embd, kv_lora_rank + n_rot");
    l.kv_a_norm = b.vec(p + "attn_kv_a_norm.weight", lora_kv, "kv_lora_rank");
    l.wo = b.mat(p + "attn_output.weight", hp.n_v(), hp.n_embd, "n_head * head_dim_v, n_embd");
    if (hp.kv_b_split) {
        const std::string kb = p + "attn_k_b.weight", vb = p + "attn_v_b.weight";
        const gguf::tensor_info* tk = b.checked(kb, {nope, lora_kv, n_head}, "head_dim - n_rot, kv_lora_rank, n_head");
        const gguf::tensor_info* tv = b.checked(vb, {lora_kv, hd_v, n_head}, "kv_lora_rank, head_dim_v, n_head");
        l.wk_b = b.mat2d(*tk, nope, n_head * lora_kv);
        l.wv_b = b.mat2d(*tv, lora_kv, n_head * hd_v);
        l.v_b_step = hd_v;
        return;
    }
    const std::string name = p + "attn_kv_b.weight";
    l.wv_b = b.mat(name, lora_kv, n_head * (nope + hd_v), "kv_lora_rank, n_head * (head_dim - n_rot + head_dim_v)");
    l.v_b_step = nope + hd_v;
    l.v_b_row0 = nope;
    const kernels::cpu::matrix& kv = l.wv_b.m;
    auto& bytes = w.packed_storage.emplace_back(static_cast<size_t>(n_head * lora_kv * nope) * sizeof(float));
    auto* kt = reinterpret_cast<float*>(bytes.data());
    std::vector<float> row(static_cast<size_t>(lora_kv));
    for (int64_t h = 0; h < n_head; ++h)
        for (int64_t d = 0; d < nope; ++d) {
            const auto* src = static_cast<const uint8_t*>(kv.data) + static_cast<size_t>(h * (nope + hd_v) + d) * kv.row_stride;
            formats::dequantize_row(kv.type, src, row.data(), lora_kv);
            for (int64_t c = 0; c < lora_kv; ++c) kt[(h * lora_kv + c) * nope + d] = row[static_cast<size_t>(c)];
        }
    l.wk_b = {name + " (keys, transposed)",
              {formats::ggml_type::F32, bytes.data(), nope, formats::row_size(formats::ggml_type::F32, nope)},
              n_head * lora_kv};
}

// A gated DeltaNet layer's mixer tensors (llama.cpp's names; ssm_a has no suffix).
void bind_delta_net(const binder& b, const hparams& hp, int i, layer_weights& l) {
    const std::string p = fmt::format("blk.{}.", i);
    const int64_t n_embd = hp.n_embd, n_v = hp.ssm_n_v_head, conv = hp.ssm_conv_dim(), vd = hp.ssm_value_dim();
    l.wqkv = b.mat(p + "attn_qkv.weight", n_embd, conv, "n_embd, 2 key_dim + value_dim", false);
    if (l.wqkv.present()) {
        l.wz = b.mat(p + "attn_gate.weight", n_embd, vd, "n_embd, value_dim");
    } else if (hp.arch.id == arch::qwen3next) {
        l.ssm_in = b.mat(p + "ssm_in.weight", n_embd, conv + vd, "n_embd, 2 key_dim + 2 value_dim", false);
        if (!l.ssm_in.present())
            throw std::runtime_error(fmt::format("{}: layer {} is a DeltaNet layer but has neither '{}attn_qkv.weight' "
                                                 "nor '{}ssm_in.weight'",
                                                 b.path(), i, p, p));
    } else {
        b.mat(p + "attn_qkv.weight", n_embd, conv, "n_embd, 2 key_dim + value_dim");  // throws: missing
    }
    const gguf::tensor_info* cw = b.checked(p + "ssm_conv1d.weight", {hp.ssm_conv_kernel, conv}, "conv_kernel, conv_dim");
    l.ssm_conv1d = b.f32(*cw);
    l.ssm_dt_bias = b.vec(p + "ssm_dt.bias", n_v, "time_step_rank");
    l.ssm_a = b.vec(p + "ssm_a", n_v, "time_step_rank");
    if (hp.arch.id == arch::qwen3next) {
        l.ssm_ba = b.mat(p + "ssm_ba.weight", n_embd, 2 * n_v, "n_embd, 2 time_step_rank");
    } else {
        l.ssm_beta = b.mat(p + "ssm_beta.weight", n_embd, n_v, "n_embd, time_step_rank");
        l.ssm_alpha = b.mat(p + "ssm_alpha.weight", n_embd, n_v, "n_embd, time_step_rank");
    }
    l.ssm_norm = b.vec(p + "ssm_norm.weight", hp.ssm_d_state, "state_size");
    l.wo = b.mat(p + "ssm_out.weight", vd, n_embd, "value_dim, n_embd");
}

// Layer i's router, routed experts and shared expert.
void bind_moe(const binder& b, const hparams& hp, int i, layer_weights& l) {
    const std::string p = fmt::format("blk.{}.", i);
    l.router = b.mat(p + "ffn_gate_inp.weight", hp.n_embd, hp.n_expert, "n_embd, n_expert");
    if (hp.arch.exp_probs_b != presence::absent)
        l.exp_probs_b = b.vec(p + "exp_probs_b.bias", hp.n_expert, "n_expert", hp.arch.exp_probs_b == presence::required);
    if (!b.fused_gate_up(p, hp.n_embd, hp.n_ff_exp, hp.n_expert, l.gate, l.up)) {
        l.gate = b.experts(p, "gate", hp.n_embd, hp.n_ff_exp, hp.n_expert, "n_embd, n_ff_exp, n_expert");
        l.up = b.experts(p, "up", hp.n_embd, hp.n_ff_exp, hp.n_expert, "n_embd, n_ff_exp, n_expert");
    }
    l.down = b.experts(p, "down", hp.n_ff_exp, hp.n_embd, hp.n_expert, "n_ff_exp, n_embd, n_expert");
    if (hp.n_ff_shexp > 0) {
        if (hp.arch.id == arch::qwen2moe || hp.hybrid())
            l.shexp_gate_inp = b.vec(p + "ffn_gate_inp_shexp.weight", hp.n_embd, "n_embd");
        l.shexp_gate = b.mat(p + "ffn_gate_shexp.weight", hp.n_embd, hp.n_ff_shexp, "n_embd, n_ff_shexp");
        l.shexp_up = b.mat(p + "ffn_up_shexp.weight", hp.n_embd, hp.n_ff_shexp, "n_embd, n_ff_shexp");
        l.shexp_down = b.mat(p + "ffn_down_shexp.weight", hp.n_ff_shexp, hp.n_embd, "n_ff_shexp, n_embd");
    }
}

// The gated attention of the hybrids: attn_q twice as wide (each head's query, then its gate), QK norms.
void bind_gated_attention(const binder& b, const hparams& hp, int i, layer_weights& l) {
    const std::string p = fmt::format("blk.{}.", i);
    l.wq = b.mat(p + "attn_q.weight", hp.n_embd, 2 * hp.n_q(), "n_embd, 2 n_head head_dim (query and gate)");
    l.wk = b.mat(p + "attn_k.weight", hp.n_embd, hp.n_kv(), "n_embd, n_head_kv * head_dim");
    l.wv = b.mat(p + "attn_v.weight", hp.n_embd, hp.n_kv(), "n_embd, n_head_kv * head_dim");
    l.wo = b.mat(p + "attn_output.weight", hp.n_q(), hp.n_embd, "n_head * head_dim, n_embd");
    l.q_norm = b.vec(p + "attn_q_norm.weight", hp.head_dim, "head_dim");
    l.k_norm = b.vec(p + "attn_k_norm.weight", hp.head_dim, "head_dim");
}

// A qwen4exp hyper-connection mixer: <prefix>norm, _down, _up (and _inject unless an output mixer).
hc_mixer bind_hc(const binder& b, const hparams& hp, const std::string& prefix, bool inject, bool required = true) {
    const int64_t dim = hp.hc_dim(), rank = hp.hc_rank;
    hc_mixer m;
    m.norm = b.vec(prefix + "norm.weight", dim, "hc * n_embd", required);
    if (!m.norm) return m;
    m.down = b.mat(prefix + "down.weight", dim, rank, "hc * n_embd, hyper_connection.low_rank");
    m.up = b.mat(prefix + "up.weight", rank, dim, "hyper_connection.low_rank, hc * n_embd");
    if (inject) m.inject = b.mat(prefix + "inject.weight", dim, hp.hc, "hc * n_embd, hyper_connection.count");
    return m;
}

// A qwen4exp layer's mixers, its QSA indexer (attention layers) and PLE block (hp.ple_layer).
void bind_qwen4(const binder& b, const hparams& hp, int i, layer_weights& l) {
    const std::string p = fmt::format("blk.{}.", i);
    l.hc_attn = bind_hc(b, hp, p + "hc_attn_", true);
    l.hc_ffn = bind_hc(b, hp, p + "hc_ffn_", true);
    if (i >= hp.n_layer || !hp.is_recurrent(i)) {
        const int64_t d = hp.idx_head_dim;
        l.idx_q = b.mat(p + "indexer.q_proj.weight", hp.n_embd, hp.idx_n_head * d, "n_embd, indexer heads * key_length");
        l.idx_k = b.mat(p + "indexer.k_proj.weight", hp.n_embd, d, "n_embd, indexer key_length");
        l.idx_q_norm = b.vec(p + "indexer.q_norm.weight", d, "indexer key_length");
        l.idx_k_norm = b.vec(p + "indexer.k_norm.weight", d, "indexer key_length");
    }
    if (i != hp.ple_layer) return;
    const int64_t dim = hp.hc_dim();
    l.ple.key = b.mat(p + "ple_key.weight", hp.ple_dim(), dim, "PLE heads * embedding_length_per_layer, hc * n_embd");
    l.ple.value = b.mat(p + "ple_value.weight", hp.ple_dim(), hp.n_embd, "PLE heads * embedding_length_per_layer, n_embd");
    l.ple.norm_key = b.vec(p + "ple_norm_key.weight", dim, "hc * n_embd");
    l.ple.norm_query = b.vec(p + "ple_norm_query.weight", dim, "hc * n_embd");
    l.ple.norm_conv = b.vec(p + "ple_norm_conv.weight", dim, "hc * n_embd");
    l.ple.conv1d = b.f32(*b.checked(p + "ple_conv1d.weight", {hp.ple_conv_kernel, dim}, "ple.conv_kernel, hc * n_embd"));
}

// per_layer_token_embd: at least the rows the head ranges reach, of a type rows can be read from.
ple_table bind_ple_table(const gguf::reader& f, const binder& b, const hparams& hp) {
    const std::string name = "per_layer_token_embd.weight";
    const gguf::tensor_info* t = b.find(name, true);
    if (t->ne.size() != 2 || t->ne[0] != hp.ple_head_dim || t->ne[1] < hp.ple_rows())
        throw std::runtime_error(fmt::format("{}: tensor '{}' has shape {}, expected [{}, at least {}] "
                                             "(embedding_length_per_layer, the rows the PLE head ranges reach)",
                                             f.path(), name, t->shape_string(), hp.ple_head_dim, hp.ple_rows()));
    if (!formats::info(t->type).quantized && t->type != formats::ggml_type::F32 && t->type != formats::ggml_type::F16 &&
        t->type != formats::ggml_type::BF16)
        throw std::runtime_error(fmt::format("{}: tensor '{}' has type {}, which strata cannot read rows of", f.path(),
                                             name, formats::info(t->type).name));
    return {f.tensor_data(*t).data(), t->type, t->ne[0], t->ne[1], formats::row_size(t->type, t->ne[0])};
}

// A plain attention layer (q, k, v, output; the architecture's optional biases and QK norms).
void bind_attention(const binder& b, const hparams& hp, int i, layer_weights& l) {
    const std::string p = fmt::format("blk.{}.", i);
    l.wq = b.mat(p + "attn_q.weight", hp.n_embd, hp.n_q(), "n_embd, n_head * head_dim");
    l.wk = b.mat(p + "attn_k.weight", hp.n_embd, hp.n_kv(), "n_embd, n_head_kv * head_dim");
    l.wv = b.mat(p + "attn_v.weight", hp.n_embd, hp.n_kv(), "n_embd, n_head_kv * head_dim");
    l.wo = b.mat(p + "attn_output.weight", hp.n_q(), hp.n_embd, "n_head * head_dim, n_embd");
    if (hp.arch.qkv_bias != presence::absent) {
        const bool req = hp.arch.qkv_bias == presence::required;
        l.bq = b.vec(p + "attn_q.bias", hp.n_q(), "n_head * head_dim", req);
        l.bk = b.vec(p + "attn_k.bias", hp.n_kv(), "n_head_kv * head_dim", req);
        l.bv = b.vec(p + "attn_v.bias", hp.n_kv(), "n_head_kv * head_dim", req);
    }
    if (hp.arch.qk_norm != presence::absent) {
        const bool req = hp.arch.qk_norm == presence::required;
        l.q_norm = b.vec(p + "attn_q_norm.weight", hp.head_dim, "head_dim", req);
        l.k_norm = b.vec(p + "attn_k_norm.weight", hp.head_dim, "head_dim", req);
        if ((l.q_norm == nullptr) != (l.k_norm == nullptr))
            throw std::runtime_error(fmt::format("{}: layer {} has only one of attn_q_norm.weight and "
                                                 "attn_k_norm.weight; strata needs both or neither",
                                                 b.path(), i));
    }
}

// The hybrids' MTP blocks: each a gated attention layer with its MoE and the nextn.* tensors (qwen4exp:
// hyper-connection mixers instead of the norms, hnorm over the wide residual, its own output mixer).
void bind_nextn(const binder& b, const hparams& hp, model_weights& w) {
    const bool q4 = hp.qwen4();
    for (int i = hp.n_layer; i < hp.n_layer + hp.n_layer_nextn; ++i) {
        const std::string p = fmt::format("blk.{}.", i);
        nextn_weights n;
        if (!q4) n.layer.attn_norm = b.vec(p + "attn_norm.weight", hp.n_embd, "n_embd");
        bind_gated_attention(b, hp, i, n.layer);
        if (!q4) n.layer.ffn_norm = b.vec(p + "post_attention_norm.weight", hp.n_embd, "n_embd");
        bind_moe(b, hp, i, n.layer);
        if (q4) bind_qwen4(b, hp, i, n.layer);
        n.eh_proj = b.mat(p + "nextn.eh_proj.weight", 2 * int64_t{hp.n_embd}, hp.n_embd, "2 n_embd, n_embd");
        n.enorm = b.vec(p + "nextn.enorm.weight", hp.n_embd, "n_embd");
        n.hnorm = b.vec(p + "nextn.hnorm.weight", q4 ? hp.hc_dim() : hp.n_embd, q4 ? "hc * n_embd" : "n_embd");
        n.shared_head_norm = b.vec(p + "nextn.shared_head_norm.weight", hp.n_embd, "n_embd", false);
        if (q4) n.hc_head = bind_hc(b, hp, p + "nextn.hc_head_", false, false);
        w.nextn.push_back(std::move(n));
    }
}

// The MTP block of glm4moe and deepseek2 files (as llama.cpp's loaders read it): the family's attention
// layer with its MoE and shared expert, eh_proj, enorm, hnorm, and optionally shared_head_norm, embed_tokens
// and shared_head_head. A file whose block cannot be bound still loads (without drafting): nextn_error says why.
void bind_nextn_deepseek(const binder& b, const hparams& hp, model_weights& w) {
    const int i = hp.n_layer;
    const std::string p = fmt::format("blk.{}.", i);
    try {
        nextn_weights n;
        n.layer.attn_norm = b.vec(p + "attn_norm.weight", hp.n_embd, "n_embd");
        if (hp.mla())
            bind_mla(b, hp, i, n.layer, w);
        else
            bind_attention(b, hp, i, n.layer);
        n.layer.ffn_norm = b.vec(p + hp.arch.ffn_norm + ".weight", hp.n_embd, "n_embd");
        bind_moe(b, hp, i, n.layer);
        n.eh_proj = b.mat(p + "nextn.eh_proj.weight", 2 * int64_t{hp.n_embd}, hp.n_embd, "2 n_embd, n_embd");
        n.enorm = b.vec(p + "nextn.enorm.weight", hp.n_embd, "n_embd");
        n.hnorm = b.vec(p + "nextn.hnorm.weight", hp.n_embd, "n_embd");
        n.shared_head_norm = b.vec(p + "nextn.shared_head_norm.weight", hp.n_embd, "n_embd", false);
        n.embed_tokens = b.mat(p + "nextn.embed_tokens.weight", hp.n_embd, w.tok_embd.n_rows, "n_embd, n_vocab", false);
        n.shared_head_head =
            b.mat(p + "nextn.shared_head_head.weight", hp.n_embd, w.tok_embd.n_rows, "n_embd, n_vocab", false);
        w.nextn.push_back(std::move(n));
    } catch (const std::runtime_error& e) {
        w.nextn_error = e.what();
    }
}

}  // namespace

model_weights bind_weights(const gguf::reader& f, const hparams& hp) {
    const binder b(f);
    model_weights w;
    const gguf::tensor_info* embd = b.find("token_embd.weight", true);
    if (embd->ne.size() != 2 || embd->ne[0] != hp.n_embd || (hp.n_vocab && embd->ne[1] != hp.n_vocab))
        throw std::runtime_error(fmt::format("{}: tensor 'token_embd.weight' has shape {}, expected [{}, {}] "
                                             "(n_embd, n_vocab)",
                                             f.path(), embd->shape_string(), hp.n_embd, hp.n_vocab));
    const int64_t n_vocab = embd->ne[1];
    w.tok_embd = b.mat("token_embd.weight", hp.n_embd, n_vocab, "n_embd, n_vocab");
    if (hp.qwen4()) {
        w.hc_head = bind_hc(b, hp, "output_hc_", false);
        if (hp.ple_layer >= 0) w.ple = bind_ple_table(f, b, hp);
    } else {
        w.output_norm = b.vec("output_norm.weight", hp.n_embd, "n_embd");
    }
    w.output = b.mat("output.weight", hp.n_embd, n_vocab, "n_embd, n_vocab", false);
    if (!w.output.present()) w.output = w.tok_embd;  // tied embeddings

    for (int i = 0; i < hp.n_layer; ++i) {
        const std::string p = fmt::format("blk.{}.", i);
        layer_weights l;
        if (!hp.qwen4()) l.attn_norm = b.vec(p + "attn_norm.weight", hp.n_embd, "n_embd");
        if (hp.qwen4()) bind_qwen4(b, hp, i, l);
        if (hp.mla()) {
            bind_mla(b, hp, i, l, w);
        } else if (hp.is_recurrent(i)) {
            bind_delta_net(b, hp, i, l);
        } else if (hp.attn_gate()) {
            bind_gated_attention(b, hp, i, l);
        } else {
            bind_attention(b, hp, i, l);
        }
        if (!hp.qwen4()) l.ffn_norm = b.vec(p + hp.arch.ffn_norm + ".weight", hp.n_embd, "n_embd");
        if (!hp.is_moe_layer(i)) {
            l.ffn_gate = b.mat(p + "ffn_gate.weight", hp.n_embd, hp.n_ff, "n_embd, n_ff");
            l.ffn_up = b.mat(p + "ffn_up.weight", hp.n_embd, hp.n_ff, "n_embd, n_ff");
            l.ffn_down = b.mat(p + "ffn_down.weight", hp.n_ff, hp.n_embd, "n_ff, n_embd");
            w.layers.push_back(std::move(l));
            continue;
        }
        bind_moe(b, hp, i, l);
        w.layers.push_back(std::move(l));
    }
    if (hp.hybrid()) bind_nextn(b, hp, w);
    if ((hp.arch.id == arch::glm4moe || hp.arch.id == arch::deepseek2) && hp.n_layer_nextn > 0)
        bind_nextn_deepseek(b, hp, w);
    return w;
}

repack_summary repack_dense(model_weights& w) {
    std::vector<weight_matrix*> todo;
    for (auto& l : w.layers)
        for (weight_matrix* wm : {&l.wq, &l.wk, &l.wv, &l.wo, &l.router, &l.shexp_gate, &l.shexp_up, &l.shexp_down,
                                  &l.wq_a, &l.wq_b, &l.wkv_a, &l.wqkv, &l.wz, &l.ssm_in, &l.ssm_beta, &l.ssm_alpha,
                                  &l.ssm_ba})
            if (wm->present()) todo.push_back(wm);
    if (w.output.present()) todo.push_back(&w.output);
    constexpr size_t kAlign = 64;
    const auto repacks = [](const weight_matrix& wm) { return kernels::cpu::can_repack(wm.m.type, wm.n_rows); };
    const auto stride_of = [&](const weight_matrix& wm) {
        return repacks(wm) ? kernels::cpu::repacked_row_stride(wm.m.type, wm.m.n_cols) : wm.m.row_stride;
    };
    const auto span_of = [&](const weight_matrix& wm) {
        return (stride_of(wm) * static_cast<size_t>(wm.n_rows) + kAlign - 1) / kAlign * kAlign;
    };
    size_t total = 0;
    for (const weight_matrix* wm : todo) total += span_of(*wm);
    repack_summary out;
    if (todo.empty()) return out;
    w.packed_dense = arenas::node_buffer(total, -1, {}, arenas::first_touch::none);
    size_t offset = 0;
    for (weight_matrix* wm : todo) {
        const size_t stride = stride_of(*wm), bytes = stride * static_cast<size_t>(wm->n_rows);
        std::byte* dst = w.packed_dense.data() + offset;
        if (repacks(*wm)) {
            kernels::cpu::repack_rows(wm->m.type, wm->m.data, wm->m.row_stride, wm->n_rows, wm->m.n_cols, dst);
            wm->packed = {wm->m.type, dst, wm->m.n_cols, stride, kernels::cpu::weight_layout::rows16};
            out.names.push_back(wm->name);
            out.bytes += bytes;
            out.gguf_bytes += formats::row_size(wm->m.type, wm->m.n_cols) * static_cast<size_t>(wm->n_rows);
        } else {
            std::memcpy(dst, wm->m.data, bytes);
            wm->packed = wm->m;
            wm->packed.data = dst;
            out.copied.push_back(wm->name);
            out.copied_bytes += bytes;
        }
        offset += span_of(*wm);
    }
    return out;
}

}  // namespace strata::engine
