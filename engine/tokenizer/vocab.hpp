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
    std::string pre_name;                        // bpe: tokenizer.ggml.pre in effect (the file's or the override)
    const pre_tokenizer_info* pre = nullptr;     // bpe: what that name selects
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
    bool ignore_merges = false;     // bpe (llama3 and others): a pre-split word that is a token is taken whole
    bool missing_bytes = false;     // bpe: some byte symbols have no token (their bytes are dropped, as llama.cpp does)

    std::vector<int32_t> eog;       // sorted
    std::vector<int32_t> specials;  // control and user-defined tokens matched in text, longest first

    int32_t n_vocab() const { return static_cast<int32_t>(text.size()); }
};

// Throws std::runtime_error naming the key and the numbers.
vocab load_vocab(const gguf::reader& r, const tokenizer_options& opt);

}  // namespace strata::tok
