// RoPE settings of a model as llama.cpp resolves them: the GGUF keys, its defaults for absent keys, and
// the command-line overrides (--rope-scaling, --rope-scale, --rope-freq-base, --yarn-*).
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "gguf/gguf_reader.hpp"
#include "rope_params.hpp"

namespace strata {
struct model_options;
}

namespace strata::engine {

using kernels::rope_params;
using kernels::rope_scaling;

// "none" | "linear" | "yarn"; throws std::invalid_argument naming `what` (a key or a flag), the name
// and the valid ones.
rope_scaling parse_rope_scaling(std::string_view name, std::string_view what);
std::string_view rope_scaling_name(rope_scaling s);

// Values given instead of the file's; empty: the file's.
struct rope_overrides {
    std::optional<rope_scaling> scaling;  // --rope-scaling
    std::optional<float> factor;          // --rope-scale: context scaling factor (freq_scale = 1 / factor)
    std::optional<float> freq_base;       // --rope-freq-base
    std::optional<int> n_ctx_orig;        // --yarn-orig-ctx
    std::optional<float> ext_factor;      // --yarn-ext-factor
    std::optional<float> attn_factor;     // --yarn-attn-factor
    std::optional<float> beta_fast;       // --yarn-beta-fast
    std::optional<float> beta_slow;       // --yarn-beta-slow
};

// model_options' rope fields (0 or negative: the model's, as llama.cpp's) as overrides; throws
// std::invalid_argument naming the flag and the value when one is out of range.
rope_overrides rope_overrides_from(const model_options& o);

// Reads `<arch>.rope.freq_base` and `<arch>.rope.scaling.*` (type, factor or the legacy
// rope.scale_linear, original_context_length, attn_factor, yarn_ext_factor, yarn_attn_factor,
// yarn_beta_fast, yarn_beta_slow) and applies the overrides. Throws std::runtime_error naming the file,
// the key and the value for an unknown scaling type or a value out of range.
rope_params read_rope(const gguf::reader& f, const std::string& arch, int n_ctx_train, const rope_overrides& o = {});

// "none", "linear x4" or "yarn x4, original context 32768", for `strata info` and the load log.
std::string describe_rope(const rope_params& p);

}  // namespace strata::engine
