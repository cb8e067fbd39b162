#include "server_fixture.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <mutex>

#include <gtest/gtest.h>
#include <httplib.h>

#include "generate.hpp"
#include "log.hpp"

namespace strata::server::test {

namespace {

struct temp_model {
    std::filesystem::path dir, file;
    temp_model(const std::string& preset, int n_ctx) {
        std::string pattern = (std::filesystem::temp_directory_path() / "strata-server-test-XXXXXX").string();
        if (!mkdtemp(pattern.data())) throw std::runtime_error("mkdtemp failed for " + pattern);
        dir = pattern;
        file = dir / (preset + ".gguf");
        make_model::model_spec spec = make_model::preset(preset);
        spec.n_ctx = n_ctx;
        make_model::build_model(spec).write_file(file.string());
    }
    ~temp_model() {
        std::error_code ec;
        std::filesystem::remove_all(dir, ec);
    }
};

httplib::Headers to_headers(const std::map<std::string, std::string>& h) { return {h.begin(), h.end()}; }

reply to_reply(const httplib::Result& r) {
    reply out;
    if (!r) return out;
    out.status = r->status;
    out.body = r->body;
    out.headers = {r->headers.begin(), r->headers.end()};
    return out;
}

}  // namespace

const std::string& tiny_model_path() {
    static temp_model model("tiny", hold_ctx);  // room for the largest context the tests ask for
    static const std::string path = model.file.string();
    return path;
}

std::shared_ptr<model> tiny_model() {
    static std::mutex mutex;
    static std::shared_ptr<model> loaded;
    std::lock_guard lock(mutex);
    if (!loaded) {
        model_options o;
        o.path = tiny_model_path();
        o.n_ctx = test_ctx;
        o.numa_pool = "off";
        o.cache_ram_mib = 0;  // tests share this model: snapshots of one must not feed the next
        loaded = model::load(o);
    }
    return loaded;
}

std::shared_ptr<model> hold_model() {
    static std::mutex mutex;
    static std::shared_ptr<model> loaded;
    std::lock_guard lock(mutex);
    if (!loaded) {
        model_options o;
        o.path = tiny_model_path();
        o.n_ctx = hold_ctx;
        o.numa_pool = "off";
        o.cache_ram_mib = 0;
        loaded = model::load(o);
    }
    return loaded;
}

std::shared_ptr<model> long_prompt_model() {
    static std::mutex mutex;
    static std::unique_ptr<temp_model> file;
    static std::shared_ptr<model> loaded;
    std::lock_guard lock(mutex);
    if (!loaded) {
        file = std::make_unique<temp_model>("demo", long_ctx);
        model_options o;
        o.path = file->file.string();
        o.n_ctx = long_ctx;
        o.n_batch = long_batch;
        o.numa_pool = "off";
        loaded = model::load(o);
    }
    return loaded;
}

json reply::parsed() const {
    json j = json::parse(body, nullptr, false);
    EXPECT_FALSE(j.is_discarded()) << "not JSON (HTTP " << status << "): " << body;
    return j;
}

std::string reply::header(const std::string& name) const {
    const auto it = headers.find(name);
    return it == headers.end() ? std::string() : it->second;
}

std::vector<json> sse_reply::chunks() const {
    std::vector<json> out;
    for (const std::string& d : data) {
        if (d == "[DONE]") continue;
        json j = json::parse(d, nullptr, false);
        EXPECT_FALSE(j.is_discarded()) << "SSE data is not JSON: " << d;
        out.push_back(std::move(j));
    }
    return out;
}

test_server::test_server(server_options o, bool with_model)
    : test_server(std::move(o), with_model ? tiny_model() : nullptr) {}

test_server::test_server(server_options o, std::shared_ptr<model> m) {
    o.host = "127.0.0.1";
    o.port = 0;
    server_ = std::make_unique<http_server>(std::move(o));
    port_ = server_->bind();
    thread_ = std::thread([this] { server_->run(); });
    if (m) server_->set_model(std::move(m));
}

test_server::~test_server() { shut_down(); }

void test_server::shut_down() {
    if (stopped_) return;
    stopped_ = true;
    server_->begin_shutdown();
    server_->wait_idle(std::chrono::seconds(20));
    server_->stop();
    thread_.join();
}

reply test_server::get(const std::string& path, const std::map<std::string, std::string>& headers) const {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(60, 0);
    return to_reply(c.Get(path.c_str(), to_headers(headers)));
}

reply test_server::post(const std::string& path, const std::string& body,
                        const std::map<std::string, std::string>& headers) const {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(60, 0);
    return to_reply(c.Post(path.c_str(), to_headers(headers), body, "application/json"));
}

reply test_server::send(const std::string& method, const std::string& path, const std::string& body,
                        const std::map<std::string, std::string>& headers) const {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(60, 0);
    httplib::Request req;
    req.method = method;
    req.path = path;
    req.headers = to_headers(headers);
    req.body = body;
    if (!body.empty() && !headers.count("Content-Type")) req.set_header("Content-Type", "application/json");
    return to_reply(c.send(req));
}

sse_reply test_server::post_stream(const std::string& path, const json& body,
                                   const std::map<std::string, std::string>& headers) const {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(60, 0);
    httplib::Request req;
    req.method = "POST";
    req.path = path;
    req.headers = to_headers(headers);
    req.set_header("Content-Type", "application/json");
    req.body = body.dump();
    std::string raw;
    req.content_receiver = [&raw](const char* data, size_t n, uint64_t, uint64_t) {
        raw.append(data, n);
        return true;
    };
    sse_reply out;
    const httplib::Result r = c.send(req);
    if (!r) return out;
    out.status = r->status;
    out.content_type = r->get_header_value("Content-Type");
    if (r->status != 200) raw = r->body;
    // Events are separated by a blank line; each of ours is one "data: " line.
    size_t pos = 0;
    while (pos < raw.size()) {
        const size_t end = raw.find("\n\n", pos);
        const std::string event = raw.substr(pos, end == std::string::npos ? std::string::npos : end - pos);
        if (event.rfind("data: ", 0) == 0) out.data.push_back(event.substr(6));
        else ADD_FAILURE() << "unexpected SSE event: " << event;
        if (end == std::string::npos) break;
        pos = end + 2;
    }
    return out;
}

bool test_server::wait_for_waiting(size_t n, std::chrono::milliseconds timeout) const {
    const auto until = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < until) {
        if (status()["queue"]["n_waiting"].get<size_t>() >= n) return true;
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return false;
}

raw_connection::raw_connection(int port, int receive_buffer) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    if (fd_ >= 0 && receive_buffer > 0) setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &receive_buffer, sizeof receive_buffer);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd_ < 0 || connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0)
        throw std::runtime_error("cannot connect to 127.0.0.1:" + std::to_string(port));
}

