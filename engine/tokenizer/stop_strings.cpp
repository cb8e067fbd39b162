#include "tokenizer/stop_strings.hpp"

#include <algorithm>

namespace strata::tok {

stop_scan scan_stop_strings(std::string_view text, std::span<const std::string> stops) {
    stop_scan r;
    size_t earliest = std::string_view::npos;
    for (size_t i = 0; i < stops.size(); ++i) {
        if (stops[i].empty()) continue;
        const size_t at = text.find(stops[i]);
        if (at < earliest) {
            earliest = at;
            r.stop_index = i;
        }
    }
    if (earliest != std::string_view::npos) {
        r.stopped = true;
        r.safe_length = earliest;
        return r;
    }
    size_t hold = 0;  // the longest tail of text that is a proper prefix of some stop string
    for (const std::string& s : stops) {
        if (s.empty()) continue;
        for (size_t k = std::min(s.size() - 1, text.size()); k > hold; --k)
            if (text.ends_with(std::string_view(s).substr(0, k))) {
                hold = k;
                break;
            }
    }
    r.safe_length = text.size() - hold;
    return r;
}

}  // namespace strata::tok
