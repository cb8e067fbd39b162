#include "http_front.hpp"

#include <fcntl.h>
#include <netdb.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <thread>
#include <unordered_map>
#include <vector>

#include <spdlog/fmt/fmt.h>

namespace strata::server {
namespace {

using clock_type = std::chrono::steady_clock;
using phase = request_reader::phase;

constexpr size_t recv_chunk = 64 * 1024;
constexpr size_t max_read_per_event = 256 * 1024;  // then the next ready connection has its turn
constexpr auto sweep_period = std::chrono::milliseconds(50);
constexpr auto linger_time = std::chrono::seconds(2);
constexpr auto log_window = std::chrono::seconds(60);

// The peer's address without its port: the key of the per-client cap.
std::string address_of(int fd) {
    sockaddr_storage a{};
    socklen_t len = sizeof a;
    char host[NI_MAXHOST];
    if (getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0 ||
        getnameinfo(reinterpret_cast<sockaddr*>(&a), len, host, sizeof host, nullptr, 0, NI_NUMERICHOST) != 0)
        return {};
    return host;
}

std::string peer_of(int fd) {
    sockaddr_storage a{};
    socklen_t len = sizeof a;
    char host[NI_MAXHOST], port[NI_MAXSERV];
    if (getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0 ||
        getnameinfo(reinterpret_cast<sockaddr*>(&a), len, host, sizeof host, port, sizeof port,
                    NI_NUMERICHOST | NI_NUMERICSERV) != 0)
        return "an unknown peer";
    return a.ss_family == AF_INET6 ? fmt::format("[{}]:{}", host, port) : fmt::format("{}:{}", host, port);
}

double seconds(std::chrono::milliseconds d) { return static_cast<double>(d.count()) / 1000.0; }

// Best effort on a non-blocking socket: a short answer fits the empty send buffer.
void send_some(int fd, const std::string& bytes) { (void)!::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL); }

// The front's caps, shared by the event thread and the workers.
class admission {
public:
    explicit admission(const front_options& o) : opt_(o) {}

    // 0: admitted; else the status to refuse the connection with.
    int admit(const std::string& client) {
        std::lock_guard lock(mutex_);
        if (opt_.max_connections > 0 && live_ >= opt_.max_connections) return 503;
        int& mine = per_client_[client];
        if (opt_.max_connections_per_client > 0 && mine >= opt_.max_connections_per_client) {
            if (mine == 0) per_client_.erase(client);
            return 429;
        }
        ++mine;
        ++live_;
        return 0;
    }
    void leave(const std::string& client) {
        std::lock_guard lock(mutex_);
        --live_;
        const auto it = per_client_.find(client);
        if (it != per_client_.end() && --it->second <= 0) per_client_.erase(it);
    }
    bool reserve(size_t bytes) {
        std::lock_guard lock(mutex_);
        if (opt_.max_bytes_in_flight > 0 && bytes > opt_.max_bytes_in_flight - std::min(in_flight_, opt_.max_bytes_in_flight))
            return false;
        in_flight_ += bytes;
        return true;
    }
    void unreserve(size_t bytes) {
        std::lock_guard lock(mutex_);
        in_flight_ -= std::min(bytes, in_flight_);
    }
    size_t in_flight() const {
        std::lock_guard lock(mutex_);
        return in_flight_;
    }

private:
    const front_options& opt_;
    mutable std::mutex mutex_;
    int live_ = 0;
    size_t in_flight_ = 0;
    std::unordered_map<std::string, int> per_client_;
};

struct connection {
    int fd;
    request_reader reader;
    std::string in;                   // received, not yet read by `reader` (the start of a pipelined request)
    clock_type::time_point deadline;  // of the current wait; the event thread closes or answers 408 then
    bool between_requests = false;    // kept alive after an answer, nothing of the next request yet
    bool lingering = false;           // answered with an error; draining until the client closes
    bool quick = false;               // the screen sent the request being read to the quick workers
    int served = 0;
    admission& caps;
    std::string client;               // the peer's address, counted in `caps` while `admitted`
    bool admitted = false;
    size_t reserved = 0;              // bytes of the current request reserved in `caps`

