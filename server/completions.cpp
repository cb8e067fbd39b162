#include "completions.hpp"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <future>
#include <mutex>
#include <optional>

#include <httplib.h>
#include <spdlog/fmt/fmt.h>

#include "api_error.hpp"
#include "cancel_watch.hpp"
#include "connection.hpp"
#include "openai_response.hpp"

namespace strata::server {
namespace {

using clock_type = std::chrono::steady_clock;

// nginx's status for a client that went away before the answer; nobody receives it, /metrics counts it.
constexpr int client_closed_request = 499;

// Why a generation (or the wait for one) ended early.
enum class cut { none, client_gone, timeout, shutdown };

std::string_view cut_name(cut c) {
    switch (c) {
        case cut::client_gone: return "client disconnected";
        case cut::timeout: return "timeout";
        case cut::shutdown: return "shutdown";
        case cut::none: break;
    }
    return "";
}

// Counts the request in server_state::in_flight for as long as it lives: a streamed answer outlives
// its handler, so the job carries it.
struct in_flight_guard {
    std::atomic<int>& n;
    explicit in_flight_guard(std::atomic<int>& counter) : n(counter) { ++n; }
    ~in_flight_guard() { --n; }
    in_flight_guard(const in_flight_guard&) = delete;
    in_flight_guard& operator=(const in_flight_guard&) = delete;
};

// The slot a job's generation runs in, given back when the job ends (before its queue turn is).
struct slot_lease {
    server_state& state;
    int index = -1;
    ~slot_lease() {
        if (index >= 0) state.release_slot(index);
    }
};

// Server-sent events on their way from the engine thread to the connection's writer. Bounded: a
// client that stops reading holds back only its own generation (the batcher's ready check).
struct event_queue {
    static constexpr size_t capacity = 64;
    std::mutex mutex;
    std::condition_variable added;
    std::deque<std::string> events;
    std::optional<clock_type::time_point> full_since;
};

struct job {
    server_state& state;
    std::shared_ptr<model> m;
    completion_request request;
    response_meta meta;
    int client_fd = -1;
    clock_type::time_point arrival = clock_type::now();
    std::optional<clock_type::time_point> deadline;
    request_queue::ticket ticket;
    slot_lease slot{state};  // after the ticket: released first
    in_flight_guard busy;
    std::atomic<cut> cut_by{cut::none};  // set once, by the engine thread or the cancel watch
    double queue_s = 0;

    job(server_state& s, uint64_t id, std::shared_ptr<model> model_, completion_request r, response_meta mt, int fd)
        : state(s), m(std::move(model_)), request(std::move(r)), meta(std::move(mt)), client_fd(fd),
          ticket(s.queue.enter(id)), busy(s.in_flight) {
        if (s.options.request_timeout_s > 0)
            deadline = arrival + std::chrono::duration_cast<clock_type::duration>(
                                     std::chrono::duration<double>(s.options.request_timeout_s));
    }

    // Records why the request stops; the first reason stays.
    void cut_for(cut why) {
        cut none = cut::none;
        cut_by.compare_exchange_strong(none, why);
    }

    // Checked while waiting, before every token and by the cancel watch during the prompt: true to go on.
    bool keep_going() {
        if (cut_by.load() != cut::none) return false;
        if (state.shutting_down.load()) cut_for(cut::shutdown);
        else if (deadline && clock_type::now() >= *deadline) cut_for(cut::timeout);
        else if (peer_closed(client_fd)) cut_for(cut::client_gone);
        return cut_by.load() == cut::none;
    }

    // True when the generation was cut before its first token: only part of the prompt was evaluated.
    bool cut_in_prompt(const generation_result& r) const {
        return r.reason == stop_reason::cancelled && r.tokens.empty() && cut_by.load() != cut::none;
    }

