#include "tokenizer/vocab.hpp"

#include <algorithm>
#include <stdexcept>

#include <spdlog/fmt/fmt.h>

#include "log.hpp"
#include "tokenizer/unicode.hpp"

namespace strata::tok {

namespace {

[[noreturn]] void fail(const std::string& msg) { throw std::runtime_error("tokenizer: " + msg); }

// A gguf_error (wrong value type) becomes a tokenizer error naming the key.
template <typename F>
decltype(auto) read_key(const char* key, F&& f) {
    try {
        return f();
    } catch (const gguf::gguf_error& e) {
        fail(fmt::format("{}: {}", key, e.what()));
    }
}

const gguf::value::array* find_array(const gguf::reader& r, const char* key) {
    const gguf::value* v = r.find(key);
    if (!v) return nullptr;
    return &read_key(key, [&]() -> const gguf::value::array& { return v->as_array(key); });
}

// An optional token id: absent -> -1; negative values mean "none" as some converters write them.
int32_t read_id(const gguf::reader& r, const char* key, int32_t n_vocab) {
    const gguf::value* v = r.find(key);
    if (!v) return -1;
    const int64_t id = read_key(key, [&] { return v->as_i64(key); });
    if (id < 0) return -1;
    if (id >= n_vocab) fail(fmt::format("{} is {}, beyond the vocabulary of {} tokens", key, id, n_vocab));
    return static_cast<int32_t>(id);
}

bool read_bool(const gguf::reader& r, const char* key, bool fallback) {
    const gguf::value* v = r.find(key);
    return v ? read_key(key, [&] { return v->as_bool(key); }) : fallback;
}

void read_tokens(const gguf::reader& r, vocab& v) {
    const auto* tokens = find_array(r, "tokenizer.ggml.tokens");
    if (!tokens) fail("the file has no tokenizer.ggml.tokens (no vocabulary)");
    if (tokens->empty()) fail("tokenizer.ggml.tokens is empty");
    v.text.reserve(tokens->size());
    for (size_t i = 0; i < tokens->size(); ++i)
        v.text.push_back(read_key("tokenizer.ggml.tokens",
                                  [&] { return (*tokens)[i].as_string(fmt::format("tokenizer.ggml.tokens[{}]", i)); }));
    const size_t n = v.text.size();

    v.type.assign(n, token_type::normal);
    if (const auto* types = find_array(r, "tokenizer.ggml.token_type")) {
        if (types->size() != n)
            fail(fmt::format("tokenizer.ggml.token_type has {} entries but tokenizer.ggml.tokens has {}",
                             types->size(), n));
        for (size_t i = 0; i < n; ++i) {
            const int64_t t = read_key("tokenizer.ggml.token_type", [&] { return (*types)[i].as_i64(); });
            if (t < 0 || t > 6)
                fail(fmt::format("tokenizer.ggml.token_type[{}] is {}, not a token type (0..6)", i, t));
            v.type[i] = static_cast<token_type>(t);
        }
    }

    v.score.assign(n, 0.0f);
    if (const auto* scores = find_array(r, "tokenizer.ggml.scores")) {
        if (scores->size() != n)
            fail(fmt::format("tokenizer.ggml.scores has {} entries but tokenizer.ggml.tokens has {}",
                             scores->size(), n));
        for (size_t i = 0; i < n; ++i)
            v.score[i] = static_cast<float>(read_key("tokenizer.ggml.scores", [&] { return (*scores)[i].as_f64(); }));
    }

    for (size_t i = 0; i < n; ++i) {
        const auto id = static_cast<int32_t>(i);
        v.text_to_id.emplace(v.text[i], id);
        if (v.type[i] != token_type::control && v.type[i] != token_type::unknown) v.piece_to_id.emplace(v.text[i], id);
    }
}

void read_merges(const gguf::reader& r, vocab& v) {
    const auto* merges = find_array(r, "tokenizer.ggml.merges");
    if (!merges && v.pre->merges_optional) return;
    if (!merges) fail("tokenizer.ggml.model is gpt2 but the file has no tokenizer.ggml.merges");
    v.merge_rank.reserve(merges->size());
    for (size_t i = 0; i < merges->size(); ++i) {
        const std::string& m = read_key("tokenizer.ggml.merges", [&]() -> const std::string& {
            return (*merges)[i].as_string(fmt::format("tokenizer.ggml.merges[{}]", i));
        });
        const size_t sp = m.find(' ', 1);  // the left side may itself be a lone space in some vocabularies
        if (sp == std::string::npos || sp + 1 >= m.size())
            fail(fmt::format("tokenizer.ggml.merges[{}] is '{}', not two tokens separated by a space", i, m));
        const std::string left = m.substr(0, sp), right = m.substr(sp + 1);
        for (const std::string* side : {&left, &right})
            if (!v.text_to_id.count(*side))
                fail(fmt::format("tokenizer.ggml.merges[{}] '{}' names '{}', which is not in the vocabulary of {} "
                                 "tokens",
                                 i, m, *side, v.text.size()));
        v.merge_rank.emplace(m, static_cast<int32_t>(i));
    }
}

// Byte-level BPE spells any text with its 256 byte symbols. Some real vocabularies lack a few (bytes
// UTF-8 never uses, rare control characters); llama.cpp loads them and drops those bytes, and so do we.
void check_byte_symbols(vocab& v) {
    const byte_unicode_map bytes;
    std::string missing;
    for (int b = 0; b < 256; ++b)
        if (!v.piece_to_id.count(bytes.encode(static_cast<uint8_t>(b))))
            missing += fmt::format("{}0x{:02X}", missing.empty() ? "" : " ", b);
    v.missing_bytes = !missing.empty();
    if (v.missing_bytes)
        logger("engine")->debug("The vocabulary has no token for bytes {}; text holding them loses those bytes.",
                                missing);
}

// tokenizer.ggml.pre (or the override) to its pre-tokenizer; an unknown name is an error.
void read_pre(const gguf::reader& r, const tokenizer_options& opt, vocab& v) {
    v.pre_name = opt.override_pre.empty() ? r.get_string("tokenizer.ggml.pre", "default") : opt.override_pre;
    try {
        v.pre = find_pre_tokenizer(v.pre_name);
    } catch (const std::runtime_error& e) {
        fail(e.what());
    }
    if (!v.pre)
        fail(fmt::format("{} '{}' is not a pre-tokenizer strata knows (--override-pre NAME picks one of: {})",
                         opt.override_pre.empty() ? "tokenizer.ggml.pre" : "--override-pre", v.pre_name,
                         known_pre_tokenizer_names()));
    v.ignore_merges = v.pre->ignore_merges;
}

void read_byte_tokens(vocab& v) {
    v.byte_token.fill(-1);
    for (int b = 0; b < 256; ++b)
        if (const auto it = v.text_to_id.find(fmt::format("<0x{:02X}>", b)); it != v.text_to_id.end())
            v.byte_token[b] = it->second;
}

void collect_eog_and_specials(vocab& v) {
    for (int32_t id : {v.eos, v.eot})
        if (id >= 0) v.eog.push_back(id);
    for (const char* t : {"<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|eom_id|>", "</s>", "<end_of_turn>"})
        if (const auto it = v.text_to_id.find(t); it != v.text_to_id.end()) v.eog.push_back(it->second);
    std::sort(v.eog.begin(), v.eog.end());
    v.eog.erase(std::unique(v.eog.begin(), v.eog.end()), v.eog.end());

    for (int32_t id = 0; id < v.n_vocab(); ++id) {
        const token_type t = v.type[static_cast<size_t>(id)];
        if ((t == token_type::control || t == token_type::user_defined) && !v.text[static_cast<size_t>(id)].empty())
            v.specials.push_back(id);
    }
    std::stable_sort(v.specials.begin(), v.specials.end(), [&](int32_t a, int32_t b) {
        return v.text[static_cast<size_t>(a)].size() > v.text[static_cast<size_t>(b)].size();
    });
}

}  // namespace

vocab load_vocab(const gguf::reader& r, const tokenizer_options& opt) {
    vocab v;
    const gguf::value* model_v = r.find("tokenizer.ggml.model");
    if (!model_v) fail("the file has no tokenizer.ggml.model (no vocabulary)");
    const std::string model = read_key("tokenizer.ggml.model", [&] { return model_v->as_string("tokenizer.ggml.model"); });
    if (model == "gpt2") {
        v.kind = vocab_kind::bpe;
    } else if (model == "llama") {
        v.kind = vocab_kind::spm;
    } else {
        fail(fmt::format("tokenizer.ggml.model '{}' is not supported (supported: gpt2, llama)", model));
    }

    read_tokens(r, v);
    const int32_t n = v.n_vocab();
    if (v.kind == vocab_kind::bpe) {
        read_pre(r, opt, v);
        check_byte_symbols(v);
        read_merges(r, v);
    } else {
        if (!opt.override_pre.empty())
            logger("engine")->warn("--override-pre {} is ignored: a SentencePiece vocabulary has no pre-tokenizer.",
                                   opt.override_pre);
        read_byte_tokens(v);
    }

    // Defaults as llama.cpp sets them: SentencePiece files start <unk>, <s>, </s> and add bos.
    const bool spm = v.kind == vocab_kind::spm;
    v.bos = read_id(r, "tokenizer.ggml.bos_token_id", n);
    v.eos = read_id(r, "tokenizer.ggml.eos_token_id", n);
    v.eot = read_id(r, "tokenizer.ggml.eot_token_id", n);
    v.unk = read_id(r, "tokenizer.ggml.unknown_token_id", n);
    v.pad = read_id(r, "tokenizer.ggml.padding_token_id", n);
    if (spm) {
        if (v.unk < 0 && n > 0) v.unk = 0;
        if (v.bos < 0 && n > 1) v.bos = 1;
        if (v.eos < 0 && n > 2) v.eos = 2;
    }
    v.add_bos = read_bool(r, "tokenizer.ggml.add_bos_token", spm || (v.pre && v.pre->add_bos));
    v.add_eos = read_bool(r, "tokenizer.ggml.add_eos_token", false);
    v.add_space_prefix = spm && read_bool(r, "tokenizer.ggml.add_space_prefix", true);
    if (v.add_bos && v.bos < 0)
        fail("tokenizer.ggml.add_bos_token is true but the file names no bos token (tokenizer.ggml.bos_token_id)");
    if (v.add_eos && v.eos < 0)
        fail("tokenizer.ggml.add_eos_token is true but the file names no eos token (tokenizer.ggml.eos_token_id)");

    collect_eog_and_specials(v);
    return v;
}

}  // namespace strata::tok
