// Reasoning and tool calls split out of reply text, whole and streamed piece by piece.
#include <gtest/gtest.h>

#include "chat_output.hpp"

namespace {

using strata::server::parse_reply;
using strata::server::parsed_reply;
using strata::server::reply_options;
using strata::server::reply_stream;

// The same text streamed one byte at a time must split as the whole text does.
parsed_reply streamed(std::string_view text, const reply_options& opt) {
    reply_stream s(opt);
    parsed_reply out;
    for (char c : text) {
        reply_stream::delta d = s.push(std::string_view(&c, 1));
        out.reasoning += d.reasoning;
        out.content += d.content;
    }
    parsed_reply rest = s.finish();
    out.reasoning += rest.reasoning;
    out.content += rest.content;
    out.tool_calls = rest.tool_calls;
    return out;
}

TEST(ChatOutput, Reasoning) {
    const reply_options opt{.tools = false};
    parsed_reply r = parse_reply("<think>\nAdd them.\n</think>\n\nIt is 4.", opt);
    EXPECT_EQ(r.reasoning, "\nAdd them.\n");
    EXPECT_EQ(r.content, "\n\nIt is 4.");
    parsed_reply s = streamed("<think>\nAdd them.\n</think>\n\nIt is 4.", opt);
    EXPECT_EQ(s.reasoning, r.reasoning);
    EXPECT_EQ(s.content, r.content);
    // The prompt opened <think> (DeepSeek R1, Qwen3 thinking templates): the reply starts inside it.
    r = parse_reply("Hmm.</think>Four.", {.thinking_opened = true});
    EXPECT_EQ(r.reasoning, "Hmm.");
    EXPECT_EQ(r.content, "Four.");
    // --reasoning-format none keeps everything inline.
    r = parse_reply("<think>x</think>y", {.split_reasoning = false});
    EXPECT_EQ(r.content, "<think>x</think>y");
    EXPECT_TRUE(r.reasoning.empty());
    // A "<" that starts no marker is content.
    EXPECT_EQ(streamed("a < b <th", opt).content, "a < b <th");
}

TEST(ChatOutput, ToolCallForms) {
    const reply_options opt{.tools = true};
    const char* forms[] = {
        "Let me look.<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
        "Let me look.<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>",
        "Let me look.<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n</tool_call>",
        "Let me look.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Paris\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
        "Let me look.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{\"city\": \"Paris\"}<|tool_call_end|><|tool_calls_section_end|>",
    };
    for (const char* text : forms) {
        SCOPED_TRACE(text);
        for (const parsed_reply& r : {parse_reply(text, opt), streamed(text, opt)}) {
            ASSERT_EQ(r.tool_calls.size(), 1u);
            EXPECT_EQ(r.content, "Let me look.");
            EXPECT_EQ(r.tool_calls[0]["function"]["name"], "get_weather");
            EXPECT_EQ(nlohmann::json::parse(r.tool_calls[0]["function"]["arguments"].get<std::string>()),
                      nlohmann::json({{"city", "Paris"}}));
            EXPECT_EQ(r.tool_calls[0]["type"], "function");
        }
    }
    // Llama 3.1: a bare JSON object with "parameters".
    parsed_reply r = parse_reply("{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}", opt);
    ASSERT_EQ(r.tool_calls.size(), 1u);
    EXPECT_TRUE(r.content.empty());
    // Two calls.
    r = parse_reply("<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call>\n<tool_call>{\"name\": \"b\", "
                    "\"arguments\": {\"x\": 1}}</tool_call>", opt);
    ASSERT_EQ(r.tool_calls.size(), 2u);
    EXPECT_EQ(r.tool_calls[1]["function"]["arguments"], "{\"x\":1}");
    EXPECT_NE(r.tool_calls[0]["id"], r.tool_calls[1]["id"]);
}

TEST(ChatOutput, MalformedToolCallsStayContent) {
    const reply_options opt{.tools = true};
    for (const char* text : {"<tool_call>{\"name\": \"f\", \"arguments\": {", "<tool_call>not a call</tool_call>",
                             "<tool_call>{\"arguments\": {}}</tool_call>"}) {
        parsed_reply r = parse_reply(text, opt);
        EXPECT_TRUE(r.tool_calls.empty()) << text;
        EXPECT_EQ(r.content, text);
    }
    // Without tools in the request the syntax is plain text.
    parsed_reply r = parse_reply("<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>", {.tools = false});
    EXPECT_TRUE(r.tool_calls.empty());
}

}  // namespace
