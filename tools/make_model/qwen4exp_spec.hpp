// strata-make-model's qwen4exp parts: presets, the tensors beyond the hybrid layout, the metadata, and
// the PLE hash constants computed as transformers' modeling_qwen4_exp.py computes them.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "gguf/gguf_writer.hpp"
#include "model_spec.hpp"

namespace strata::make_model {

using add_matrix = std::function<void(std::string, formats::ggml_type, std::vector<int64_t>, float)>;
using add_vec = std::function<void(std::string, int64_t, init)>;

// tiny / demo / bench on top of the hybrid preset; bench is Qwen3.8-Flash-Next per layer (n_embd 2560,
// 24 / 2 heads of 256, 512 experts of 640 with 10 used, 4 streams of rank 320) with 8 layers.
model_spec qwen4exp_preset(const std::string& name, model_spec s);

// Block i's hyper-connection mixers, QSA indexer (attention layers) and PLE block (ple_layer).
void qwen4exp_block_tensors(const model_spec& s, int i, const add_matrix& matrix, const add_vec& vec);
// An MTP block's nextn.* tensors (hnorm over the wide residual, its own output mixer).
void qwen4exp_nextn_tensors(const model_spec& s, int i, const add_matrix& matrix, const add_vec& vec);
// The output mixer output_hc_* and the PLE table per_layer_token_embd.
void qwen4exp_global_tensors(const model_spec& s, const add_matrix& matrix, const add_vec& vec);

// The PLE hash constants: splitmix64 multipliers from the seed, per head the (h+1)-th prime from
// ple_vocab_base and the running offsets; rows: the table's rows (the ranges padded to 64, or ple_rows).
struct ple_hash {
    std::vector<uint64_t> mult, offset, vocab;
    int64_t rows = 0;
};
ple_hash make_ple_hash(const model_spec& s);

// The qwen4exp.* keys beyond the hybrid ones; eos: the vocabulary's end-of-sequence id.
void set_qwen4exp_hparams(gguf::writer& w, const model_spec& s, const std::string& a, int64_t eos);
void check_qwen4exp(const model_spec& s);

}  // namespace strata::make_model
