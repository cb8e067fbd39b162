// What `strata info` says of each real chat template in ../shared/realdata/templates: its markup family,
// tool-call syntax and reasoning markers, checked against what each model family is known to emit.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tokenizer/template_facts.hpp"

namespace strata::tok {
namespace {

namespace fs = std::filesystem;

std::string read_template(const std::string& name) {
    const fs::path p = fs::path(STRATA_REALDATA_DIR) / "templates" / name;
    std::ifstream in(p, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

struct expected {
    const char* file;
    const char* family;
    const char* tool_syntax;  // "" when the template renders no tools
    bool parsed;
    const char* marker;
    std::vector<std::string> switches;
};

TEST(TemplateFacts, RealTemplatesAreDescribedAsTheirModelsBehave) {
    const std::vector<expected> cases = {
        {"Qwen-Qwen3-0.6B.jinja", "chatml", "hermes/qwen3-json", true, "<think>", {"enable_thinking"}},
        {"Qwen3.5-4B.jinja", "chatml", "qwen3-xml", true, "<think>", {"enable_thinking"}},
        {"Qwen-Qwen2.5-7B-Instruct.jinja", "chatml", "hermes/qwen3-json", true, "", {}},
        {"GLM-4.6.jinja", "other", "glm-4.5", true, "<think>", {"enable_thinking"}},
        {"moonshotai-Kimi-K2.jinja", "other", "kimi-k2", true, "", {}},
        {"deepseek-ai-DeepSeek-V3.1.jinja", "other", "deepseek-v3.1", true, "<think>", {"enable_thinking", "thinking"}},
        {"meta-llama-Llama-3.1-8B-Instruct.jinja", "llama3", "llama-3.1-json", true, "", {}},
        {"mistralai-Mistral-Nemo-Instruct-2407.jinja", "mistral", "mistral", false, "", {}},
        {"openai-gpt-oss-120b.jinja", "other", "harmony", false, "<|channel|>analysis", {"reasoning_effort"}},
    };
    int seen = 0;
    for (const expected& e : cases) {
        const std::string src = read_template(e.file);
        if (src.empty()) {
            ADD_FAILURE() << e.file << " is missing from " << STRATA_REALDATA_DIR;
            continue;
        }
        ++seen;
        const template_facts f = describe_template(src);
        EXPECT_EQ(f.family, e.family) << e.file;
        EXPECT_EQ(f.tools, *e.tool_syntax != '\0') << e.file;
        EXPECT_EQ(f.tool_syntax, e.tool_syntax) << e.file;
        EXPECT_EQ(f.tool_syntax_parsed, e.parsed) << e.file;
        EXPECT_EQ(f.reasoning_marker, e.marker) << e.file;
        EXPECT_EQ(f.reasoning_switches, e.switches) << e.file;
    }
    EXPECT_EQ(seen, static_cast<int>(cases.size()));
}

TEST(TemplateFacts, APlainTemplateHasNoToolsAndNoReasoning) {
    const template_facts f = describe_template(
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}");
    EXPECT_EQ(f.family, "chatml");
    EXPECT_FALSE(f.tools);
    EXPECT_EQ(f.tool_syntax, "");
    EXPECT_EQ(f.reasoning_marker, "");
    EXPECT_TRUE(f.reasoning_switches.empty());
    const template_facts g = describe_template("{% if tools %}{{ tools | tojson }}{% endif %}{{ messages[0].content }}");
    EXPECT_TRUE(g.tools);
    EXPECT_EQ(g.tool_syntax, "unknown");
    EXPECT_FALSE(g.tool_syntax_parsed);
}

}  // namespace
}  // namespace strata::tok
