// Learns a GPT-2 style byte-level BPE vocabulary (256 byte tokens + merges) from a text.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace strata::make_model {

// GPT-2's reversible byte -> printable code point mapping, as the UTF-8 string of each byte's symbol.
std::string byte_symbol(unsigned char b);

// Splits text the way the qwen2 pre-tokenizer does for ASCII input: contractions, an optional
// leading non-letter before a run of letters, single digits, punctuation runs, whitespace.
std::vector<std::string> pre_split(std::string_view text);

struct bpe_vocab {
    std::vector<std::string> tokens;  // id -> token text (byte symbols); ids 0..255 are the bytes
    std::vector<std::string> merges;  // "left right", in priority order
};

// Learns up to max_merges merges (most frequent pair first; ties by the pair's text, so the result
// is deterministic). Stops early when no pair is left.
bpe_vocab train_bpe(std::string_view text, size_t max_merges);

}  // namespace strata::make_model
