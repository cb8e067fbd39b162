// strata-server -m MODEL.gguf [--host H] [--port P] [--api-key KEY] [engine and sampling flags]:
// listens at once (503 "Loading model" until the model is ready), then serves the OpenAI-compatible
// API. SIGTERM (or POST /admin/drain): drain (readiness fails, new generations get 503, the admitted
// ones finish within --drain-timeout, the conversation is parked), then exit 0. SIGINT, a second
// SIGTERM or the drain timeout: new requests get 503, the running generation stops at its next
// prompt batch or token, and the process exits 0 once the open requests have been answered.
#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <thread>

#include <cxxopts.hpp>
#include <spdlog/fmt/fmt.h>

#include "engine_flags.hpp"
#include "log.hpp"
#include "request_reader.hpp"
#include "strata/server.hpp"
#include "text.hpp"

namespace {

using namespace strata;

constexpr auto shutdown_grace = std::chrono::seconds(30);

cxxopts::Options make_options() {
    cxxopts::Options o("strata-server", "OpenAI-compatible HTTP server for a GGUF Mixture-of-Experts model");
    cli::add_model_flags(o);
    cli::add_sampling_flags(o);
    cli::add_spec_flags(o);
    o.add_options("server")
        ("host", "address to listen on", cxxopts::value<std::string>()->default_value("127.0.0.1"))
        ("port", "port to listen on (0: any free port)", cxxopts::value<int>()->default_value("8080"))
        ("api-key", "require this key (Authorization: Bearer KEY or x-api-key: KEY); default: STRATA_API_KEY",
         cxxopts::value<std::string>())
        ("alias", "model id in /v1/models and responses (default: the model file's name)", cxxopts::value<std::string>())
        ("timeout", "seconds a generation request may take, queue wait included (0: no limit)",
         cxxopts::value<double>()->default_value("600"))
        ("parallel", "generations at once (slots); their tokens share each forward pass (1: one at a time)",
         cxxopts::value<int>()->default_value("4"))
        ("write-timeout", "seconds a streamed answer waits for a client that stopped reading before that request "
                          "ends", cxxopts::value<double>()->default_value("30"))
        ("max-body", "largest request body in bytes (larger: 413)", cxxopts::value<size_t>()->default_value("8388608"))
        ("http-threads", "requests answered at once (each waiting request holds one)",
         cxxopts::value<int>()->default_value("32"))
        ("header-timeout", "seconds a client has to send its request headers (else 408)",
         cxxopts::value<double>()->default_value("10"))
        ("body-timeout", "seconds a client has to send its request body after the headers (else 408)",
         cxxopts::value<double>()->default_value("30"))
        ("max-connections", "connections open at once; more get 503 with Retry-After (0: no cap)",
         cxxopts::value<int>()->default_value("1024"))
        ("max-connections-per-client", "connections open at once from one client address; more get 429 with "
                                       "Retry-After (0: no cap)", cxxopts::value<int>()->default_value("256"))
        ("max-bytes-in-flight", "bytes of request heads and bodies being read or answered, all connections "
                                "together; a request past it gets 503 with Retry-After before its body is read",
         cxxopts::value<size_t>()->default_value("268435456"))
        ("max-waiting-requests", "requests read whole and waiting for a request thread; more get 503 with "
                                 "Retry-After", cxxopts::value<int>()->default_value("256"))
        ("cors-origin", "origins browsers may call from: '*', a comma-separated list, or '' for none (default: '*' "
                        "on a loopback host without an API key, else none)", cxxopts::value<std::string>())
        ("drain-timeout", "seconds SIGTERM or POST /admin/drain lets admitted generations run before stopping them "
                          "(0: SIGTERM stops at once)", cxxopts::value<double>()->default_value("60"))
        ("ready-max-waiting", "/health/ready answers 503 while more generation requests than this wait (0: never)",
         cxxopts::value<int>()->default_value("16"))
        ("admin-key", "key for POST /admin/drain (Authorization: Bearer KEY); default: STRATA_ADMIN_KEY; unset: "
                      "the /admin/ routes answer 403", cxxopts::value<std::string>())
        ("no-webui", "do not serve the chat page (/) and the live view (/dashboard)")
        ("special-in-content", "treat control tokens written in chat messages as tokens (default: as text)")
        ("reasoning-format", "auto: a thinking model's reasoning is returned as reasoning_content; none: it stays "
                             "inline in content", cxxopts::value<std::string>()->default_value("auto"))
        ("h,help", "show help");
    return o;
}

server::server_options server_options_from(const cxxopts::ParseResult& a) {
    server::server_options s;
    s.host = a["host"].as<std::string>();
    s.port = a["port"].as<int>();
    if (a.count("api-key")) s.api_key = a["api-key"].as<std::string>();
    else if (const char* env = std::getenv("STRATA_API_KEY")) s.api_key = env;
    if (a.count("alias")) s.model_id = a["alias"].as<std::string>();
    s.request_timeout_s = a["timeout"].as<double>();
    if (s.request_timeout_s < 0) throw std::invalid_argument("--timeout must be 0 or positive");
    s.parallel = a["parallel"].as<int>();
    if (s.parallel < 1 || s.parallel > 256)
        throw std::invalid_argument(fmt::format("--parallel must be 1..256, got {}", s.parallel));
    s.write_timeout_s = a["write-timeout"].as<double>();
    if (!(s.write_timeout_s >= 0.1))
        throw std::invalid_argument(fmt::format("--write-timeout must be at least 0.1 s, got {:g}", s.write_timeout_s));
    s.max_body_bytes = a["max-body"].as<size_t>();
    if (s.max_body_bytes < 1024) throw std::invalid_argument("--max-body must be at least 1024 bytes");
    s.http_threads = a["http-threads"].as<int>();
    if (s.http_threads < 2) throw std::invalid_argument("--http-threads must be at least 2");
    s.header_timeout_s = a["header-timeout"].as<double>();
    s.body_timeout_s = a["body-timeout"].as<double>();
    if (!(s.header_timeout_s >= 0.1) || !(s.body_timeout_s >= 0.1))
        throw std::invalid_argument(fmt::format("--header-timeout and --body-timeout must be at least 0.1 s, got {:g} "
                                                "and {:g}", s.header_timeout_s, s.body_timeout_s));
    s.max_connections = a["max-connections"].as<int>();
    s.max_connections_per_client = a["max-connections-per-client"].as<int>();
    s.max_bytes_in_flight = a["max-bytes-in-flight"].as<size_t>();
    s.max_waiting_requests = a["max-waiting-requests"].as<int>();
    if (s.max_connections < 0 || s.max_connections_per_client < 0 || s.max_waiting_requests < 1)
        throw std::invalid_argument("--max-connections and --max-connections-per-client must be 0 or positive, "
                                    "--max-waiting-requests at least 1");
    if (s.max_bytes_in_flight < s.max_body_bytes + server::request_reader::max_head_bytes)
        throw std::invalid_argument(fmt::format("--max-bytes-in-flight ({}) must hold at least one request of "
                                                "--max-body ({}) and its head ({})", s.max_bytes_in_flight,
                                                s.max_body_bytes, server::request_reader::max_head_bytes));
    s.ready_max_waiting = a["ready-max-waiting"].as<int>();
    if (s.ready_max_waiting < 0) throw std::invalid_argument("--ready-max-waiting must be 0 or positive");
    if (a.count("admin-key")) s.admin_key = a["admin-key"].as<std::string>();
    else if (const char* env = std::getenv("STRATA_ADMIN_KEY")) s.admin_key = env;
    s.default_sampling = cli::sampling_options_from(a);
    s.default_speculation = cli::speculation_options_from(a);
    if (a.count("cors-origin")) s.cors_origin = a["cors-origin"].as<std::string>();
    s.special_in_content = a.count("special-in-content") > 0;
    s.webui = a.count("no-webui") == 0;
    const std::string reasoning = a["reasoning-format"].as<std::string>();
    if (reasoning != "auto" && reasoning != "none")
        throw std::invalid_argument(fmt::format("--reasoning-format must be auto or none, got '{}'", reasoning));
    s.reasoning_inline = reasoning == "none";
    return s;
}

// POST /admin/drain's way to the signal thread (blocked like the stop signals).
constexpr int drain_signal = SIGUSR2;

const char* signal_name(int sig) { return sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "a drain request"; }

// Drains: waits until the admitted requests are answered, the timeout passes or a second stop signal
// comes. True when it drained whole (the conversation is then parked).
bool drain(server::http_server& srv, const sigset_t& signals, double timeout_s) {
    const auto log = logger("server");
    const auto t0 = std::chrono::steady_clock::now();
    srv.begin_drain();
    const auto until = t0 + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                std::chrono::duration<double>(timeout_s));
    while (srv.in_flight() > 0) {
        if (std::chrono::steady_clock::now() >= until) {
            log->warn("Drain: {} request(s) still running after --drain-timeout {:g} s; stopping them.",
                      srv.in_flight(), timeout_s);
            return false;
        }
        const timespec poll{0, 20'000'000};
        if (const int sig = sigtimedwait(&signals, nullptr, &poll); sig == SIGINT || sig == SIGTERM) {
            log->warn("Received {} while draining; stopping the {} running request(s) now.", signal_name(sig),
                      srv.in_flight());
            return false;
        }
    }
    const size_t parked = srv.park_conversation();
    log->info("Drained in {:.3f} s: every admitted request was answered{}.",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
              parked ? fmt::format("; the last conversation ({} tokens) is parked", parked) : std::string());
    return true;
}

