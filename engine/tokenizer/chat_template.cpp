#include "tokenizer/chat_template.hpp"

#include <fstream>
#include <sstream>
#include <stdexcept>

#include <nlohmann/json.hpp>
#include <spdlog/fmt/fmt.h>
#include <spdlog/spdlog.h>

#include "template/jinja.hpp"

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

// Appends markup and content to a rendered_chat, recording where content lies.
struct chat_writer {
    rendered_chat out;
    void markup(std::string_view s) { out.text += s; }
    void content(std::string_view s) {
        if (s.empty()) return;
        out.content.push_back({out.text.size(), out.text.size() + s.size()});
        out.text += s;
    }
};

rendered_chat render_chatml(std::span<const chat_message> msgs, bool add_generation_prompt) {
    chat_writer w;
    for (const chat_message& m : msgs) {
        w.markup("<|im_start|>" + m.role + "\n");
        w.content(m.content);
        w.markup("<|im_end|>\n");
    }
    if (add_generation_prompt) w.markup("<|im_start|>assistant\n");
    return std::move(w.out);
}

rendered_chat render_llama3(std::span<const chat_message> msgs, bool add_generation_prompt) {
    chat_writer w;
    for (const chat_message& m : msgs) {
        w.markup("<|start_header_id|>" + m.role + "<|end_header_id|>\n\n");
        w.content(trim(m.content));
        w.markup("<|eot_id|>");
    }
    if (add_generation_prompt) w.markup("<|start_header_id|>assistant<|end_header_id|>\n\n");
    return std::move(w.out);
}

// Mixtral-Instruct's template has no system role; like llama.cpp we put system text in front of the
// first user turn, separated by a blank line.
rendered_chat render_mistral(std::span<const chat_message> msgs) {
    std::vector<std::string_view> system;
    for (const chat_message& m : msgs)
        if (m.role == "system") system.push_back(m.content);
    const auto write_system = [&](chat_writer& w) {
        for (size_t i = 0; i < system.size(); ++i) {
            if (i > 0) w.markup("\n\n");
            w.content(system[i]);
        }
    };
    chat_writer w;
    bool system_used = false;
    for (const chat_message& m : msgs) {
        if (m.role == "user") {
            w.markup("[INST] ");
            if (!system.empty() && !system_used) {
                write_system(w);
                w.markup("\n\n");
            }
            system_used = true;
            w.content(m.content);
            w.markup(" [/INST]");
        } else if (m.role == "assistant") {
            w.content(m.content);
            w.markup("</s>");
        }
    }
    if (!system.empty() && !system_used) {  // a system prompt alone
        w.markup("[INST] ");
        write_system(w);
        w.markup(" [/INST]");
    }
    return std::move(w.out);
}

