// The pre-tokenizer of byte-level BPE vocabularies: a regex (PCRE2, UTF + UCP) that cuts text into
// words before merges run, chosen by the GGUF key tokenizer.ggml.pre. PCRE2 stays in the .cpp.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace strata::tok {

enum class pre_kind { gpt2, llama3, qwen2 };

// Maps a tokenizer.ggml.pre value to its pattern family; `known` is false for a name strata does
// not recognise (the caller falls back to gpt2 and warns).
pre_kind parse_pre(std::string_view name, bool& known);
std::string_view pre_kind_name(pre_kind k);

class pre_splitter {
public:
    explicit pre_splitter(pre_kind kind);  // throws std::runtime_error with PCRE2's message
    pre_splitter(pre_splitter&&) noexcept;
    pre_splitter& operator=(pre_splitter&&) noexcept;
    ~pre_splitter();

    // Cuts text into consecutive pieces whose concatenation is text. Bytes the pattern cannot match
    // (invalid UTF-8) become pieces of their own, so any byte string survives. Thread-safe.
    std::vector<std::string_view> split(std::string_view text) const;

    pre_kind kind() const { return kind_; }

private:
    struct compiled;
    pre_kind kind_;
    std::unique_ptr<compiled> re_;
};

}  // namespace strata::tok
