// Hand-made vocabularies: every inconsistency is an error naming the key and the numbers; special
// token matching rules; fallbacks.
#include <gtest/gtest.h>

#include <functional>

#include "gguf/gguf_writer.hpp"
#include "tokenizer/tokenizer.hpp"
#include "tokenizer/unicode.hpp"

namespace strata::tok {
namespace {

using gguf::value;

// A small byte-level BPE vocabulary: the 256 byte symbols, "ab", "abc", two specials.
struct mini_vocab {
    std::vector<std::string> tokens;
    std::vector<int32_t> types;
    std::vector<std::string> merges = {"a b", "ab c"};

    mini_vocab() {
        const byte_unicode_map bytes;
        for (int b = 0; b < 256; ++b) tokens.push_back(bytes.encode(static_cast<uint8_t>(b)));
        types.assign(256, 1);
        add("ab", 1);
        add("abc", 1);
        add("<x>", 4);      // user-defined
        add("<x><y>", 3);   // control, and longer
        add("<|eot|>", 3);  // control
    }
    void add(const std::string& t, int32_t type) {
        tokens.push_back(t);
        types.push_back(type);
    }
    int32_t id(const std::string& t) const {
        return static_cast<int32_t>(std::find(tokens.begin(), tokens.end(), t) - tokens.begin());
    }
    gguf::writer writer(bool with_merges = true) const {
        gguf::writer w;
        w.set("general.architecture", value::str("qwen3moe"));
        w.set("tokenizer.ggml.model", value::str("gpt2"));
        w.set("tokenizer.ggml.pre", value::str("qwen2"));
        w.set("tokenizer.ggml.tokens", value::str_array(tokens));
        w.set("tokenizer.ggml.token_type", value::i32_array(types));
        if (with_merges) w.set("tokenizer.ggml.merges", value::str_array(merges));
        w.set("tokenizer.ggml.eos_token_id", value::u32(static_cast<uint32_t>(id("<|eot|>"))));
        return w;
    }
};

tokenizer load(const gguf::writer& w) { return tokenizer::from_gguf(gguf::reader::from_bytes(w.write_to_memory())); }

// Loads and expects a std::runtime_error whose message contains every fragment.
void expect_error(const gguf::writer& w, std::vector<std::string> fragments) {
    try {
        load(w);
        ADD_FAILURE() << "no error; expected one mentioning " << fragments.front();
    } catch (const std::runtime_error& e) {
        const std::string msg = e.what();
        for (const std::string& f : fragments) EXPECT_NE(msg.find(f), std::string::npos) << msg << "\nlacks: " << f;
    }
}

TEST(VocabErrors, MiniVocabularyLoads) {
    const mini_vocab v;
    const tokenizer t = load(v.writer());
    EXPECT_EQ(t.encode("abc"), std::vector<int32_t>{v.id("abc")});
    EXPECT_EQ(t.decode(t.encode("abcab zz")), "abcab zz");
}

TEST(VocabErrors, MissingOrUnsupportedModel) {
    gguf::writer w;
    w.set("general.architecture", value::str("qwen3moe"));
    expect_error(w, {"tokenizer.ggml.model"});
    w.set("tokenizer.ggml.model", value::str("bert"));
    expect_error(w, {"'bert'", "gpt2, llama"});
    w.set("tokenizer.ggml.model", value::str("gpt2"));
    expect_error(w, {"tokenizer.ggml.tokens"});
}

TEST(VocabErrors, TokenTypeLengthMismatch) {
    mini_vocab v;
    v.types.pop_back();
    expect_error(v.writer(), {"tokenizer.ggml.token_type", std::to_string(v.types.size()),
                              std::to_string(v.tokens.size())});
}

TEST(VocabErrors, TokenTypeOutOfRange) {
    mini_vocab v;
    v.types[260] = 9;
    expect_error(v.writer(), {"tokenizer.ggml.token_type[260]", "9"});
}

TEST(VocabErrors, ScoresLengthMismatch) {
    const mini_vocab v;
    gguf::writer w = v.writer();
    w.set("tokenizer.ggml.scores", value::f32_array(std::vector<float>(10, 0.0f)));
    expect_error(w, {"tokenizer.ggml.scores", "10", std::to_string(v.tokens.size())});
}

TEST(VocabErrors, MergeNamingAnAbsentToken) {
    mini_vocab v;
    v.merges.push_back("ab zq");
    expect_error(v.writer(), {"tokenizer.ggml.merges[2]", "'zq'", std::to_string(v.tokens.size())});
    v.merges.back() = "abc";
    expect_error(v.writer(), {"tokenizer.ggml.merges[2]", "not two tokens"});
}

TEST(VocabErrors, MissingMerges) {
    mini_vocab v;
    expect_error(v.writer(false), {"tokenizer.ggml.merges"});
    gguf::writer w = v.writer(false);
    w.set("tokenizer.ggml.pre", value::str("kimi-k2"));  // llama.cpp lets kimi-k2 files go without merges
    EXPECT_EQ(load(w).encode("ab").size(), 2u);
}

TEST(VocabErrors, UnknownPreTokenizerNamesIt) {
    gguf::writer w = mini_vocab().writer();
    w.set("tokenizer.ggml.pre", value::str("martian"));
    expect_error(w, {"tokenizer.ggml.pre", "'martian'", "--override-pre", "deepseek-llm"});
    w.set("tokenizer.ggml.pre", value::str("gemma4"));
    expect_error(w, {"'gemma4'", "does not run"});
    // The override replaces the file's name, and is checked the same way.
    const tokenizer t = tokenizer::from_gguf(gguf::reader::from_bytes(mini_vocab().writer().write_to_memory()),
                                             {.override_pre = "deepseek-coder"});
    EXPECT_EQ(t.pre_name(), "deepseek-coder");
    EXPECT_EQ(t.pre_family(), "deepseek-coder");
    try {
        tokenizer::from_gguf(gguf::reader::from_bytes(mini_vocab().writer().write_to_memory()),
                             {.override_pre = "venusian"});
        ADD_FAILURE() << "no error for --override-pre venusian";
    } catch (const std::runtime_error& e) {
        EXPECT_NE(std::string(e.what()).find("--override-pre 'venusian'"), std::string::npos) << e.what();
    }
}

TEST(Fallbacks, MissingByteSymbolsDropThoseBytes) {
    // Real vocabularies (falcon, starcoder, ...) lack some byte symbols; llama.cpp loads them and drops
    // bytes it cannot spell.
    mini_vocab v;
    const byte_unicode_map bytes;
    v.tokens[0x03] = "<unused-3>";   // byte 0x03's symbol replaced
    v.tokens[0xFF] = "<unused-ff>";  // and 0xFF's, a byte UTF-8 never uses
    const tokenizer t = load(v.writer());
    EXPECT_EQ(t.encode("a\x03" "b"), (std::vector<int32_t>{v.id("a"), v.id("b")}));
    // Bytes that are not UTF-8 become U+FFFD (EF BF BD) first, as llama.cpp reads all text.
    EXPECT_EQ(t.encode("\xFF"), (std::vector<int32_t>{v.id(bytes.encode(0xEF)), v.id(bytes.encode(0xBF)),
                                                       v.id(bytes.encode(0xBD))}));
}

TEST(VocabErrors, SpecialIdBeyondTheVocabulary) {
    const mini_vocab v;
    gguf::writer w = v.writer();
    w.set("tokenizer.ggml.bos_token_id", value::u32(9999));
    expect_error(w, {"tokenizer.ggml.bos_token_id", "9999", std::to_string(v.tokens.size())});
    w = v.writer();
    w.set("tokenizer.ggml.add_bos_token", value::boolean(true));
    expect_error(w, {"add_bos_token", "bos_token_id"});
}

TEST(VocabErrors, WrongValueTypeNamesTheKey) {
    gguf::writer w = mini_vocab().writer();
    w.set("tokenizer.ggml.tokens", value::u32(5));
    expect_error(w, {"tokenizer.ggml.tokens"});
}

TEST(SpecialTokens, LongestMatchFirstAndUserDefinedAlways) {
    const mini_vocab v;
    const tokenizer t = load(v.writer());
    // parse_special: the control token "<x><y>" is longer than the user-defined "<x>" and wins.
    EXPECT_EQ(t.encode("<x><y>", {.parse_special = true}), std::vector<int32_t>{v.id("<x><y>")});
    // Without it, control tokens are text but user-defined ones are still recognised (llama.cpp).
    const auto ids = t.encode("<x><y>");
    ASSERT_GT(ids.size(), 1u);
    EXPECT_EQ(ids[0], v.id("<x>"));
    EXPECT_EQ(t.decode(ids), "<x><y>");
}

TEST(SpecialTokens, EndOfGenerationIncludesEot) {
    mini_vocab v;
    v.add("<|im_end|>", 3);
    gguf::writer w = v.writer();
    w.set("tokenizer.ggml.eot_token_id", value::u32(static_cast<uint32_t>(v.id("<x><y>"))));
    const tokenizer t = load(w);
    EXPECT_EQ(t.eog_ids(), (std::vector<int32_t>{v.id("<x><y>"), v.id("<|eot|>"), v.id("<|im_end|>")}));
}

TEST(Fallbacks, Llama3PreTokenizerTakesWholeWordsAndAddsBos) {
    mini_vocab v;
    v.add("xyz", 1);  // a token no merge builds: taken whole because llama3 ignores merges for known words
    gguf::writer w = v.writer();
    w.set("tokenizer.ggml.pre", value::str("llama-bpe"));
    w.set("tokenizer.ggml.bos_token_id", value::u32(static_cast<uint32_t>(v.id("<x>"))));
    const tokenizer t = load(w);
    EXPECT_EQ(t.pre_name(), "llama-bpe");
    EXPECT_EQ(t.pre_family(), "llama3");
    EXPECT_TRUE(t.add_bos());  // llama.cpp's default for llama3 vocabularies
    EXPECT_EQ(t.encode("xyz"), (std::vector<int32_t>{v.id("<x>"), v.id("xyz")}));
    EXPECT_EQ(t.pre_split("12345"), (std::vector<std::string>{"123", "45"}));
}

TEST(Fallbacks, MergeResultMissingFromTheVocabularySpellsBytes) {
    mini_vocab v;
    v.merges = {"b c"};  // "bc" is not a token
    const tokenizer t = load(v.writer());
    const auto ids = t.encode("bc");
    EXPECT_EQ(ids, (std::vector<int32_t>{v.id("b"), v.id("c")}));
}

}  // namespace
}  // namespace strata::tok
