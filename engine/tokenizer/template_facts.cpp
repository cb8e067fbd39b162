#include "tokenizer/template_facts.hpp"

#include <array>
#include <cctype>
#include <utility>

#include "tokenizer/chat_template.hpp"

namespace strata::tok {
namespace {

bool has(std::string_view s, std::string_view what) { return s.find(what) != std::string_view::npos; }

// `what` starting a word: "thinking is defined" is not found inside "enable_thinking is defined".
bool has_word(std::string_view s, std::string_view what) {
    for (size_t at = s.find(what); at != std::string_view::npos; at = s.find(what, at + 1)) {
        const char c = at ? s[at - 1] : ' ';
        if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_') return true;
    }
    return false;
}

struct syntax {
    std::string_view marker, name;
    bool parsed;  // server/chat_output parses it
};
// Most specific first: Qwen3.5's XML calls sit inside <tool_call>, GLM's pairs too.
constexpr std::array<syntax, 8> syntaxes{{
    {"<|tool_calls_section_begin|>", "kimi-k2", true},
    {"<｜tool▁calls▁begin｜>", "deepseek-v3.1", true},
    {"<arg_key>", "glm-4.5", true},
    {"<function=", "qwen3-xml", true},
    {"<tool_call>", "hermes/qwen3-json", true},
    {"<|python_tag|>", "llama-3.1-json", true},
    {"[TOOL_CALLS]", "mistral", false},
    {"<|call|>", "harmony", false},
}};
constexpr std::array<std::string_view, 6> reasoning_markers{"<think>", "<seed:think>", "[THINK]", "◁think▷",
                                                            "<|START_THINKING|>", "<|channel|>analysis"};
constexpr std::array<std::pair<std::string_view, std::string_view>, 3> switches{{
    {"enable_thinking", "enable_thinking"},
    {"reasoning_effort", "reasoning_effort"},
    {"thinking is defined", "thinking"},
}};

}  // namespace

template_facts describe_template(std::string_view source) {
    template_facts f;
    const auto fam = detect_chat_format(source);
    f.family = fam ? std::string(chat_format_name(*fam)) : "other";
    for (const syntax& s : syntaxes)
        if (has(source, s.marker)) {
            f.tool_syntax = s.name;
            f.tool_syntax_parsed = s.parsed;
            break;
        }
    f.tools = !f.tool_syntax.empty() || has(source, "tools");
    if (f.tools && f.tool_syntax.empty()) f.tool_syntax = "unknown";
    for (std::string_view m : reasoning_markers)
        if (has(source, m)) {
            f.reasoning_marker = m;
            break;
        }
    for (const auto& [needle, name] : switches)
        if (has_word(source, needle)) f.reasoning_switches.emplace_back(name);
    return f;
}

}  // namespace strata::tok
