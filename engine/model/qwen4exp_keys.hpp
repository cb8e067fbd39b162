// The qwen4exp metadata (hyper-connections, the QSA indexer, the PLE n-gram embedding) as llama.cpp's
// src/models/qwen4exp.cpp reads it, with at least the ranges it checks.
#pragma once

#include <string>

#include "gguf/gguf_reader.hpp"
#include "model/hparams.hpp"

namespace strata::engine {

// Fills hp's qwen4exp fields; `p` is "qwen4exp.". Expects the hybrid keys already read (the layer
// layout); throws std::runtime_error naming the key and the numbers.
void read_qwen4exp_keys(const gguf::reader& f, const std::string& p, hparams& hp);

}  // namespace strata::engine
