// strata-server in a memory-limited cgroup: a prompt whose keys and values need more memory than the
// limit leaves gets a clean error (the KV cache checks before it commits pages), and the server keeps
// serving. The test makes a child cgroup (v2, or v1's memory hierarchy) and skips where it cannot.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include <gtest/gtest.h>
#include <httplib.h>

#include "server_fixture.hpp"

namespace strata::server::test {
namespace {

namespace fs = std::filesystem;

std::string slurp(const std::string& path) {
    std::ifstream f(path);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

bool write_to(const std::string& path, const std::string& text) {
    std::ofstream f(path);
    f << text;
    f.flush();
    return f.good();
}

// A cgroup made for the test and removed after it; empty dir() where none could be made.
class memory_cgroup {
public:
    memory_cgroup() {
        std::ifstream self("/proc/self/cgroup");
        std::string line;
        while (std::getline(self, line) && dir_.empty()) {
            const size_t a = line.find(':'), b = line.find(':', a + 1);
            if (a == std::string::npos || b == std::string::npos) continue;
            const std::string controllers = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
            const bool v2 = line.compare(0, a, "0") == 0 && controllers.empty();
            if (v2 && slurp("/sys/fs/cgroup" + path + "/cgroup.subtree_control").find("memory") == std::string::npos)
                continue;
            if (!v2 && controllers.find("memory") == std::string::npos) continue;
            const std::string dir = (v2 ? "/sys/fs/cgroup" : "/sys/fs/cgroup/memory") + path + "/strata-test-" +
                                    std::to_string(getpid());
            if (mkdir(dir.c_str(), 0755) != 0) continue;
            dir_ = dir;
            v2_ = v2;
        }
    }
    ~memory_cgroup() {
        if (!dir_.empty()) rmdir(dir_.c_str());
    }
    const std::string& dir() const { return dir_; }
    std::string procs() const { return dir_ + "/cgroup.procs"; }
    size_t usage() const { return std::stoull("0" + slurp(dir_ + (v2_ ? "/memory.current" : "/memory.usage_in_bytes"))); }
    bool limit(size_t bytes) const { return write_to(dir_ + (v2_ ? "/memory.max" : "/memory.limit_in_bytes"), std::to_string(bytes)); }

private:
    std::string dir_;
    bool v2_ = false;
};

// After a generation the KV cache keeps the chunks of its conversation and gives the rest back.
TEST(ServerMemoryLimit, KvCacheGivesMemoryBack) {
    test_server s;
    json ids = json::array();
    for (int i = 0; i < test_ctx - 64; ++i) ids.push_back(1 + i % 50);
    ASSERT_EQ(s.post("/v1/completions", json{{"prompt", ids}, {"max_tokens", 2}}).status, 200);
    const size_t grown = s.status()["context"]["kv_bytes_allocated"].get<size_t>();
    const reply short_one = s.post("/v1/completions", json{{"prompt", json::array({7, 8, 9})}, {"max_tokens", 2}});
    ASSERT_EQ(short_one.status, 200) << short_one.body;
    const size_t after = s.status()["context"]["kv_bytes_allocated"].get<size_t>();
    std::printf("KV cache: %zu bytes after a %d-token prompt, %zu after a 3-token one\n", grown, test_ctx - 64, after);
    EXPECT_GT(grown, 0u);
    EXPECT_LT(after, grown);
    EXPECT_GT(after, 0u);  // the conversation's own chunk stays for its next turn
}

// The value of an unlabelled (or fully labelled) sample in Prometheus text, -1 when absent.
double sample(const std::string& text, const std::string& name) {
    const size_t at = text.find("\n" + name + " ");
    return at == std::string::npos ? -1 : std::stod(text.substr(at + name.size() + 2));
}

// With --mem-budget 1 a prompt whose keys and values need 2 MiB gets a 400 naming the budget and its
// use, the session and the server keep serving, and /v1/status and /metrics show the budget.
TEST(ServerMemoryLimit, PromptPastTheMemoryBudgetFailsCleanly) {
    model_options mo;
    mo.path = tiny_model_path();
    mo.n_ctx = 4 * test_ctx;
    mo.numa_pool = "off";
    mo.cache_ram_mib = 0;
    mo.mem_budget_mib = 1;
    server_options o;
    o.parallel = 2;
    test_server s(o, model::load(mo));
    const json status = s.status();
    ASSERT_EQ(status["memory_budget"]["budget_bytes"], 1u << 20) << status["memory_budget"].dump();
    const double per_token = status["context"]["kv_bytes_max"].get<double>() / mo.n_ctx;
    const int long_tokens = static_cast<int>(2 * (1 << 20) / per_token) - 16;
    if (long_tokens >= mo.n_ctx) GTEST_SKIP() << "the tiny model's context is too small to pass the budget";

    json ids = json::array();
    for (int i = 0; i < long_tokens; ++i) ids.push_back(1 + i % 50);
    const reply big = s.post("/v1/completions", json{{"prompt", ids}, {"max_tokens", 1}});
    EXPECT_EQ(big.status, 400) << big.body;
    EXPECT_NE(big.body.find("memory budget of 1.0 MiB"), std::string::npos) << big.body;
    EXPECT_NE(big.body.find("KV caches"), std::string::npos) << big.body;

    const reply after = s.post("/v1/completions", json{{"prompt", "hi"}, {"max_tokens", 2}});
    EXPECT_EQ(after.status, 200) << after.body;
    EXPECT_EQ(s.get("/health").status, 200);
    const json budget = s.status()["memory_budget"];
    EXPECT_EQ(budget["refusals"], 1) << budget.dump();
    EXPECT_LE(budget["used_bytes"].get<uint64_t>(), 1u << 20) << budget.dump();
    EXPECT_GT(budget["kv_bytes"].get<uint64_t>(), 0u) << budget.dump();
    EXPECT_EQ(budget["used_bytes"], budget["kv_bytes"]) << budget.dump();
    const std::string metrics = s.get("/metrics").body;
    EXPECT_EQ(sample(metrics, "strata_memory_budget_bytes"), double(1 << 20));
    EXPECT_EQ(sample(metrics, "strata_memory_budget_refusals_total"), 1);
    EXPECT_EQ(sample(metrics, "strata_memory_budget_used_bytes{use=\"kv\"}"), budget["kv_bytes"].get<double>());
}

TEST(ServerMemoryLimit, PromptPastACgroupLimitFailsCleanly) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
    GTEST_SKIP() << "a sanitizer's shadow memory counts against the cgroup, so the limit says nothing here";
#endif
    memory_cgroup cg;
    if (cg.dir().empty()) GTEST_SKIP() << "no writable cgroup with the memory controller here";
    const std::string log_path = tiny_model_path() + ".cgroup.log";
    const std::string procs = cg.procs();
    std::vector<std::string> args = {STRATA_SERVER_BIN, "-m", tiny_model_path(), "--port", "0", "--ctx", "32768",
                                     "--numa-pool", "off", "--pool-workers", "1"};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {  // only async-signal-safe calls until exec
        const int p = open(procs.c_str(), O_WRONLY);
        if (p < 0 || write(p, "0", 1) != 1) _exit(90);
        close(p);
        const int out = open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(out, 1);
        dup2(out, 2);
        execv(argv[0], argv.data());
        _exit(91);
    }
    struct reaper {
        pid_t pid;
        ~reaper() {
            kill(pid, SIGKILL);
            waitpid(pid, nullptr, 0);
        }
    } reap{pid};

    int port = 0;
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    static const std::regex listening(R"(Listening on http://127\.0\.0\.1:(\d+))");
    while (port == 0 && std::chrono::steady_clock::now() < until) {
        std::smatch m;
        const std::string log = slurp(log_path);
        if (std::regex_search(log, m, listening)) port = std::stoi(m[1]);
        else std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ASSERT_GT(port, 0) << slurp(log_path);
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(120, 0);
    int health = 0;
    while (health != 200 && std::chrono::steady_clock::now() < until) {
        const auto r = c.Get("/health");
        health = r ? r->status : 0;
        if (health != 200) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ASSERT_EQ(health, 200) << slurp(log_path);
    const auto status = c.Get("/v1/status");
    ASSERT_TRUE(status);
    const double per_token = json::parse(status->body)["context"]["kv_bytes_max"].get<double>() / 32768;

    // Room for the cache's margin and 4 MiB of keys and values; the long prompt needs 4 times that.
    constexpr size_t room = 4u << 20;
    const int long_tokens = std::min(32000, static_cast<int>(4 * room / per_token));
    if (long_tokens * per_token < 2.0 * room) GTEST_SKIP() << "the tiny model's context is too small to pass the limit";
    if (!cg.limit(cg.usage() + (size_t(64) << 20) + room)) GTEST_SKIP() << "cannot set the cgroup's memory limit";
    json ids = json::array();
    for (int i = 0; i < long_tokens; ++i) ids.push_back(1 + i % 50);
    const auto big = c.Post("/v1/completions", json{{"prompt", ids}, {"max_tokens", 1}}.dump(), "application/json");
    ASSERT_TRUE(big) << "no answer: the server was killed?\n" << slurp(log_path).substr(0, 4000);
    EXPECT_EQ(big->status, 400) << big->body;
    EXPECT_NE(big->body.find("not enough memory"), std::string::npos) << big->body;

    const auto after = c.Post("/v1/completions", json{{"prompt", "hi"}, {"max_tokens", 2}}.dump(), "application/json");
    ASSERT_TRUE(after);
    EXPECT_EQ(after->status, 200) << after->body;
    EXPECT_EQ(c.Get("/health")->status, 200);
}

}  // namespace
}  // namespace strata::server::test
