// Stop strings: a full match ends the text before it; a partial match at the end is held back. The
// incremental matcher agrees with a plain scan of the whole text at every step of a growing text.
#include <gtest/gtest.h>

#include <chrono>
#include <random>

#include "tokenizer/stop_strings.hpp"

namespace strata::tok {
namespace {

stop_scan scan(std::string_view text, std::vector<std::string> stops) { return scan_stop_strings(text, stops); }

TEST(StopStrings, HoldsBackAPossibleStart) {
    const stop_scan r = scan("Hello wor", {"world"});
    EXPECT_FALSE(r.stopped);
    EXPECT_EQ(r.safe_length, 6u);  // "Hello "
    EXPECT_EQ(scan("wo", {"world"}).safe_length, 0u);
    EXPECT_EQ(scan("a\n", {"\n\n"}).safe_length, 1u);
    EXPECT_EQ(scan("Hi\nUs", {"\n\n", "User:"}).safe_length, 3u);
}

TEST(StopStrings, FullMatchEndsBeforeIt) {
    const stop_scan r = scan("Hello world! more", {"world"});
    EXPECT_TRUE(r.stopped);
    EXPECT_EQ(r.stop_index, 0u);
    EXPECT_EQ(r.safe_length, 6u);
}

TEST(StopStrings, EarliestOccurrenceWins) {
    const stop_scan r = scan("x STOP2 y STOP1", {"STOP1", "STOP2"});
    EXPECT_TRUE(r.stopped);
    EXPECT_EQ(r.stop_index, 1u);
    EXPECT_EQ(r.safe_length, 2u);
}

TEST(StopStrings, NothingToHold) {
    EXPECT_EQ(scan("plain text", {"zz"}).safe_length, 10u);
    EXPECT_EQ(scan("plain text", {}).safe_length, 10u);
    EXPECT_EQ(scan("plain text", {""}).safe_length, 10u);
    EXPECT_FALSE(scan("plain text", {""}).stopped);
}

TEST(StopStrings, MultiByteStopStringsCutOnCharacterBoundaries) {
    // "…" is three bytes; text ending in its first two bytes holds exactly those back.
    const stop_scan r = scan("wait\xE2\x80", {"\xE2\x80\xA6"});
    EXPECT_FALSE(r.stopped);
    EXPECT_EQ(r.safe_length, 4u);
    EXPECT_TRUE(scan("wait\xE2\x80\xA6", {"\xE2\x80\xA6"}).stopped);
}

// The reference: every stop string searched in the whole text, the held-back tail found by brute force.
stop_scan naive_scan(std::string_view text, const std::vector<std::string>& stops) {
    stop_scan r;
    size_t earliest = std::string_view::npos;
    for (size_t i = 0; i < stops.size(); ++i)
        if (!stops[i].empty() && text.find(stops[i]) < earliest) {
            earliest = text.find(stops[i]);
            r.stop_index = i;
        }
    if (earliest != std::string_view::npos) return {true, r.stop_index, earliest};
    r.safe_length = text.size();
    for (size_t start = 0; start < text.size(); ++start)
        for (const std::string& s : stops)
            if (!s.empty() && text.size() - start < s.size() && s.starts_with(text.substr(start)))
                r.safe_length = std::min(r.safe_length, start);
    return r;
}

// Feeds `pieces` to one matcher and checks each scan against the reference on the text so far;
// returns the first scan that stopped (or the last one).
stop_scan feed(const std::vector<std::string>& pieces, const std::vector<std::string>& stops) {
    stop_matcher m(stops);
    std::string text;
    stop_scan r;
    for (const std::string& p : pieces) {
        text += p;
        r = m.scan(text);
        const stop_scan want = naive_scan(text, stops);
        EXPECT_EQ(r.stopped, want.stopped) << "text '" << text << "'";
        EXPECT_EQ(r.safe_length, want.safe_length) << "text '" << text << "'";
        if (want.stopped) {
            EXPECT_EQ(r.stop_index, want.stop_index) << "text '" << text << "'";
        }
        if (r.stopped) break;
    }
    return r;
}

TEST(StopMatcher, StopStringSplitOverManyTokens) {
    const std::vector<std::string> stops = {"<|end_of_turn|>", "\n\nUser:"};
    std::vector<std::string> pieces = {"The answer is 42.", " <|", "end", "_of", "_", "tu", "rn", "|", ">", " more"};
    const stop_scan r = feed(pieces, stops);
    EXPECT_TRUE(r.stopped);
    EXPECT_EQ(r.stop_index, 0u);
    EXPECT_EQ(r.safe_length, std::string("The answer is 42. ").size());

    // One byte at a time: the growing start is held back until it can no longer begin a stop string.
    pieces.clear();
    for (char c : std::string("a <|end_of_tu x <|end_of_turn|>")) pieces.emplace_back(1, c);
    const stop_scan bytes = feed(pieces, stops);
    EXPECT_TRUE(bytes.stopped);
    EXPECT_EQ(bytes.safe_length, std::string("a <|end_of_tu x ").size());
}

TEST(StopMatcher, AgreesWithAWholeTextScanOnRandomGrowth) {
    std::mt19937 rng(11);
    const std::vector<std::string> alphabet = {"a", "b", "ab", "ba", "\xE2\x80\xA6", "\xC3\xA9", " "};
    for (int trial = 0; trial < 300; ++trial) {
        std::vector<std::string> stops;
        for (int k = 0, n = 1 + int(rng() % 3); k < n; ++k) {
            std::string s;
            for (int c = 0, len = 1 + int(rng() % 4); c < len; ++c) s += alphabet[rng() % alphabet.size()];
            stops.push_back(s);
        }
        if (trial % 10 == 0) stops.emplace_back();  // an empty stop string is ignored
        std::vector<std::string> pieces;
        for (int t = 0; t < 40; ++t) {
            std::string p;
            for (int c = 0, len = int(rng() % 3); c < len; ++c) p += alphabet[rng() % alphabet.size()];
            pieces.push_back(p);
        }
        feed(pieces, stops);
    }
}

TEST(StopMatcher, HeldBackTextEndsOnACharacterBoundary) {
    // "→" (3 bytes) starts the stop string; the text holds "→", "é" and ASCII.
    const std::vector<std::string> stops = {"\xE2\x86\x92" "END"};
    stop_matcher m(stops);
    std::string text;
    for (const char* piece : {"x\xC3\xA9", "\xE2\x86\x92", "E", "N", "o \xE2\x86\x92", "EN"}) {
        text += piece;
        const stop_scan r = m.scan(text);
        ASSERT_FALSE(r.stopped);
        ASSERT_LE(r.safe_length, text.size());
        if (r.safe_length < text.size()) {
            EXPECT_NE(static_cast<unsigned char>(text[r.safe_length]) & 0xC0, 0x80) << "cut inside a character";
        }
    }
    EXPECT_EQ(m.scan(text).safe_length, text.size() - std::string("\xE2\x86\x92" "EN").size());
    text += "D!";
    const stop_scan r = m.scan(text);
    EXPECT_TRUE(r.stopped);
    EXPECT_EQ(r.safe_length, std::string("x\xC3\xA9\xE2\x86\x92" "ENo ").size());
}

TEST(StopMatcher, LongGenerationCostsLinearTime) {
    // 4 MiB in 4-byte tokens (a million scans) with a stop string that only the last token completes.
    // Rescanning the whole text on every token would read about 2 * 10^12 bytes; the matcher reads a
    // few dozen per token.
    const std::vector<std::string> stops = {"</answer>", "STOP-NEVER-SEEN"};
    constexpr size_t n_bytes = size_t(4) << 20;
    stop_matcher m(stops);
    std::string text;
    text.reserve(n_bytes + 16);
    const auto t0 = std::chrono::steady_clock::now();
    stop_scan r;
    while (text.size() < n_bytes) {
        text += "ab</";  // a possible start of "</answer>" at the end of every token
        r = m.scan(text);
        ASSERT_FALSE(r.stopped);
        ASSERT_EQ(r.safe_length, text.size() - 2);
    }
    text += "answer>";
    r = m.scan(text);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_TRUE(r.stopped);
    EXPECT_EQ(r.safe_length, n_bytes - 2);
    EXPECT_LT(s, 5.0) << "a million scans took " << s << " s: the matcher rescans the text";
}

}  // namespace
}  // namespace strata::tok
