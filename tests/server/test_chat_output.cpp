// Reasoning and tool calls split out of reply text, whole and streamed piece by piece.
#include <gtest/gtest.h>

#include <algorithm>

#include "chat_output.hpp"

namespace {

using strata::server::parse_reply;
using strata::server::parsed_reply;
using strata::server::reply_options;
using strata::server::reply_stream;

// OpenAI tool_calls deltas added up the way clients do: by index, the first carries id, type and
// name, every one may add argument text.
void add_call_deltas(const nlohmann::json& deltas, nlohmann::json& calls) {
    for (const nlohmann::json& d : deltas) {
        const size_t i = d.at("index").get<size_t>();
        ASSERT_LE(i, calls.size()) << d.dump();
        if (i == calls.size()) {
            ASSERT_TRUE(d.contains("id") && d.contains("type") && d["function"].contains("name")) << d.dump();
            nlohmann::json c = d;
            c.erase("index");
            calls.push_back(c);
        } else {
            EXPECT_FALSE(d.contains("id")) << d.dump();
            calls[i]["function"]["arguments"] =
                calls[i]["function"]["arguments"].get<std::string>() + d["function"]["arguments"].get<std::string>();
        }
    }
}

// The same text streamed `step` bytes at a time (never inside a UTF-8 character) must split as the
// whole text does; tool calls are rebuilt from the deltas alone. calls_before_end: the deltas that
// arrived before finish().
parsed_reply streamed(std::string_view text, const reply_options& opt, size_t step = 1, size_t* calls_before_end = nullptr) {
    reply_stream s(opt);
    parsed_reply out;
    size_t early = 0;
    for (size_t i = 0; i < text.size();) {
        size_t n = std::min(step, text.size() - i);
        while (i + n < text.size() && (static_cast<unsigned char>(text[i + n]) & 0xC0) == 0x80) ++n;
        reply_stream::delta d = s.push(text.substr(i, n));
        i += n;
        out.reasoning += d.reasoning;
        out.content += d.content;
        early += d.tool_calls.size();
        add_call_deltas(d.tool_calls, out.tool_calls);
    }
    parsed_reply rest = s.finish();
    out.reasoning += rest.reasoning;
    out.content += rest.content;
    add_call_deltas(rest.tool_call_deltas, out.tool_calls);
    if (calls_before_end) *calls_before_end = early;
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

TEST(ChatOutput, StreamedToolCallDeltasAddUpToTheWholeReply) {
    const reply_options opt{.tools = true};
    const char* texts[] = {
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": [1, 2],\n \"note\": \"a \\\"b\\\" {c}\"}}\n</tool_call>",
        "Checking.\n<tool_call>\n{\"name\": \"a\", \"arguments\": {\"z\": 1, \"y\": {\"x\": null}}}\n</tool_call>\n"
        "<tool_call>\n{\"name\": \"b\", \"arguments\": \"{\\\"s\\\": 2}\"}\n</tool_call>",
        "<tool_call>\n<function=write_file>\n<parameter=path>\n/tmp/x\n</parameter>\n<parameter=count>\n3\n</parameter>\n"
        "</function>\n</tool_call>",
        "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n<arg_key>days</arg_key>\n"
        "<arg_value>[1, 2]</arg_value>\n</tool_call>",
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Zürich\"}<｜tool▁call▁end｜>"
        "<｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
        "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>"
        "{\"city\": \"Paris\"}<|tool_call_end|><|tool_calls_section_end|>",
        "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}",
        "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}",
        "<think>Need the weather.</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {}}\n</tool_call>",
    };
    for (const char* text : texts) {
        SCOPED_TRACE(text);
        const parsed_reply whole = parse_reply(text, opt);
        ASSERT_FALSE(whole.tool_calls.empty());
        for (const size_t step : {1, 3, 7, 1000}) {
            SCOPED_TRACE(step);
            size_t early = 0;
            const parsed_reply s = streamed(text, opt, step, &early);
            EXPECT_EQ(s.tool_calls, whole.tool_calls);
            EXPECT_EQ(s.content, whole.content);
            EXPECT_EQ(s.reasoning, whole.reasoning);
            for (const char* markup : {"<tool_call", "<｜", "<|", "{\"name", "<function"})
                EXPECT_EQ(s.content.find(markup), std::string::npos) << s.content;
            // Piece by piece, the calls go out while the text arrives, not all at the end.
            if (step == 1) {
                EXPECT_GE(early, whole.tool_calls.size());
            }
        }
    }
    // The arguments keep the model's key order and come out minified.
    const parsed_reply r = parse_reply(texts[1], opt);
    ASSERT_EQ(r.tool_calls.size(), 2u);
    EXPECT_EQ(r.tool_calls[0]["function"]["arguments"], "{\"z\":1,\"y\":{\"x\":null}}");
    EXPECT_EQ(r.tool_calls[1]["function"]["arguments"], "{\"s\": 2}");
    EXPECT_EQ(r.content, "Checking.\n");
    EXPECT_EQ(parse_reply(texts[2], opt).tool_calls[0]["function"]["arguments"], "{\"path\":\"/tmp/x\",\"count\":3}");
}

TEST(ChatOutput, StreamedArgumentsArriveInPieces) {
    // The name goes out once it is complete; the JSON arguments follow piece by piece.
    reply_stream s({.tools = true});
    EXPECT_TRUE(s.push("<tool_call>\n{\"name\": \"get_wea").tool_calls.empty());
    reply_stream::delta d = s.push("ther\", \"arguments\": {\"ci");
    ASSERT_EQ(d.tool_calls.size(), 1u);
    EXPECT_EQ(d.tool_calls[0]["function"]["name"], "get_weather");
    EXPECT_EQ(d.tool_calls[0]["id"], "call_0");
    EXPECT_EQ(d.tool_calls[0]["function"]["arguments"], "{\"ci");
    d = s.push("ty\": \"Par");
    ASSERT_EQ(d.tool_calls.size(), 1u);
    EXPECT_EQ(d.tool_calls[0], nlohmann::json({{"index", 0}, {"function", {{"arguments", "ty\":\"Par"}}}}));
    EXPECT_TRUE(d.content.empty());
    d = s.push("is\"}}\n</tool_call>");
    ASSERT_EQ(d.tool_calls.size(), 1u);
    EXPECT_EQ(d.tool_calls[0]["function"]["arguments"], "is\"}");
    const parsed_reply end = s.finish();
    EXPECT_TRUE(end.tool_call_deltas.empty()) << end.tool_call_deltas.dump();
    EXPECT_EQ(end.tool_calls[0]["function"]["arguments"], "{\"city\":\"Paris\"}");
}

TEST(ChatOutput, ALongCallStreamsItsStartAndEndsWhole) {
    // Arguments past the streaming limit (64 KiB) arrive with finish(); the sum is still the reply's.
    const std::string text = "<tool_call>\n{\"name\": \"write\", \"arguments\": {\"text\": \"" + std::string(100000, 'x') +
                             "\"}}\n</tool_call>";
    size_t early = 0;
    const parsed_reply s = streamed(text, {.tools = true}, 997, &early);
    const parsed_reply whole = parse_reply(text, {.tools = true});
    ASSERT_EQ(whole.tool_calls.size(), 1u);
    EXPECT_EQ(s.tool_calls, whole.tool_calls);
    EXPECT_GT(early, 10u);
    EXPECT_EQ(whole.tool_calls[0]["function"]["arguments"].get<std::string>().size(), 100000u + 11u);  // {"text":"..."}
}

TEST(ChatOutput, ReasoningMarkersOfOtherFamilies) {
    for (const auto& [open, close] : std::vector<std::pair<std::string, std::string>>{
             {"<seed:think>", "</seed:think>"}, {"[THINK]", "[/THINK]"}, {"◁think▷", "◁/think▷"},
             {"<|START_THINKING|>", "<|END_THINKING|>"}}) {
        const std::string text = open + "Add them." + close + "It is 4.";
        for (const parsed_reply& r : {parse_reply(text, {}), streamed(text, {}), streamed(text, {}, 4)}) {
            EXPECT_EQ(r.reasoning, "Add them.") << text;
            EXPECT_EQ(r.content, "It is 4.") << text;
        }
        EXPECT_TRUE(strata::server::opens_reasoning("<|im_start|>assistant\n" + open + "\n"));
        const parsed_reply r = parse_reply("Hmm." + close + "Four.", {.thinking_opened = true});
        EXPECT_EQ(r.reasoning, "Hmm.");
        EXPECT_EQ(r.content, "Four.");
    }
    EXPECT_FALSE(strata::server::opens_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
}

TEST(ChatOutput, KimiToolSectionEndsReasoning) {
    // Kimi K2 thinking may open its tool-call section without closing the reasoning.
    const std::string text = "<think>I should look it up.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
                             "<|tool_call_argument_begin|>{\"city\": \"Paris\"}<|tool_call_end|><|tool_calls_section_end|>";
    for (const parsed_reply& r : {parse_reply(text, {.tools = true}), streamed(text, {.tools = true}), streamed(text, {.tools = true}, 5)}) {
        EXPECT_EQ(r.reasoning, "I should look it up.");
        EXPECT_TRUE(r.content.empty()) << r.content;
        ASSERT_EQ(r.tool_calls.size(), 1u);
        EXPECT_EQ(r.tool_calls[0]["function"]["name"], "get_weather");
        EXPECT_EQ(r.tool_calls[0]["function"]["arguments"], "{\"city\":\"Paris\"}");
    }
    // Also when the prompt opened the reasoning, and without tools the section is plain content.
    const parsed_reply r = parse_reply("Plan.<|tool_calls_section_begin|>x", {.thinking_opened = true});
    EXPECT_EQ(r.reasoning, "Plan.");
    EXPECT_EQ(r.content, "<|tool_calls_section_begin|>x");
}

TEST(ChatOutput, MalformedToolCallsStayContent) {
    const reply_options opt{.tools = true};
    for (const char* text : {"<tool_call>{\"name\": \"f\", \"arguments\": {", "<tool_call>not a call</tool_call>",
                             "<tool_call>{\"arguments\": {}}</tool_call>"}) {
        parsed_reply r = parse_reply(text, opt);
        EXPECT_TRUE(r.tool_calls.empty()) << text;
        EXPECT_EQ(r.content, text);
        EXPECT_EQ(streamed(text, opt).content, text);
    }
    // Without tools in the request the syntax is plain text.
    parsed_reply r = parse_reply("<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>", {.tools = false});
    EXPECT_TRUE(r.tool_calls.empty());
}

}  // namespace
