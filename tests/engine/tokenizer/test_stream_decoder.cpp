// The streaming decoder: whatever way a text's bytes are cut into tokens, every chunk it returns is
// valid UTF-8 and the chunks add up to the text.
#include <gtest/gtest.h>

#include "fixtures.hpp"
#include "tokenizer/unicode.hpp"

namespace strata::tok {
namespace {

using testing::gpt2_tokenizer;
using testing::id_of;

// Feeds ids one by one; checks each chunk; returns the concatenation and how many pushes held bytes.
std::string stream(const tokenizer& t, const std::vector<int32_t>& ids, int& held, bool render_special = false) {
    stream_decoder d(t, render_special);
    std::string out;
    held = 0;
    for (int32_t id : ids) {
        const std::string chunk = d.push(id);
        EXPECT_TRUE(utf8_valid(chunk)) << "chunk after id " << id;
        if (d.pending_bytes() > 0) ++held;
        out += chunk;
    }
    const std::string tail = d.flush();
    EXPECT_TRUE(utf8_valid(tail));
    EXPECT_EQ(d.pending_bytes(), 0u);
    return out + tail;
}

TEST(StreamDecoder, MultiByteCharactersSplitOverTokensComeOutWhole) {
    const tokenizer& t = gpt2_tokenizer();
    // The vocabulary is learned from ASCII text, so each of these characters is several byte tokens.
    const std::string text = "caf\xC3\xA9 \xE6\x97\xA5\xE6\x9C\xAC \xF0\x9F\x91\x8B\xF0\x9F\x8F\xBD done";
    const std::vector<int32_t> ids = t.encode(text);
    ASSERT_GT(ids.size(), 12u);
    int held = 0;
    EXPECT_EQ(stream(t, ids, held), text);
    EXPECT_GE(held, 4) << "the 2-, 3- and 4-byte characters should each have been held at least once";
}

TEST(StreamDecoder, EveryRoundTripTextStreams) {
    const tokenizer& t = gpt2_tokenizer();
    for (const std::string& text : testing::round_trip_texts()) {
        int held = 0;
        EXPECT_EQ(stream(t, t.encode(text), held), text);
    }
}

TEST(StreamDecoder, ExplicitByteTokensOfAFourByteCharacter) {
    const tokenizer& t = gpt2_tokenizer();
    const byte_unicode_map bytes;
    // U+1F600 as four single-byte tokens, pushed one at a time.
    std::vector<int32_t> ids;
    for (uint8_t b : {0xF0, 0x9F, 0x98, 0x80}) ids.push_back(id_of(t, bytes.encode(b)));
    stream_decoder d(t);
    EXPECT_EQ(d.push(ids[0]), "");
    EXPECT_EQ(d.push(ids[1]), "");
    EXPECT_EQ(d.push(ids[2]), "");
    EXPECT_EQ(d.pending_bytes(), 3u);
    EXPECT_EQ(d.push(ids[3]), "\xF0\x9F\x98\x80");
    EXPECT_EQ(d.flush(), "");
}

TEST(StreamDecoder, BrokenSequencesBecomeReplacementCharacters) {
    const tokenizer& t = gpt2_tokenizer();
    const byte_unicode_map bytes;
    stream_decoder d(t);
    // A lead byte followed by ASCII can never complete: U+FFFD then the ASCII.
    EXPECT_EQ(d.push(id_of(t, bytes.encode(0xE2))), "");
    EXPECT_EQ(d.push(id_of(t, "A")), std::string(kReplacementChar) + "A");
    // A lone continuation byte.
    EXPECT_EQ(d.push(id_of(t, bytes.encode(0x80))), std::string(kReplacementChar));
    // A generation that ends inside a character.
    EXPECT_EQ(d.push(id_of(t, bytes.encode(0xC3))), "");
    EXPECT_EQ(d.flush(), std::string(kReplacementChar));
}

TEST(StreamDecoder, ControlTokensOnlyWhenAsked) {
    const tokenizer& t = gpt2_tokenizer();
    const std::vector<int32_t> ids = t.encode("<|im_start|>hi<|im_end|>", {.parse_special = true});
    int held = 0;
    EXPECT_EQ(stream(t, ids, held), "hi");
    EXPECT_EQ(stream(t, ids, held, true), "<|im_start|>hi<|im_end|>");
}

TEST(Utf8, IncompleteTailAndValidity) {
    EXPECT_EQ(utf8_incomplete_tail("abc"), 0u);
    EXPECT_EQ(utf8_incomplete_tail("ab\xE2\x82"), 2u);
    EXPECT_EQ(utf8_incomplete_tail("ab\xF0"), 1u);
    EXPECT_EQ(utf8_incomplete_tail("ab\xE2\x82\xAC"), 0u);
    EXPECT_TRUE(utf8_valid("\xE2\x82\xAC \xF0\x9F\x98\x80"));
    EXPECT_FALSE(utf8_valid("\xC0\x80"));          // overlong NUL
    EXPECT_FALSE(utf8_valid("\xED\xA0\x80"));      // surrogate
    EXPECT_FALSE(utf8_valid("\xF4\x90\x80\x80"));  // beyond U+10FFFF
    EXPECT_FALSE(utf8_valid("\xE2\x82"));          // incomplete
}

}  // namespace
}  // namespace strata::tok