// Waits for SIGINT, SIGTERM or a drain request (blocked in every thread, so only this one sees them),
// drains on SIGTERM or a drain request, then shuts the server down gracefully.
void handle_signals(server::http_server& srv, sigset_t signals, double drain_timeout_s) {
    int sig = 0;
    sigwait(&signals, &sig);
    const auto log = logger("server");
    if (sig != SIGINT && drain_timeout_s > 0) {
        log->info("Received {}; draining (at most {:g} s, --drain-timeout).", signal_name(sig), drain_timeout_s);
        if (drain(srv, signals, drain_timeout_s)) {
            srv.begin_shutdown();
            srv.stop();
            return;
        }
    }
    log->info("Received {}; finishing the open requests (at most {} s).", signal_name(sig), shutdown_grace.count());
    srv.begin_shutdown();
    if (!srv.wait_idle(shutdown_grace))
        logger("server")->warn("{} request(s) still open after {} s; closing anyway.", srv.in_flight(),
                               shutdown_grace.count());
    srv.stop();
}

int serve(const cxxopts::ParseResult& args, sigset_t signals) {
    const model_options mo = cli::model_options_from(args);
    const server::server_options so = server_options_from(args);
    const double drain_timeout_s = args["drain-timeout"].as<double>();
    if (!(drain_timeout_s >= 0)) throw std::invalid_argument("--drain-timeout must be 0 or positive");
    const auto log = logger("server");

    signal(SIGPIPE, SIG_IGN);
    // Every open connection holds a descriptor, idle ones included: use the hard limit, not the soft 1024.
    if (rlimit nofile{}; getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur < nofile.rlim_max) {
        nofile.rlim_cur = nofile.rlim_max;
        setrlimit(RLIMIT_NOFILE, &nofile);
    }

    server::http_server srv(so);
    const int port = srv.bind();
    const std::string base = fmt::format("http://{}:{}", so.host.find(':') != std::string::npos ? "[" + so.host + "]" : so.host, port);
    log->info("Listening on {} (OpenAI base URL {}/v1); loading {}.", base, base, mo.path);
    if (so.webui) log->info("Chat in a browser at {}/ and watch the engine at {}/dashboard.", base, base);
    if (so.api_key.empty() && !server::is_loopback_host(so.host))
        log->warn("No API key and --host {} is not a loopback address: anyone who can reach port {} can use this "
                  "server. Set STRATA_API_KEY or --api-key.", so.host, port);
    if (!so.api_key.empty()) log->info("API key required (Authorization: Bearer KEY or x-api-key: KEY).");

    srv.on_drain_requested([] { kill(getpid(), drain_signal); });
    std::thread http([&srv] { srv.run(); });
    std::thread signal_thread([&srv, signals, drain_timeout_s] { handle_signals(srv, signals, drain_timeout_s); });
    int status = 0;
    try {
        srv.set_model(model::load(mo));
        log->info("Ready. Try: curl {}/v1/chat/completions -H 'Content-Type: application/json'{} -d "
                  "'{{\"messages\": [{{\"role\": \"user\", \"content\": \"Hello!\"}}], \"max_tokens\": 32}}'",
                  base, so.api_key.empty() ? "" : " -H \"Authorization: Bearer $STRATA_API_KEY\"");
    } catch (const std::exception& e) {
        log->error("Cannot load the model: {}", e.what());
        status = 1;
        pthread_kill(signal_thread.native_handle(), SIGTERM);  // the same path as a signal: shut down
    }
    http.join();
    signal_thread.join();
    log->info("strata-server stopped.");
    return status;
}

}  // namespace

int main(int argc, char** argv) {
    // Blocked before anything else (and so in every thread started later): a stop signal that comes
    // while the server starts waits for the signal thread instead of being lost or killing the process.
    sigset_t signals;
    sigemptyset(&signals);
    sigaddset(&signals, SIGINT);
    sigaddset(&signals, SIGTERM);
    sigaddset(&signals, drain_signal);
    pthread_sigmask(SIG_BLOCK, &signals, nullptr);
    try {
        auto options = make_options();
        const auto args = options.parse(argc, argv);
        if (args.count("help")) {
            std::printf("%s\n", options.help().c_str());
            return 0;
        }
        return serve(args, signals);
    } catch (const cxxopts::exceptions::exception& e) {
        std::fprintf(stderr, "strata-server: %s (see --help)\n", e.what());
        return 2;
    } catch (const std::invalid_argument& e) {
        std::fprintf(stderr, "strata-server: %s\n", e.what());
        return 2;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "strata-server: error: %s\n", e.what());
        return 1;
    }
}
