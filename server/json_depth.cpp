#include "json_depth.hpp"

#include <spdlog/fmt/fmt.h>

#include "api_error.hpp"

namespace strata::server {

void check_json_depth(std::string_view body, int max_depth) {
    int depth = 0;
    bool in_string = false;
    for (size_t i = 0; i < body.size(); ++i) {
        const char c = body[i];
        if (in_string) {
            if (c == '\\') ++i;
            else if (c == '"') in_string = false;
            continue;
        }
        if (c == '"') {
            in_string = true;
        } else if (c == '[' || c == '{') {
            if (++depth > max_depth)
                throw api_error(400, fmt::format("the JSON body nests arrays and objects deeper than the limit of {} "
                                                 "levels (at byte {})", max_depth, i),
                                "invalid_request_error", "", "too_deep");
        } else if (c == ']' || c == '}') {
            --depth;
        }
    }
}

}  // namespace strata::server
