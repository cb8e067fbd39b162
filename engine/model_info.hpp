// A summary of a GGUF model file for `strata info`: architecture, hyper-parameters, tensor types,
// bytes per tensor class, tokenizer facts.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "gguf/gguf_reader.hpp"

namespace strata {

// "attention", "experts", "router", "shared_expert", "ffn" (dense), "embeddings", "head", "norms",
// "nextn" (next-token-prediction layers), "other".
std::string_view tensor_class(std::string_view tensor_name);

struct model_summary {
    struct class_total {
        int n_tensors = 0;
        uint64_t n_bytes = 0;
    };
    std::string architecture;
    std::string name;
    std::vector<std::pair<std::string, std::string>> hparams;  // "<arch>.key" without the prefix -> value
    std::string rope_scaling;  // "none", "linear x2", "yarn x4, original context 32768", or why it is unreadable
    size_t n_tensors = 0;
    int64_t n_params = 0;
    uint64_t tensor_bytes = 0;
    std::map<std::string, int> tensors_by_type;             // "Q4_K" -> count
    std::map<std::string, class_total> bytes_by_class;
    int64_t vocab_size = 0;
    std::string tokenizer_model;                            // "gpt2", "llama", ... or empty
    std::string tokenizer_pre;
    bool has_chat_template = false;
};

model_summary summarize(const gguf::reader& file);

}  // namespace strata