    // A timeout during the prompt has no answer to give, not even a partial one.
    api_error prompt_timeout_error(const generation_result& r) const {
        return api_error(503, fmt::format("the prompt of {} tokens was still being evaluated ({} done) after {:.1f} s, "
                                          "past the {:g} s request timeout (--timeout)",
                                          request.prompt.size(), r.time.cache_n + r.time.prompt_n,
                                          std::chrono::duration<double>(clock_type::now() - arrival).count(),
                                          state.options.request_timeout_s),
                         "unavailable_error", "", "timeout");
    }

    bool wait_for_engine() {
        const bool got = state.queue.wait_turn(ticket, [this] { return !keep_going(); });
        queue_s = std::chrono::duration<double>(clock_type::now() - arrival).count();
        if (got) slot.index = state.take_slot(ticket.id(), request.prompt);
        return got;
    }

    api_error wait_error() const {
        if (cut_by == cut::timeout)
            return api_error(503, fmt::format("the request waited {:.1f} s for the engine, past the {} s request "
                                              "timeout (--timeout)", queue_s, state.options.request_timeout_s),
                             "unavailable_error", "", "timeout");
        return api_error(503, "the server is shutting down", "unavailable_error", "", "shutting_down");
    }

    reply_options reply_opts() const {
        return {.split_reasoning = !state.options.reasoning_inline, .thinking_opened = request.thinking_opened,
                .tools = request.tools_offered};
    }

    std::string_view finish_reason(const generation_result& r) const {
        switch (r.reason) {
            case stop_reason::eos:
            case stop_reason::stop_string: return "stop";
            case stop_reason::length: return "length";
            case stop_reason::cancelled: break;
        }
        return cut_by.load() == cut::timeout ? "length" : "cancelled";
    }

    std::string stopped_by(const generation_result& r) const {
        switch (r.reason) {
            case stop_reason::eos: return "end of generation";
            case stop_reason::stop_string: return "stop string";
            case stop_reason::length:
                return r.time.predicted_n >= request.generation.max_tokens ? "max_tokens" : "context";
            case stop_reason::cancelled: break;
        }
        return std::string(cut_by.load() == cut::none ? "cancelled" : cut_name(cut_by.load()));
    }

    // Runs the generation; the caller holds the engine. The watch cancels it between prompt batches or
    // tokens once the request should stop. request_error (a prompt the engine refuses) becomes a 400.
    generation_result generate(const token_callback& cb) {
        session& engine = state.slot_session(slot.index);
        const cancel_watch watch([this] { return !keep_going(); }, [&engine] { engine.cancel(); });
        try {
            return engine.generate(request.prompt, request.generation, cb);
        } catch (const request_error& e) {
            throw invalid(e);
        }
    }

    api_error invalid(const request_error& e) const {
        return api_error(400, e.what(), "invalid_request_error", request.kind == endpoint::chat ? "messages" : "prompt",
                         "invalid_value");
    }

