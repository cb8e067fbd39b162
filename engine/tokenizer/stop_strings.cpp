#include "tokenizer/stop_strings.hpp"

#include <algorithm>

namespace strata::tok {

stop_matcher::stop_matcher(std::span<const std::string> stops) : stops_(stops) {
    for (const std::string& s : stops_) max_length_ = std::max(max_length_, s.size());
}

stop_scan stop_matcher::scan(std::string_view text) {
    stop_scan r;
    // A match not found before must end past the previous text's end, so it starts at most
    // max_length_ - 1 bytes before it.
    const size_t from = scanned_ + 1 > max_length_ ? scanned_ + 1 - max_length_ : 0;
    scanned_ = text.size();
    const std::string_view window = text.substr(std::min(from, text.size()));
    size_t earliest = std::string_view::npos;
    for (size_t i = 0; i < stops_.size(); ++i) {
        if (stops_[i].empty()) continue;
        const size_t at = window.find(stops_[i]);
        if (at < earliest) {
            earliest = at;
            r.stop_index = i;
        }
    }
    if (earliest != std::string_view::npos) {
        r.stopped = true;
        r.safe_length = from + earliest;
        return r;
    }
    size_t hold = 0;  // the longest tail of text that is a proper prefix of some stop string
    for (const std::string& s : stops_) {
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

stop_scan scan_stop_strings(std::string_view text, std::span<const std::string> stops) {
    return stop_matcher(stops).scan(text);
}

}  // namespace strata::tok