    connection(int f, size_t max_body, admission& a) : fd(f), reader(max_body, true), caps(a) {}
    ~connection() { release(); }
    connection(const connection&) = delete;
    connection& operator=(const connection&) = delete;

    void unreserve() {
        caps.unreserve(reserved);
        reserved = 0;
    }
    // Gives back everything counted in the caps (the connection closes, or only lingers now).
    void release() {
        unreserve();
        if (admitted) caps.leave(client);
        admitted = false;
    }
};

// Connections closed at a deadline: the first is logged at once with its details, the rest are
// counted and summed up once a minute, so a flood of slow clients costs a few lines.
class cut_log {
public:
    enum kind { silent, slow_head, slow_body, n_kinds };

    void record(kind k, const std::string& details, clock_type::time_point now, spdlog::logger& log) {
        if (!window_end_) {
            log.warn("{} Further connections closed at a deadline are summed up once a minute.", details);
            window_end_ = now + log_window;
            return;
        }
        ++counts_[k];
    }

    void flush(clock_type::time_point now, spdlog::logger& log, const front_options& o) {
        if (!window_end_ || now < *window_end_) return;
        if (counts_[silent] + counts_[slow_head] + counts_[slow_body] == 0) {
            window_end_.reset();
            return;
        }
        log.warn("In the last {} s, {} more connection(s) were closed at a deadline: {} sent no request within "
                 "{:g} s (--header-timeout), {} did not complete their headers within {:g} s (--header-timeout), {} "
                 "did not complete their body within {:g} s (--body-timeout).",
                 log_window.count(), counts_[silent] + counts_[slow_head] + counts_[slow_body], counts_[silent],
                 seconds(o.header_timeout), counts_[slow_head], seconds(o.header_timeout), counts_[slow_body],
                 seconds(o.body_timeout));
        counts_ = {};
        window_end_ = now + log_window;
    }

private:
    std::optional<clock_type::time_point> window_end_;  // set while lines are being summed up
    std::array<uint64_t, n_kinds> counts_{};
};

}  // namespace

struct http_front::impl {
    front_options opt;
    serve_fn serve;
    reject_fn reject;
    screen_fn screen;
    std::shared_ptr<spdlog::logger> log;
    std::unique_ptr<admission> caps;

    int epoll_fd = -1, wake_fd = -1;
    std::thread events;
    std::vector<std::thread> workers;

    using work_queue = std::deque<std::pair<std::unique_ptr<connection>, front_request>>;
    std::mutex mutex;  // guards the members below
    std::condition_variable work_ready, quick_ready;
    bool stopping = false;
    std::vector<int> accepted;                                             // adopt() -> event thread
    std::vector<std::unique_ptr<connection>> returned;                     // workers -> event thread
    work_queue work;                                                       // event thread -> workers
    work_queue quick_work;                                                 // event thread -> quick workers

    // The event thread's own.
    std::unordered_map<int, std::unique_ptr<connection>> open;
    std::vector<char> buffer = std::vector<char>(recv_chunk);
    cut_log cuts;

    void wake() const {
        const uint64_t one = 1;
        (void)!::write(wake_fd, &one, sizeof one);
    }

    void watch(std::unique_ptr<connection> c) {
        epoll_event e{};
        e.events = EPOLLIN;
        e.data.fd = c->fd;
        if (epoll_ctl(epoll_fd, EPOLL_CTL_ADD, c->fd, &e) != 0) {
            log->error("Cannot watch connection {}: {}; closing it.", c->fd, std::strerror(errno));
            ::close(c->fd);
            return;
        }
        connection& ref = *c;
        open.emplace(ref.fd, std::move(c));
        if (!ref.in.empty()) advance(ref, false);  // a pipelined request already here
    }

    void close_connection(connection& c) {
        const int fd = c.fd;
        epoll_ctl(epoll_fd, EPOLL_CTL_DEL, fd, nullptr);
        open.erase(fd);
        ::close(fd);
    }

