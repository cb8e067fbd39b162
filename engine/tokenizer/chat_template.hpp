// Chat prompts: the model's own Jinja tokenizer.chat_template rendered as transformers renders it
// (engine/template), or a template file named by --chat-template; for files whose template does not
// parse, or when named, one of the built-in families ChatML (Qwen), Mistral [INST] (Mixtral) and
// Llama 3.
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

#include <memory>

#include <nlohmann/json_fwd.hpp>

#include "tokenizer/tokenizer.hpp"

namespace strata::jinja {
class template_program;
}

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
    // A Jinja template; throws std::runtime_error "ORIGIN: line N: ..." when it does not parse.
    static chat_template from_jinja(std::string_view source, std::string_view origin);

    // override_name (when not empty) wins over the model's template: a family name, or the path of a
    // Jinja template file (std::invalid_argument when it is neither). Without one, the model's
    // template is parsed as Jinja; when that fails its family is recognised from markers. Throws
    // std::runtime_error listing the supported names when the template is absent or unusable.
    static chat_template from_model(std::string_view model_template, std::string_view override_name = {});

    bool is_jinja() const { return jinja_ != nullptr; }
    chat_format format() const { return format_; }
    // "jinja" or the family's name.
    std::string_view name() const { return is_jinja() ? std::string_view("jinja") : chat_format_name(format_); }
    // The texts {{ bos_token }} and {{ eos_token }} render as. A leading bos in the rendered text is
    // dropped (the tokenizer adds the bos the model asks for).
    void set_special_tokens(std::string bos, std::string eos);

    // Renders a Jinja template over the context (messages, tools, add_generation_prompt, keyword
    // arguments; bos_token and eos_token are added). Legacy families render context["messages"]'s
    // role and string content. Throws std::invalid_argument "chat template: line N: ..." when the
    // template fails (its own raise_exception included).
    // Objects keep their keys in the order the client wrote them, as in Python.
    rendered_chat render_context(const nlohmann::ordered_json& context) const;

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
    chat_format format_ = chat_format::chatml;
    std::shared_ptr<const jinja::template_program> jinja_;
    std::string bos_, eos_;
};

}  // namespace strata::tok
