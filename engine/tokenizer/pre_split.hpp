// The pre-tokenizers of byte-level BPE vocabularies as llama.cpp runs them, chosen by the GGUF key
// tokenizer.ggml.pre: one or more regex passes (PCRE2, UTF + UCP), each cutting every piece the pass
// before left into its matches and the unmatched runs between them. PCRE2 stays in the .cpp.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace strata::tok {

// What a tokenizer.ggml.pre name means to llama.cpp's loader: the family of split patterns it selects
// and the vocabulary defaults that come with it.
struct pre_tokenizer_info {
    std::string_view family;     // "gpt2", "llama3", "qwen2", "deepseek-llm", ... (pre_splitter's name)
    bool ignore_merges = false;  // a pre-split word that is a whole token is taken as it is
    bool add_bos = false;        // default of tokenizer.ggml.add_bos_token
    bool merges_optional = false;  // kimi-k2 files may come without tokenizer.ggml.merges
};

// The entry for a tokenizer.ggml.pre value; nullptr when llama.cpp does not know the name.
// Throws std::runtime_error for a name llama.cpp knows but strata cannot run (not byte-level BPE).
const pre_tokenizer_info* find_pre_tokenizer(std::string_view name);
// Every name find_pre_tokenizer accepts, comma-separated (for error messages).
std::string known_pre_tokenizer_names();

class pre_splitter {
public:
    // `family` as in pre_tokenizer_info. Throws std::runtime_error for an unknown family or a pattern
    // PCRE2 rejects (with its message).
    explicit pre_splitter(std::string_view family);
    pre_splitter(pre_splitter&&) noexcept;
    pre_splitter& operator=(pre_splitter&&) noexcept;
    ~pre_splitter();

    // Cuts text into consecutive pieces whose concatenation is text. Bytes no pattern can match
    // (invalid UTF-8) stay in the unmatched runs, so any byte string survives. Thread-safe.
    std::vector<std::string_view> split(std::string_view text) const;

    std::string_view family() const;

private:
    struct impl;
    std::unique_ptr<impl> impl_;
};

}  // namespace strata::tok
