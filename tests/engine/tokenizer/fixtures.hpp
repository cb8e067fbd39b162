// Tokenizers built from generated models (strata-make-model's vocabularies), made once per process.
#pragma once

#include <string>
#include <vector>

#include "generate.hpp"
#include "gguf/gguf_reader.hpp"
#include "model_spec.hpp"
#include "tokenizer/tokenizer.hpp"

namespace strata::tok::testing {

inline gguf::reader generated_reader(make_model::tokenizer_kind kind, int n_vocab) {
    make_model::model_spec s = make_model::preset("tiny");
    s.tokenizer = kind;
    s.n_vocab = n_vocab;
    return gguf::reader::from_bytes(make_model::build_model(s).write_to_memory());
}

// The demo's vocabulary size: enough merges that common words are single tokens.
inline const tokenizer& gpt2_tokenizer() {
    static const tokenizer t = tokenizer::from_gguf(generated_reader(make_model::tokenizer_kind::gpt2, 4096));
    return t;
}

inline const tokenizer& llama_tokenizer() {
    static const tokenizer t = tokenizer::from_gguf(generated_reader(make_model::tokenizer_kind::llama, 4096));
    return t;
}

inline int32_t id_of(const tokenizer& t, const std::string& text) {
    const auto id = t.find_token(text);
    if (!id) throw std::runtime_error("test vocabulary has no token '" + text + "'");
    return *id;
}

// Texts that exercise the byte-level paths: multi-byte UTF-8, emoji with joiners and modifiers,
// newlines and tabs, digits, code, runs of spaces, contractions.
inline const std::vector<std::string>& round_trip_texts() {
    static const std::vector<std::string> texts = {
        "Hello! How are you today?",
        "The river ran quietly past the old mill.",
        "h\xC3\xA9llo w\xC3\xB6rld, na\xC3\xAFve caf\xC3\xA9",                           // héllo wörld, naïve café
        "\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E\xE3\x81\xAE\xE3\x83\x86\xE3\x82\xAD\xE3\x82\xB9\xE3\x83\x88",  // 日本語のテキスト
        "\xD0\x9F\xD1\x80\xD0\xB8\xD0\xB2\xD0\xB5\xD1\x82, \xD0\xBC\xD0\xB8\xD1\x80!",    // Привет, мир!
        "wave \xF0\x9F\x91\x8B\xF0\x9F\x8F\xBD family \xF0\x9F\x91\xA8\xE2\x80\x8D\xF0\x9F\x91\xA9\xE2\x80\x8D"
        "\xF0\x9F\x91\xA7 \xF0\x9F\x8E\x89",                                                // 👋🏽 👨‍👩‍👧 🎉
        "line one\nline two\r\n\n\ttabbed\n\n\n",
        "pi = 3.14159, e = 2.71828, 1234567890 and 007",
        "int main(int argc, char** argv) {\n    return argc > 1 ? 0 : -1;  // done\n}\n",
        "    leading, inner   spaces, and trailing   ",
        "I'm sure you'll see we've done it; they're here, isn't it? YOU'RE RIGHT.",
        "",
        " ",
        "\n",
        "a",
    };
    return texts;
}

}  // namespace strata::tok::testing
