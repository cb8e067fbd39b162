// strata-bench server: N concurrent clients x M short completions against strata-server, either a
// running one (--url) or one started in-process on a generated tiny model (the default). Prints
// requests/s next to the engine alone doing the same generations one after another (in-process
// only), p50/p99 latency, and the server's resident memory before and after the requests. With
// --abuse it runs the same load again beside idle connections and slow clients that trickle their
// headers or body, and prints both latencies.
#include <netdb.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include <cxxopts.hpp>
#include <httplib.h>
#include <nlohmann/json.hpp>
#include <spdlog/fmt/fmt.h>

#include "conversation_bench.hpp"
#include "generate.hpp"
#include "modes.hpp"
#include "strata/engine.hpp"
#include "strata/server.hpp"

namespace strata::bench {
namespace {

using clock_type = std::chrono::steady_clock;
using json = nlohmann::json;

// VmRSS of a process in MiB, or a negative number when it cannot be read.
double resident_mib(pid_t pid) {
    std::ifstream f(fmt::format("/proc/{}/status", pid));
    for (std::string line; std::getline(f, line);)
        if (line.rfind("VmRSS:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;
    return -1;
}

std::string rss_text(double mib) { return mib < 0 ? std::string("n/a") : fmt::format("{:.1f} MiB", mib); }

double percentile(std::vector<double> v, double p) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    const size_t i = std::min(v.size() - 1, static_cast<size_t>(p / 100.0 * static_cast<double>(v.size() - 1) + 0.5));
    return v[i];
}

json request_body(int client, int i, int max_tokens) {
    return {{"prompt", fmt::format("Client {} sends request {} about the weather", client, i)},
            {"max_tokens", max_tokens}, {"temperature", 0}, {"ignore_eos", true}};
}

struct load_result {
    std::vector<double> latency_ms;
    int errors = 0;
    double wall_s = 0;
};

load_result run_load(const std::string& host, int port, const std::string& api_key, int clients, int per_client,
                     int max_tokens) {
    load_result out;
    std::vector<std::vector<double>> lat(static_cast<size_t>(clients));
    std::vector<int> errors(static_cast<size_t>(clients), 0);
    std::vector<std::thread> threads;
    const auto t0 = clock_type::now();
    for (int c = 0; c < clients; ++c)
        threads.emplace_back([&, c] {
            httplib::Client cli(host, port);
            cli.set_keep_alive(true);
            cli.set_tcp_nodelay(true);
            cli.set_read_timeout(600, 0);
            httplib::Headers headers;
            if (!api_key.empty()) headers.emplace("Authorization", "Bearer " + api_key);
            for (int i = 0; i < per_client; ++i) {
                const auto start = clock_type::now();
                const auto r = cli.Post("/v1/completions", headers, request_body(c, i, max_tokens).dump(), "application/json");
                lat[size_t(c)].push_back(std::chrono::duration<double, std::milli>(clock_type::now() - start).count());
                if (!r || r->status != 200) ++errors[size_t(c)];
            }
        });
    for (auto& t : threads) t.join();
    out.wall_s = std::chrono::duration<double>(clock_type::now() - t0).count();
    for (size_t c = 0; c < lat.size(); ++c) {
        out.latency_ms.insert(out.latency_ms.end(), lat[c].begin(), lat[c].end());
        out.errors += errors[c];
    }
    return out;
}

// Connections that hold a server's attention without finishing a request: `idle` send nothing,
// `slow` send a request line and then a header line (even ones) or a body byte (odd ones) every 200 ms
// for as long as this lives.
class abusers {
public:
    abusers(const std::string& host, int port, int idle, int slow) {
        rlimit r{};
        const rlim_t need = static_cast<rlim_t>(idle + slow) * 2 + 512;
        if (getrlimit(RLIMIT_NOFILE, &r) == 0 && r.rlim_cur < need && r.rlim_max >= need) {
            r.rlim_cur = need;
            setrlimit(RLIMIT_NOFILE, &r);
        }
        for (int i = 0; i < idle; ++i) idle_.push_back(connect_to(host, port));
        for (int i = 0; i < slow; ++i) {
            slow_.push_back(connect_to(host, port));
            send_text(slow_.back(), i % 2 ? "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\n"
                                          : "POST /v1/completions HTTP/1.1\r\nHost: x\r\n");
        }
        trickle_ = std::thread([this] {
            while (running_) {
                for (size_t i = 0; i < slow_.size(); ++i) send_text(slow_[i], i % 2 ? "[" : "X-Slow: 1\r\n");
                std::this_thread::sleep_for(std::chrono::milliseconds(200));
            }
        });
    }
    ~abusers() {
        running_ = false;
        trickle_.join();
        for (const int fd : idle_) ::close(fd);
        for (const int fd : slow_) ::close(fd);
    }
    abusers(const abusers&) = delete;
    abusers& operator=(const abusers&) = delete;

private:
    static int connect_to(const std::string& host, int port) {
        addrinfo hints{}, *found = nullptr;
        hints.ai_socktype = SOCK_STREAM;
        if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0 || !found)
            throw std::runtime_error(fmt::format("cannot resolve {}", host));
        const int fd = socket(found->ai_family, SOCK_STREAM, 0);
        const bool ok = fd >= 0 && connect(fd, found->ai_addr, found->ai_addrlen) == 0;
        freeaddrinfo(found);
        if (!ok) throw std::runtime_error(fmt::format("cannot connect to {}:{} ({} open)", host, port, fd));
        return fd;
    }
    static void send_text(int fd, const std::string& s) { (void)!::send(fd, s.data(), s.size(), MSG_NOSIGNAL); }

    std::vector<int> idle_, slow_;
    std::atomic<bool> running_{true};
    std::thread trickle_;
};

// The same generations through the engine API alone, one after another: the ceiling the server's
// queue can reach, since it runs one generation at a time.
double engine_requests_per_second(const std::shared_ptr<model>& m, int n, int max_tokens) {
    session s(m);
    generation_options g;
    g.max_tokens = max_tokens;
    g.sampling.temperature = 0;
    g.ignore_eos = true;
    const auto t0 = clock_type::now();
    for (int i = 0; i < n; ++i)
        s.generate(m->tokenize(request_body(i % 8, i, max_tokens)["prompt"].get<std::string>(), true, true), g);
    return n / std::chrono::duration<double>(clock_type::now() - t0).count();
}

int run(int argc, char** argv) {
    cxxopts::Options opts("strata-bench server", "Requests/s, latency and memory of strata-server under concurrent clients");
    opts.add_options()
        ("url", "a running server, http://HOST:PORT (default: start one in-process)", cxxopts::value<std::string>())
        ("pid", "the running server's process id, for its resident memory (with --url)", cxxopts::value<int>())
        ("api-key", "API key for --url (default: STRATA_API_KEY)", cxxopts::value<std::string>())
        ("m,model", "model for the in-process server (default: a generated tiny model)", cxxopts::value<std::string>())
        ("clients", "concurrent clients", cxxopts::value<int>()->default_value("8"))
        ("requests", "requests in all (split evenly across clients)", cxxopts::value<int>()->default_value("1000"))
        ("max-tokens", "tokens generated per request", cxxopts::value<int>()->default_value("8"))
        ("conversations", "N conversations taking turns: time to first token of returning turns with the "
                          "conversation cache on and off (default model: the demo preset, context 8192)",
         cxxopts::value<int>())
        ("history", "with --conversations: tokens of each conversation's opening prompt",
         cxxopts::value<int>()->default_value("2000"))
        ("turns", "with --conversations: turns per conversation", cxxopts::value<int>()->default_value("3"))
        ("cache-ram", "with --conversations: the cache-on arm's budget in MiB (default: the engine's)",
         cxxopts::value<int>())
        ("edit", "with --conversations: after the turns, each conversation's last question again, reworded "
                 "(time to first token of an edited turn)")
        ("abuse", "run the load again beside --idle idle connections and --slow clients trickling headers or a body")
        ("idle", "with --abuse: connections that send nothing", cxxopts::value<int>()->default_value("500"))
        ("slow", "with --abuse: clients sending a header line or a body byte every 200 ms",
         cxxopts::value<int>()->default_value("64"))
        ("h,help", "show help");
    const auto a = opts.parse(argc, argv);
    if (a.count("help")) {
        std::printf("%s\n", opts.help().c_str());
        return 0;
    }
    if (a.count("conversations")) {
        conversation_bench_options c;
        if (a.count("model")) c.model = a["model"].as<std::string>();
        c.conversations = std::max(1, a["conversations"].as<int>());
        c.history = std::max(1, a["history"].as<int>());
        c.turns = std::max(2, a["turns"].as<int>());
        if (a.count("max-tokens")) c.max_tokens = std::max(1, a["max-tokens"].as<int>());
        if (a.count("cache-ram")) c.cache_ram_mib = a["cache-ram"].as<int>();
        c.edit = a.count("edit") > 0;
        return run_conversation_bench(c);
    }
    const int clients = std::max(1, a["clients"].as<int>());
    const int per_client = std::max(1, a["requests"].as<int>() / clients);
    const int max_tokens = std::max(1, a["max-tokens"].as<int>());
    std::string api_key;
    if (a.count("api-key")) api_key = a["api-key"].as<std::string>();
    else if (const char* env = std::getenv("STRATA_API_KEY")) api_key = env;

    std::string host = "127.0.0.1", where;
    int port = 0;
    pid_t server_pid = -1;
    std::unique_ptr<server::http_server> srv;
    std::thread serving;
    std::shared_ptr<model> m;
    std::filesystem::path temp_dir;
    if (a.count("url")) {
        std::smatch u;
        const std::string url = a["url"].as<std::string>();
        if (!std::regex_match(url, u, std::regex(R"(http://([^:/]+):(\d+)/?)")))
            throw std::invalid_argument("--url must look like http://HOST:PORT, got " + url);
        host = u[1];
        port = std::stoi(u[2]);
        if (a.count("pid")) server_pid = a["pid"].as<int>();
        where = "server at " + url;
    } else {
        std::string path;
        if (a.count("model")) {
            path = a["model"].as<std::string>();
        } else {
            temp_dir = std::filesystem::temp_directory_path() / fmt::format("strata-bench-server-{}", getpid());
            std::filesystem::create_directories(temp_dir);
            path = (temp_dir / "tiny.gguf").string();
            make_model::build_model(make_model::preset("tiny")).write_file(path);
        }
        model_options mo;
        mo.path = path;
        mo.n_ctx = 512;
        m = model::load(mo);
        server::server_options so;
        so.port = 0;
        so.api_key = api_key;
        srv = std::make_unique<server::http_server>(so);
        port = srv->bind();
        srv->set_model(m);
        serving = std::thread([&] { srv->run(); });
        server_pid = getpid();
        where = fmt::format("in-process server on {} (resident memory includes the bench's clients)", path);
    }

    // With --abuse the two runs are compared: a short warm-up first, so the first is not the colder.
    if (a.count("abuse")) run_load(host, port, api_key, clients, std::max(1, per_client / 10), max_tokens);
    const double rss_before = server_pid > 0 ? resident_mib(server_pid) : -1;
    const load_result r = run_load(host, port, api_key, clients, per_client, max_tokens);
    const double rss_after = server_pid > 0 ? resident_mib(server_pid) : -1;
    const int n = clients * per_client;

    fmt::print("strata-bench server: {} clients x {} requests ({} in all), {} tokens each, {}\n", clients, per_client, n,
               max_tokens, where);
    fmt::print("  throughput : {:.1f} requests/s ({:.2f} s)", n / r.wall_s, r.wall_s);
    if (m) {
        const double engine = engine_requests_per_second(m, std::min(n, 200), max_tokens);
        fmt::print("; engine alone, one after another: {:.1f} requests/s (HTTP + queue cost {:.2f} ms per request)",
                   engine, std::max(0.0, (r.wall_s / n - 1.0 / engine) * 1000));
    }
    fmt::print("\n  latency    : p50 {:.1f} ms, p99 {:.1f} ms, max {:.1f} ms\n", percentile(r.latency_ms, 50),
               percentile(r.latency_ms, 99), percentile(r.latency_ms, 100));
    fmt::print("  server RSS : before {}, after {} requests {}", rss_text(rss_before), n, rss_text(rss_after));
    if (rss_before > 0 && rss_after > 0) fmt::print(" ({:+.1f} MiB)", rss_after - rss_before);
    fmt::print("\n  errors     : {}\n", r.errors);
    int errors = r.errors;
    if (a.count("abuse")) {
        const int idle = std::max(0, a["idle"].as<int>()), slow = std::max(0, a["slow"].as<int>());
        load_result b;
        {
            const abusers crowd(host, port, idle, slow);
            std::this_thread::sleep_for(std::chrono::milliseconds(300));
            b = run_load(host, port, api_key, clients, per_client, max_tokens);
        }
        const double p99 = percentile(r.latency_ms, 99), abused_p99 = percentile(b.latency_ms, 99);
        fmt::print("  beside {} idle and {} slow connections: p50 {:.1f} ms, p99 {:.1f} ms ({:.2f}x the p99 above), "
                   "max {:.1f} ms, {:.1f} requests/s, errors {}\n", idle, slow, percentile(b.latency_ms, 50),
                   abused_p99, abused_p99 / std::max(p99, 1e-9), percentile(b.latency_ms, 100), n / b.wall_s, b.errors);
        errors += b.errors;
    }

    if (srv) {
        srv->begin_shutdown();
        srv->wait_idle(std::chrono::seconds(10));
        srv->stop();
        serving.join();
    }
    if (!temp_dir.empty()) std::filesystem::remove_all(temp_dir);
    return errors == 0 ? 0 : 1;
}

register_mode reg{{"server", "requests/s, p50/p99 latency and resident memory of strata-server under N clients", &run}};

}  // namespace
}  // namespace strata::bench
