// Command-line flags shared by strata run, strata-bench and strata-server: engine options (model,
// context, KV cache, pool) and sampling options, with llama.cpp's names and defaults where they exist.
#pragma once

#include <cxxopts.hpp>

#include "strata/engine.hpp"

namespace strata::cli {

void add_model_flags(cxxopts::Options& options);     // -m, --ctx, --batch, --kv, --numa-pool, --pool-workers,
                                                     // --chat-template, --numa-hot-node, --mmap-experts,
                                                     // GPU flags, --rope-scaling, --rope-scale, --yarn-*,
                                                     // --override-pre
void add_sampling_flags(cxxopts::Options& options);  // --temp, --top-k, --top-p, --min-p, penalties, --seed
void add_spec_flags(cxxopts::Options& options);      // --spec-type, --spec, --spec-min-p (llama.cpp's
                                                     // --draft-max, --draft-p-min as aliases)

// Throws std::invalid_argument naming the flag when a value is out of range.
model_options model_options_from(const cxxopts::ParseResult& args);
sampling_options sampling_options_from(const cxxopts::ParseResult& args);
speculation_options speculation_options_from(const cxxopts::ParseResult& args);

}  // namespace strata::cli
