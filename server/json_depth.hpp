// A limit on how deeply a JSON body nests, checked by a linear scan before it is parsed: each level
// costs the parser a heap-allocated container, so 8 MiB of '[' would cost hundreds of MiB.
#pragma once

#include <string_view>

namespace strata::server {

inline constexpr int max_json_depth = 64;

// Throws api_error 400 (code "too_deep") naming the limit and where the body passes it. Brackets
// inside strings do not count; anything else that is not JSON is left to the parser.
void check_json_depth(std::string_view body, int max_depth = max_json_depth);

}  // namespace strata::server
