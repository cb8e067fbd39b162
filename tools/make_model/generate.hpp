// Turns a model_spec into a GGUF writer: metadata as llama.cpp reads it for the architecture, a
// learned tokenizer (byte-level BPE with ChatML, or SentencePiece with the Mistral template), and
// random weights filled at write time.
#pragma once

#include <cstdint>

#include "gguf/gguf_writer.hpp"
#include "model_spec.hpp"

namespace strata::make_model {

// The same spec (seed included) always gives the same bytes, whatever the thread count.
gguf::writer build_model(const model_spec& spec);

}  // namespace strata::make_model
