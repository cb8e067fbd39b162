// Text <-> token ids from a GGUF file's vocabulary: GPT-2 byte-level BPE (tokenizer.ggml.model "gpt2",
// pre-split regex from tokenizer.ggml.pre) and SentencePiece-style BPE ("llama": scores, U+2581 for
// spaces, <0xXX> byte fallback), special tokens, and a streaming decoder that only ever emits whole
// UTF-8 characters.
//
// Thread-safety: a tokenizer is immutable after from_gguf; every const member may be called from
// any number of threads. A stream_decoder belongs to one generation (one thread at a time).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "gguf/gguf_reader.hpp"

namespace strata::tok {

// llama.cpp's token types (tokenizer.ggml.token_type).
enum class token_type : int32_t {
    undefined = 0, normal = 1, unknown = 2, control = 3, user_defined = 4, unused = 5, byte = 6,
};

enum class vocab_kind { bpe, spm };

// Bytes [begin, end) of a text.
struct text_span {
    size_t begin = 0;
    size_t end = 0;
};

struct encode_options {
    // Adds bos (and eos) when the model asks for it (tokenizer.ggml.add_bos_token / add_eos_token).
    bool add_special = true;
    // Recognises control tokens ("<|im_start|>", "</s>") written in the text. User-defined tokens are
    // recognised either way, as llama.cpp does. Off for untrusted text (a user typing "<|im_end|>").
    bool parse_special = false;
    // With parse_special: ranges of the text (ascending, not overlapping) where control tokens are not
    // recognised, such as the messages inside a rendered chat template. A control token is recognised
    // only when it lies wholly outside them.
    std::span<const text_span> plain = {};
};

struct decode_options {
    // Control, unknown and unused tokens render as their text instead of nothing.
    bool render_special = false;
    // SentencePiece with add_space_prefix: drop the space the encoder put in front of the text, so
    // decode(encode(s)) == s. Turn off when decoding a continuation (its leading space is real).
    bool strip_space_prefix = true;
};

struct tokenizer_options {
    // A tokenizer.ggml.pre name to use instead of the file's (llama.cpp's names; byte-level BPE only).
    std::string override_pre;
};

class tokenizer {
public:
    // Reads tokenizer.ggml.* from the file. Throws std::runtime_error naming the key and the numbers
    // for a missing or inconsistent vocabulary (lengths that disagree, merges naming absent tokens,
    // special ids beyond the vocabulary, an unsupported tokenizer model).
    // An unknown tokenizer.ggml.pre is an error naming it (tokenizer_options::override_pre picks one).
    static tokenizer from_gguf(const gguf::reader& r, const tokenizer_options& opt = {});

    tokenizer(tokenizer&&) noexcept;
    tokenizer& operator=(tokenizer&&) noexcept;
    ~tokenizer();

    std::vector<int32_t> encode(std::string_view text, encode_options opt = {}) const;
    std::string decode(std::span<const int32_t> ids, decode_options opt = {}) const;
    // The bytes one token stands for (may be part of a UTF-8 character). Throws std::out_of_range.
    std::string_view token_to_piece(int32_t id, bool render_special = false) const;

    int32_t n_vocab() const;
    vocab_kind kind() const;
    const std::string& token_text(int32_t id) const;  // as stored in the file
    token_type type(int32_t id) const;
    std::optional<int32_t> find_token(std::string_view text) const;

    int32_t bos() const;  // -1 when the model has none
    int32_t eos() const;
    bool add_bos() const;
    // End of generation: eos, eot (tokenizer.ggml.eot_token_id) and the usual end-of-turn tokens
    // (<|im_end|>, <|endoftext|>, <|eot_id|>, <|eom_id|>, </s>) that the vocabulary has.
    bool is_eog(int32_t id) const;
    const std::vector<int32_t>& eog_ids() const;

    // The BPE pre-tokenizer's pieces for a text (tests, diagnostics). Throws std::logic_error for spm.
    std::vector<std::string> pre_split(std::string_view text) const;
    std::string_view pre_name() const;    // tokenizer.ggml.pre in effect ("llama-bpe", ...); "" for spm
    std::string_view pre_family() const;  // its split patterns ("llama3", ...); "" for spm

private:
    struct impl;
    explicit tokenizer(std::unique_ptr<impl> p);
    std::unique_ptr<impl> impl_;
};

// Turns generated ids into text one token at a time without ever returning a broken UTF-8 sequence:
// bytes of a character split over several tokens are held until the token that completes them.
// Bytes that can never form a character come out as U+FFFD, so everything returned is valid UTF-8.
class stream_decoder {
public:
    explicit stream_decoder(const tokenizer& tok, bool render_special = false);

    std::string push(int32_t id);  // the text that became complete with this token (may be empty)
    std::string flush();           // what is still held, incomplete characters as U+FFFD; resets
    size_t pending_bytes() const { return pending_.size(); }

private:
    std::string take_complete();

    const tokenizer* tok_;
    bool render_special_;
    std::string pending_;
};

}  // namespace strata::tok
