// The pre-tokenizer families beyond gpt2/llama3/qwen2 (test_bpe.cpp): multi-pass splits cut where
// llama.cpp's unicode_regex_split cuts, including its quirks, and every family survives any input.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tokenizer/pre_split.hpp"

namespace strata::tok {
namespace {

using Pieces = std::vector<std::string>;

Pieces split(std::string_view family, std::string_view text) {
    const pre_splitter s(family);
    Pieces out;
    for (std::string_view p : s.split(text)) out.emplace_back(p);
    return out;
}

// Every family llama.cpp's names lead to.
std::vector<std::string> all_families() {
    std::vector<std::string> out;
    std::string names = known_pre_tokenizer_names();
    for (size_t pos = 0; pos <= names.size();) {
        const size_t comma = std::min(names.find(", ", pos), names.size());
        const std::string family(find_pre_tokenizer(names.substr(pos, comma - pos))->family);
        if (std::find(out.begin(), out.end(), family) == out.end()) out.push_back(family);
        pos = comma + 2;
    }
    return out;
}

TEST(PreFamilies, EveryFamilyKeepsEveryByte) {
    const std::vector<std::string> families = all_families();
    EXPECT_EQ(families.size(), 29u);
    const std::vector<std::string> texts = {
        "Hello, WORLD! I'm here; they'RE 1234567 times.\n\n\tTabs  and   spaces   ",
        "h\xC3\xA9llo \xD0\xBC\xD0\xB8\xD1\x80 \xE4\xBD\xA0\xE5\xA5\xBD\xE4\xB8\x96\xE7\x95\x8C \xF0\x9F\x91\x8B "
        "\xED\x95\x9C\xEA\xB5\xAD\xEC\x96\xB4 \xE3\x81\x8B\xE3\x81\xAA \xD9\xA3\xD9\xA4",  // é мир 你好世界 👋 한국어 かな ٣٤
        "ok \xFF\xFE then \xC3 and \xE2\x82 end \x80",                                        // not UTF-8
        "<sentinel:12> IMGIMGABZ ~~ $+<=>^`| \xE3\x80\x80\xC2\x85\xC2\xA0x",
        "",
    };
    for (const std::string& f : families)
        for (const std::string& text : texts) {
            std::string joined;
            for (const std::string& p : split(f, text)) {
                EXPECT_FALSE(p.empty()) << f;
                joined += p;
            }
            EXPECT_EQ(joined, text) << f;
        }
}

TEST(PreFamilies, LongRunsDoNotExhaustTheMatcher) {
    // Patterns whose repeats backtrack (tekken's upper*lower+) over 100k letters need the JIT stack.
    std::string text(100000, 'a');
    text += std::string(100000, 'B');
    text += std::string(30000, '7');
    text += std::string(50000, ' ');
    for (int i = 0; i < 20000; ++i) text += "\xE4\xBD\xA0";  // 你
    for (const std::string& f : all_families()) {
        size_t total = 0;
        for (std::string_view p : pre_splitter(f).split(text)) total += p.size();
        EXPECT_EQ(total, text.size()) << f;
    }
}

TEST(PreFamilies, DefaultAndFalconIsolatePunctuationAndCutDigitsInThrees) {
    EXPECT_EQ(split("default", "1234567 abc, d!"), (Pieces{"123", "456", "7", " abc", ",", " d", "!"}));
    EXPECT_EQ(split("falcon", "hello, 12345"), (Pieces{"hello", ",", " ", "123", "45"}));
}

TEST(PreFamilies, StarcoderAndDeepseekCoderSplitDigitsOneByOne) {
    EXPECT_EQ(split("starcoder", "abc123"), (Pieces{"abc", "1", "2", "3"}));
    EXPECT_EQ(split("deepseek-coder", "Hello\n\nworld 123"),
              (Pieces{"Hello", "\n", "\n", "world", " ", "1", "2", "3"}));
}

TEST(PreFamilies, DeepseekLlmLettersPunctuationCjkAndNumbers) {
    // "Hello 世界 123 ！": the full-width "！" takes the space before it, CJK and numbers stand alone.
    EXPECT_EQ(split("deepseek-llm", "Hello \xE4\xB8\x96\xE7\x95\x8C 123 \xEF\xBC\x81"),
              (Pieces{"Hello", " ", "\xE4\xB8\x96\xE7\x95\x8C", " ", "123", " \xEF\xBC\x81"}));
}

TEST(PreFamilies, Deepseek3TildeIsNoSymbol) {
    // llama.cpp's collapsed \p{S} leaves ASCII '~' out: a run of them matches nothing and stays alone.
    EXPECT_EQ(split("deepseek-v3", "x ~~"), (Pieces{"x", " ", "~~"}));
    EXPECT_EQ(split("deepseek-v3", "x !!"), (Pieces{"x", " !!"}));
    EXPECT_EQ(split("deepseek-v3", "~\xC3\xA9t\xC3\xA9"), (Pieces{"~\xC3\xA9t\xC3\xA9"}));  // ~été
}

TEST(PreFamilies, TekkenAndGpt4oCaseRuns) {
    EXPECT_EQ(split("tekken", "HelloWORLD abc"), (Pieces{"Hello", "WORLD", " abc"}));
    EXPECT_EQ(split("gpt-4o", "I'm HAPPY'S 1234567"), (Pieces{"I'm", " HAPPY'S", " ", "123", "456", "7"}));
}

TEST(PreFamilies, KimiK2KeepsHanApart) {
    EXPECT_EQ(split("kimi-k2", "\xE4\xBD\xA0\xE5\xA5\xBDworld \xE4\xBD\xA0"),
              (Pieces{"\xE4\xBD\xA0\xE5\xA5\xBD", "world", " ", "\xE4\xBD\xA0"}));
}

TEST(PreFamilies, DigitGroupsFromTheRight) {
    EXPECT_EQ(split("superbpe", "1234567"), (Pieces{"1", "234", "567"}));
    EXPECT_EQ(split("tiny_aya", "x 1234567"), (Pieces{"x", " ", "1", "234", "567"}));
    EXPECT_EQ(split("afmoe", "abc1234 x"), (Pieces{"abc", "1", "234", " x"}));
    // The text before a run joins its first group in llama.cpp's AFMoE split; '~' and the digits then
    // match nothing in the last pass and stay one piece.
    EXPECT_EQ(split("afmoe", "~12"), (Pieces{"~12"}));
}

TEST(PreFamilies, BloomCutsAtPunctuationAndSpaces) {
    EXPECT_EQ(split("bloom", "Hello, world. Foo"), (Pieces{"Hello", ",", " world", ".", " Foo"}));
}

TEST(PreFamilies, NextLineIsWhitespace) {
    // U+0085 is whitespace to llama.cpp (PCRE2's \s leaves it out).
    EXPECT_EQ(split("gpt2", "a\xC2\x85\xC2\x85" "b"), (Pieces{"a", "\xC2\x85", "\xC2\x85", "b"}));
}

}  // namespace
}  // namespace strata::tok
