#include "generate.hpp"
#include "qwen4exp_spec.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>

#include <spdlog/fmt/fmt.h>
#include <tbb/parallel_for.h>

#include "bpe_trainer.hpp"
#include "corpus.hpp"
#include "formats/quant.hpp"
#include "gguf/gguf_reader.hpp"

namespace strata::make_model {

namespace {

constexpr const char* kChatMLTemplate =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

// Mixtral-8x7B-Instruct's template: no system role, bos written by the template (the tokenizer adds
// it, so strata's renderer leaves it out).
constexpr const char* kMistralTemplate =
    "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}"
    "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}";

// llama.cpp token types.
constexpr int32_t kTokenNormal = 1, kTokenUnknown = 2, kTokenControl = 3, kTokenUserDefined = 4, kTokenUnused = 5,
                  kTokenByte = 6;

uint64_t splitmix64(uint64_t& x) {
    uint64_t z = (x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

uint64_t hash_name(const std::string& s) {
    uint64_t h = 0xCBF29CE484222325ull;  // FNV-1a
    for (unsigned char c : s) h = (h ^ c) * 0x100000001B3ull;
    return h;
}

// xoshiro256+ : fast, good enough for weights; uniform floats in [-1, 1).
class rng {
public:
    explicit rng(uint64_t seed) {
        for (auto& w : s_) w = splitmix64(seed);
    }
    float uniform() { return static_cast<float>(next() >> 40) * (2.0f / 16777216.0f) - 1.0f; }
    uint64_t next() {
        const uint64_t r = s_[0] + s_[3];
        const uint64_t t = s_[1] << 17;
        s_[2] ^= s_[0];
        s_[3] ^= s_[1];
        s_[1] ^= s_[2];
        s_[0] ^= s_[3];
        s_[2] ^= t;
        s_[3] = (s_[3] << 45) | (s_[3] >> 19);
        return r;
    }

private:
    uint64_t s_[4];
};

void draw(rng& r, const tensor_spec& t, float* out, int64_t n) {
    constexpr float kSqrt3 = 1.7320508f;  // uniform on [-a, a] has std a / sqrt(3)
    for (int64_t i = 0; i < n; ++i) {
        const float u = r.uniform();
        switch (t.kind) {
            case init::matrix:
            case init::embedding: out[i] = u * t.scale * kSqrt3; break;
            case init::norm: out[i] = 1.0f + u * t.scale; break;
            case init::bias: out[i] = u * t.scale; break;
            case init::decay: out[i] = -std::exp(u * t.scale); break;
        }
    }
}

// ThreadSanitizer cannot see the synchronisation inside libtbb (not instrumented): the hand-off of the
// output buffer to parallel_for's tasks and of their rows back to the caller would read as races.
// These annotations state the happens-before edges parallel_for guarantees; they compile to nothing
// otherwise.
#if defined(__SANITIZE_THREAD__)
extern "C" void __tsan_acquire(void* addr);
extern "C" void __tsan_release(void* addr);
void happens_after(const void* p) { __tsan_acquire(const_cast<void*>(p)); }
void happens_before(const void* p) { __tsan_release(const_cast<void*>(p)); }
#else
void happens_after(const void*) {}
void happens_before(const void*) {}
#endif

// A parallel_for body with the edges above: what the caller wrote before the loop is visible to every
// call, and what every call wrote is visible to the caller after it. parallel_for calls this object
// by reference, so `this` names the same edge in every task without reading a member before the
// acquire.
template <class Body>
class annotated_body {
public:
    explicit annotated_body(const Body& body) : body_(body) {}
    void operator()(int64_t i) const {
        happens_after(this);
        body_(i);
        happens_before(&body_);
    }

private:
    const Body& body_;
};

template <class Body>
void annotated_parallel_for(int64_t n, const Body& body) {
    const annotated_body<Body> task(body);
    happens_before(&task);
    tbb::parallel_for(int64_t{0}, n, task);
    happens_after(&body);
}

// Rows are drawn and quantized in chunks, each chunk from its own seed, so the bytes do not depend
// on how TBB schedules the chunks.
void quantize_rows(const tensor_spec& t, uint64_t tensor_seed, int64_t n_rows, std::span<uint8_t> out) {
    constexpr int64_t kRowsPerChunk = 16;
    const int64_t n_cols = t.ne[0];
    const size_t row_bytes = formats::row_size(t.type, n_cols);
    const int64_t n_chunks = (n_rows + kRowsPerChunk - 1) / kRowsPerChunk;
    annotated_parallel_for(n_chunks, [&](int64_t chunk) {
        rng r(tensor_seed + static_cast<uint64_t>(chunk) * 0x9E3779B97F4A7C15ull);
        std::vector<float> row(static_cast<size_t>(n_cols));
        const int64_t end = std::min(n_rows, (chunk + 1) * kRowsPerChunk);
        for (int64_t i = chunk * kRowsPerChunk; i < end; ++i) {
            draw(r, t, row.data(), n_cols);
            uint8_t* dst = out.data() + static_cast<size_t>(i) * row_bytes;
            if (t.type == formats::ggml_type::F32)
                std::memcpy(dst, row.data(), row_bytes);
            else
                formats::quantize_row(t.type, row.data(), dst, n_cols);
        }
    });
}

// NOTE: the reference quantizers search scales carefully and take ~100 ns per weight, which would make
// the 1.5 GB bench model a matter of minutes. Large quantized tensors are instead assembled from a pool
// of kPoolBlocks blocks quantized from the same distribution, each block of each row drawn from the pool
// at random: every block is a real encoding with the format's usual error, rows stay distinct, and the
// statistics per tensor are those of direct quantization.
constexpr int64_t kPoolBlocks = 2048;

void fill_tensor(const tensor_spec& t, uint64_t seed, std::span<uint8_t> out) {
    const formats::type_info& ti = formats::info(t.type);
    const uint64_t tensor_seed = seed ^ hash_name(t.name);
    int64_t n_rows = 1;
    for (size_t d = 1; d < t.ne.size(); ++d) n_rows *= t.ne[d];
    const int64_t n_blocks = n_rows * (t.ne[0] / ti.block_size);
    if (!ti.quantized || n_blocks < 4 * kPoolBlocks) {
        quantize_rows(t, tensor_seed, n_rows, out);
        return;
    }
    tensor_spec pool_spec = t;
    pool_spec.ne = {ti.block_size * 64};  // the pool as rows of 64 blocks
    const int64_t pool_rows = kPoolBlocks / 64;
    std::vector<uint8_t> pool(static_cast<size_t>(kPoolBlocks) * ti.type_size);
    quantize_rows(pool_spec, ~tensor_seed, pool_rows, pool);

    constexpr int64_t kBlocksPerChunk = 1 << 16;
    const int64_t n_chunks = (n_blocks + kBlocksPerChunk - 1) / kBlocksPerChunk;
    annotated_parallel_for(n_chunks, [&](int64_t chunk) {
        rng r(tensor_seed + static_cast<uint64_t>(chunk) * 0x9E3779B97F4A7C15ull);
        const int64_t end = std::min(n_blocks, (chunk + 1) * kBlocksPerChunk);
        for (int64_t b = chunk * kBlocksPerChunk; b < end; ++b) {
            const uint64_t pick = r.next() % static_cast<uint64_t>(kPoolBlocks);
            std::memcpy(out.data() + static_cast<size_t>(b) * ti.type_size, pool.data() + pick * ti.type_size,
                        ti.type_size);
        }
    });
}

// A fused ffn_gate_up_exps holds, per expert, the rows ffn_gate_exps and then those ffn_up_exps would
// hold in a file without it, so both layouts of one spec compute the same model.
void fill_gate_up(const tensor_spec& t, uint64_t seed, std::span<uint8_t> out) {
    const std::string blk = t.name.substr(0, t.name.size() - std::string_view("gate_up_exps.weight").size());
    const int64_t n_ff = t.ne[1] / 2, n_expert = t.ne[2];
    const size_t part_bytes = formats::row_size(t.type, t.ne[0]) * static_cast<size_t>(n_ff);
    std::vector<uint8_t> gate(part_bytes * static_cast<size_t>(n_expert)), up(gate.size());
    fill_tensor({blk + "gate_exps.weight", t.type, {t.ne[0], n_ff, n_expert}, t.kind, t.scale}, seed, gate);
    fill_tensor({blk + "up_exps.weight", t.type, {t.ne[0], n_ff, n_expert}, t.kind, t.scale}, seed, up);
    for (size_t e = 0; e < static_cast<size_t>(n_expert); ++e) {
        std::memcpy(out.data() + 2 * e * part_bytes, gate.data() + e * part_bytes, part_bytes);
        std::memcpy(out.data() + (2 * e + 1) * part_bytes, up.data() + e * part_bytes, part_bytes);
    }
}

// <arch>.rope.scaling.*: the keys llama.cpp's converter writes for the type.
void set_rope_scaling(gguf::writer& w, const model_spec& s, const std::string& a) {
    using gguf::value;
    static constexpr const char* kNames[] = {"", "none", "linear", "yarn"};
    if (s.rope_scaling == rope_scaling_type::absent) return;
    w.set(a + "rope.scaling.type", value::str(kNames[static_cast<int>(s.rope_scaling)]));
    if (s.rope_scaling == rope_scaling_type::none) return;
    if (!(s.rope_factor > 0.0f))
        throw std::invalid_argument(fmt::format("the RoPE scaling factor must be positive, got {}", s.rope_factor));
    w.set(a + "rope.scaling.factor", value::f32(s.rope_factor));
    if (s.rope_scaling != rope_scaling_type::yarn) return;
    const int orig = s.rope_orig_ctx > 0 ? s.rope_orig_ctx : static_cast<int>(static_cast<float>(s.n_ctx) / s.rope_factor);
    if (orig < 1)
        throw std::invalid_argument(fmt::format("YaRN's original context is {} (context {} / factor {}); it must be "
                                                "at least 1",
                                                orig, s.n_ctx, s.rope_factor));
    w.set(a + "rope.scaling.original_context_length", value::u32(static_cast<uint32_t>(orig)));
}

// deepseek2's keys as llama.cpp's converter writes them. With attn_k_b / attn_v_b the file describes
// the cache llama.cpp keeps (one latent + rotated key per position: key_length kv_lora_rank + n_rot,
// value_length kv_lora_rank, one kv head) and the per-head sizes in the *_mla keys; with one attn_kv_b
// (older files) key_length and value_length are the per-head sizes and every head is a kv head.
void set_deepseek2_hparams(gguf::writer& w, const model_spec& s, const std::string& a) {
    using gguf::value;
    w.set(a + "feed_forward_length", value::u32(s.n_ff));
    w.set(a + "expert_feed_forward_length", value::u32(s.n_ff_exp));
    w.set(a + "leading_dense_block_count", value::u32(s.n_layer_dense_lead));
    w.set(a + "expert_shared_count", value::u32(s.n_expert_shared));
    w.set(a + "expert_weights_norm", value::boolean(s.expert_weights_norm));
    w.set(a + "expert_weights_scale", value::f32(s.expert_weights_scale));
    w.set(a + "expert_gating_func", value::u32(s.expert_gating_func));
    if (s.n_expert_groups > 0) {
        w.set(a + "expert_group_count", value::u32(s.n_expert_groups));
        w.set(a + "expert_group_used_count", value::u32(s.n_group_used));
    }
    w.set(a + "attention.q_lora_rank", value::u32(s.n_lora_q));
    w.set(a + "attention.kv_lora_rank", value::u32(s.n_lora_kv));
    w.set(a + "rope.dimension_count", value::u32(s.n_rot));
    if (s.kv_b_split) {
        w.set(a + "attention.head_count_kv", value::u32(1));
        w.set(a + "attention.key_length", value::u32(s.n_lora_kv + s.n_rot));
        w.set(a + "attention.value_length", value::u32(s.n_lora_kv));
        w.set(a + "attention.key_length_mla", value::u32(s.head_dim));
        w.set(a + "attention.value_length_mla", value::u32(s.head_dim_v));
    } else {
        w.set(a + "attention.head_count_kv", value::u32(s.n_head));
        w.set(a + "attention.key_length", value::u32(s.head_dim));
        w.set(a + "attention.value_length", value::u32(s.head_dim_v));
    }
    if (s.rope_yarn_log_mul != 0.0f) w.set(a + "rope.scaling.yarn_log_multiplier", value::f32(s.rope_yarn_log_mul));
    if (s.n_layer_nextn > 0) w.set(a + "nextn_predict_layers", value::u32(s.n_layer_nextn));
    w.set(a + "vocab_size", value::u32(s.n_vocab));
}

// The hybrid Qwen families' keys as llama.cpp's converter writes them (qwen35moe also the IMRoPE
// sections, here the pairs of the rotated dims split as Qwen3.5's [11, 11, 10, 0] splits 32).
void set_hybrid_hparams(gguf::writer& w, const model_spec& s, const std::string& a) {
    using gguf::value;
    w.set(a + "feed_forward_length", value::u32(s.n_ff_exp * s.n_expert_used));
    w.set(a + "expert_feed_forward_length", value::u32(s.n_ff_exp));
    w.set(a + "expert_shared_feed_forward_length", value::u32(s.n_ff_shexp));
    w.set(a + "ssm.conv_kernel", value::u32(s.ssm_conv_kernel));
    w.set(a + "ssm.state_size", value::u32(s.ssm_d_state));
    w.set(a + "ssm.group_count", value::u32(s.ssm_n_group));
    w.set(a + "ssm.time_step_rank", value::u32(s.ssm_dt_rank));
    w.set(a + "ssm.inner_size", value::u32(s.ssm_dt_rank * s.ssm_d_state));
    w.set(a + "full_attention_interval", value::u32(s.full_attention_interval));
    if (s.architecture == arch::qwen35moe || s.architecture == arch::qwen4exp) {
        w.set(a + "nextn_predict_layers", value::u32(s.n_layer_nextn));
        const int pairs = (s.n_rot > 0 ? s.n_rot : s.head_dim) / 2;
        const int t = pairs * 11 / 32, h = pairs * 11 / 32;
        w.set(a + "rope.dimension_sections", value::i32_array({t, h, pairs - t - h, 0}));
    }
    w.set(a + "vocab_size", value::u32(s.n_vocab));
}

void set_hparams(gguf::writer& w, const model_spec& s) {
    using gguf::value;
    const std::string a = gguf_architecture(s.architecture) + ".";
    w.set(a + "context_length", value::u32(s.n_ctx));
    w.set(a + "embedding_length", value::u32(s.n_embd));
    const bool glm_ds = s.architecture == arch::glm4moe || s.architecture == arch::deepseek2;
    w.set(a + "block_count", value::u32(s.n_layer + (glm_ds || hybrid(s.architecture) ? s.n_layer_nextn : 0)));
    w.set(a + "attention.head_count", value::u32(s.n_head));
    w.set(a + "attention.head_count_kv", value::u32(s.n_head_kv));
    w.set(a + "attention.key_length", value::u32(s.head_dim));
    w.set(a + "attention.value_length", value::u32(s.head_dim));
    w.set(a + "attention.layer_norm_rms_epsilon", value::f32(s.rms_eps));
    w.set(a + "rope.freq_base", value::f32(s.rope_freq_base));
    set_rope_scaling(w, s, a);
    w.set(a + "expert_count", value::u32(s.n_expert));
    w.set(a + "expert_used_count", value::u32(s.n_expert_used));
    switch (s.architecture) {
        case arch::qwen3moe:
            w.set(a + "feed_forward_length", value::u32(s.n_ff_exp * s.n_expert_used));
            w.set(a + "expert_feed_forward_length", value::u32(s.n_ff_exp));
            break;
        case arch::qwen2moe:
            w.set(a + "feed_forward_length", value::u32(s.n_ff_exp * s.n_expert_used));
            w.set(a + "expert_feed_forward_length", value::u32(s.n_ff_exp));
            w.set(a + "expert_shared_feed_forward_length", value::u32(s.n_ff_shexp));
            break;
        case arch::glm4moe:  // feed_forward_length is the leading dense layers' width
            w.set(a + "feed_forward_length", value::u32(s.n_ff));
            w.set(a + "expert_feed_forward_length", value::u32(s.n_ff_exp));
            w.set(a + "rope.dimension_count", value::u32(s.n_rot > 0 ? s.n_rot : s.head_dim / 2));
            w.set(a + "leading_dense_block_count", value::u32(s.n_layer_dense_lead));
            w.set(a + "expert_shared_count", value::u32(s.n_expert_shared));
            w.set(a + "expert_weights_norm", value::boolean(s.expert_weights_norm));
            w.set(a + "expert_weights_scale", value::f32(s.expert_weights_scale));
            w.set(a + "expert_gating_func", value::u32(2));  // sigmoid
            w.set(a + "nextn_predict_layers", value::u32(s.n_layer_nextn));
            w.set(a + "vocab_size", value::u32(s.n_vocab));
            break;
        case arch::deepseek2: set_deepseek2_hparams(w, s, a); break;
        case arch::qwen35moe:
        case arch::qwen3next:
        case arch::qwen4exp: set_hybrid_hparams(w, s, a); break;
        case arch::mixtral:  // llama-style MoE: feed_forward_length is the expert's hidden size
            w.set(a + "feed_forward_length", value::u32(s.n_ff_exp));
            w.set(a + "rope.dimension_count", value::u32(s.head_dim));
            w.set(a + "vocab_size", value::u32(s.n_vocab));
            break;
    }
    if (s.n_rot > 0) w.set(a + "rope.dimension_count", value::u32(s.n_rot));
}

void set_gpt2_tokenizer(gguf::writer& w, const model_spec& s) {
    using gguf::value;
    static const std::vector<std::string> kSpecials = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
    const int64_t n_special = static_cast<int64_t>(kSpecials.size() + s.added_tokens.size());
    if (s.n_vocab < 256 + n_special)
        throw std::invalid_argument(fmt::format("a vocabulary of {} tokens is too small: the byte tokens and special "
                                                "tokens alone need {}",
                                                s.n_vocab, 256 + n_special));
    bpe_vocab bpe = train_bpe(training_corpus(), static_cast<size_t>(s.n_vocab - n_special - 256));
    std::vector<int32_t> types(bpe.tokens.size(), kTokenNormal);
    // When the corpus runs out of pairs, reserved tokens fill the vocabulary up to the requested size.
    for (int i = 0; static_cast<int64_t>(bpe.tokens.size()) < s.n_vocab - n_special; ++i) {
        bpe.tokens.push_back(fmt::format("<|reserved_{}|>", i));
        types.push_back(kTokenUnused);
    }
    const auto first_special = static_cast<uint32_t>(bpe.tokens.size());
    for (const auto& sp : kSpecials) {
        bpe.tokens.push_back(sp);
        types.push_back(kTokenControl);
    }
    for (const auto& t : s.added_tokens) {
        if (t.empty() || std::find(bpe.tokens.begin(), bpe.tokens.end(), t) != bpe.tokens.end())
            throw std::invalid_argument(fmt::format("--add-token '{}': empty or already in the vocabulary", t));
        bpe.tokens.push_back(t);
        types.push_back(kTokenUserDefined);
    }
    w.set("tokenizer.ggml.model", value::str("gpt2"));
    w.set("tokenizer.ggml.pre", value::str("qwen2"));
    w.set("tokenizer.ggml.tokens", value::str_array(bpe.tokens));
    w.set("tokenizer.ggml.token_type", value::i32_array(types));
    w.set("tokenizer.ggml.merges", value::str_array(bpe.merges));
    w.set("tokenizer.ggml.bos_token_id", value::u32(first_special));      // <|endoftext|>
    w.set("tokenizer.ggml.padding_token_id", value::u32(first_special));  // <|endoftext|>
    w.set("tokenizer.ggml.eos_token_id", value::u32(first_special + 2));  // <|im_end|>
    w.set("tokenizer.ggml.add_bos_token", value::boolean(false));
    w.set("tokenizer.chat_template", value::str(kChatMLTemplate));
}

// A SentencePiece-style vocabulary as Llama/Mistral files have it: <unk> <s> </s>, the 256 byte
// tokens, then subword pieces (spaces as U+2581) scored by merge order, single characters last, and
// placeholders up to the requested size. The pieces are the byte-level BPE merges learned from the
// same corpus, spelled back as text; pieces with control characters are left to byte fallback.
void set_llama_tokenizer(gguf::writer& w, const model_spec& s) {
    using gguf::value;
    constexpr int kFixed = 3 + 256;
    constexpr int kChars = 1 + ('~' - '!' + 1);  // U+2581 and printable ASCII
    if (s.n_vocab < kFixed + kChars)
        throw std::invalid_argument(fmt::format("a vocabulary of {} tokens is too small: the special, byte and "
                                                "single-character tokens of a llama vocabulary alone need {}",
                                                s.n_vocab, kFixed + kChars));
    std::vector<std::string> tokens = {"<unk>", "<s>", "</s>"};
    std::vector<int32_t> types = {kTokenUnknown, kTokenControl, kTokenControl};
    for (int b = 0; b < 256; ++b) {
        tokens.push_back(fmt::format("<0x{:02X}>", b));
        types.push_back(kTokenByte);
    }
    std::map<std::string, unsigned char> byte_of_symbol;
    for (int b = 0; b < 256; ++b) byte_of_symbol[byte_symbol(static_cast<unsigned char>(b))] = static_cast<unsigned char>(b);
    std::set<std::string> known;
    auto add_piece = [&](const std::string& piece) {
        if (!known.insert(piece).second) return;
        tokens.push_back(piece);
        types.push_back(kTokenNormal);
    };
    const bpe_vocab bpe = train_bpe(training_corpus(), static_cast<size_t>(s.n_vocab - kFixed - kChars));
    for (size_t i = 256; i < bpe.tokens.size(); ++i) {
        std::string piece;
        bool control = false;
        const std::string& t = bpe.tokens[i];
        for (size_t pos = 0; pos < t.size();) {
            const size_t len = static_cast<unsigned char>(t[pos]) < 0x80 ? 1 : 2;  // symbols are U+0021..U+0143
            const unsigned char b = byte_of_symbol.at(t.substr(pos, len));
            control = control || b < 0x20 || b == 0x7F;
            piece += b == ' ' ? std::string("\xE2\x96\x81") : std::string(1, static_cast<char>(b));
            pos += len;
        }
        if (!control) add_piece(piece);
    }
    add_piece("\xE2\x96\x81");
    for (char c = '!'; c <= '~'; ++c) add_piece(std::string(1, c));
    for (int i = 0; static_cast<int64_t>(tokens.size()) < s.n_vocab; ++i) {
        tokens.push_back(fmt::format("<unused_{}>", i));
        types.push_back(kTokenUnused);
    }
    // SentencePiece BPE scores: the earlier a piece was learned, the higher; specials and bytes 0.
    std::vector<float> scores(tokens.size(), 0.0f);
    for (size_t i = kFixed; i < tokens.size(); ++i) scores[i] = -static_cast<float>(i - kFixed);

    w.set("tokenizer.ggml.model", value::str("llama"));
    w.set("tokenizer.ggml.tokens", value::str_array(tokens));
    w.set("tokenizer.ggml.scores", value::f32_array(scores));
    w.set("tokenizer.ggml.token_type", value::i32_array(types));
    w.set("tokenizer.ggml.bos_token_id", value::u32(1));
    w.set("tokenizer.ggml.eos_token_id", value::u32(2));
    w.set("tokenizer.ggml.unknown_token_id", value::u32(0));
    w.set("tokenizer.ggml.add_bos_token", value::boolean(true));
    w.set("tokenizer.ggml.add_eos_token", value::boolean(false));
    w.set("tokenizer.chat_template", value::str(kMistralTemplate));
}

void check_deepseek2(const model_spec& s) {
    if (s.n_rot >= s.head_dim)
        throw std::invalid_argument(fmt::format("deepseek2 heads need a part without RoPE: {} rotated dimensions of a "
                                                "{}-wide head leave none",
                                                s.n_rot, s.head_dim));
    if (s.n_lora_kv < 1 || s.n_lora_q < 0 || s.head_dim_v < 1)
        throw std::invalid_argument(fmt::format("deepseek2 needs kv_lora_rank >= 1 (got {}), q_lora_rank >= 0 (got {}) "
                                                "and a value head >= 1 (got {})",
                                                s.n_lora_kv, s.n_lora_q, s.head_dim_v));
    if (s.expert_gating_func != 1 && s.expert_gating_func != 2)
        throw std::invalid_argument(fmt::format("expert_gating_func is 1 (softmax) or 2 (sigmoid), got {}",
                                                s.expert_gating_func));
    if (s.n_expert_groups > 0 &&
        (s.n_expert % s.n_expert_groups != 0 || s.n_group_used < 1 || s.n_group_used >= s.n_expert_groups ||
         s.n_expert_used > s.n_group_used * (s.n_expert / s.n_expert_groups)))
        throw std::invalid_argument(fmt::format("{} experts in {} groups with {} groups used cannot route {} experts per "
                                                "token",
                                                s.n_expert, s.n_expert_groups, s.n_group_used, s.n_expert_used));
}

}  // namespace

uint32_t llama_file_type(formats::ggml_type type) {
    // llama.cpp's enum llama_ftype; a K type stands for its _M mix, as llama.cpp guesses without the key.
    switch (type) {
        case formats::ggml_type::F32: return 0;      // ALL_F32
        case formats::ggml_type::F16: return 1;      // MOSTLY_F16
        case formats::ggml_type::Q4_0: return 2;     // MOSTLY_Q4_0
        case formats::ggml_type::Q4_1: return 3;     // MOSTLY_Q4_1
        case formats::ggml_type::Q8_0: return 7;     // MOSTLY_Q8_0
        case formats::ggml_type::Q5_0: return 8;     // MOSTLY_Q5_0
        case formats::ggml_type::Q5_1: return 9;     // MOSTLY_Q5_1
        case formats::ggml_type::Q2_K: return 10;    // MOSTLY_Q2_K
        case formats::ggml_type::Q3_K: return 12;    // MOSTLY_Q3_K_M
        case formats::ggml_type::Q4_K: return 15;    // MOSTLY_Q4_K_M
        case formats::ggml_type::Q5_K: return 17;    // MOSTLY_Q5_K_M
        case formats::ggml_type::Q6_K: return 18;    // MOSTLY_Q6_K
        case formats::ggml_type::IQ4_NL: return 25;  // MOSTLY_IQ4_NL
        case formats::ggml_type::IQ4_XS: return 30;  // MOSTLY_IQ4_XS
        case formats::ggml_type::IQ2_XXS: return 19;  // MOSTLY_IQ2_XXS
        case formats::ggml_type::IQ2_XS: return 20;   // MOSTLY_IQ2_XS
        case formats::ggml_type::IQ3_XXS: return 23;  // MOSTLY_IQ3_XXS
        case formats::ggml_type::IQ1_S: return 24;    // MOSTLY_IQ1_S
        case formats::ggml_type::IQ3_S: return 26;    // MOSTLY_IQ3_S
        case formats::ggml_type::IQ2_S: return 28;    // MOSTLY_IQ2_S
        case formats::ggml_type::IQ1_M: return 31;    // MOSTLY_IQ1_M
        case formats::ggml_type::MXFP4: return 38;    // MOSTLY_MXFP4_MOE
        case formats::ggml_type::BF16: return 32;    // MOSTLY_BF16
        default: break;
    }
    throw std::invalid_argument(fmt::format("no llama.cpp file type stands for weights of type {}",
                                            formats::info(type).name));
}

formats::ggml_type dominant_type(const std::vector<tensor_spec>& tensors) {
    // Bytes per type over the weight matrices (vectors such as norms and biases stay F32 in every file).
    std::map<formats::ggml_type, size_t> bytes;
    for (const tensor_spec& t : tensors) {
        if (t.ne.size() < 2) continue;
        size_t rows = 1;
        for (size_t d = 1; d < t.ne.size(); ++d) rows *= static_cast<size_t>(t.ne[d]);
        bytes[t.type] += formats::row_size(t.type, t.ne[0]) * rows;
    }
    if (bytes.empty()) return formats::ggml_type::F32;
    auto best = bytes.begin();
    for (auto it = bytes.begin(); it != bytes.end(); ++it)
        if (it->second > best->second) best = it;
    return best->first;
}

void check_hybrid(const model_spec& s) {
    if (s.ssm_d_state < 1 || s.ssm_n_group < 1 || s.ssm_dt_rank % s.ssm_n_group != 0 || s.ssm_conv_kernel < 2 ||
        s.full_attention_interval < 1)
        throw std::invalid_argument(fmt::format("DeltaNet layers need a positive state size ({}), value heads ({}) a "
                                                "multiple of the key heads ({}), a conv kernel of at least 2 ({}) and "
                                                "a positive full-attention interval ({})",
                                                s.ssm_d_state, s.ssm_dt_rank, s.ssm_n_group, s.ssm_conv_kernel,
                                                s.full_attention_interval));
    if (s.architecture == arch::qwen3next && s.n_layer_nextn > 0)
        throw std::invalid_argument("qwen3next files carry no next-token-prediction layers (llama.cpp reads none)");
    if (s.ssm_in && s.architecture != arch::qwen3next)
        throw std::invalid_argument("the interleaved ssm_in (--ssm-in) exists only for qwen3next");
}

// --vocab-from: every tokenizer.* key of another GGUF file (a vocabulary-only file, or a model).
void copy_tokenizer(gguf::writer& w, const gguf::reader& from) {
    int copied = 0;
    for (const auto& [key, v] : from.metadata())
        if (key.starts_with("tokenizer.")) {
            w.set(key, v);
            ++copied;
        }
    if (!from.find("tokenizer.ggml.tokens"))
        throw std::invalid_argument(fmt::format("--vocab-from {}: the file has no tokenizer.ggml.tokens ({} tokenizer "
                                                "keys)",
                                                from.path(), copied));
}

gguf::writer build_model(const model_spec& in) {
    using gguf::value;
    model_spec spec = in;
    if (!spec.added_tokens.empty() && (!spec.vocab_from.empty() || resolve_tokenizer(spec) != tokenizer_kind::gpt2))
        throw std::invalid_argument("added tokens need the gpt2 tokenizer (and no vocabulary from a file)");
    std::optional<gguf::reader> vocab_file;
    if (!spec.vocab_from.empty()) {
        vocab_file.emplace(gguf::reader::open(spec.vocab_from));
        if (const gguf::value* tokens = vocab_file->find("tokenizer.ggml.tokens"))
            spec.n_vocab = static_cast<int>(tokens->as_array("tokenizer.ggml.tokens").size());
    }
    if (spec.n_head % spec.n_head_kv != 0)
        throw std::invalid_argument(fmt::format("{} attention heads cannot be grouped over {} kv heads", spec.n_head,
                                                spec.n_head_kv));
    if (spec.n_expert_used < 1 || spec.n_expert_used > spec.n_expert)
        throw std::invalid_argument(fmt::format("experts used per token must be 1..{} (the expert count), got {}",
                                                spec.n_expert, spec.n_expert_used));
    if ((spec.architecture == arch::glm4moe || spec.architecture == arch::deepseek2) &&
        (spec.n_layer_dense_lead < 0 || spec.n_layer_dense_lead >= spec.n_layer))
        throw std::invalid_argument(fmt::format("{} leading dense layers leave no MoE layer among {}",
                                                spec.n_layer_dense_lead, spec.n_layer));
    const int n_rot = spec.n_rot > 0 ? spec.n_rot : spec.head_dim;
    if (n_rot % 2 != 0 || n_rot > spec.head_dim)
        throw std::invalid_argument(fmt::format("the rotated dimensions ({}) must be even and at most the head "
                                                "width {}",
                                                n_rot, spec.head_dim));
    if (spec.architecture == arch::deepseek2) check_deepseek2(spec);
    if (hybrid(spec.architecture)) check_hybrid(spec);
    if (spec.architecture == arch::qwen4exp) check_qwen4exp(spec);
    if (spec.split_experts && spec.architecture != arch::mixtral)
        throw std::invalid_argument("per-expert tensors (--split-experts) exist only for mixtral");
    const std::vector<tensor_spec> tensors = tensor_specs(spec);

    gguf::writer w;
    w.set("general.architecture", value::str(gguf_architecture(spec.architecture)));
    w.set("general.name", value::str(spec.name));
    w.set("general.quantization_version", value::u32(2));
    w.set("general.file_type", value::u32(llama_file_type(dominant_type(tensors))));
    w.set("general.alignment", value::u32(32));
    set_hparams(w, spec);
    if (vocab_file)
        copy_tokenizer(w, *vocab_file);
    else if (resolve_tokenizer(spec) == tokenizer_kind::llama)
        set_llama_tokenizer(w, spec);
    else
        set_gpt2_tokenizer(w, spec);
    if (spec.architecture == arch::qwen4exp) {
        const gguf::value* eos = vocab_file ? vocab_file->find("tokenizer.ggml.eos_token_id") : nullptr;
        const int64_t eos_id = eos                                                         ? static_cast<int64_t>(eos->as_u64())
                               : resolve_tokenizer(spec) == tokenizer_kind::llama ? 2
                                                                                  : spec.n_vocab - 1;
        set_qwen4exp_hparams(w, spec, gguf_architecture(spec.architecture) + ".", eos_id);
    }
    // A PLE table larger than its hash heads reach (--ple-rows) holds values in those rows only; the
    // rest are zero rows the file leaves as a hole.
    model_spec reached = spec;
    reached.ple_rows = 0;
    for (const tensor_spec& t : tensors) {
        tensor_spec drawn = t;
        if (t.name == "per_layer_token_embd.weight") drawn.ne[1] = make_ple_hash(reached).rows;
        if (t.name.ends_with("ffn_gate_up_exps.weight"))
            w.add_tensor(t.name, t.type, t.ne, [t, seed = spec.seed](std::span<uint8_t> out) { fill_gate_up(t, seed, out); });
        else
            w.add_tensor(t.name, t.type, t.ne,
                         [drawn, seed = spec.seed](std::span<uint8_t> out) { fill_tensor(drawn, seed, out); });
        if (drawn.ne != t.ne)
            w.set_zero_tail(t.name, formats::row_size(t.type, t.ne[0]) * static_cast<uint64_t>(t.ne[1] - drawn.ne[1]));
    }
    return w;
}

}  // namespace strata::make_model