    // Streams: the engine thread formats each event (make_event) into `q`; this thread writes them
    // with `write` until the generation is over. A queue full for longer than --write-timeout ends
    // the request (its client stopped reading), never the others'.
    generation_result stream(event_queue& q, const std::function<std::optional<std::string>(const token_event&)>& make_event,
                             const std::function<bool(const std::string&)>& write) {
        session& engine = state.slot_session(slot.index);
        const auto write_timeout = std::chrono::duration<double>(state.options.write_timeout_s);
        const auto on_token = [&](const token_event& e) {
            if (!keep_going()) return false;
            std::optional<std::string> ev = make_event(e);
            if (ev) {
                std::lock_guard lock(q.mutex);
                q.events.push_back(std::move(*ev));
            }
            q.added.notify_one();
            return true;
        };
        const auto ready = [&] {
            if (cut_by.load() != cut::none) return true;  // let it end at its next token
            std::lock_guard lock(q.mutex);
            if (q.events.size() < event_queue::capacity) {
                q.full_since.reset();
                return true;
            }
            if (!q.full_since) q.full_since = clock_type::now();
            if (clock_type::now() - *q.full_since < write_timeout) return false;
            state.log->warn("Request {}: its client read nothing for {:g} s (--write-timeout); the request ends.",
                            ticket.id(), state.options.write_timeout_s);
            cut_for(cut::client_gone);
            return true;
        };
        const cancel_watch watch([this] { return !keep_going(); }, [&engine] { engine.cancel(); });
        std::future<generation_result> f;
        try {
            f = engine.start(request.prompt, request.generation, on_token, ready);
        } catch (const request_error& e) {
            throw invalid(e);
        }
        bool writing = true;
        for (;;) {
            std::unique_lock lock(q.mutex);
            q.added.wait_for(lock, std::chrono::milliseconds(10), [&] { return !q.events.empty(); });
            if (q.events.empty()) {
                if (f.wait_for(std::chrono::seconds(0)) == std::future_status::ready) break;
                continue;
            }
            std::string ev = std::move(q.events.front());
            q.events.pop_front();
            lock.unlock();
            if (writing && !write(ev)) writing = false;  // the client is gone: the generation ends at its next step
        }
        try {
            return f.get();
        } catch (const request_error& e) {
            throw invalid(e);
        }
    }