// transformers' continue_final_message: the text ends where the last message's content does, so
// generation continues it instead of starting a new turn.
void cut_after_final_message(std::string& text, const nlohmann::ordered_json& last) {
    if (!last.contains("content") || !last["content"].is_string()) return;
    const std::string content = last["content"].get<std::string>();
    for (std::string_view c : {std::string_view(content), trim(content)}) {
        if (c.empty()) continue;
        const std::size_t at = text.rfind(c);
        if (at != std::string::npos) {
            text.resize(at + c.size());
            return;
        }
    }
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

chat_template chat_template::from_jinja(std::string_view source, std::string_view origin) {
    chat_template t(chat_format::chatml);
    try {
        t.jinja_ = std::make_shared<const jinja::template_program>(source);
    } catch (const jinja::template_error& e) {
        throw std::runtime_error(fmt::format("{}: {}", origin, e.what()));
    }
    return t;
}

chat_template chat_template::from_model(std::string_view model_template, std::string_view override_name) {
    if (!override_name.empty()) {
        for (chat_format f : {chat_format::chatml, chat_format::mistral, chat_format::llama3})
            if (chat_format_name(f) == override_name) return chat_template(f);
        std::ifstream in{std::string(override_name), std::ios::binary};
        if (!in)
            throw std::invalid_argument(fmt::format("chat template '{}' is neither a template name ({}) nor a readable "
                                                    "Jinja template file", override_name, kFormatNames));
        std::stringstream ss;
        ss << in.rdbuf();
        try {
            return from_jinja(ss.str(), override_name);
        } catch (const std::runtime_error& e) {
            throw std::invalid_argument(e.what());
        }
    }
    if (model_template.empty())
        throw std::runtime_error(fmt::format("the model has no chat template (tokenizer.chat_template); name one of "
                                             "{} or a Jinja template file to use",
                                             kFormatNames));
    std::string jinja_error;
    try {
        return from_jinja(model_template, "the model's chat template");
    } catch (const std::runtime_error& e) {
        jinja_error = e.what();
    }
    if (const auto f = detect_chat_format(model_template)) {
        spdlog::warn("{}; rendering the {} format instead.", jinja_error, chat_format_name(*f));
        return chat_template(*f);
    }
    throw std::runtime_error(fmt::format("{} ({} characters); name one of {} or a Jinja template file to use instead",
                                         jinja_error, model_template.size(), kFormatNames));
}

void chat_template::set_special_tokens(std::string bos, std::string eos) {
    bos_ = std::move(bos);
    eos_ = std::move(eos);
}

rendered_chat chat_template::render_context(const nlohmann::ordered_json& context) const {
    const nlohmann::ordered_json& msgs = context.at("messages");
    if (!jinja_) {
        std::vector<chat_message> converted;
        for (const auto& m : msgs)
            converted.push_back({m.value("role", ""), m.contains("content") && m["content"].is_string()
                                                          ? m["content"].get<std::string>() : std::string()});
        return render(converted, context.value("add_generation_prompt", true));
    }
    nlohmann::ordered_json ctx = context;
    const bool continue_final = ctx.value("continue_final_message", false);
    ctx.erase("continue_final_message");
    ctx["bos_token"] = bos_;
    ctx["eos_token"] = eos_;
    if (!ctx.contains("tools")) ctx["tools"] = nullptr;
    rendered_chat out;
    try {
        out.text = jinja_->render(ctx);
    } catch (const jinja::template_error& e) {
        throw std::invalid_argument(fmt::format("chat template: {}", e.what()));
    }
    if (!bos_.empty() && out.text.starts_with(bos_)) out.text.erase(0, bos_.size());
    if (continue_final && !msgs.empty()) cut_after_final_message(out.text, msgs.back());
    // Message content, found in order in the text, is what a control token written by the user may
    // not become.
    std::size_t from = 0;
    for (const auto& m : msgs) {
        if (!m.contains("content") || !m["content"].is_string()) continue;
        const std::string& c = m["content"].get_ref<const std::string&>();
        if (c.empty()) continue;
        std::size_t at = out.text.find(c, from);
        if (at == std::string::npos) continue;
        out.content.push_back({at, at + c.size()});
        from = at + c.size();
    }
    return out;
}

std::string chat_template::apply(std::span<const chat_message> messages, bool add_generation_prompt) const {
    return render(messages, add_generation_prompt).text;
}

rendered_chat chat_template::render(std::span<const chat_message> messages, bool add_generation_prompt) const {
    if (jinja_) {
        nlohmann::ordered_json ctx = {{"messages", nlohmann::ordered_json::array()},
                                      {"add_generation_prompt", add_generation_prompt}};
        for (const chat_message& m : messages) ctx["messages"].push_back({{"role", m.role}, {"content", m.content}});
        return render_context(ctx);
    }
    for (size_t i = 0; i < messages.size(); ++i) check_role(format_, messages[i], i);
    switch (format_) {
        case chat_format::chatml: return render_chatml(messages, add_generation_prompt);
        case chat_format::mistral: return render_mistral(messages);
        case chat_format::llama3: return render_llama3(messages, add_generation_prompt);
    }
    return {};
}

}  // namespace strata::tok
