// Byte-level BPE on the generated gpt2/qwen2 vocabulary: round trips, known tokenisations, special
// tokens, end-of-generation ids, and the three pre-split patterns against llama.cpp's pieces.
#include <gtest/gtest.h>

#include <algorithm>

#include "fixtures.hpp"
#include "tokenizer/pre_split.hpp"

namespace strata::tok {
namespace {

using testing::gpt2_tokenizer;
using testing::id_of;
using Pieces = std::vector<std::string>;

Pieces split(pre_kind k, std::string_view text) {
    const pre_splitter s(k);
    Pieces out;
    for (std::string_view p : s.split(text)) out.emplace_back(p);
    return out;
}

TEST(Bpe, RoundTripsVariedText) {
    const tokenizer& t = gpt2_tokenizer();
    for (const std::string& text : testing::round_trip_texts()) {
        const std::vector<int32_t> ids = t.encode(text);
        EXPECT_EQ(t.decode(ids), text) << "text: " << text;
        for (int32_t id : ids) EXPECT_EQ(t.type(id), token_type::normal) << text;
    }
}

TEST(Bpe, RoundTripsBytesThatAreNotUtf8) {
    const tokenizer& t = gpt2_tokenizer();
    const std::string text = "ok \xFF\xFE then \xC3 and \xE2\x82 end \x80";
    EXPECT_EQ(t.decode(t.encode(text)), text);
}

TEST(Bpe, LongRunsRoundTrip) {
    // Long matches of \s+, \p{L}+ and punctuation runs must not hit PCRE2's JIT stack or match limits.
    const tokenizer& t = gpt2_tokenizer();
    std::string text(100000, ' ');
    text += "x";
    text += std::string(100000, 'a');
    for (int i = 0; i < 20000; ++i) text += "\xC3\xA9";  // é
    text += std::string(50000, '!');
    text += std::string(50000, '\n');
    EXPECT_EQ(t.decode(t.encode(text)), text);
}

TEST(Bpe, CommonWordsAreSingleTokens) {
    const tokenizer& t = gpt2_tokenizer();
    EXPECT_EQ(t.pre_name(), "qwen2");
    EXPECT_FALSE(t.add_bos());
    const auto the = t.encode(" the");
    ASSERT_EQ(the.size(), 1u);
    EXPECT_EQ(t.token_text(the[0]), "\xC4\xA0the");  // "Ġthe"
    const auto hello = t.encode("Hello");
    ASSERT_EQ(hello.size(), 1u);
    EXPECT_EQ(t.token_text(hello[0]), "Hello");
    // A sentence from the corpus takes far fewer tokens than bytes.
    const std::string s = "The capital of France is Paris.";
    EXPECT_LT(t.encode(s).size(), s.size() / 2);
}

TEST(Bpe, DigitsAreSingleTokensUnderQwen2) {
    const tokenizer& t = gpt2_tokenizer();
    const auto ids = t.encode("12345");
    ASSERT_EQ(ids.size(), 5u);
    for (size_t i = 0; i < 5; ++i) EXPECT_EQ(t.token_text(ids[i]), std::string(1, char('1' + i)));
}

TEST(Bpe, ControlTokensOnlyWithParseSpecial) {
    const tokenizer& t = gpt2_tokenizer();
    const int32_t im_start = id_of(t, "<|im_start|>"), im_end = id_of(t, "<|im_end|>");
    const std::string text = "<|im_start|>user\nHello<|im_end|>\n";
    const auto parsed = t.encode(text, {.parse_special = true});
    ASSERT_GE(parsed.size(), 4u);
    EXPECT_EQ(parsed.front(), im_start);
    EXPECT_NE(std::find(parsed.begin(), parsed.end(), im_end), parsed.end());
    EXPECT_EQ(t.decode(parsed, {.render_special = true}), text);
    EXPECT_EQ(t.decode(parsed), "user\nHello\n");  // control tokens render as nothing by default

    const auto plain = t.encode(text);
    EXPECT_EQ(std::find(plain.begin(), plain.end(), im_start), plain.end());
    EXPECT_EQ(std::find(plain.begin(), plain.end(), im_end), plain.end());
    EXPECT_EQ(t.decode(plain), text);  // spelled out in ordinary tokens
}

TEST(Bpe, AdjacentSpecialTokens) {
    const tokenizer& t = gpt2_tokenizer();
    const auto ids = t.encode("<|im_end|><|endoftext|>x", {.parse_special = true});
    ASSERT_EQ(ids.size(), 3u);
    EXPECT_EQ(ids[0], id_of(t, "<|im_end|>"));
    EXPECT_EQ(ids[1], id_of(t, "<|endoftext|>"));
    EXPECT_EQ(t.token_text(ids[2]), "x");
}

TEST(Bpe, EndOfGenerationIds) {
    const tokenizer& t = gpt2_tokenizer();
    EXPECT_EQ(t.token_text(t.eos()), "<|im_end|>");
    EXPECT_TRUE(t.is_eog(t.eos()));
    EXPECT_TRUE(t.is_eog(id_of(t, "<|endoftext|>")));
    EXPECT_FALSE(t.is_eog(id_of(t, "<|im_start|>")));
    EXPECT_FALSE(t.is_eog(t.encode("Hello")[0]));
    EXPECT_EQ(t.eog_ids().size(), 2u);
}

TEST(Bpe, OutOfRangeIdsThrow) {
    const tokenizer& t = gpt2_tokenizer();
    const std::vector<int32_t> bad = {t.n_vocab()};
    EXPECT_THROW(t.decode(bad), std::out_of_range);
    EXPECT_THROW(t.token_to_piece(-1), std::out_of_range);
}

// Expected pieces are what llama.cpp's pre-tokenizers (and the Hugging Face originals) give.
TEST(PreSplit, Qwen2DigitsOneByOne) {
    EXPECT_EQ(split(pre_kind::qwen2, "abc 12345 def"), (Pieces{"abc", " ", "1", "2", "3", "4", "5", " def"}));
    EXPECT_EQ(split(pre_kind::qwen2, "x=3.14"), (Pieces{"x", "=", "3", ".", "1", "4"}));
}

TEST(PreSplit, Qwen2Contractions) {
    EXPECT_EQ(split(pre_kind::qwen2, "I'm don't YOU'RE we'll"),
              (Pieces{"I", "'m", " don", "'t", " YOU", "'RE", " we", "'ll"}));
    // Only the listed suffixes: "'x" is punctuation followed by a word.
    EXPECT_EQ(split(pre_kind::qwen2, "o'xford"), (Pieces{"o", "'xford"}));
}

TEST(PreSplit, Qwen2PunctuationNewlinesAndSpaces) {
    EXPECT_EQ(split(pre_kind::qwen2, "Hello, world!!\n\nNew"), (Pieces{"Hello", ",", " world", "!!\n\n", "New"}));
    EXPECT_EQ(split(pre_kind::qwen2, "a   b"), (Pieces{"a", "  ", " b"}));
    EXPECT_EQ(split(pre_kind::qwen2, "end  \n\n  x"), (Pieces{"end", "  \n\n", " ", " x"}));
    EXPECT_EQ(split(pre_kind::qwen2, "trailing   "), (Pieces{"trailing", "   "}));
    EXPECT_EQ(split(pre_kind::qwen2, "(hi)"), (Pieces{"(hi", ")"}));
}

TEST(PreSplit, Qwen2UnicodeLettersAndEmoji) {
    // "héllo мир 你好 👋": letters of any script are \p{L}; the emoji is neither letter nor number.
    EXPECT_EQ(split(pre_kind::qwen2, "h\xC3\xA9llo \xD0\xBC\xD0\xB8\xD1\x80 \xE4\xBD\xA0\xE5\xA5\xBD \xF0\x9F\x91\x8B"),
              (Pieces{"h\xC3\xA9llo", " \xD0\xBC\xD0\xB8\xD1\x80", " \xE4\xBD\xA0\xE5\xA5\xBD", " \xF0\x9F\x91\x8B"}));
    // Non-ASCII digits are \p{N} too (Arabic-Indic ٣٤).
    EXPECT_EQ(split(pre_kind::qwen2, "\xD9\xA3\xD9\xA4"), (Pieces{"\xD9\xA3", "\xD9\xA4"}));
}

TEST(PreSplit, Llama3GroupsDigitsInThrees) {
    EXPECT_EQ(split(pre_kind::llama3, "12345 abc"), (Pieces{"123", "45", " abc"}));
    EXPECT_EQ(split(pre_kind::llama3, "I'm 1000000"), (Pieces{"I", "'m", " ", "100", "000", "0"}));
}

TEST(PreSplit, Gpt2Pattern) {
    EXPECT_EQ(split(pre_kind::gpt2, "12345 abc"), (Pieces{"12345", " abc"}));
    EXPECT_EQ(split(pre_kind::gpt2, "I'm DON'T"), (Pieces{"I", "'m", " DON", "'", "T"}));  // lower case only
    // \s+(?!\S) leaves the last whitespace character to the next match, which the fallback \s+ takes.
    EXPECT_EQ(split(pre_kind::gpt2, "Hello, world!!\n\nNew"),
              (Pieces{"Hello", ",", " world", "!!", "\n", "\n", "New"}));
    EXPECT_EQ(split(pre_kind::gpt2, "a   b"), (Pieces{"a", "  ", " b"}));
}

TEST(PreSplit, InvalidBytesBecomeTheirOwnPieces) {
    const Pieces p = split(pre_kind::qwen2, "ab\xFF\xFEgh");
    std::string joined;
    for (const auto& s : p) joined += s;
    EXPECT_EQ(joined, "ab\xFF\xFEgh");
    EXPECT_NE(std::find(p.begin(), p.end(), "ab"), p.end());
}

TEST(PreSplit, NamesMapToPatterns) {
    bool known = false;
    EXPECT_EQ(parse_pre("llama-bpe", known), pre_kind::llama3);
    EXPECT_TRUE(known);
    EXPECT_EQ(parse_pre("qwen2", known), pre_kind::qwen2);
    EXPECT_EQ(parse_pre("qwen35", known), pre_kind::qwen2);
    EXPECT_TRUE(known);
    EXPECT_EQ(parse_pre("gpt-2", known), pre_kind::gpt2);
    EXPECT_EQ(parse_pre("no-such-pre", known), pre_kind::gpt2);
    EXPECT_FALSE(known);
}

}  // namespace
}  // namespace strata::tok
