// Chat prompts for the template families strata supports: ChatML (Qwen), Mistral [INST] (Mixtral)
// and Llama 3. The family is recognised from markers in the model's Jinja tokenizer.chat_template
// (strata has no Jinja engine) or named by an override.
//
// The rendered text carries the format's control tokens as text ("<|im_start|>", "</s>") and no bos:
// encode it with encode_options{.add_special = true, .parse_special = true}, which adds the bos the
// model asks for and maps those markers to their ids, and with .plain = the rendered content spans, so
// a control token written inside a message stays text. Stateless; thread-safe.
#pragma once

#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/tokenizer.hpp"

namespace strata::tok {

enum class chat_format { chatml, mistral, llama3 };

struct chat_message {
    std::string role;  // "system", "user" or "assistant"
    std::string content;
};

// A rendered conversation: the text, and the byte ranges of it that came from message content (the
// rest is the template's own markup).
struct rendered_chat {
    std::string text;
    std::vector<text_span> content;  // ascending, not overlapping
};

std::string_view chat_format_name(chat_format f);
// "chatml" | "mistral" | "llama3"; throws std::invalid_argument listing them.
chat_format parse_chat_format(std::string_view name);
// The family whose markers the template contains; nullopt when none does.
std::optional<chat_format> detect_chat_format(std::string_view model_template);

class chat_template {
public:
    explicit chat_template(chat_format f) : format_(f) {}

    // override_name (when not empty) wins over the model's template. Throws std::runtime_error listing
    // the supported names when the template is absent or unrecognised and there is no override.
    static chat_template from_model(std::string_view model_template, std::string_view override_name = {});

    chat_format format() const { return format_; }
    std::string_view name() const { return chat_format_name(format_); }

    // Renders the conversation; add_generation_prompt opens the assistant's turn. Throws
    // std::invalid_argument naming an unknown role and its message index.
    //   chatml:  <|im_start|>{role}\n{content}<|im_end|>\n ...  [+ <|im_start|>assistant\n]
    //   mistral: [INST] {system}\n\n{user} [/INST]{assistant}</s>[INST] {user} [/INST]
    //            (system messages go in front of the first user turn; the prompt ends at [/INST])
    //   llama3:  <|start_header_id|>{role}<|end_header_id|>\n\n{content, trimmed}<|eot_id|> ...
    //            [+ <|start_header_id|>assistant<|end_header_id|>\n\n]
    std::string apply(std::span<const chat_message> messages, bool add_generation_prompt = true) const;
    // The same text with the spans of message content marked.
    rendered_chat render(std::span<const chat_message> messages, bool add_generation_prompt = true) const;

private:
    chat_format format_;
};

}  // namespace strata::tok
