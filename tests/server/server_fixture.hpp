// Helpers for the strata-server tests: a tiny generated model, an in-process server on an ephemeral
// loopback port, JSON and SSE requests, a raw socket client for disconnects and malformed requests.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>
#include <spdlog/sinks/ringbuffer_sink.h>

#include "strata/engine.hpp"
#include "strata/server.hpp"

namespace strata::server::test {

using json = nlohmann::json;

inline constexpr int test_ctx = 1024;

// Generated once per test process into its own temporary folder (removed at exit).
const std::string& tiny_model_path();
// Loaded once per process with --ctx test_ctx and the pool split off.
std::shared_ptr<model> tiny_model();

// The tiny model loaded again with a context of hold_ctx tokens, for a generation that holds the
// engine (hold_tokens long: seconds even on a fast machine) until its client leaves or the server
// stops it, while a test arranges the queue behind it.
inline constexpr int hold_ctx = 32768;
inline constexpr int hold_tokens = hold_ctx - 32;
std::shared_ptr<model> hold_model();

// For long prompts: the demo preset (slower per token than tiny), loaded once per process with
// --ctx long_ctx and --batch long_batch, so a prompt of a few thousand tokens takes seconds and many batches.
inline constexpr int long_ctx = 4096;
inline constexpr int long_batch = 16;
std::shared_ptr<model> long_prompt_model();

struct reply {
    int status = 0;                            // 0: no HTTP answer (connection failed or cut)
    std::string body;
    std::multimap<std::string, std::string> headers;
    json parsed() const;                       // the body as JSON (a test failure when it is not)
    std::string header(const std::string& name) const;
};

struct sse_reply {
    int status = 0;
    std::string content_type;
    std::vector<std::string> data;             // the "data: " payloads in order ("[DONE]" included)
    std::vector<json> chunks() const;          // the JSON payloads (all but [DONE])
};

class test_server {
public:
    explicit test_server(server_options o = {}, bool with_model = true);
    test_server(server_options o, std::shared_ptr<model> m);
    ~test_server();
    test_server(const test_server&) = delete;
    test_server& operator=(const test_server&) = delete;

    int port() const { return port_; }
    http_server& server() { return *server_; }

    reply get(const std::string& path, const std::map<std::string, std::string>& headers = {}) const;
    reply post(const std::string& path, const std::string& body,
               const std::map<std::string, std::string>& headers = {}) const;
    reply post(const std::string& path, const json& body, const std::map<std::string, std::string>& headers = {}) const {
        return post(path, body.dump(), headers);
    }
    reply send(const std::string& method, const std::string& path, const std::string& body = {},
               const std::map<std::string, std::string>& headers = {}) const;
    sse_reply post_stream(const std::string& path, const json& body,
                          const std::map<std::string, std::string>& headers = {}) const;
    json status() const { return get("/v1/status").parsed(); }

    // Waits until /v1/status shows `n` requests waiting (false after the timeout).
    bool wait_for_waiting(size_t n, std::chrono::milliseconds timeout = std::chrono::seconds(20)) const;

    // Begins a graceful shutdown and stops; the destructor does this when a test did not.
    void shut_down();

private:
    std::unique_ptr<http_server> server_;
    std::thread thread_;
    int port_ = 0;
    bool stopped_ = false;
};

// A plain TCP connection to 127.0.0.1:port for requests cpp-httplib's client would not send (bad
// request lines) and for disconnecting in the middle of a stream.
class raw_connection {
public:
    // receive_buffer > 0: SO_RCVBUF before connecting (a client whose window fills fast).
    explicit raw_connection(int port, int receive_buffer = 0);
    ~raw_connection();
    raw_connection(const raw_connection&) = delete;
    raw_connection& operator=(const raw_connection&) = delete;
    void send_all(const std::string& bytes);
    // Reads until `needle` has arrived (true) or the timeout passes (false); everything read so far in received().
    bool read_until(const std::string& needle, std::chrono::milliseconds timeout = std::chrono::seconds(20));
    const std::string& received() const { return received_; }
    void close();

private:
    int fd_ = -1;
    std::string received_;
};

std::string http_post_text(const std::string& path, const std::string& body);

// A chat request body with one user message.
json chat_body(const std::string& content, int max_tokens, bool stream = false);

// Everything the "server" logger writes while it lives (the last 4,096 lines).
class log_capture {
public:
    log_capture();
    ~log_capture();
    log_capture(const log_capture&) = delete;
    log_capture& operator=(const log_capture&) = delete;
    std::string text() const;                           // every line, concatenated
    size_t count(const std::string& needle) const;      // lines that contain needle

private:
    std::shared_ptr<spdlog::sinks::ringbuffer_sink_mt> sink_;
};

}  // namespace strata::server::test
