// qwen4exp's PLE n-gram hashing (transformers' Qwen4ExpTextNGramEmbedding): for the n-grams of 2..N
// tokens ending at a token, mixed = XOR over j of token[p - j] * multiplier[j] (64-bit, wrapping), and
// head h of that n-gram reads table row mixed % vocab[h] + offset[h]. An EOS among the predecessors
// cuts the window: it and everything before it read as EOS, as do positions before the sequence.
#pragma once

#include <cstdint>

#include "model/hparams.hpp"

namespace strata::engine {

// Token t of `tokens`' table rows [ple_n_heads]; window: the ple_ngram - 1 tokens before tokens[0],
// oldest first, each stored as id + 1 (0: none).
void ple_rows_of(const hparams& hp, const float* window, const int32_t* tokens, int t, int64_t* rows);
// Slides the window past n tokens.
void ple_push_window(const hparams& hp, float* window, const int32_t* tokens, int n);

}  // namespace strata::engine