    // Counters, snapshot and the log line; still holding the engine.
    void record(const generation_result& r) {
        generation_record g;
        g.id = ticket.id();
        g.endpoint = request.kind == endpoint::chat ? "chat" : "completions";
        g.finish_reason = std::string(finish_reason(r));
        g.stopped_by = stopped_by(r);
        g.prompt_tokens = static_cast<int>(request.prompt.size());
        g.time = r.time;
        g.queue_s = queue_s;
        g.total_s = std::chrono::duration<double>(clock_type::now() - arrival).count();
        state.counters.count_generation(g);
        state.take_snapshot(g.id, slot.index);
        const uint64_t lookups = r.time.expert_lookups, hits = r.time.vram_hits;
        const std::string in_prompt =
            cut_in_prompt(r) ? fmt::format(" during the prompt, with {} of its {} tokens evaluated or reused",
                                           r.time.cache_n + r.time.prompt_n, g.prompt_tokens)
                             : std::string();
        const std::string vram = lookups ? fmt::format("; routed experts: {:.1f} % from VRAM ({} of {})",
                                                       100.0 * double(hits) / double(lookups), hits, lookups)
                                         : std::string();
        const std::string prefix_from = r.time.cache_source == prefix_source::snapshot
                                            ? fmt::format("snapshot {}", r.time.cache_snapshot)
                                            : std::string(prefix_source_name(r.time.cache_source));
        state.log->info("Request {} ({}) finished: prompt {} tokens ({} reused from {}, {} evaluated in {:.1f} ms, "
                        "{:.1f} tokens/s); decode {} tokens in {:.1f} ms ({:.1f} tokens/s){}; stopped by {}{}; waited "
                        "{:.3f} s for the engine, {:.3f} s in all.",
                        g.id, g.endpoint, g.prompt_tokens, r.time.cache_n, prefix_from, r.time.prompt_n, r.time.prompt_ms,
                        r.time.prompt_per_second(), r.time.predicted_n, r.time.predicted_ms,
                        r.time.predicted_per_second(), vram, g.stopped_by, in_prompt, g.queue_s, g.total_s);
    }
};

void answer_whole(job& j, httplib::Response& res) {
    if (!j.wait_for_engine()) {
        if (j.cut_by == cut::client_gone) {
            j.state.log->info("Request {} left the queue: its client disconnected.", j.ticket.id());
            res.status = client_closed_request;
            return;
        }
        throw j.wait_error();
    }
    // Where each token's text starts in the answer (the engine repeats the last token when it flushes
    // held-back text at the end, which adds text but no token).
    std::vector<size_t> text_offsets;
    size_t emitted = 0;
    const generated_token* previous = nullptr;
    const generation_result r = j.generate([&](const token_event& e) {
        if (&e.token != previous) text_offsets.push_back(emitted);
        previous = &e.token;
        emitted += e.text.size();
        return j.keep_going();
    });
    j.record(r);
    if (j.cut_by == cut::client_gone) {
        res.status = client_closed_request;
        return;
    }
    if (j.cut_by == cut::timeout && j.cut_in_prompt(r)) throw j.prompt_timeout_error(r);
    if (j.cut_by == cut::shutdown)
        throw api_error(503, "the server is shutting down; the generation was cancelled", "unavailable_error", "",
                        "shutting_down");
    const json logprobs = j.request.logprobs
                              ? logprobs_json(j.request.kind, r.tokens, *j.m, j.request.top_logprobs, text_offsets)
                              : json(nullptr);
    parsed_reply reply;
    if (j.request.kind == endpoint::chat) reply = parse_reply(r.text, j.reply_opts());
    else reply.content = r.text;
    const json body = completion_response(j.meta, reply, j.finish_reason(r), logprobs,
                                           static_cast<int>(j.request.prompt.size()), r.time);
    res.status = 200;
    res.set_content(to_text(body), "application/json");
}

// Writes the whole event stream from inside cpp-httplib's content provider (on the connection's
// thread), holding a slot (the handler waited for it); the engine thread formats the token events
// into a bounded queue and only this thread writes to the sink. A failure once the stream has begun is an error event and [DONE]. False: the
// client is gone.
bool stream_events(job& j, httplib::DataSink& sink) {
    const auto write = [&](const std::string& event) {
        if (j.cut_by == cut::client_gone) return false;
        if (!sink.write(event.data(), event.size())) j.cut_for(cut::client_gone);
        return j.cut_by != cut::client_gone;
    };
    const auto finish = [&](const std::string& last) {
        if ((!last.empty() && !write(last)) || !write(std::string(sse_done))) return false;
        sink.done();
        return true;
    };
    const completion_request& rq = j.request;
    if (rq.kind == endpoint::chat && !write(sse_event(stream_chunk(j.meta, {.first = true, .usage_null = rq.include_usage}))))
        return false;

    const generated_token* previous = nullptr;  // the engine repeats the last token when it flushes held-back text
    size_t emitted = 0;                         // bytes of answer text sent so far
    reply_stream splitter(j.reply_opts());
    const bool chat = rq.kind == endpoint::chat;
    generation_result r;
    event_queue q;
    try {
        r = j.stream(q, [&](const token_event& e) -> std::optional<std::string> {
            json logprobs = nullptr;
            if (rq.logprobs && &e.token != previous)
                logprobs = logprobs_json(rq.kind, std::span(&e.token, 1), *j.m, rq.top_logprobs, std::span(&emitted, 1));
            previous = &e.token;
            emitted += e.text.size();
            const reply_stream::delta d = chat ? splitter.push(e.text) : reply_stream::delta{{}, std::string(e.text)};
            const bool calls = !d.tool_calls.empty();
            if (d.content.empty() && d.reasoning.empty() && !calls && logprobs.is_null()) return std::nullopt;
            return sse_event(stream_chunk(j.meta, {.piece = d.content, .reasoning = d.reasoning,
                                                   .tool_calls = calls ? &d.tool_calls : nullptr,
                                                   .logprobs = std::move(logprobs), .usage_null = rq.include_usage}));
        }, write);
    } catch (const api_error& e) {
        return finish(sse_event(error_body(e)));
    } catch (const std::exception& e) {
        j.state.log->error("Request {} failed while streaming: {}", j.ticket.id(), e.what());
        return finish(sse_event(error_body(api_error(500, fmt::format("internal error: {}", e.what()), "server_error"))));
    }
    j.record(r);
    if (j.cut_by == cut::client_gone) return false;
    if (j.cut_by == cut::timeout && j.cut_in_prompt(r)) return finish(sse_event(error_body(j.prompt_timeout_error(r))));
    if (j.cut_by == cut::shutdown)
        return finish(sse_event(error_body(api_error(503, "the server is shutting down; the generation was cancelled",
                                                     "unavailable_error", "", "shutting_down"))));
    const int n_prompt = static_cast<int>(rq.prompt.size());
    std::string_view reason = j.finish_reason(r);
    if (chat) {
        const parsed_reply rest = splitter.finish();
        const bool calls = !rest.tool_calls.empty(), deltas = !rest.tool_call_deltas.empty();
        if ((!rest.content.empty() || !rest.reasoning.empty() || deltas) &&
            !write(sse_event(stream_chunk(j.meta, {.piece = rest.content, .reasoning = rest.reasoning,
                                                   .tool_calls = deltas ? &rest.tool_call_deltas : nullptr,
                                                   .usage_null = rq.include_usage}))))
            return false;
        if (calls) reason = "tool_calls";
    }
    if (!write(sse_event(stream_chunk(j.meta, {.finish_reason = reason, .final_timings = &r.time,
                                               .usage_null = rq.include_usage}))))
        return false;
    return finish(rq.include_usage ? sse_event(usage_chunk(j.meta, n_prompt, r.time)) : std::string());
}

}  // namespace

void handle_completion(server_state& state, const httplib::Request& req, httplib::Response& res, endpoint kind) {
    const std::shared_ptr<model> m = state.loaded_model();
    if (!m) throw api_error(503, "Loading model", "unavailable_error", "", "loading");
    const json body = parse_body(req.body);
    completion_request request =
        parse_completion_request(body, kind, *m, state.options.default_sampling, state.options.special_in_content, req.body);
    request.generation.speculation = state.options.default_speculation;
    // The header a balancer hashes on names the conversation ahead of the body's fields.
    if (const std::string header = req.get_header_value("X-Conversation-Id"); !header.empty()) {
        check_conversation_key("X-Conversation-Id", header);
        request.conversation = header;
        request.generation.cache_scope = cache_scope_of(header);
    }

    const uint64_t id = state.next_request_id.fetch_add(1);
    response_meta meta{kind, state.new_response_id(kind == endpoint::chat ? "chatcmpl" : "cmpl"),
                       std::chrono::duration_cast<std::chrono::seconds>(
                           std::chrono::system_clock::now().time_since_epoch()).count(),
                       state.model_id()};
    const int fd = current_connection_socket(req.remote_port);
    const bool stream = request.stream;
    auto j = std::make_shared<job>(state, id, m, std::move(request), std::move(meta), fd);
    // Refused at admission while draining; checked after the job counts in in_flight, so a drain that
    // saw in_flight reach 0 can never be followed by a generation.
    if (state.draining.load()) {
        res.set_header("Retry-After", "1");
        throw api_error(503, "the server is draining: this request was not started, retry it on another replica",
                        "unavailable_error", "", "draining");
    }
    if (!stream) {
        answer_whole(*j, res);
        return;
    }
    // The wait happens before the stream starts, so a request that leaves the queue (shutdown,
    // timeout) gets a plain 503 like a whole answer.
    if (!j->wait_for_engine()) {
        if (j->cut_by == cut::client_gone) {
            state.log->info("Request {} left the queue: its client disconnected.", id);
            res.status = client_closed_request;
            return;
        }
        throw j->wait_error();
    }
    res.status = 200;
    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Accel-Buffering", "no");
    res.set_chunked_content_provider("text/event-stream", [j](size_t, httplib::DataSink& sink) {
        try {
            return stream_events(*j, sink);
        } catch (const std::exception& e) {
            j->state.log->error("Request {} failed while streaming: {}", j->ticket.id(), e.what());
            return false;
        }
    });
}

}  // namespace strata::server
