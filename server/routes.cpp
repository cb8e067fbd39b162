#include "routes.hpp"

#include <algorithm>
#include <cctype>
#include <optional>
#include <regex>
#include <string_view>
#include <vector>

#include <httplib.h>
#include <spdlog/fmt/fmt.h>

#include "api_error.hpp"
#include "completions.hpp"
#include "json_depth.hpp"
#include "openai_response.hpp"
#include "status.hpp"
#include "text.hpp"
#include "webui.hpp"

namespace strata::server {
namespace {

using handler = std::function<void(server_state&, const httplib::Request&, httplib::Response&)>;

struct route {
    std::string_view path;     // a regular expression over the whole path, as cpp-httplib reads it
    std::string_view method;   // "GET" | "POST" | "OPTIONS"
    std::string_view name;     // the label in /metrics
    bool open = false;         // served without the API key
    bool during_shutdown = false;
    handler run;
};

void send_json(httplib::Response& res, int status, const json& body) {
    res.status = status;
    res.set_content(to_text(body), "application/json");
}

void send_error(httplib::Response& res, const api_error& e) {
    send_json(res, e.status, error_body(e));
    if (e.status == 401) res.set_header("WWW-Authenticate", "Bearer");
}

std::shared_ptr<model> require_model(const server_state& state) {
    auto m = state.loaded_model();
    if (!m) throw api_error(503, "Loading model", "unavailable_error", "", "loading");
    return m;
}

std::optional<std::string_view> header_of(const httplib::Request& req, const char* name) {
    const auto it = req.headers.find(name);
    return it == req.headers.end() ? std::nullopt : std::optional<std::string_view>(it->second);
}

void check_api_key(const server_state& state, const httplib::Request& req) {
    if (auto e = api_key_problem(state, header_of(req, "Authorization"), header_of(req, "x-api-key"))) throw *e;
}

std::optional<std::string> allowed_origin(const server_state& state, const httplib::Request& req) {
    return cors_origin_for(state, header_of(req, "Origin"));
}

void add_cors_headers(const server_state& state, const httplib::Request& req, httplib::Response& res) {
    const auto origin = allowed_origin(state, req);
    if (!origin) return;
    res.set_header("Access-Control-Allow-Origin", *origin);
    if (*origin != "*") res.set_header("Vary", "Origin");
}

// A CORS preflight (browsers send it without credentials, so it needs no key): 204, and the
// permissions when the origin is allowed (add_cors_headers adds the origin itself).
void handle_preflight(server_state& state, const httplib::Request& req, httplib::Response& res) {
    res.status = 204;
    res.set_header("Allow", "GET, POST, OPTIONS");
    if (!allowed_origin(state, req)) return;
    res.set_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS");
    // A wildcard does not cover Authorization, so the headers the browser asks for are named.
    const std::string asked = req.get_header_value("Access-Control-Request-Headers");
    res.set_header("Access-Control-Allow-Headers", asked.empty() ? "Authorization, Content-Type, x-api-key" : asked);
    res.set_header("Access-Control-Max-Age", "86400");
}

void handle_health(server_state& state, const httplib::Request&, httplib::Response& res) {
    require_model(state);
    send_json(res, 200, {{"status", "ok"}});
}

// Kubernetes' liveness probe: 200 while the process answers (loading and draining included).
void handle_live(server_state&, const httplib::Request&, httplib::Response& res) {
    send_json(res, 200, {{"status", "alive"}});
}

// A balancer's readiness check: 503 while loading, draining, shutting down or with more than
// --ready-max-waiting requests queued; 200 otherwise.
void handle_ready(server_state& state, const httplib::Request&, httplib::Response& res) {
    const size_t waiting = state.queue.state().waiting.size();
    const std::string_view why = state.not_ready_reason();
    if (why.empty()) {
        send_json(res, 200, {{"status", "ready"}, {"waiting", waiting}});
        return;
    }
    const std::string message = why == "loading" ? "Loading model"
                                : why == "busy"  ? fmt::format("{} requests are waiting for the engine, more than "
                                                               "--ready-max-waiting {}", waiting,
                                                               state.options.ready_max_waiting)
                                : why == "draining" ? "the server is draining: running generations finish, new ones "
                                                      "go elsewhere"
                                                    : "the server is shutting down";
    throw api_error(503, message, "unavailable_error", "", std::string(why));
}

// POST /admin/drain with the admin key: starts a drain (the binary then exits once it is done).
void handle_admin_drain(server_state& state, const httplib::Request& req, httplib::Response& res) {
    if (state.options.admin_key.empty())
        throw api_error(403, "no admin key is set (--admin-key or STRATA_ADMIN_KEY): the /admin/ routes are off",
                        "permission_error", "", "admin_disabled");
    if (auto e = key_problem(state.options.admin_key, header_of(req, "Authorization"), header_of(req, "x-api-key")))
        throw *e;
    const bool started = state.request_drain();
    send_json(res, 202, {{"status", "draining"}, {"started", started}, {"in_flight", state.in_flight.load()}});
}

void handle_tokenize(server_state& state, const httplib::Request& req, httplib::Response& res) {
    const auto m = require_model(state);
    const tokenize_request r = parse_tokenize_request(parse_body(req.body));
    const std::vector<int32_t> ids = m->tokenize(r.content, r.add_special, r.parse_special);
    json tokens = json::array();
    for (int32_t id : ids) {
        if (!r.with_pieces) {
            tokens.push_back(id);
            continue;
        }
        // llama-server: the piece as a string when it is whole UTF-8, else its bytes.
        const std::string piece = m->token_text(id);
        json bytes = json::array();
        for (unsigned char c : piece) bytes.push_back(int(c));
        tokens.push_back({{"id", id}, {"piece", find_invalid_utf8(piece) ? bytes : json(piece)}});
    }
    send_json(res, 200, {{"tokens", std::move(tokens)}});
}

void handle_detokenize(server_state& state, const httplib::Request& req, httplib::Response& res) {
    const auto m = require_model(state);
    const std::vector<int32_t> ids = parse_detokenize_request(parse_body(req.body));
    try {
        // Control tokens as their text, as llama-server does: /tokenize's output round-trips.
        send_json(res, 200, {{"content", m->detokenize(ids, true)}});
    } catch (const request_error& e) {
        throw bad_field("tokens", e.what());
    }
}

void handle_model(server_state& state, const httplib::Request& req, httplib::Response& res) {
    const auto m = require_model(state);
    const std::string id = req.matches.size() > 1 ? req.matches[1].str() : std::string();
    if (id != state.model_id())
        throw api_error(404, fmt::format("The model '{}' does not exist: this server serves '{}'", id, state.model_id()),
                        "invalid_request_error", "model", "model_not_found");
    send_json(res, 200, model_json(state, *m));
}

// The embedded pages (server/webui), served without the key: the pages ask for it when the API answers 401.
// Their scripts come only from this server, so model output that slips HTML into a page cannot run script.
void handle_webui(server_state& state, const httplib::Request& req, httplib::Response& res) {
    const webui::asset* a = webui::find(req.path);
    if (!state.options.webui || !a)
        throw api_error(404, !state.options.webui ? fmt::format("{} is off: the server runs with --no-webui", req.path)
                             : webui::assets().empty() ? fmt::format("{}: this strata-server was built without its web "
                                                                     "pages (-DSTRATA_WEBUI=OFF)", req.path)
                                                       : fmt::format("Invalid URL (GET {})", req.path),
                        "not_found_error", "", "not_found");
    res.status = 200;
    res.set_content(std::string(a->body), std::string(a->content_type));
    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Content-Type-Options", "nosniff");
    res.set_header("Content-Security-Policy", "default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:");
}

const std::vector<route>& route_table() {
    static const std::vector<route> table = {
        {"/health", "GET", "health", true, false, handle_health},
        {"/v1/health", "GET", "health", true, false, handle_health},
        {"/health/live", "GET", "health", true, true, handle_live},
        {"/health/ready", "GET", "health", true, true, handle_ready},
        {"/admin/drain", "POST", "admin", true, true, handle_admin_drain},
        {"/v1/models", "GET", "models", false, false,
         [](server_state& s, const httplib::Request&, httplib::Response& res) { send_json(res, 200, models_json(s)); }},
        {"/models", "GET", "models", false, false,
         [](server_state& s, const httplib::Request&, httplib::Response& res) { send_json(res, 200, models_json(s)); }},
        {"/v1/models/(.+)", "GET", "models", false, false, handle_model},
        {"/models/(.+)", "GET", "models", false, false, handle_model},
        {".*", "OPTIONS", "preflight", true, true, handle_preflight},
        {"/v1/status", "GET", "status", false, true,
         [](server_state& s, const httplib::Request&, httplib::Response& res) { send_json(res, 200, status_json(s)); }},
        {"/metrics", "GET", "metrics", false, true,
         [](server_state& s, const httplib::Request&, httplib::Response& res) {
             res.status = 200;
             res.set_content(metrics_text(s), "text/plain; version=0.0.4; charset=utf-8");
         }},
        {"/v1/chat/completions", "POST", "chat", false, false,
         [](server_state& s, const httplib::Request& q, httplib::Response& r) { handle_completion(s, q, r, endpoint::chat); }},
        {"/chat/completions", "POST", "chat", false, false,
         [](server_state& s, const httplib::Request& q, httplib::Response& r) { handle_completion(s, q, r, endpoint::chat); }},
        {"/v1/completions", "POST", "completions", false, false,
         [](server_state& s, const httplib::Request& q, httplib::Response& r) {
             handle_completion(s, q, r, endpoint::completions);
         }},
        {"/completions", "POST", "completions", false, false,
         [](server_state& s, const httplib::Request& q, httplib::Response& r) {
             handle_completion(s, q, r, endpoint::completions);
         }},
        {"/tokenize", "POST", "tokenize", false, false, handle_tokenize},
        {"/", "GET", "webui", true, true, handle_webui},
        {"/dashboard", "GET", "webui", true, true, handle_webui},
        {"/webui/.+", "GET", "webui", true, true, handle_webui},
        {"/detokenize", "POST", "detokenize", false, false, handle_detokenize},
    };
    return table;
}

// Any path and method not in the table: 405 with Allow for a known path, else 404.
void handle_unrouted(server_state&, const httplib::Request& req, httplib::Response& res) {
    std::string allow;
    for (const route& r : route_table())
        if (r.path == req.path && allow.find(r.method) == std::string::npos)
            allow += (allow.empty() ? "" : ", ") + std::string(r.method);
    if (!allow.empty()) {
        res.set_header("Allow", allow);
        throw api_error(405, fmt::format("{} is not allowed on {} (allowed: {})", req.method, req.path, allow),
                        "invalid_request_error", "", "method_not_allowed");
    }
    throw api_error(404, fmt::format("Invalid URL ({} {})", req.method, req.path), "not_found_error", "", "not_found");
}

// Runs a route's handler so that nothing escapes: every failure becomes an error object, and each
// answer is counted under the route's name.
httplib::Server::Handler guarded(server_state& state, const route& r) {
    return [&state, &r](const httplib::Request& req, httplib::Response& res) {
        try {
            if (!r.open) check_api_key(state, req);
            if (state.shutting_down.load() && !r.during_shutdown) {
                res.set_header("Retry-After", "1");
                throw api_error(503, "the server is shutting down", "unavailable_error", "", "shutting_down");
            }
            check_json_depth(req.body);
            r.run(state, req, res);
        } catch (const api_error& e) {
            send_error(res, e);
            state.log->info("{} {} from {} answered {}: {}", req.method, req.path, req.remote_addr, e.status, e.what());
        } catch (const std::exception& e) {
            state.log->error("{} {} failed: {}", req.method, req.path, e.what());
            send_error(res, api_error(500, fmt::format("internal error: {}", e.what()), "server_error"));
        } catch (...) {
            state.log->error("{} {} failed with an unknown exception.", req.method, req.path);
            send_error(res, api_error(500, "internal error", "server_error"));
        }
        add_cors_headers(state, req, res);
        state.counters.count_request(std::string(r.name), res.status);
    };
}

}  // namespace

std::optional<api_error> api_key_problem(const server_state& state, std::optional<std::string_view> authorization,
                                         std::optional<std::string_view> x_api_key) {
    return key_problem(state.options.api_key, authorization, x_api_key);
}

std::optional<api_error> key_problem(const std::string& key, std::optional<std::string_view> authorization,
                                     std::optional<std::string_view> x_api_key) {
    if (key.empty()) return std::nullopt;
    std::string_view given;
    constexpr std::string_view bearer = "Bearer ";
    if (authorization) {
        const std::string_view auth = *authorization;
        if (auth.size() > bearer.size() && std::equal(bearer.begin(), bearer.end(), auth.begin(), [](char a, char b) {
                return std::tolower(static_cast<unsigned char>(a)) == std::tolower(static_cast<unsigned char>(b));
            }))
            given = auth.substr(bearer.size());
    } else if (x_api_key) {
        given = *x_api_key;
    }
    if (given.empty())
        return api_error(401, "no API key: send 'Authorization: Bearer KEY' or 'x-api-key: KEY'",
                         "authentication_error", "", "invalid_api_key");
    if (!equal_constant_time(given, key))
        return api_error(401, "the API key is not valid", "authentication_error", "", "invalid_api_key");
    return std::nullopt;
}

std::optional<std::string> cors_origin_for(const server_state& state, std::optional<std::string_view> origin) {
    if (!origin || state.cors_origins.empty()) return std::nullopt;
    for (const std::string& o : state.cors_origins) {
        if (o == "*") return o;
        if (o == *origin) return o;
    }
    return std::nullopt;
}

bool route_is_open(std::string_view method, std::string_view path) {
    if (method == "OPTIONS") return true;
    // Route paths are patterns, matched whole as httplib matches them ("/webui/.+").
    static const std::vector<std::regex> patterns = [] {
        std::vector<std::regex> p;
        for (const route& r : route_table()) p.emplace_back(std::string(r.path));
        return p;
    }();
    const std::vector<route>& table = route_table();
    for (size_t i = 0; i < table.size(); ++i)
        if (table[i].open && table[i].method == method &&
            std::regex_match(path.begin(), path.end(), patterns[i]))
            return true;
    return false;
}

void add_routes(httplib::Server& http, server_state& state) {
    for (const route& r : route_table()) {
        if (r.method == "GET") http.Get(std::string(r.path), guarded(state, r));
        else if (r.method == "OPTIONS") http.Options(std::string(r.path), guarded(state, r));
        else http.Post(std::string(r.path), guarded(state, r));
    }
    static const route unrouted{"", "", "unrouted", false, true, handle_unrouted};
    const auto fallback = guarded(state, unrouted);
    http.Get(".*", fallback);
    http.Post(".*", fallback);
    http.Put(".*", fallback);
    http.Patch(".*", fallback);
    http.Delete(".*", fallback);

    // Answers cpp-httplib gives before any handler runs (413 for a body over the limit, 400 for a
    // request it cannot parse) get an error object too; handlers' own errors already have a body.
    http.set_error_handler(httplib::Server::HandlerWithResponse([&state](const httplib::Request& req, httplib::Response& res) {
        if (!res.body.empty() || res.status == 499) return httplib::Server::HandlerResponse::Unhandled;
        // cpp-httplib parses form-encoded bodies (curl -d without a Content-Type) and caps them at 8 KiB.
        const bool form = req.get_header_value("Content-Type") == "application/x-www-form-urlencoded";
        const api_error e = res.status != 413
            ? api_error(res.status, fmt::format("the request could not be handled (HTTP {})", res.status),
                        res.status >= 500 ? "server_error" : "invalid_request_error")
            : form ? api_error(413, "a form-encoded body (curl -d without a Content-Type) is limited to 8192 bytes; "
                                    "send 'Content-Type: application/json'", "invalid_request_error", "",
                               "request_too_large")
                   : api_error(413, fmt::format("the request body is larger than the limit of {} bytes (--max-body)",
                                                state.options.max_body_bytes), "invalid_request_error", "",
                               "request_too_large");
        send_error(res, e);
        add_cors_headers(state, req, res);
        state.counters.count_request("rejected", res.status);
        return httplib::Server::HandlerResponse::Handled;
    }));
    http.set_exception_handler([&state](const httplib::Request& req, httplib::Response& res, std::exception_ptr) {
        state.log->error("{} {} failed with an exception outside the handlers.", req.method, req.path);
        send_error(res, api_error(500, "internal error", "server_error"));
    });
}

}  // namespace strata::server
