// Turns a model_spec into a GGUF writer: metadata as llama.cpp reads it for the architecture, a
// learned tokenizer (byte-level BPE with ChatML, or SentencePiece with the Mistral template), and
// random weights filled at write time.
#pragma once

#include <cstdint>
#include <vector>

#include "gguf/gguf_writer.hpp"
#include "model_spec.hpp"

namespace strata::make_model {

// llama.cpp's general.file_type (enum llama_ftype) for a file whose weights are mostly `type`.
uint32_t llama_file_type(formats::ggml_type type);
// The type holding the most bytes among the weight matrices (tensors of two or more dimensions).
formats::ggml_type dominant_type(const std::vector<tensor_spec>& tensors);

// The same spec (seed included) always gives the same bytes, whatever the thread count.
gguf::writer build_model(const model_spec& spec);

}  // namespace strata::make_model
