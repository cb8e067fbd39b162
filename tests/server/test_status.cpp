// /metrics parses as Prometheus text (a small parser of the exposition format 0.0.4 below),
// /v1/status has the documented fields, /health is 503 while loading and 200 once ready.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include "server_fixture.hpp"

namespace strata::server::test {
namespace {

struct sample {
    std::string name;
    std::map<std::string, std::string> labels;
    double value = 0;
};

// Parses the text exposition format: "# HELP name text", "# TYPE name type", and samples
// `name{label="value",...} value`. Every sample must belong to a family declared by TYPE, with the
// histogram suffixes _bucket/_sum/_count. Failures are reported through gtest.
std::vector<sample> parse_prometheus(const std::string& text) {
    static const std::regex help(R"(# HELP ([a-zA-Z_:][a-zA-Z0-9_:]*) .*)");
    static const std::regex type(R"(# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (counter|gauge|histogram|summary|untyped))");
    static const std::regex line(R"(([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? ([^ ]+))");
    static const std::regex label(R"re(([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"(,|$))re");
    std::map<std::string, std::string> types;
    std::vector<sample> out;
    std::istringstream in(text);
    std::string l;
    int n = 0;
    EXPECT_TRUE(!text.empty() && text.back() == '\n') << "the exposition must end with a newline";
    while (std::getline(in, l)) {
        ++n;
        std::smatch m;
        if (l.empty()) continue;
        if (l.rfind("# HELP", 0) == 0) {
            EXPECT_TRUE(std::regex_match(l, m, help)) << "line " << n << ": " << l;
            continue;
        }
        if (l.rfind("# TYPE", 0) == 0) {
            EXPECT_TRUE(std::regex_match(l, m, type)) << "line " << n << ": " << l;
            if (!m.empty()) {
                EXPECT_FALSE(types.count(m[1])) << "family declared twice: " << m[1];
                types[m[1]] = m[2];
            }
            continue;
        }
        if (l[0] == '#') continue;
        if (!std::regex_match(l, m, line)) {
            ADD_FAILURE() << "line " << n << " is not a sample: " << l;
            continue;
        }
        sample s;
        s.name = m[1];
        const std::string labels = m[3];
        for (auto it = std::sregex_iterator(labels.begin(), labels.end(), label); it != std::sregex_iterator(); ++it)
            s.labels[(*it)[1]] = (*it)[2];
        const std::string v = m[4];
        s.value = v == "+Inf" ? INFINITY : v == "-Inf" ? -INFINITY : std::stod(v);
        std::string family = s.name;
        for (const char* suffix : {"_bucket", "_sum", "_count"})
            if (!types.count(family) && family.ends_with(suffix)) family = family.substr(0, family.size() - std::strlen(suffix));
        EXPECT_TRUE(types.count(family)) << "sample without a TYPE: " << l;
        out.push_back(std::move(s));
    }
    return out;
}

double value_of(const std::vector<sample>& samples, const std::string& name,
                const std::map<std::string, std::string>& labels = {}) {
    for (const sample& s : samples)
        if (s.name == name && s.labels == labels) return s.value;
    ADD_FAILURE() << "no sample " << name;
    return NAN;
}

std::string fmt_share(double share) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.4f", share);
    return buf;
}

TEST(ServerStatus, MetricsParseAsPrometheusText) {
    test_server s;
    ASSERT_EQ(s.post("/v1/chat/completions", chat_body("Count me", 5)).status, 200);
    ASSERT_EQ(s.get("/v1/nothing").status, 404);
    const reply r = s.get("/metrics");
    ASSERT_EQ(r.status, 200);
    EXPECT_EQ(r.header("Content-Type").rfind("text/plain; version=0.0.4", 0), 0u) << r.header("Content-Type");
    const std::vector<sample> m = parse_prometheus(r.body);
    EXPECT_EQ(value_of(m, "strata_http_requests_total", {{"route", "chat"}, {"code", "200"}}), 1);
    EXPECT_EQ(value_of(m, "strata_http_requests_total", {{"route", "unrouted"}, {"code", "404"}}), 1);
    EXPECT_GE(value_of(m, "strata_completion_tokens_total"), 1);
    EXPECT_GT(value_of(m, "strata_prompt_tokens_total"), 0);
    EXPECT_GT(value_of(m, "strata_decode_tokens_per_second"), 0);
    EXPECT_EQ(value_of(m, "strata_queue_waiting"), 0);
    EXPECT_EQ(value_of(m, "strata_model_loaded"), 1);
    EXPECT_GT(value_of(m, "strata_expert_routed_tokens_total"), 0);
    EXPECT_EQ(value_of(m, "strata_expert_vram_lookups_total"), 0);  // CPU-only
    for (const auto& n : tiny_model()->info().placement_nodes)
        EXPECT_EQ(value_of(m, "strata_placement_share", {{"slice", std::to_string(n.slice)}, {"node", std::to_string(n.node)}}),
                  std::stod(fmt_share(n.share)));
    double previous = 0;
    for (const sample& x : m)
        if (x.name == "strata_request_duration_seconds_bucket") {
            EXPECT_GE(x.value, previous);
            previous = x.value;
        }
    EXPECT_EQ(value_of(m, "strata_request_duration_seconds_bucket", {{"le", "+Inf"}}),
              value_of(m, "strata_request_duration_seconds_count"));
    EXPECT_EQ(value_of(m, "strata_request_duration_seconds_count"), 1);
}

TEST(ServerStatus, StatusHasTheDocumentedFields) {
    test_server s;
    ASSERT_EQ(s.post("/v1/completions", json{{"prompt", "Status please"}, {"max_tokens", 3}, {"ignore_eos", true}}).status, 200);
    const json j = s.status();
    EXPECT_EQ(j["state"], "ready");
    EXPECT_TRUE(j["version"].is_string());
    EXPECT_TRUE(j["uptime_s"].is_number());
    const model_info& info = tiny_model()->info();
    EXPECT_EQ(j["model"]["id"], "tiny.gguf");
    EXPECT_EQ(j["model"]["architecture"], info.architecture);
    for (const char* k : {"path", "name", "n_layer", "n_embd", "n_head", "n_head_kv", "n_expert", "n_expert_used",
                          "n_ff_exp", "n_vocab", "file_bytes", "chat_format"})
        EXPECT_TRUE(j["model"].contains(k)) << k;
    EXPECT_EQ(j["context"]["n_ctx"], test_ctx);
    for (const char* k : {"n_ctx_train", "n_batch", "kv_type", "kv_bytes_per_session", "cached_tokens"})
        EXPECT_TRUE(j["context"].contains(k)) << k;
    EXPECT_GT(j["context"]["cached_tokens"].get<int>(), 0);
    // A short request grew the KV cache by one chunk, not to the whole context.
    const size_t chunk = j["context"]["kv_chunk_tokens"].get<size_t>();
    EXPECT_EQ(j["context"]["kv_bytes_max"].get<size_t>(), info.kv_bytes_per_session);
    EXPECT_EQ(j["context"]["kv_bytes_allocated"].get<size_t>(), info.kv_bytes_per_session * chunk / test_ctx);
    EXPECT_TRUE(j["pool"]["split"].is_boolean());
    EXPECT_TRUE(j["pool"]["reason"].is_string());
    EXPECT_GE(j["pool"]["threads"].get<int>(), 1);
    ASSERT_FALSE(j["pool"]["slices"].empty());
    for (const char* k : {"node", "threads", "cores"}) EXPECT_TRUE(j["pool"]["slices"][0].contains(k)) << k;
    const json& placement = j["placement"];
    EXPECT_EQ(placement["mode"], info.placement_mode);
    EXPECT_EQ(placement["summary"], info.placement);
    EXPECT_TRUE(placement["expert_bytes"].is_number());
    EXPECT_TRUE(placement["region_map"].is_string());
    ASSERT_EQ(placement["nodes"].size(), info.placement_nodes.size());
    for (const json& n : placement["nodes"])
        for (const char* k : {"slice", "node", "bytes", "share", "ok"}) EXPECT_TRUE(n.contains(k)) << k;
    for (const char* k : {"lookups", "hits", "hit_rate"}) EXPECT_TRUE(j["experts"]["vram"].contains(k)) << k;
    EXPECT_GT(j["experts"]["tokens"].get<int>(), 0);
    ASSERT_EQ(j["experts"]["layers"].size(), size_t(info.n_layer));
    EXPECT_EQ(j["experts"]["layers"][0]["counts"].size(), size_t(info.n_expert));
    EXPECT_FALSE(j["experts"]["layers"][0]["hottest"].empty());
    const json& last = j["last_request"];
    EXPECT_EQ(last["endpoint"], "completions");
    EXPECT_EQ(last["finish_reason"], "length");
    EXPECT_EQ(last["stopped_by"], "max_tokens");
    EXPECT_EQ(last["usage"]["completion_tokens"], 3);
    for (const char* k : {"prompt_n", "prompt_ms", "prompt_per_second", "predicted_n", "predicted_ms",
                          "predicted_per_second", "cache_n"})
        EXPECT_TRUE(last["timings"].contains(k)) << k;
    EXPECT_EQ(last["vram"]["lookups"], 0);  // CPU-only
    EXPECT_EQ(last["vram"]["hits"], 0);
    EXPECT_EQ(last["vram"]["hit_rate"], 0.0);
    EXPECT_TRUE(j["cold_regions"].is_array() && j["cold_regions"].empty());  // no PLE table (Qwen4Cold.* has one)
    EXPECT_TRUE(j["queue"]["policy"].is_string());
    EXPECT_TRUE(j["queue"]["running"].is_null());
    EXPECT_EQ(j["queue"]["n_waiting"], 0);
    EXPECT_EQ(j["queue"]["served"], 1);
}

TEST(ServerStatus, HealthWhileLoadingThenReady) {
    test_server s(server_options{}, false);
    const reply loading = s.get("/health");
    EXPECT_EQ(loading.status, 503);
    EXPECT_EQ(loading.parsed()["error"]["message"], "Loading model");
    EXPECT_EQ(loading.parsed()["error"]["type"], "unavailable_error");
    EXPECT_EQ(s.post("/v1/chat/completions", chat_body("hi", 2)).status, 503);
    EXPECT_EQ(s.status()["state"], "loading");
    EXPECT_TRUE(s.get("/v1/models").parsed()["data"].empty());
    s.server().set_model(tiny_model());
    const reply ready = s.get("/health");
    EXPECT_EQ(ready.status, 200);
    EXPECT_EQ(ready.parsed()["status"], "ok");
}

}  // namespace
}  // namespace strata::server::test
