#include "tokenizer/pre_split.hpp"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <stdexcept>

#include <spdlog/fmt/fmt.h>

namespace strata::tok {

namespace {

// The patterns as llama.cpp runs them (src/llama-vocab.cpp). llama.cpp spells the case-insensitive
// contractions of the Hugging Face originals, (?i:'s|'t|...), as '[sS]|'[tT]|...; we do the same so
// that UCP case folding (which would let 's' match U+017F) cannot make the two disagree.
constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr std::string_view kLlama3Pattern =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// Qwen2 differs from Llama 3 only in splitting numbers into single digits.
constexpr std::string_view kQwen2Pattern =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

std::string_view pattern(pre_kind k) {
    switch (k) {
        case pre_kind::gpt2: return kGpt2Pattern;
        case pre_kind::llama3: return kLlama3Pattern;
        case pre_kind::qwen2: return kQwen2Pattern;
    }
    return kGpt2Pattern;
}

std::string pcre2_message(int code) {
    PCRE2_UCHAR buf[256];
    pcre2_get_error_message(code, buf, sizeof buf);
    return reinterpret_cast<const char*>(buf);
}

}  // namespace

pre_kind parse_pre(std::string_view name, bool& known) {
    known = true;
    // tokenizer.ggml.pre values llama.cpp maps to the same three patterns.
    for (std::string_view n : {"llama3", "llama-v3", "llama-bpe", "dbrx", "smaug-bpe"})
        if (name == n) return pre_kind::llama3;
    // qwen35 (Qwen3.5): llama.cpp gives it its own pattern; mapped to qwen2's here until the pre-tokenizers
    // cover it.
    for (std::string_view n : {"qwen2", "qwen35", "stablelm2", "deepseek-r1-qwen", "hunyuan"})
        if (name == n) return pre_kind::qwen2;
    for (std::string_view n : {"gpt2", "gpt-2", "default", "mpt", "olmo", "jais", "phi-2"})
        if (name == n) return pre_kind::gpt2;
    known = false;
    return pre_kind::gpt2;
}

std::string_view pre_kind_name(pre_kind k) {
    switch (k) {
        case pre_kind::gpt2: return "gpt2";
        case pre_kind::llama3: return "llama3";
        case pre_kind::qwen2: return "qwen2";
    }
    return "?";
}

struct pre_splitter::compiled {
    pcre2_code* code = nullptr;
    ~compiled() { pcre2_code_free(code); }
};

pre_splitter::pre_splitter(pre_kind kind) : kind_(kind), re_(std::make_unique<compiled>()) {
    const std::string_view p = pattern(kind);
    int err = 0;
    PCRE2_SIZE err_offset = 0;
    // MATCH_INVALID_UTF: invalid bytes simply never match instead of failing the whole call.
    re_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(p.data()), p.size(),
                              PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &err_offset, nullptr);
    if (!re_->code)
        throw std::runtime_error(fmt::format("the {} pre-tokenizer pattern does not compile at offset {}: {}",
                                             pre_kind_name(kind), err_offset, pcre2_message(err)));
    pcre2_jit_compile(re_->code, PCRE2_JIT_COMPLETE);  // optional: the interpreter is used without it
}

pre_splitter::pre_splitter(pre_splitter&&) noexcept = default;
pre_splitter& pre_splitter::operator=(pre_splitter&&) noexcept = default;
pre_splitter::~pre_splitter() = default;

std::vector<std::string_view> pre_splitter::split(std::string_view text) const {
    std::vector<std::string_view> out;
    std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> md(
        pcre2_match_data_create_from_pattern(re_->code, nullptr), &pcre2_match_data_free);
    if (!md) throw std::bad_alloc();
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    size_t pos = 0;
    while (pos < text.size()) {
        const int rc = pcre2_match(re_->code, subject, text.size(), pos, 0, md.get(), nullptr);
        if (rc == PCRE2_ERROR_NOMATCH) {
            out.push_back(text.substr(pos));  // only unmatched (invalid) bytes are left
            break;
        }
        if (rc < 0)
            throw std::runtime_error(fmt::format("the {} pre-tokenizer failed at byte {} of {}: {}",
                                                 pre_kind_name(kind_), pos, text.size(), pcre2_message(rc)));
        const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
        size_t begin = ov[0], end = ov[1];
        if (begin > pos) out.push_back(text.substr(pos, begin - pos));
        if (end == begin) end = begin + 1;  // the patterns never match empty; stay safe if one did
        out.push_back(text.substr(begin, end - begin));
        pos = end;
    }
    return out;
}

}  // namespace strata::tok
