// The split patterns of each pre-tokenizer family, in PCRE2 syntax with one convention: \s and \S
// stand for llama.cpp's whitespace set, which pre_split.cpp writes out. Internal to the tokenizer.
#pragma once

#include <string_view>
#include <vector>

namespace strata::tok {

struct pre_pass {
    std::string_view pattern;
    // Instead of isolating matches: cut each run the pattern matches into groups of three counted
    // from its end, the text before a run joining its first group (llama.cpp's AFMoE digit split).
    bool digit_groups = false;
};

struct pre_family {
    std::string_view name;
    std::vector<pre_pass> passes;  // applied in order, each to every piece of the one before
};

// nullptr for an unknown family name.
const pre_family* find_pre_family(std::string_view name);

}  // namespace strata::tok