    // Takes the connections adopt() and the workers handed over; false once stopping.
    bool take_handed_over() {
        std::vector<int> fresh;
        std::vector<std::unique_ptr<connection>> back;
        {
            std::lock_guard lock(mutex);
            if (stopping) return false;
            fresh.swap(accepted);
            back.swap(returned);
        }
        const auto now = clock_type::now();
        for (const int fd : fresh) {
            fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
            auto c = std::make_unique<connection>(fd, opt.max_body_bytes, *caps);
            c->deadline = now + opt.header_timeout;
            c->client = address_of(fd);
            const int refused = caps->admit(c->client);
            c->admitted = refused == 0;
            connection& ref = *c;
            watch(std::move(c));
            if (refused == 0 || !open.count(fd)) continue;
            answer_error(ref, refused == 503
                ? request_error{503, fmt::format("the server has {} connections open, its limit (--max-connections); "
                                                 "retry later", opt.max_connections), "too_many_connections", 1}
                : request_error{429, fmt::format("{} has {} connections open, the limit per client address "
                                                 "(--max-connections-per-client); retry later", ref.client,
                                                 opt.max_connections_per_client), "too_many_connections", 1});
        }
        for (auto& c : back) {
            c->between_requests = true;
            c->deadline = now + opt.keep_alive_timeout;
            watch(std::move(c));
        }
        return true;
    }

