// The assistant's reply split the way llama-server and vLLM return it: reasoning between thinking
// markers goes to reasoning_content, tool-call syntax becomes OpenAI tool_calls, the rest is content.
// Tool-call forms: <tool_call>{json}</tool_call> (Qwen3, Hermes), <tool_call><function=NAME>
// <parameter=P>V</parameter></function></tool_call> (Qwen3.5, Qwen3-Coder), <tool_call>NAME
// <arg_key>K</arg_key><arg_value>V</arg_value></tool_call> (GLM-4.5+), DeepSeek V3.1's
// <｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{json}, Kimi K2's <|tool_call_begin|>functions.NAME:N
// <|tool_call_argument_begin|>{json}, and a bare {"name", "parameters"|"arguments"} object (Llama 3.1).
// Text that does not parse stays content. Reasoning markers: <think> (Qwen3, DeepSeek, GLM, Kimi K2,
// whose tool-call section may also end the reasoning), <seed:think>, [THINK], ◁think▷, <|START_THINKING|>.
#pragma once

#include <string>
#include <string_view>
#include <vector>

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
    // reply_stream::finish: the tool_calls deltas still to send (streamed ones add up to tool_calls).
    nlohmann::json tool_call_deltas = nlohmann::json::array();
};

parsed_reply parse_reply(std::string_view text, const reply_options& opt);

// Whether a rendered chat prompt ends with an open reasoning marker (<think>, [THINK], ...): the
// generation starts as reasoning.
bool opens_reasoning(std::string_view prompt);

// Streaming: text pieces in, reasoning, content and tool-call deltas out. A piece that may begin a
// marker is held back until it is decided. Once a tool call starts, its text never reaches content:
// each call goes out as OpenAI deltas (index, id, type and function.name first, then pieces of
// function.arguments) as soon as its name is known; the JSON forms' arguments piece by piece, the
// XML forms' parameter by parameter (within the first 64 KiB of call text; the rest goes out at the
// end). Concatenated, the deltas are the whole reply's tool_calls.
// A reply that turns out malformed at the end is content (after any call deltas already sent).
class reply_stream {
public:
    explicit reply_stream(const reply_options& opt) : opt_(opt), in_reasoning_(opt.split_reasoning && opt.thinking_opened) {}
    struct delta {
        std::string reasoning;
        std::string content;
        nlohmann::json tool_calls = nlohmann::json::array();  // OpenAI delta.tool_calls entries
    };
    delta push(std::string_view piece);
    // The held text and, when tools were offered, the tool calls found in it.
    parsed_reply finish();

private:
    reply_options opt_;
    bool in_reasoning_;
    bool in_tools_ = false;
    bool at_start_ = true;            // no content but whitespace yet (a bare JSON call may come)
    std::string pending_;             // undecided text
    std::string tool_text_;
    std::vector<std::string> sent_;   // per call: the arguments text sent so far
};

}  // namespace strata::server
