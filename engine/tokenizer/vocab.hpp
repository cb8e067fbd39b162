// The vocabulary as read from tokenizer.ggml.* and checked for consistency; shared by the BPE and
// SentencePiece encoders. Internal to the tokenizer.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "gguf/gguf_reader.hpp"
#include "tokenizer/pre_split.hpp"
#include "tokenizer/tokenizer.hpp"

namespace strata::tok {

struct vocab {
    vocab_kind kind = vocab_kind::bpe;
    pre_kind pre = pre_kind::gpt2;               // bpe only
    std::vector<std::string> text;               // [n_vocab] token text as stored
    std::vector<token_type> type;                // [n_vocab]
    std::vector<float> score;                    // [n_vocab] spm merge priority (higher first); 0 for bpe

    std::unordered_map<std::string, int32_t> text_to_id;   // every token; the first id wins a duplicate
    std::unordered_map<std::string, int32_t> piece_to_id;  // tokens merges may produce: no control/unknown
    std::unordered_map<std::string, int32_t> merge_rank;   // bpe: "left right" -> rank (lower merges first)
    std::array<int32_t, 256> byte_token{};                 // spm: id of <0xXX>, -1 when absent

    int32_t bos = -1, eos = -1, eot = -1, unk = -1, pad = -1;
    bool add_bos = false, add_eos = false;
    bool add_space_prefix = false;  // spm: a space in front of the text (and after each special token)
    bool ignore_merges = false;     // bpe llama3: a pre-split word that is a token is taken whole

    std::vector<int32_t> eog;       // sorted
    std::vector<int32_t> specials;  // control and user-defined tokens matched in text, longest first

    int32_t n_vocab() const { return static_cast<int32_t>(text.size()); }
};

// Throws std::runtime_error naming the key and the numbers.
vocab load_vocab(const gguf::reader& r);

}  // namespace strata::tok