    void on_readable(connection& c) {
        size_t total = 0;
        bool eof = false;
        while (total < max_read_per_event) {
            const ssize_t n = ::recv(c.fd, buffer.data(), buffer.size(), 0);
            if (n > 0) {
                total += static_cast<size_t>(n);
                if (!c.lingering) c.in.append(buffer.data(), static_cast<size_t>(n));
            } else if (n < 0 && errno == EINTR) {
                continue;
            } else {
                eof = n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK);
                break;
            }
        }
        if (c.lingering) {
            if (eof) close_connection(c);
            return;
        }
        advance(c, eof);
    }

    // A head just arrived whole: the screen's verdict, then its bytes reserved; false: refused.
    bool admit_request(connection& c) {
        screening verdict = screen(c.reader.head());
        c.quick = verdict.quick;
        if (verdict.refuse) {
            answer_error(c, *verdict.refuse);
            return false;
        }
        const size_t want = c.reader.head().size() + static_cast<size_t>(
            c.reader.chunked() ? opt.max_body_bytes : c.reader.body_expected());
        if (!caps->reserve(want)) {
            answer_error(c, {503, fmt::format("the server is reading or answering {} MiB of requests, near its limit of "
                                              "{} MiB (--max-bytes-in-flight); retry later",
                                              caps->in_flight() >> 20, opt.max_bytes_in_flight >> 20),
                             "server_busy", 1});
            return false;
        }
        c.reserved = want;
        return true;
    }

    // Reads what arrived into the request; hands a whole one to a worker, answers an error, or waits.
    void advance(connection& c, bool eof) {
        const auto now = clock_type::now();
        const phase before = c.reader.at();
        c.in.erase(0, c.reader.feed(c.in));
        if ((before == phase::idle || before == phase::head) &&
            (c.reader.at() == phase::body || c.reader.at() == phase::done)) {
            if (!admit_request(c)) return;
            c.in.erase(0, c.reader.feed(c.in));  // the body that came with the head
        }
        const phase after = c.reader.at();
        if (before == phase::idle && after != phase::idle && c.between_requests) {
            c.between_requests = false;
            c.deadline = now + opt.header_timeout;
        }
        if (before != phase::body && after == phase::body) c.deadline = now + opt.body_timeout;
        // A client that waits for "100 Continue" has sent nothing of its body yet.
        if (c.reader.take_continue() && after == phase::body && c.reader.body_received() == 0)
            send_some(c.fd, "HTTP/1.1 100 Continue\r\n\r\n");
        if (after == phase::failed) return answer_error(c, c.reader.error());
        if (after == phase::done) return dispatch(c);
        if (eof) {
            if (after != phase::idle)
                log->debug("The client at {} closed its connection in the middle of a request.", peer_of(c.fd));
            close_connection(c);
        }
    }

    void answer_error(connection& c, const request_error& e) {
        send_some(c.fd, reject(e, c.reader.head(), peer_of(c.fd)));
        c.release();
        ::shutdown(c.fd, SHUT_WR);
        c.lingering = true;
        c.deadline = clock_type::now() + linger_time;
        c.in = std::string();
        c.reader.next();
    }

    void dispatch(connection& c) {
        epoll_ctl(epoll_fd, EPOLL_CTL_DEL, c.fd, nullptr);
        auto node = open.extract(c.fd);
        std::unique_ptr<connection> owned = std::move(node.mapped());
        front_request r{owned->fd, std::move(owned->reader.head()), std::move(owned->reader.body()),
                        ++owned->served >= opt.max_requests_per_connection};
        owned->reader.next();
        const bool quick = owned->quick;
        size_t waiting = 0;
        {
            std::lock_guard lock(mutex);
            waiting = work.size();
            if (quick || opt.max_waiting_requests <= 0 || waiting < size_t(opt.max_waiting_requests))
                (quick ? quick_work : work).emplace_back(std::move(owned), std::move(r));
        }
        if (!owned) return (quick ? quick_ready : work_ready).notify_one();
        // Every worker is busy and the line for them is full: refused, and the connection closes.
        connection& back = *owned;
        std::swap(back.reader.head(), r.head);
        back.in.clear();
        watch(std::move(owned));
        if (open.count(back.fd))
            answer_error(back, {503, fmt::format("{} requests are waiting for one of the server's {} request threads "
                                                 "(--http-threads), the limit; retry later", waiting, opt.workers),
                                "server_busy", 1});
    }

    void on_deadline(connection& c, clock_type::time_point now) {
        if (c.lingering || c.between_requests) return close_connection(c);
        const std::string peer = peer_of(c.fd);
        switch (c.reader.at()) {
            case phase::idle:
                cuts.record(cut_log::silent,
                            fmt::format("Closed the connection from {}: it sent no request within {:g} s of "
                                        "connecting (--header-timeout).", peer, seconds(opt.header_timeout)),
                            now, *log);
                return close_connection(c);
            case phase::head: {
                const std::string what = fmt::format("its request headers were not complete within {:g} s "
                                                     "(--header-timeout); {} bytes of them had arrived",
                                                     seconds(opt.header_timeout), c.reader.head().size());
                cuts.record(cut_log::slow_head, fmt::format("Closed the connection from {} with 408: {}.", peer, what),
                            now, *log);
                return answer_error(c, {408, fmt::format("the server closed the connection: {}", what), "timeout"});
            }
            case phase::body: {
                const std::string what = fmt::format("its request body was not complete within {:g} s of the headers "
                                                     "(--body-timeout); {} of {} bytes had arrived",
                                                     seconds(opt.body_timeout), c.reader.body_received(),
                                                     c.reader.body_expected());
                cuts.record(cut_log::slow_body, fmt::format("Closed the connection from {} with 408: {}.", peer, what),
                            now, *log);
                return answer_error(c, {408, fmt::format("the server closed the connection: {}", what), "timeout"});
            }
            case phase::done:
            case phase::failed: break;
        }
        close_connection(c);
    }

    void sweep(clock_type::time_point now) {
        std::vector<int> expired;
        for (const auto& [fd, c] : open)
            if (now >= c->deadline) expired.push_back(fd);
        for (const int fd : expired) on_deadline(*open.at(fd), now);
        cuts.flush(now, *log, opt);
    }

    void run_events() {
        std::array<epoll_event, 256> ready{};
        auto last_sweep = clock_type::now();
        for (;;) {
            const int n = epoll_wait(epoll_fd, ready.data(), static_cast<int>(ready.size()),
                                     static_cast<int>(sweep_period.count()));
            if (n < 0 && errno != EINTR) {
                log->error("The HTTP event loop failed: epoll_wait: {}; no further requests are read.",
                           std::strerror(errno));
                break;
            }
            for (int i = 0; i < n; ++i) {
                const int fd = ready[static_cast<size_t>(i)].data.fd;
                if (fd == wake_fd) {
                    uint64_t count = 0;
                    (void)!::read(wake_fd, &count, sizeof count);
                    continue;
                }
                const auto it = open.find(fd);
                if (it != open.end()) on_readable(*it->second);
            }
            if (!take_handed_over()) break;
            const auto now = clock_type::now();
            if (now - last_sweep >= sweep_period) {
                sweep(now);
                last_sweep = now;
            }
        }
        for (const auto& [fd, c] : open) ::close(fd);
        open.clear();
    }

    void run_worker(work_queue& queue, std::condition_variable& ready) {
        for (;;) {
            std::unique_ptr<connection> c;
            front_request r;
            {
                std::unique_lock lock(mutex);
                ready.wait(lock, [this, &queue] { return stopping || !queue.empty(); });
                if (queue.empty()) return;  // stopping, and every request taken
                c = std::move(queue.front().first);
                r = std::move(queue.front().second);
                queue.pop_front();
            }
            bool keep = false;
            try {
                keep = serve(r) && !r.last;
            } catch (const std::exception& e) {
                log->error("A request from {} failed outside its handler: {}", peer_of(c->fd), e.what());
            }
            r.body = std::string();
            c->unreserve();
            if (keep) {
                std::lock_guard lock(mutex);
                if (stopping) keep = false;
                else returned.push_back(std::move(c));
            }
            if (keep) wake();
            else ::close(c->fd);
        }
    }
};

