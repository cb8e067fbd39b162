// The two subword models, each turning one run of plain text (no special tokens in it) into ids and
// one token into the bytes it stands for. Internal to the tokenizer.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/pre_split.hpp"
#include "tokenizer/unicode.hpp"
#include "tokenizer/vocab.hpp"

namespace strata::tok {

// Byte-level BPE: pre-split, bytes spelled as GPT-2 symbols, merges by rank (lowest first, leftmost
// on ties), then each symbol looked up (a symbol without a token falls back to its byte tokens).
void bpe_encode(const vocab& v, const pre_splitter& splitter, const byte_unicode_map& bytes, std::string_view text,
                std::vector<int32_t>& out);
std::string bpe_piece(const vocab& v, const byte_unicode_map& bytes, int32_t id);

// SentencePiece BPE on text whose spaces are already U+2581: characters merged by the score of the
// piece they form (highest first, leftmost on ties); characters without a piece become <0xXX> tokens
// (or unk when the vocabulary has no byte tokens).
void spm_encode(const vocab& v, std::string_view text, std::vector<int32_t>& out);
std::string spm_piece(const vocab& v, int32_t id);

inline constexpr std::string_view kSpmSpace = "\xE2\x96\x81";  // U+2581 LOWER ONE EIGHTH BLOCK

}  // namespace strata::tok
