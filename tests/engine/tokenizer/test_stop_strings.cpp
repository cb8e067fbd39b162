// Stop strings: a full match ends the text before it; a partial match at the end is held back.
#include <gtest/gtest.h>

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

}  // namespace
}  // namespace strata::tok
