// Tool calls over HTTP, whole and streamed: a tiny model whose vocabulary holds a call's text in a few
// user-defined tokens, written in order by logit_bias (each token, once written, drops to a tenth under
// repeat_penalty 10, so the next one's lower bias wins). For each form the server parses, the streamed
// delta.tool_calls add up to the whole reply's tool_calls, the call's markup never reaches content, and
// the call goes out in pieces while it is generated.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include "generate.hpp"
#include "server_fixture.hpp"

namespace strata::server::test {
namespace {

struct call_form {
    const char* name;
    std::vector<std::string> tokens;  // the call's text, in generation order
};

const std::vector<call_form>& forms() {
    static const std::vector<call_form> f = {
        {"qwen3 json", {"<tool_call>\n{\"name\": \"get_weather\", ", "\"arguments\": {\"city\": ", "\"Paris\"}}\n</tool_call>"}},
        {"qwen3.5 xml", {"<tool_call>\n<function=get_weather>\n", "<parameter=city>\nParis\n</parameter>\n", "</function>\n</tool_call>"}},
        {"glm", {"<tool_call>get_weather\n<arg_key>city</arg_key>\n", "<arg_value>Paris</arg_value>\n</tool_call>"}},
        {"deepseek v3.1", {"<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": ",
                           "\"Paris\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>"}},
        {"kimi k2", {"<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>",
                     "{\"city\": \"Paris\"}<|tool_call_end|><|tool_calls_section_end|>"}},
        {"llama 3.1", {"{\"name\": \"get_weather\", \"parameters\": ", "{\"city\": \"Paris\"}}"}},
    };
    return f;
}

struct forced_model {
    std::filesystem::path dir;
    std::shared_ptr<model> m;
    forced_model() {
        std::string pattern = (std::filesystem::temp_directory_path() / "strata-tools-test-XXXXXX").string();
        if (!mkdtemp(pattern.data())) throw std::runtime_error("mkdtemp failed for " + pattern);
        dir = pattern;
        make_model::model_spec spec = make_model::preset("tiny");
        spec.n_ctx = test_ctx;
        for (const call_form& f : forms()) spec.added_tokens.insert(spec.added_tokens.end(), f.tokens.begin(), f.tokens.end());
        make_model::build_model(spec).write_file((dir / "tools.gguf").string());
        model_options o;
        o.path = (dir / "tools.gguf").string();
        o.n_ctx = test_ctx;
        o.numa_pool = "off";
        o.cache_ram_mib = 0;
        m = model::load(o);
    }
    ~forced_model() {
        m.reset();
        std::error_code ec;
        std::filesystem::remove_all(dir, ec);
    }
};

const json weather_tool = {{"type", "function"},
                           {"function", {{"name", "get_weather"},
                                         {"parameters", {{"type", "object"}, {"properties", {{"city", {{"type", "string"}}}}}}}}}};

json forced_body(const model& m, const call_form& f) {
    json bias = json::object();
    for (size_t i = 0; i < f.tokens.size(); ++i) {
        const std::vector<int32_t> ids = m.tokenize(f.tokens[i], false, false);
        EXPECT_EQ(ids.size(), 1u) << f.tokens[i];
        bias[std::to_string(ids.at(0))] = 100 - 30 * static_cast<int>(i);
    }
    json body = chat_body("What is the weather in Paris?", static_cast<int>(f.tokens.size()));
    body["tools"] = json::array({weather_tool});
    body["logit_bias"] = bias;
    body["repeat_penalty"] = 10;
    body["repeat_last_n"] = -1;
    return body;
}

TEST(ToolCallStream, DeltasAddUpToTheWholeReplyInEveryForm) {
    forced_model fm;
    test_server s({}, fm.m);
    for (const call_form& f : forms()) {
        SCOPED_TRACE(f.name);
        json body = forced_body(*fm.m, f);
        const reply whole = s.post("/v1/chat/completions", body);
        ASSERT_EQ(whole.status, 200) << whole.body;
        const json choice = whole.parsed()["choices"][0];
        EXPECT_EQ(choice["finish_reason"], "tool_calls") << choice.dump();
        ASSERT_EQ(choice["message"]["tool_calls"].size(), 1u) << choice.dump();
        const json& call = choice["message"]["tool_calls"][0];
        EXPECT_EQ(call["function"]["name"], "get_weather");
        EXPECT_EQ(json::parse(call["function"]["arguments"].get<std::string>()), json({{"city", "Paris"}}));
        EXPECT_TRUE(choice["message"]["content"].is_null()) << choice.dump();

        body["stream"] = true;
        const sse_reply st = s.post_stream("/v1/chat/completions", body);
        ASSERT_EQ(st.status, 200);
        json calls = json::array();
        std::string content, finish;
        size_t call_chunks = 0;
        for (const json& c : st.chunks()) {
            if (c["choices"].empty()) continue;
            const json& ch = c["choices"][0];
            if (!ch["finish_reason"].is_null()) finish = ch["finish_reason"];
            if (ch["delta"].contains("content")) content += ch["delta"]["content"].get<std::string>();
            if (!ch["delta"].contains("tool_calls")) continue;
            ++call_chunks;
            for (const json& d : ch["delta"]["tool_calls"]) {
                const size_t i = d["index"];
                if (i == calls.size()) {
                    json first = d;
                    first.erase("index");
                    calls.push_back(first);
                } else {
                    calls[i]["function"]["arguments"] =
                        calls[i]["function"]["arguments"].get<std::string>() + d["function"]["arguments"].get<std::string>();
                }
            }
        }
        EXPECT_EQ(calls, choice["message"]["tool_calls"]);
        EXPECT_EQ(finish, "tool_calls");
        EXPECT_EQ(content, "");
        // One chunk per generated token at least for all but the first: the call is not held to the end.
        EXPECT_GE(call_chunks, f.tokens.size() - 1) << st.data.size() << " events";
    }
}

}  // namespace
}  // namespace strata::server::test
