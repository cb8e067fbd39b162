#include "qwen4exp_spec.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include <spdlog/fmt/fmt.h>

namespace strata::make_model {

using formats::ggml_type;
using gguf::value;

namespace {

// transformers' _splitmix64 (the standard constants of SplitMix64).
uint64_t splitmix64(uint64_t v) {
    v += 0x9E3779B97F4A7C15ull;
    v = (v ^ (v >> 30)) * 0xBF58476D1CE4E5B9ull;
    v = (v ^ (v >> 27)) * 0x94D049BB133111EBull;
    return v ^ (v >> 31);
}

bool is_prime(uint64_t v) {
    if (v < 2) return false;
    if (v % 2 == 0) return v == 2;
    for (uint64_t d = 3; d * d <= v; d += 2)
        if (v % d == 0) return false;
    return true;
}

void hc_tensors(const model_spec& s, const std::string& prefix, bool inject, const add_matrix& matrix,
                const add_vec& vec) {
    const int64_t dim = int64_t{s.hc} * s.n_embd, rank = s.hc_rank;
    vec(prefix + "norm.weight", dim, init::norm);
    matrix(prefix + "down.weight", s.type_router, {dim, rank}, 0);
    matrix(prefix + "up.weight", s.type_router, {rank, dim}, 0);
    if (inject) matrix(prefix + "inject.weight", s.type_router, {dim, int64_t{s.hc}}, 0);
}

int ple_n_heads(const model_spec& s) { return (s.ple_ngram - 1) * s.ple_heads_per_ngram; }

}  // namespace

model_spec qwen4exp_preset(const std::string& name, model_spec s) {
    s.architecture = arch::qwen4exp;
    if (name == "tiny") {
        s.n_ctx = 4096;
    } else if (name == "demo") {
        s.hc_rank = 64;
        s.idx_head_dim = 64;
        s.idx_top_k = 256;
        s.n_ctx = 32768;
    } else {  // Qwen3.8-Flash-Next per layer
        s.n_embd = 2560;
        s.n_head = 24;
        s.n_head_kv = 2;
        s.head_dim = 256;
        s.n_rot = 64;
        s.n_expert = 512;
        s.n_expert_used = 10;
        s.n_ff_exp = 640;
        s.n_ff_shexp = 640;
        s.hc = 4;
        s.hc_rank = 320;
        s.idx_n_head = 16;
        s.idx_head_dim = 128;
        s.idx_top_k = 2048;
        s.qsa_ratio = 4;
        s.ple_head_dim = 128;
        s.ple_heads_per_ngram = 4;
        s.ple_vocab_base = 100000;
        // 640-wide experts: a k-quant's 256-element super-blocks do not divide the down projection's
        // rows, Q4_0's 32-element blocks do.
        s.type_experts = ggml_type::Q4_0;
    }
    return s;
}

void qwen4exp_block_tensors(const model_spec& s, int i, const add_matrix& matrix, const add_vec& vec) {
    const std::string b = fmt::format("blk.{}.", i);
    hc_tensors(s, b + "hc_attn_", true, matrix, vec);
    hc_tensors(s, b + "hc_ffn_", true, matrix, vec);
    const int64_t n_embd = s.n_embd, d = s.idx_head_dim, dim = int64_t{s.hc} * n_embd;
    if (!recurrent_layer(s, i)) {
        matrix(b + "indexer.q_proj.weight", s.type_attn, {n_embd, int64_t{s.idx_n_head} * d}, 0);
        matrix(b + "indexer.k_proj.weight", s.type_attn, {n_embd, d}, 0);
        vec(b + "indexer.q_norm.weight", d, init::norm);
        vec(b + "indexer.k_norm.weight", d, init::norm);
    }
    if (i != s.ple_layer) return;
    const int64_t ple_dim = int64_t{ple_n_heads(s)} * s.ple_head_dim;
    matrix(b + "ple_key.weight", s.type_attn, {ple_dim, dim}, 0);
    matrix(b + "ple_value.weight", s.type_attn, {ple_dim, n_embd}, 0);
    vec(b + "ple_norm_key.weight", dim, init::norm);
    vec(b + "ple_norm_query.weight", dim, init::norm);
    vec(b + "ple_norm_conv.weight", dim, init::norm);
    matrix(b + "ple_conv1d.weight", ggml_type::F32, {int64_t{s.ple_conv_kernel}, dim}, 0.5f);
}

void qwen4exp_nextn_tensors(const model_spec& s, int i, const add_matrix& matrix, const add_vec& vec) {
    const std::string b = fmt::format("blk.{}.", i);
    const int64_t n_embd = s.n_embd;
    matrix(b + "nextn.eh_proj.weight", s.type_attn, {2 * n_embd, n_embd}, 0);
    vec(b + "nextn.enorm.weight", n_embd, init::norm);
    vec(b + "nextn.hnorm.weight", int64_t{s.hc} * n_embd, init::norm);
    hc_tensors(s, b + "nextn.hc_head_", false, matrix, vec);
}

void qwen4exp_global_tensors(const model_spec& s, const add_matrix& matrix, const add_vec& vec) {
    hc_tensors(s, "output_hc_", false, matrix, vec);
    if (s.ple_layer < 0) return;
    // The table's rows are drawn like an embedding's (tensor_specs checks the block fit).
    matrix("per_layer_token_embd.weight", s.type_ple, {int64_t{s.ple_head_dim}, make_ple_hash(s).rows}, 1.0f);
}

ple_hash make_ple_hash(const model_spec& s) {
    ple_hash h;
    // transformers' _build_layer_multipliers for the first (only) PLE layer.
    const uint64_t max_long = (uint64_t{1} << 63) - 1;
    const uint64_t half = std::max<uint64_t>(1, max_long / static_cast<uint64_t>(std::max(s.n_vocab, 1)) / 2);
    for (int i = 0; i < s.ple_ngram; ++i)
        h.mult.push_back(2 * (splitmix64(s.seed + 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(i + 1)) % half) + 1);
    // _find_nth_prime_after(base - 1, head + 1): the (head + 1)-th prime from base.
    uint64_t total = 0, p = static_cast<uint64_t>(s.ple_vocab_base) - 1;
    for (int head = 0; head < ple_n_heads(s); ++head) {
        ++p;
        while (!is_prime(p)) ++p;
        h.vocab.push_back(p);
        h.offset.push_back(total);
        total += p;
    }
    h.rows = static_cast<int64_t>((total + 63) / 64 * 64);
    if (s.ple_rows > 0) {
        if (s.ple_rows < h.rows)
            throw std::invalid_argument(fmt::format("--ple-rows {} is fewer than the {} rows the hash heads reach",
                                                    s.ple_rows, h.rows));
        h.rows = s.ple_rows;
    }
    return h;
}

void set_qwen4exp_hparams(gguf::writer& w, const model_spec& s, const std::string& a, int64_t eos) {
    w.set(a + "hyper_connection.count", value::u32(static_cast<uint32_t>(s.hc)));
    w.set(a + "hyper_connection.low_rank", value::u32(static_cast<uint32_t>(s.hc_rank)));
    w.set(a + "attention.indexer.head_count", value::u32(static_cast<uint32_t>(s.idx_n_head)));
    w.set(a + "attention.indexer.key_length", value::u32(static_cast<uint32_t>(s.idx_head_dim)));
    w.set(a + "attention.indexer.top_k", value::u32(static_cast<uint32_t>(s.idx_top_k)));
    std::vector<int32_t> ratios;
    for (int i = 0; i < s.n_layer + s.n_layer_nextn; ++i) ratios.push_back(recurrent_layer(s, i) ? 0 : s.qsa_ratio);
    w.set(a + "attention.compress_ratios", value::i32_array(ratios));
    if (s.ple_layer < 0) return;
    const ple_hash h = make_ple_hash(s);
    const auto u64s = [](const std::vector<uint64_t>& v) {
        value::array a;
        for (uint64_t x : v) a.push_back(value::u64(x));
        return value::arr(gguf::value_type::UINT64, std::move(a));
    };
    w.set(a + "ple.layers", value::i32_array({s.ple_layer}));
    w.set(a + "ple.ngram_size", value::u32(static_cast<uint32_t>(s.ple_ngram)));
    w.set(a + "ple.heads_per_ngram", value::u32(static_cast<uint32_t>(s.ple_heads_per_ngram)));
    w.set(a + "ple.conv_kernel", value::u32(static_cast<uint32_t>(s.ple_conv_kernel)));
    w.set(a + "ple.eos_token_id", value::u32(static_cast<uint32_t>(eos)));
    w.set(a + "embedding_length_per_layer", value::u32(static_cast<uint32_t>(s.ple_head_dim)));
    w.set(a + "ple.layer_multipliers", u64s(h.mult));
    w.set(a + "ple.head_offsets", u64s(h.offset));
    w.set(a + "ple.head_vocab_sizes", u64s(h.vocab));
}

void check_qwen4exp(const model_spec& s) {
    if (s.hc < 2 || s.hc_rank < 1 || s.idx_n_head < 1 || s.idx_head_dim < 1 || s.qsa_ratio < 1 ||
        s.idx_top_k < s.qsa_ratio)
        throw std::invalid_argument(fmt::format("qwen4exp needs at least 2 streams (got {}), a positive rank ({}), "
                                                "indexer heads ({}) and key length ({}), and a token budget ({}) of at "
                                                "least one block ({})",
                                                s.hc, s.hc_rank, s.idx_n_head, s.idx_head_dim, s.idx_top_k, s.qsa_ratio));
    const int n_rot = s.n_rot > 0 ? s.n_rot : s.head_dim;
    if (s.idx_head_dim < n_rot || s.idx_head_dim % 2 != 0)
        throw std::invalid_argument(fmt::format("the indexer key length {} must be even and at least the rotated "
                                                "dims {}",
                                                s.idx_head_dim, n_rot));
    if (s.ple_layer >= 0 && (!recurrent_layer(s, s.ple_layer) || s.ple_ngram < 2 || s.ple_ngram > 8 ||
                             s.ple_heads_per_ngram < 1 || s.ple_conv_kernel < 1 || s.ple_head_dim < 1 ||
                             s.ple_vocab_base < 2))
        throw std::invalid_argument(fmt::format("the PLE layer {} must be a DeltaNet layer, with an n-gram size of "
                                                "2..8 ({}), positive heads per n-gram ({}), conv kernel ({}), row "
                                                "width ({}) and a vocabulary base of at least 2 ({})",
                                                s.ple_layer, s.ple_ngram, s.ple_heads_per_ngram, s.ple_conv_kernel,
                                                s.ple_head_dim, s.ple_vocab_base));
}

}  // namespace strata::make_model
