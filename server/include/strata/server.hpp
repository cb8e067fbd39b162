// strata-server as a library: an OpenAI-compatible HTTP server over one loaded model. Requests that
// generate take one of `parallel` slots (engine sessions) in arrival order, preferring the free slot
// whose cache shares the longest prefix with the prompt; the slots' generations advance together in
// the engine's batched steps. Everything else (health, status, metrics, tokenize) is answered
// while a generation runs.
//
// Thread-safety: bind() and run() from one thread; set_model(), begin_shutdown(), begin_drain(),
// on_drain_requested(), park_conversation(), stop() and in_flight() from any thread.
#pragma once

#include <chrono>
#include <functional>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>

#include "strata/engine.hpp"

namespace strata::server {

struct server_options {
    std::string host = "127.0.0.1";
    int port = 8080;                        // 0: any free port (bind() returns it)
    std::string api_key;                    // empty: no authentication
    std::string model_id;                   // the id /v1/models reports; empty: the model file's name
    size_t max_body_bytes = 8u << 20;       // larger request bodies get 413
    double request_timeout_s = 600;         // queue wait plus generation; 0: no limit
    int parallel = 1;                       // generations at once (slots); strata-server's --parallel: 4
    double write_timeout_s = 30;            // a streamed answer's client that stops reading this long is cut
    int http_threads = 32;                  // requests answered at once (each waiting request holds one)
    double header_timeout_s = 10;           // a connection's request head must be whole this long after it
                                            // connects (or, kept alive, after its first byte): else 408
    double body_timeout_s = 30;             // the body must be whole this long after the head: else 408
    int max_connections = 1024;             // open at once; more get 503 with Retry-After (0: no cap)
    int max_connections_per_client = 256;   // open at once from one address; more get 429 (0: no cap)
    size_t max_bytes_in_flight = 256u << 20;  // request heads and bodies being read or answered; past it 503
    int max_waiting_requests = 256;         // complete requests waiting for a request thread; more get 503
    sampling_options default_sampling;      // for fields a request leaves out
    speculation_options default_speculation;  // --spec-type, --spec, --spec-min-p: every request's
    bool special_in_content = false;        // control tokens written in chat messages count as tokens
    bool webui = true;                      // serve the chat page at / and the live view at /dashboard
    bool reasoning_inline = false;          // --reasoning-format none: <think>...</think> stays in content
    // /health/ready answers 503 while more generation requests than this wait for the engine (0: never).
    int ready_max_waiting = 16;
    // Key for the /admin/ routes (Authorization: Bearer KEY or x-api-key: KEY); empty: they answer 403.
    std::string admin_key;
    // Origins browsers may call from (CORS): "*", or origins separated by commas ("https://a.example,
    // http://localhost:3000"); "" for none. Unset: "*" on a loopback host without an API key, else none.
    std::optional<std::string> cors_origin;
};

class http_server {
public:
    explicit http_server(server_options options);
    ~http_server();
    http_server(const http_server&) = delete;
    http_server& operator=(const http_server&) = delete;

    // Binds host:port and returns the port. Throws std::runtime_error naming both when it cannot.
    int bind();
    // Serves until stop(); returns once every connection has been closed.
    void run();

    // Until a model is set, /health and every model endpoint answer 503 ("Loading model"). Call once.
    void set_model(std::shared_ptr<model> m);

    // From now on new requests get 503, requests waiting in the queue get 503, and the running
    // generation stops at its next token. Idempotent.
    void begin_shutdown();
    // Drain (SIGTERM, POST /admin/drain): /health/ready answers 503 and new generation requests get 503
    // with Retry-After, while the ones already admitted run to their end. Idempotent; false when the
    // server was already draining.
    bool begin_drain();
    bool draining() const;
    // Called (once, on the request's thread) when POST /admin/drain starts a drain: the binary finishes
    // it from there (waits for in_flight() to reach 0, parks, stops).
    void on_drain_requested(std::function<void()> fn);
    // Parks every slot's conversation in the conversation cache, taking a queue turn per slot (waits
    // for the running generations). The number of tokens parked (0: none, or no model).
    size_t park_conversation();
    // Closes the listening socket; run() returns when the open connections are done. Before run()
    // too: run() then returns at once.
    void stop();
    // Generation requests being handled right now (waiting, generating or streaming their answer).
    int in_flight() const;
    // Waits until in_flight() is 0 or the timeout passes; true when it reached 0.
    bool wait_idle(std::chrono::milliseconds timeout) const;

    struct impl;

private:
    std::unique_ptr<impl> impl_;
};

}  // namespace strata::server
