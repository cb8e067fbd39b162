#include "model/qwen4exp_keys.hpp"

#include <algorithm>
#include <cstdint>
#include <stdexcept>

#include <spdlog/fmt/fmt.h>

namespace strata::engine {

namespace {

constexpr int kMaxNgram = 8;         // n-gram sizes llama.cpp accepts
constexpr int kMaxPleHeads = 64;     // hash heads of the PLE table
constexpr uint64_t kMaxSize = 1u << 30;

uint64_t get_u64(const gguf::reader& f, const std::string& key) {
    const gguf::value* v = f.find(key);
    if (!v) throw std::runtime_error(fmt::format("{}: required metadata key '{}' is missing", f.path(), key));
    return v->as_u64(key);
}

// A positive size below 2^30.
int positive(const gguf::reader& f, const std::string& key, int min = 1) {
    const uint64_t u = get_u64(f, key);
    if (u < static_cast<uint64_t>(min) || u > kMaxSize)
        throw std::runtime_error(fmt::format("{}: {} is {}, must be {} or more (and below 2^30)", f.path(), key, u, min));
    return static_cast<int>(u);
}

// An array of at least n unsigned integers (the first n kept); a short one would leave hash constants unset.
std::vector<uint64_t> u64_array(const gguf::reader& f, const std::string& key, int n) {
    const gguf::value* v = f.find(key);
    if (!v) throw std::runtime_error(fmt::format("{}: required metadata key '{}' is missing", f.path(), key));
    const auto& a = v->as_array(key);
    if (a.size() < static_cast<size_t>(n))
        throw std::runtime_error(fmt::format("{}: {} has {} entries, but at least {} are required", f.path(), key,
                                             a.size(), n));
    std::vector<uint64_t> out;
    for (int i = 0; i < n; ++i) out.push_back(a[static_cast<size_t>(i)].as_u64(key));
    return out;
}

// attention.compress_ratios: one per block (or one for all); an attention layer's ratio must fit the budget.
void read_qsa(const gguf::reader& f, const std::string& p, hparams& hp) {
    hp.idx_n_head = positive(f, p + "attention.indexer.head_count");
    hp.idx_head_dim = positive(f, p + "attention.indexer.key_length");
    hp.idx_top_k = positive(f, p + "attention.indexer.top_k");
    if (hp.idx_head_dim < hp.n_rot || hp.idx_head_dim % 2 != 0)
        throw std::runtime_error(fmt::format("{}: {}attention.indexer.key_length is {}; the indexer's keys rotate "
                                             "rope.dimension_count ({}) dims, so it must be even and at least that",
                                             f.path(), p, hp.idx_head_dim, hp.n_rot));
    const std::string key = p + "attention.compress_ratios";
    const int n_all = hp.n_layer + hp.n_layer_nextn;
    std::vector<int> ratio(static_cast<size_t>(n_all), 0);
    if (const gguf::value* v = f.find(key)) {
        if (v->type() == gguf::value_type::ARRAY) {
            const auto& a = v->as_array(key);
            if (static_cast<int>(a.size()) != n_all)
                throw std::runtime_error(fmt::format("{}: {} has {} entries, expected one per block ({})", f.path(), key,
                                                     a.size(), n_all));
            for (int i = 0; i < n_all; ++i) ratio[static_cast<size_t>(i)] = static_cast<int>(std::min<uint64_t>(a[static_cast<size_t>(i)].as_u64(key), kMaxSize));
        } else {
            std::fill(ratio.begin(), ratio.end(), static_cast<int>(std::min<uint64_t>(v->as_u64(key), kMaxSize)));
        }
    }
    for (int il = 0; il < hp.n_layer; ++il) {
        int& r = ratio[static_cast<size_t>(il)];
        if (hp.is_recurrent(il)) r = 0;
        if (r > hp.idx_top_k)
            throw std::runtime_error(fmt::format("{}: {} gives layer {} blocks of {} tokens, more than the indexer's "
                                                 "budget {}attention.indexer.top_k = {}",
                                                 f.path(), key, il, r, p, hp.idx_top_k));
    }
    ratio.resize(static_cast<size_t>(hp.n_layer));
    hp.qsa_ratio = std::move(ratio);
}

// ple.*: absent means no PLE block. One layer, a DeltaNet layer, with hash ranges the int32 gather holds.
void read_ple(const gguf::reader& f, const std::string& p, hparams& hp) {
    const std::string layers_key = p + "ple.layers";
    const gguf::value* layers = f.find(layers_key);
    if (!layers) return;
    const auto& a = layers->as_array(layers_key);
    if (a.empty()) return;
    if (a.size() != 1)
        throw std::runtime_error(fmt::format("{}: {} lists {} layers, but only one PLE layer is supported", f.path(),
                                             layers_key, a.size()));
    const uint64_t il = a[0].as_u64(layers_key);
    if (il >= static_cast<uint64_t>(hp.n_layer))
        throw std::runtime_error(fmt::format("{}: {} names layer {}, but the trunk has {} layers", f.path(), layers_key,
                                             il, hp.n_layer));
    hp.ple_layer = static_cast<int>(il);
    if (!hp.is_recurrent(hp.ple_layer))
        throw std::runtime_error(fmt::format("{}: PLE layer {} ({}) is not a linear attention (DeltaNet) layer",
                                             f.path(), il, layers_key));
    hp.ple_ngram = positive(f, p + "ple.ngram_size", 0);
    hp.ple_heads_per_ngram = positive(f, p + "ple.heads_per_ngram", 0);
    hp.ple_conv_kernel = positive(f, p + "ple.conv_kernel");
    hp.ple_head_dim = positive(f, p + "embedding_length_per_layer");
    hp.ple_eos = static_cast<int64_t>(get_u64(f, p + "ple.eos_token_id"));
    if (hp.ple_ngram < 2 || hp.ple_ngram > kMaxNgram)
        throw std::runtime_error(fmt::format("{}: {}ple.ngram_size is {}, must be 2..{}", f.path(), p, hp.ple_ngram,
                                             kMaxNgram));
    if (hp.ple_n_heads() < 1 || hp.ple_n_heads() > kMaxPleHeads)
        throw std::runtime_error(fmt::format("{}: (ple.ngram_size - 1) x ple.heads_per_ngram = ({} - 1) x {} = {} hash "
                                             "heads, must be 1..{}",
                                             f.path(), hp.ple_ngram, hp.ple_heads_per_ngram, hp.ple_n_heads(),
                                             kMaxPleHeads));
    if (hp.ple_conv_kernel > 16)
        throw std::runtime_error(fmt::format("{}: {}ple.conv_kernel is {}, must be 1..16", f.path(), p,
                                             hp.ple_conv_kernel));
    if (hp.n_vocab > 0 && hp.ple_eos >= hp.n_vocab)
        throw std::runtime_error(fmt::format("{}: {}ple.eos_token_id is {}, beyond the vocabulary of {}", f.path(), p,
                                             hp.ple_eos, hp.n_vocab));
    if (hp.n_vocab >= (1 << 24))
        throw std::runtime_error(fmt::format("{}: a vocabulary of {} tokens; the PLE window keeps ids as f32 in the "
                                             "recurrent state, exact below 2^24",
                                             f.path(), hp.n_vocab));
    hp.ple_mult = u64_array(f, p + "ple.layer_multipliers", hp.ple_ngram);
    hp.ple_offset = u64_array(f, p + "ple.head_offsets", hp.ple_n_heads());
    hp.ple_vocab = u64_array(f, p + "ple.head_vocab_sizes", hp.ple_n_heads());
    for (int h = 0; h < hp.ple_n_heads(); ++h) {
        const uint64_t off = hp.ple_offset[static_cast<size_t>(h)], n = hp.ple_vocab[static_cast<size_t>(h)];
        if (n == 0 || off > INT32_MAX || n > INT32_MAX || off + n > INT32_MAX)
            throw std::runtime_error(fmt::format("{}: PLE head {} covers rows {}..{} ({}ple.head_offsets, "
                                                 "ple.head_vocab_sizes): empty or beyond the int32 row index",
                                                 f.path(), h, off, off + n, p));
    }
}

}  // namespace

void read_qwen4exp_keys(const gguf::reader& f, const std::string& p, hparams& hp) {
    hp.hc = positive(f, p + "hyper_connection.count");
    if (hp.hc <= 1)
        throw std::runtime_error(fmt::format("{}: {}hyper_connection.count must be greater than one, got {}", f.path(), p,
                                             hp.hc));
    hp.hc_rank = positive(f, p + "hyper_connection.low_rank");
    read_qsa(f, p, hp);
    read_ple(f, p, hp);
}

}  // namespace strata::engine