raw_connection::~raw_connection() { close(); }

void raw_connection::send_all(const std::string& bytes) {
    size_t sent = 0;
    while (sent < bytes.size()) {
        const ssize_t n = ::send(fd_, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
        if (n <= 0) throw std::runtime_error("send failed");
        sent += static_cast<size_t>(n);
    }
}

bool raw_connection::read_until(const std::string& needle, std::chrono::milliseconds timeout) {
    const auto until = std::chrono::steady_clock::now() + timeout;
    while (received_.find(needle) == std::string::npos) {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
        if (left.count() <= 0) return false;
        pollfd p{fd_, POLLIN, 0};
        if (poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
        char buf[4096];
        const ssize_t n = recv(fd_, buf, sizeof buf, 0);
        if (n <= 0) return received_.find(needle) != std::string::npos;
        received_.append(buf, static_cast<size_t>(n));
    }
    return true;
}

void raw_connection::close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
}

std::string http_post_text(const std::string& path, const std::string& body) {
    return "POST " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: " +
           std::to_string(body.size()) + "\r\n\r\n" + body;
}

json chat_body(const std::string& content, int max_tokens, bool stream) {
    return {{"messages", json::array({{{"role", "user"}, {"content", content}}})},
            {"max_tokens", max_tokens},
            {"temperature", 0},
            {"stream", stream}};
}

log_capture::log_capture() : sink_(std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(4096)) {
    logger("server")->sinks().push_back(sink_);
}

log_capture::~log_capture() {
    auto& sinks = logger("server")->sinks();
    sinks.erase(std::remove(sinks.begin(), sinks.end(), sink_), sinks.end());
}

std::string log_capture::text() const {
    std::string out;
    for (const std::string& line : sink_->last_formatted()) out += line;
    return out;
}

size_t log_capture::count(const std::string& needle) const {
    size_t n = 0;
    for (const std::string& line : sink_->last_formatted()) n += line.find(needle) != std::string::npos;
    return n;
}

}  // namespace strata::server::test
