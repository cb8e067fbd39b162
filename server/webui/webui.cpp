#include "webui.hpp"

#include <algorithm>

namespace strata::server::webui {

const asset* find(std::string_view path) {
    const std::span<const asset> all = assets();
    const auto it = std::find_if(all.begin(), all.end(), [path](const asset& a) { return a.path == path; });
    return it == all.end() ? nullptr : &*it;
}

}  // namespace strata::server::webui