http_front::http_front(front_options o, serve_fn serve, reject_fn reject, screen_fn screen,
                       std::shared_ptr<spdlog::logger> log)
    : impl_(std::make_unique<impl>()) {
    impl& m = *impl_;
    m.opt = o;
    m.serve = std::move(serve);
    m.reject = std::move(reject);
    m.screen = std::move(screen);
    m.caps = std::make_unique<admission>(m.opt);
    m.log = std::move(log);
    m.epoll_fd = epoll_create1(EPOLL_CLOEXEC);
    m.wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (m.epoll_fd < 0 || m.wake_fd < 0)
        throw std::runtime_error(fmt::format("cannot create the HTTP event loop: {}", std::strerror(errno)));
    epoll_event e{};
    e.events = EPOLLIN;
    e.data.fd = m.wake_fd;
    epoll_ctl(m.epoll_fd, EPOLL_CTL_ADD, m.wake_fd, &e);
    m.events = std::thread([&m] { m.run_events(); });
    for (int i = 0; i < std::max(o.workers, 1); ++i)
        m.workers.emplace_back([&m] { m.run_worker(m.work, m.work_ready); });
    for (int i = 0; i < std::max(o.quick_workers, 1); ++i)
        m.workers.emplace_back([&m] { m.run_worker(m.quick_work, m.quick_ready); });
}

http_front::~http_front() {
    stop();
    ::close(impl_->epoll_fd);
    ::close(impl_->wake_fd);
}

void http_front::adopt(int fd) {
    {
        std::lock_guard lock(impl_->mutex);
        if (!impl_->stopping) {
            impl_->accepted.push_back(fd);
            fd = -1;
        }
    }
    if (fd >= 0) ::close(fd);
    else impl_->wake();
}

void http_front::stop() {
    impl& m = *impl_;
    {
        std::lock_guard lock(m.mutex);
        m.stopping = true;
    }
    m.wake();
    m.work_ready.notify_all();
    m.quick_ready.notify_all();
    if (m.events.joinable()) m.events.join();
    for (std::thread& w : m.workers)
        if (w.joinable()) w.join();
    std::lock_guard lock(m.mutex);
    for (const int fd : m.accepted) ::close(fd);
    for (const auto& c : m.returned) ::close(c->fd);
    m.accepted.clear();
    m.returned.clear();
}

}  // namespace strata::server
