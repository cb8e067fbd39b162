// Real chat templates (../shared/realdata/templates, named with --chat-template FILE) through the
// server: tools and tool turns reach the template, and a template's own error is a 400 naming its line.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include "openai_schema.hpp"
#include "server_fixture.hpp"

namespace strata::server::test {
namespace {

std::shared_ptr<model> with_template(const std::string& name) {
    const std::filesystem::path file = std::filesystem::path(STRATA_REALDATA_DIR) / "templates" / name;
    if (!std::filesystem::exists(file)) return nullptr;
    model_options o;
    o.path = tiny_model_path();
    o.n_ctx = test_ctx;
    o.numa_pool = "off";
    o.chat_template = file.string();
    return model::load(o);
}

bool in_ci() {
    const char* ci = std::getenv("CI");
    return ci && std::string(ci) == "true";
}

const json weather_tool = {{"type", "function"},
                           {"function", {{"name", "get_weather"}, {"description", "Weather of a city."},
                                         {"parameters", {{"type", "object"},
                                                         {"properties", {{"city", {{"type", "string"}}}}},
                                                         {"required", {"city"}}}}}}};

TEST(ChatTemplates, ToolsAndToolTurnsReachTheTemplate) {
    std::shared_ptr<model> m = with_template("Qwen-Qwen3-0.6B.jinja");
    if (!m) {
        if (in_ci()) FAIL() << "../shared/realdata/templates is missing";
        GTEST_SKIP() << "../shared/realdata/templates is missing";
    }
    json body = {{"messages", {{{"role", "user"}, {"content", "Weather in Paris?"}},
                               {{"role", "assistant"}, {"content", nullptr},
                                {"tool_calls", {{{"id", "c1"}, {"type", "function"},
                                                 {"function", {{"name", "get_weather"}, {"arguments", "{\"city\":\"Paris\"}"}}}}}}},
                               {{"role", "tool"}, {"tool_call_id", "c1"}, {"content", "sunny"}}}},
                 {"tools", {weather_tool}},
                 {"chat_template_kwargs", {{"enable_thinking", false}}},
                 {"max_tokens", 3}};
    test_server s({}, m);
    const reply r = s.post("/v1/chat/completions", body);
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(r.parsed()["choices"][0]["message"]["role"], "assistant");

    // What the template was given: the tool list, the call with its arguments as an object, the
    // tool's answer, and enable_thinking=false's empty think block in the generation prompt.
    json ctx = {{"messages", body["messages"]}, {"tools", body["tools"]}, {"add_generation_prompt", true},
                {"enable_thinking", false}};
    ctx["messages"][1]["content"] = "";
    ctx["messages"][1]["tool_calls"][0]["function"]["arguments"] = {{"city", "Paris"}};
    // The client's key order reaches the template (tojson shows it), as in transformers.
    const std::string raw = R"({"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function",
        "function": {"name": "get_weather", "description": "d", "parameters": {"type": "object"}}}]})";
    const completion_request parsed = parse_completion_request(json::parse(raw), endpoint::chat, *m, {}, false, raw);
    EXPECT_NE(m->detokenize(parsed.prompt, true).find(R"({"type": "function", "function": {"name": "get_weather", "description": "d")"),
              std::string::npos);
    const std::string text = m->tokenize_chat_context(ctx.dump()).text;
    EXPECT_NE(text.find("<tools>\n{\"function\": {\"description\": \"Weather of a city.\", \"name\": \"get_weather\""),
              std::string::npos) << text;
    EXPECT_NE(text.find("{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}"), std::string::npos) << text;
    EXPECT_NE(text.find("<tool_response>\nsunny\n</tool_response>"), std::string::npos) << text;
    EXPECT_TRUE(text.ends_with("<|im_start|>assistant\n<think>\n\n</think>\n\n")) << text;
}

TEST(ChatTemplates, TemplateErrorIsA400NamingItsLine) {
    std::shared_ptr<model> m = with_template("mistralai-Mistral-Nemo-Instruct-2407.jinja");
    if (!m) GTEST_SKIP() << "../shared/realdata/templates is missing";
    test_server s({}, m);
    // Mistral's template demands tool-call ids of 9 alphanumeric characters.
    json body = {{"messages", {{{"role", "user"}, {"content", "hi"}},
                               {{"role", "assistant"}, {"content", nullptr},
                                {"tool_calls", {{{"id", "c1"}, {"type", "function"},
                                                 {"function", {{"name", "f"}, {"arguments", "{}"}}}}}}},
                               {{"role", "tool"}, {"tool_call_id", "c1"}, {"content", "ok"}}}},
                 {"max_tokens", 2}};
    const reply r = s.post("/v1/chat/completions", body);
    ASSERT_EQ(r.status, 400) << r.body;
    const std::string msg = r.parsed()["error"]["message"];
    EXPECT_NE(msg.find("chat template: line "), std::string::npos) << msg;
    EXPECT_NE(msg.find("Tool call IDs should be alphanumeric strings with length 9"), std::string::npos) << msg;
    EXPECT_EQ(r.parsed()["error"]["param"], "messages");
}

}  // namespace
}  // namespace strata::server::test
