// Stop strings for streamed generation: whether the text so far contains one, and how much of it can
// be sent without sending the start of a stop string that the next tokens might complete.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <string_view>

namespace strata::tok {

struct stop_scan {
    bool stopped = false;     // a stop string occurs in the text
    size_t stop_index = 0;    // which one (the earliest occurrence; the first listed on a tie)
    // text[0, safe_length) is final. Stopped: everything before the stop string (which is not part of
    // the output, as in OpenAI's API). Otherwise: all but the longest tail that begins a stop string.
    size_t safe_length = 0;
};

// Matches stop strings against a text that only grows (a generation, token by token). Each scan reads
// the bytes added since the previous scan plus the longest stop string's length - 1 before them (where
// a match across the boundary can start), so a generation costs time linear in its length, not
// quadratic. Empty stop strings are ignored. The held-back tail starts where a stop string starts, so
// when the text and the stop strings are valid UTF-8 the safe prefix ends on a character boundary.
class stop_matcher {
public:
    // Keeps a view of `stops`: they must outlive the matcher.
    explicit stop_matcher(std::span<const std::string> stops);

    // `text` extends the text of the previous scan (which found no stop string).
    stop_scan scan(std::string_view text);

private:
    std::span<const std::string> stops_;
    size_t max_length_ = 0;   // bytes of the longest stop string
    size_t scanned_ = 0;      // text.size() at the previous scan: no stop string ends before it
};

// One scan of a whole text.
stop_scan scan_stop_strings(std::string_view text, std::span<const std::string> stops);

}  // namespace strata::tok
