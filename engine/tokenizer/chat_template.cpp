#include "tokenizer/chat_template.hpp"

#include <stdexcept>

#include <spdlog/fmt/fmt.h>

namespace strata::tok {

namespace {

constexpr std::string_view kFormatNames = "chatml, mistral, llama3";

void check_role(chat_format f, const chat_message& m, size_t index) {
    if (m.role == "system" || m.role == "user" || m.role == "assistant") return;
    throw std::invalid_argument(fmt::format("chat template {}: message {} has role '{}', which it cannot render "
                                            "(valid roles: system, user, assistant)",
                                            chat_format_name(f), index, m.role));
}

std::string_view trim(std::string_view s) {
    constexpr std::string_view kSpace = " \t\n\r\f\v";
    const size_t b = s.find_first_not_of(kSpace);
    if (b == std::string_view::npos) return {};
    return s.substr(b, s.find_last_not_of(kSpace) - b + 1);
}

std::string render_chatml(std::span<const chat_message> msgs, bool add_generation_prompt) {
    std::string out;
    for (const chat_message& m : msgs) out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
    if (add_generation_prompt) out += "<|im_start|>assistant\n";
    return out;
}

std::string render_llama3(std::span<const chat_message> msgs, bool add_generation_prompt) {
    std::string out;
    for (const chat_message& m : msgs) {
        out += "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n";
        out += trim(m.content);
        out += "<|eot_id|>";
    }
    if (add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
    return out;
}

// Mixtral-Instruct's template has no system role; like llama.cpp we put system text in front of the
// first user turn, separated by a blank line.
std::string render_mistral(std::span<const chat_message> msgs) {
    std::string system, out;
    bool system_used = false;
    for (const chat_message& m : msgs) {
        if (m.role == "system") {
            if (!system.empty()) system += "\n\n";
            system += m.content;
        }
    }
    for (const chat_message& m : msgs) {
        if (m.role == "user") {
            out += "[INST] ";
            if (!system.empty() && !system_used) out += system + "\n\n";
            system_used = true;
            out += m.content + " [/INST]";
        } else if (m.role == "assistant") {
            out += m.content + "</s>";
        }
    }
    if (!system.empty() && !system_used) out += "[INST] " + system + " [/INST]";  // a system prompt alone
    return out;
}

}  // namespace

std::string_view chat_format_name(chat_format f) {
    switch (f) {
        case chat_format::chatml: return "chatml";
        case chat_format::mistral: return "mistral";
        case chat_format::llama3: return "llama3";
    }
    return "?";
}

chat_format parse_chat_format(std::string_view name) {
    for (chat_format f : {chat_format::chatml, chat_format::mistral, chat_format::llama3})
        if (chat_format_name(f) == name) return f;
    throw std::invalid_argument(fmt::format("unknown chat template '{}' (valid: {})", name, kFormatNames));
}

std::optional<chat_format> detect_chat_format(std::string_view t) {
    const auto has = [&](std::string_view marker) { return t.find(marker) != std::string_view::npos; };
    if (has("<|im_start|>")) return chat_format::chatml;
    if (has("<|start_header_id|>") && has("<|end_header_id|>")) return chat_format::llama3;
    if (has("[INST]")) return chat_format::mistral;
    return std::nullopt;
}

chat_template chat_template::from_model(std::string_view model_template, std::string_view override_name) {
    if (!override_name.empty()) return chat_template(parse_chat_format(override_name));
    if (model_template.empty())
        throw std::runtime_error(fmt::format("the model has no chat template (tokenizer.chat_template); name one of "
                                             "{} to use",
                                             kFormatNames));
    if (const auto f = detect_chat_format(model_template)) return chat_template(*f);
    throw std::runtime_error(fmt::format("the model's chat template ({} characters, starting '{}') is none strata "
                                         "recognises; name one of {} to use instead",
                                         model_template.size(), model_template.substr(0, 40), kFormatNames));
}

std::string chat_template::apply(std::span<const chat_message> messages, bool add_generation_prompt) const {
    for (size_t i = 0; i < messages.size(); ++i) check_role(format_, messages[i], i);
    switch (format_) {
        case chat_format::chatml: return render_chatml(messages, add_generation_prompt);
        case chat_format::mistral: return render_mistral(messages);
        case chat_format::llama3: return render_llama3(messages, add_generation_prompt);
    }
    return {};
}

}  // namespace strata::tok
