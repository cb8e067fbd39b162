// SentencePiece-style tokenizer on the generated llama vocabulary: bos, the space prefix, U+2581,
// byte fallback, special tokens and round trips.
#include <gtest/gtest.h>

#include <algorithm>

#include "fixtures.hpp"

namespace strata::tok {
namespace {

using testing::id_of;
using testing::llama_tokenizer;

constexpr const char* kSpace = "\xE2\x96\x81";  // U+2581

TEST(Spm, VocabularyFacts) {
    const tokenizer& t = llama_tokenizer();
    EXPECT_EQ(t.kind(), vocab_kind::spm);
    EXPECT_EQ(t.n_vocab(), 4096);
    EXPECT_EQ(t.bos(), 1);
    EXPECT_EQ(t.eos(), 2);
    EXPECT_TRUE(t.add_bos());
    EXPECT_EQ(t.token_text(0), "<unk>");
    EXPECT_EQ(t.type(0), token_type::unknown);
    EXPECT_EQ(t.type(3 + 0x41), token_type::byte);
    EXPECT_EQ(t.pre_name(), "");
    EXPECT_THROW(t.pre_split("x"), std::logic_error);
    EXPECT_EQ(t.eog_ids(), std::vector<int32_t>{2});
}

TEST(Spm, BosAndLeadingSpace) {
    const tokenizer& t = llama_tokenizer();
    const auto ids = t.encode("the");
    ASSERT_EQ(ids.size(), 2u);
    EXPECT_EQ(ids[0], 1);
    EXPECT_EQ(t.token_text(ids[1]), std::string(kSpace) + "the");
    EXPECT_EQ(t.encode("the", {.add_special = false}), std::vector<int32_t>{ids[1]});
    EXPECT_EQ(t.encode(""), std::vector<int32_t>{1});
    // Words of the corpus are single pieces with their space.
    const auto river = t.encode("the river", {.add_special = false});
    ASSERT_EQ(river.size(), 2u);
    EXPECT_EQ(t.token_text(river[1]), std::string(kSpace) + "river");
}

TEST(Spm, RoundTripsVariedText) {
    const tokenizer& t = llama_tokenizer();
    for (const std::string& text : testing::round_trip_texts()) {
        const auto ids = t.encode(text);
        ASSERT_FALSE(ids.empty());
        EXPECT_EQ(ids.front(), t.bos());
        EXPECT_EQ(t.decode(ids), text) << "text: " << text;
        EXPECT_EQ(t.decode(t.encode(text, {.add_special = false})), text) << "text: " << text;
    }
}

TEST(Spm, ByteFallbackForCharactersWithoutPieces) {
    const tokenizer& t = llama_tokenizer();
    const auto nl = t.encode("a\nb", {.add_special = false});
    EXPECT_NE(std::find(nl.begin(), nl.end(), id_of(t, "<0x0A>")), nl.end());
    // U+1F600: four byte tokens in order.
    const auto emoji = t.encode("\xF0\x9F\x98\x80", {.add_special = false});
    const std::vector<int32_t> bytes = {id_of(t, "<0xF0>"), id_of(t, "<0x9F>"), id_of(t, "<0x98>"), id_of(t, "<0x80>")};
    ASSERT_GE(emoji.size(), 4u);
    EXPECT_TRUE(std::equal(bytes.begin(), bytes.end(), emoji.end() - 4));
    EXPECT_EQ(t.decode(emoji), "\xF0\x9F\x98\x80");
    // Invalid UTF-8 goes through byte tokens as well.
    EXPECT_EQ(t.decode(t.encode("x\xFFy")), "x\xFFy");
}

TEST(Spm, StreamingByteFallbackHoldsPartialCharacters) {
    const tokenizer& t = llama_tokenizer();
    const std::string text = "caf\xC3\xA9 \xF0\x9F\x98\x80!";
    stream_decoder d(t);
    std::string out;
    int held = 0;
    for (int32_t id : t.encode(text, {.add_special = false})) {
        out += d.push(id);
        held += d.pending_bytes() > 0;
    }
    out += d.flush();
    EXPECT_EQ(out, " " + text);  // the stream keeps the space prefix: a continuation's space is real
    EXPECT_GE(held, 2);
}

TEST(Spm, SpecialTokensAndTheSpaceAfterThem) {
    const tokenizer& t = llama_tokenizer();
    const auto ids = t.encode("[INST] hi [/INST]ok</s>", {.parse_special = true});
    ASSERT_GE(ids.size(), 3u);
    EXPECT_EQ(ids.front(), 1);
    EXPECT_EQ(ids.back(), 2);
    const auto plain = t.encode("ok</s>");
    EXPECT_EQ(std::count(plain.begin(), plain.end(), 2), 0);
    EXPECT_EQ(t.decode(plain), "ok</s>");
    // After a special token the next text gets a space prefix, as llama.cpp's SPM tokenizer does.
    const auto after = t.encode("</s>the", {.add_special = false, .parse_special = true});
    ASSERT_EQ(after.size(), 2u);
    EXPECT_EQ(t.token_text(after[1]), std::string(kSpace) + "the");
}

TEST(Spm, DecodeKeepsTheSpaceOfAContinuationWhenAsked) {
    const tokenizer& t = llama_tokenizer();
    const auto ids = t.encode("the river", {.add_special = false});
    EXPECT_EQ(t.decode(ids), "the river");
    EXPECT_EQ(t.decode(ids, {.strip_space_prefix = false}), " the river");
    EXPECT_EQ(t.decode(std::vector<int32_t>{1, 2}, {.render_special = true}), "<s></s>");
}

}  // namespace
}  // namespace strata::tok
