// The web pages' routes without a browser: what is embedded and how it is served (content types,
// the security headers, open without the API key, 405/404), and --no-webui turning them off.
#include <gtest/gtest.h>

#include <string>

#include "server_fixture.hpp"
#include "webui.hpp"

namespace strata::server::test {
namespace {

TEST(WebUiRoutes, EveryPageAndLibraryIsEmbedded) {
    for (const char* path : {"/", "/dashboard", "/webui/chat.js", "/webui/dashboard.js", "/webui/common.js",
                             "/webui/webui.css", "/webui/about.js", "/webui/lib/marked.js", "/webui/lib/highlight.js",
                             "/webui/lib/highlight.css", "/webui/lib/chart.js"}) {
        const webui::asset* a = webui::find(path);
        ASSERT_NE(a, nullptr) << path;
        EXPECT_GT(a->body.size(), 100u) << path;
    }
    // The libraries are Debian's files, byte for byte; the about line names their versions.
    EXPECT_NE(webui::find("/webui/lib/chart.js")->body.find("Chart.js v3."), std::string_view::npos);
    const std::string_view about = webui::find("/webui/about.js")->body;
    for (const char* name : {"\"marked\"", "\"highlight.js\"", "\"Chart.js\"", "libjs-marked "})
        EXPECT_NE(about.find(name), std::string_view::npos) << name << " missing from " << about;
    EXPECT_EQ(about.find("unknown version"), std::string_view::npos) << about;
}

TEST(WebUiRoutes, PagesAreServedWithoutTheKeyAndWithTheirHeaders) {
    server_options o;
    o.api_key = "secret";
    const test_server s(o);
    const reply page = s.get("/");
    ASSERT_EQ(page.status, 200) << page.body;
    EXPECT_EQ(page.header("Content-Type"), "text/html; charset=utf-8");
    EXPECT_NE(page.body.find("<title>strata chat</title>"), std::string::npos);
    EXPECT_EQ(page.header("Content-Security-Policy").rfind("default-src 'self'", 0), 0u);
    EXPECT_EQ(page.header("X-Content-Type-Options"), "nosniff");
    const reply dash = s.get("/dashboard");
    ASSERT_EQ(dash.status, 200);
    EXPECT_NE(dash.body.find("/webui/lib/chart.js"), std::string::npos);
    const reply lib = s.get("/webui/lib/marked.js");
    ASSERT_EQ(lib.status, 200);
    EXPECT_EQ(lib.header("Content-Type"), "text/javascript; charset=utf-8");
    EXPECT_EQ(lib.body, std::string(webui::find("/webui/lib/marked.js")->body));
    EXPECT_EQ(s.get("/webui/lib/highlight.css").header("Content-Type"), "text/css; charset=utf-8");
    // The API behind them still needs the key.
    EXPECT_EQ(s.get("/v1/status").status, 401);
}

TEST(WebUiRoutes, UnknownFilesAndOtherMethodsAreErrors) {
    const test_server s;
    const reply missing = s.get("/webui/nope.js");
    EXPECT_EQ(missing.status, 404);
    EXPECT_EQ(missing.parsed()["error"]["code"], "not_found");
    const reply post = s.post("/", std::string("{}"));
    EXPECT_EQ(post.status, 405);
    EXPECT_EQ(post.header("Allow"), "GET");
}

TEST(WebUiRoutes, NoWebuiTurnsThePagesOff) {
    server_options o;
    o.webui = false;
    const test_server s(o);
    for (const char* path : {"/", "/dashboard", "/webui/lib/chart.js"}) {
        const reply r = s.get(path);
        EXPECT_EQ(r.status, 404) << path;
        EXPECT_NE(r.body.find("--no-webui"), std::string::npos) << r.body;
    }
    EXPECT_EQ(s.get("/health").status, 200);
}

}  // namespace
}  // namespace strata::server::test
