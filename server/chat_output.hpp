// The assistant's reply split the way llama-server and vLLM return it: reasoning between thinking
// markers goes to reasoning_content, tool-call syntax becomes OpenAI tool_calls, the rest is content.
// Tool-call forms: <tool_call>{json}</tool_call> (Qwen3, Hermes), <tool_call><function=NAME>
// <parameter=P>V</parameter></function></tool_call> (Qwen3.5, Qwen3-Coder), <tool_call>NAME
// <arg_key>K</arg_key><arg_value>V</arg_value></tool_call> (GLM-4.5+), DeepSeek V3.1's
// <｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{json}, Kimi K2's <|tool_call_begin|>functions.NAME:N
// <|tool_call_argument_begin|>{json}, and a bare {"name", "parameters"|"arguments"} object (Llama 3.1).
// Text that does not parse stays content.
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace strata::server {

struct reply_options {
    bool split_reasoning = true;  // --reasoning-format auto; none keeps the markers inline
    bool thinking_opened = false; // the prompt ended with <think>: the reply starts as reasoning
    bool tools = false;           // the request offered tools
};

struct parsed_reply {
    std::string content;
    std::string reasoning;
    nlohmann::json tool_calls = nlohmann::json::array();  // OpenAI tool_calls, arguments as JSON text
};

parsed_reply parse_reply(std::string_view text, const reply_options& opt);

// Streaming: text pieces in, reasoning and content deltas out. A piece that may begin a marker is
// held back until it is decided; once a tool call starts, the rest is held for finish().
class reply_stream {
public:
    explicit reply_stream(const reply_options& opt) : opt_(opt), in_reasoning_(opt.split_reasoning && opt.thinking_opened) {}
    struct delta {
        std::string reasoning;
        std::string content;
    };
    delta push(std::string_view piece);
    // The held text and, when tools were offered, the tool calls found in it.
    parsed_reply finish();

private:
    reply_options opt_;
    bool in_reasoning_;
    bool in_tools_ = false;
    std::string pending_;  // undecided text
    std::string tool_text_;
};

}  // namespace strata::server
