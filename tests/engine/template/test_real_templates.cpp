// Every chat template in ../shared/realdata/templates, rendered over the conversations in
// conversations.json by strata's renderer and by python3-jinja2 (render_jinja.py, set up as
// transformers sets Jinja2 up): the texts must be byte-identical, and where Jinja2 fails so must we.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "template/jinja.hpp"

namespace jinja = strata::jinja;

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
constexpr std::int64_t test_now = 1764770400;  // 2025-12-03, for strftime_now

std::string read_file(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

bool in_ci() {
    const char* ci = std::getenv("CI");
    return ci && std::string(ci) == "true";
}

// Runs the oracle over all cases at once; nullopt when python3 or jinja2 is missing.
std::optional<json> run_oracle(const json& cases) {
    fs::path in = fs::temp_directory_path() / ("strata-jinja-cases-" + std::to_string(::getpid()) + ".json");
    std::ofstream(in) << cases.dump();
    std::string cmd = "python3 " + std::string(STRATA_TEMPLATE_TEST_DIR) + "/render_jinja.py < " + in.string();
    FILE* p = ::popen(cmd.c_str(), "r");
    std::string out;
    if (p) {
        char buf[65536];
        for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
        int rc = ::pclose(p);
        if (rc != 0) out.clear();
    }
    fs::remove(in);
    if (out.empty()) return std::nullopt;
    return json::parse(out);
}

std::string first_difference(const std::string& a, const std::string& b) {
    std::size_t i = 0;
    while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
    std::size_t from = i > 40 ? i - 40 : 0;
    return "at byte " + std::to_string(i) + ":\n  strata: " + json(a.substr(from, 120)).dump() +
           "\n  jinja2: " + json(b.substr(from, 120)).dump();
}

TEST(RealTemplates, RenderAsJinja2Does) {
    fs::path dir = fs::path(STRATA_REALDATA_DIR) / "templates";
    if (!fs::is_directory(dir)) {
        if (in_ci()) FAIL() << dir << " is missing (the real templates; see ../shared/realdata/README.md)";
        GTEST_SKIP() << dir << " is missing";
    }
    std::vector<fs::path> templates;
    for (const auto& e : fs::directory_iterator(dir))
        if (e.path().extension() == ".jinja") templates.push_back(e.path());
    std::sort(templates.begin(), templates.end());
    ASSERT_FALSE(templates.empty());

    json conversations = json::parse(read_file(fs::path(STRATA_TEMPLATE_TEST_DIR) / "conversations.json"));
    json cases = json::array();
    for (const auto& t : templates)
        for (const auto& conv : conversations) {
            json ctx = conv["context"];
            ctx["bos_token"] = "<s>";
            ctx["eos_token"] = "</s>";
            if (!ctx.contains("tools")) ctx["tools"] = nullptr;
            cases.push_back({{"template", t.string()}, {"context", ctx}, {"now", test_now}, {"name", conv["name"]}});
        }
    auto expected = run_oracle(cases);
    if (!expected) {
        if (in_ci()) FAIL() << "python3 with jinja2 (python3-jinja2) is needed for the oracle";
        GTEST_SKIP() << "python3-jinja2 is not installed";
    }
    ASSERT_EQ(expected->size(), cases.size());

    std::size_t matched = 0, both_failed = 0;
    for (std::size_t i = 0; i < cases.size(); ++i) {
        const json& c = cases[i];
        const json& want = (*expected)[i];
        SCOPED_TRACE(fs::path(c["template"].get<std::string>()).filename().string() + " / " + c["name"].get<std::string>());
        std::string got, error;
        try {
            jinja::template_program prog(read_file(c["template"].get<std::string>()));
            got = prog.render(c["context"], jinja::render_options{.now = test_now});
        } catch (const jinja::template_error& e) {
            error = e.what();
        }
        if (want.contains("error")) {
            EXPECT_FALSE(error.empty()) << "jinja2 failed (" << want["error"].get<std::string>() << ") but strata rendered:\n" << got;
            both_failed += !error.empty();
            continue;
        }
        ASSERT_TRUE(error.empty()) << "strata failed: " << error;
        const std::string text = want["text"].get<std::string>();
        EXPECT_EQ(got, text) << first_difference(got, text);
        matched += got == text;
    }
    std::printf("%zu templates x %zu conversations: %zu byte-identical, %zu failing in both\n", templates.size(),
                conversations.size(), matched, both_failed);
}

}  // namespace
