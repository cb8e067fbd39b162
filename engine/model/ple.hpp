// qwen4exp's PLE n-gram hashing (transformers' Qwen4ExpTextNGramEmbedding): for the n-grams of 2..N
// tokens ending at a token, mixed = XOR over j of token[p - j] * multiplier[j] (64-bit, wrapping), and
// head h of that n-gram reads table row mixed % vocab[h] + offset[h]. An EOS among the predecessors
// cuts the window: it and everything before it read as EOS, as do positions before the sequence.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "model/hparams.hpp"

namespace strata::engine {

// Token t of `tokens`' table rows [ple_n_heads]; window: the ple_ngram - 1 tokens before tokens[0],
// oldest first, each stored as id + 1 (0: none).
void ple_rows_of(const hparams& hp, const float* window, const int32_t* tokens, int t, int64_t* rows);
// Slides the window past n tokens.
void ple_push_window(const hparams& hp, float* window, const int32_t* tokens, int n);

// What forward passes gathered from the table (the engine's cold-region counters; model_weights'
// ple_table points at them).
struct ple_reads {
    std::atomic<uint64_t> tokens{0}, rows{0}, faults{0};
};
// The calling thread's major page faults so far: pages it waited for the file to read.
uint64_t thread_major_faults();
// Bytes of [p, p + n) in the page cache now (mincore over the pages the range touches).
uint64_t resident_bytes(const void* p, size_t n);

}  // namespace strata::engine
