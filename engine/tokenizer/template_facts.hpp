// What a chat template's source tells a user before the first request (`strata info`): which family's
// markup it uses, which tool-call syntax it teaches the model, and how it marks and switches reasoning.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace strata::tok {

struct template_facts {
    std::string family;            // "chatml" | "mistral" | "llama3" | "other" (by its markers)
    bool tools = false;            // renders the request's tools or the model's tool calls
    std::string tool_syntax;       // e.g. "qwen3-xml"; empty without tools, "unknown" when none is recognised
    bool tool_syntax_parsed = false;  // the server turns this syntax back into tool_calls
    std::string reasoning_marker;  // e.g. "<think>"; empty when the template shows no reasoning
    std::vector<std::string> reasoning_switches;  // keyword arguments it reads: enable_thinking, ...
};

template_facts describe_template(std::string_view source);

}  // namespace strata::tok
