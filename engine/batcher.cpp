#include "batcher.hpp"

#include <algorithm>
#include <chrono>
#include <optional>
#include <string>
#include <thread>

#include <spdlog/fmt/fmt.h>

#include "log.hpp"
#include "session_impl.hpp"
#include "tokenizer/sampler.hpp"
#include "tokenizer/stop_strings.hpp"

namespace strata {

namespace {

using clock_type = std::chrono::steady_clock;

double ms_since(clock_type::time_point t0) {
    return std::chrono::duration<double, std::milli>(clock_type::now() - t0).count();
}

tok::sampler_params to_sampler(const sampling_options& s) {
    tok::sampler_params p;
    p.temperature = s.temperature;
    p.top_k = s.top_k;
    p.top_p = s.top_p;
    p.min_p = s.min_p;
    p.repeat_penalty = s.repeat_penalty;
    p.repeat_last_n = s.repeat_last_n;
    p.presence_penalty = s.presence_penalty;
    p.frequency_penalty = s.frequency_penalty;
    p.seed = s.seed;
    p.logit_bias = s.logit_bias;
    return p;
}

}  // namespace

// One generate() call in flight: its prompt's progress, sampler, decoded text and result.
struct generation {
    generation(session::impl& s_, std::vector<int32_t> p, const generation_options& o_, token_callback cb_,
               std::function<bool()> ready_)
        : s(s_), prompt(std::move(p)), o(o_), cb(std::move(cb_)), ready(std::move(ready_)),
          sampler(to_sampler(o.sampling)), decoder(s.m.tokenizer), stops(o.stop) {}

    session::impl& s;
    const std::vector<int32_t> prompt;
    const generation_options o;
    const token_callback cb;
    const std::function<bool()> ready;
    std::promise<generation_result> done;
    generation_result result;
    tok::sampler sampler;
    tok::stream_decoder decoder;
    tok::stop_matcher stops;
    bool decoding = false;      // the prompt is in; next_token waits for its step
    size_t common = 0;          // prompt tokens reused
    int32_t next_token = 0;
    std::string text;           // everything decoded so far
    size_t emitted = 0;         // bytes of `text` already handed to the callback
    clock_type::time_point t0, t1;
    engine::gpu::cache_stats before;
    engine::phase_clock parts;  // decode passes by part (model_options::phase_timing, alone in a step)
};

step_batcher::step_batcher(model::impl& m) : m_(m) {}
step_batcher::~step_batcher() = default;

std::future<generation_result> step_batcher::submit(session::impl& s, std::vector<int32_t> prompt,
                                                    const generation_options& o, token_callback cb,
                                                    std::function<bool()> ready) {
    auto g = std::make_unique<generation>(s, std::move(prompt), o, std::move(cb), std::move(ready));
    std::future<generation_result> f = g->done.get_future();
    bool post = false;
    {
        std::lock_guard lock(mutex_);
        pending_.push_back(std::move(g));
        post = !posted_;
        posted_ = true;
    }
    if (post) m_.thread.post([this] { pump(); });
    return f;
}

batch_stats step_batcher::stats() const {
    batch_stats b;
    b.steps = steps_.load();
    b.rows = rows_.load();
    b.bytes = bytes_.load();
    b.active = n_active_.load();
    b.last_step_rows = last_rows_.load();
    b.max_step_rows = max_rows_.load();
    b.sequences_in_one_pass = !m_.hybrid && m_.forward && m_.forward->batches_sequences();
    std::lock_guard lock(mutex_);
    b.waiting = static_cast<int>(pending_.size());
    return b;
}

void step_batcher::pump() {
    admit();
    const bool ran = step();
    n_active_.store(static_cast<int>(active_.size()));
    {
        std::lock_guard lock(mutex_);
        if (active_.empty() && pending_.empty()) {
            posted_ = false;
            return;
        }
    }
    // Every generation waits for its reader: give the readers a moment instead of spinning.
    if (!ran) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    m_.thread.post([this] { pump(); });
}

void step_batcher::admit() {
    // The GPU hybrid keeps one session's cache in VRAM at a time: its generations run one after another.
    const size_t limit = m_.hybrid ? 1 : SIZE_MAX;
    for (;;) {
        std::unique_ptr<generation> g;
        {
            std::lock_guard lock(mutex_);
            if (pending_.empty() || active_.size() >= limit) break;
            g = std::move(pending_.front());
            pending_.pop_front();
        }
        if (m_.hybrid && !logged_sequential_) {
            logger("engine")->info("The GPU hybrid runs one generation at a time (one session's KV cache in VRAM); "
                                   "concurrent generations wait their turn.");
            logged_sequential_ = true;
        }
        try {
            g->before = g->s.expert_cache_stats();
            g->sampler.accept_prompt(g->prompt);
            g->t0 = clock_type::now();
            g->common = g->s.reuse_prefix(g->prompt, g->o.cache_scope, g->result.time);
            active_.push_back(std::move(g));
        } catch (...) {
            fail(*g, std::current_exception());
        }
    }
}

bool step_batcher::step() {
    const int budget = std::max(1, m_.options.n_batch);
    const size_t n = active_.size();
    std::vector<engine::step_segment> segs;
    std::vector<generation*> owners;
    std::vector<generation*> ended;
    int rows = 0;
    const auto reserve = [&](generation& g, int n_tok) {
        g.s.grow(static_cast<int>(g.s.cached.size()) + n_tok);
    };
    // Decode rows first, then prompt chunks, each round-robin from next_.
    for (int pass = 0; pass < 2; ++pass)
        for (size_t i = 0; i < n && rows < budget; ++i) {
            generation& g = *active_[(next_ + i) % n];
            if (g.decoding != (pass == 0) || std::find(ended.begin(), ended.end(), &g) != ended.end()) continue;
            if (g.s.cancel.load(std::memory_order_relaxed)) {
                g.result.reason = stop_reason::cancelled;
                if (!g.decoding) {
                    g.result.time.prompt_n = static_cast<int>(g.s.cached.size() - g.common);
                    g.result.time.prompt_ms = ms_since(g.t0);
                }
                finish(g, g.decoding);
                ended.push_back(&g);
                continue;
            }
            if (g.decoding) {
                if (g.ready && !g.ready()) continue;
                try {
                    reserve(g, 1);
                } catch (const engine::kv_cache_full& e) {
                    logger("engine")->warn("The generation stops at {} tokens: {}.", g.result.tokens.size(), e.what());
                    g.result.reason = stop_reason::length;
                    finish(g);
                    ended.push_back(&g);
                    continue;
                }
                segs.push_back({&g.next_token, 1, static_cast<int>(g.s.cached.size()), &g.s.kv, g.s.logits.data(), false});
            } else {
                const size_t fed = g.s.cached.size();
                const int n_tok = std::min({static_cast<int>(g.prompt.size() - fed), budget - rows, m_.options.n_batch});
                try {
                    reserve(g, n_tok);
                } catch (const engine::kv_cache_full& e) {
                    fail(g, std::make_exception_ptr(request_error(
                                fmt::format("the prompt's {} tokens do not fit: {}", g.prompt.size(), e.what()))));
                    ended.push_back(&g);
                    continue;
                }
                const bool last = fed + static_cast<size_t>(n_tok) == g.prompt.size();
                segs.push_back({g.prompt.data() + fed, n_tok, static_cast<int>(fed), &g.s.kv,
                                last || m_.hybrid ? g.s.logits.data() : nullptr, false});
            }
            owners.push_back(&g);
            rows += segs.back().n_tok;
        }
    if (n > 0) next_ = (next_ + 1) % n;
    if (!segs.empty()) {
        // Phase timing describes one generation's decode passes: only while it is alone in the step.
        generation* timed = m_.options.phase_timing && !m_.hybrid && owners.size() == 1 && owners[0]->decoding
                                ? owners[0] : nullptr;
        if (timed) m_.forward->set_clock(&timed->parts);
        struct detach {
            engine::forward_pass* f;
            ~detach() {
                if (f) f->set_clock(nullptr);
            }
        } detached{timed ? m_.forward.get() : nullptr};
        const uint64_t bytes_before = m_.forward ? m_.forward->bytes_read() : 0;
        try {
            if (m_.hybrid)
                for (const engine::step_segment& s : segs)
                    m_.hybrid->eval(std::span(s.tokens, static_cast<size_t>(s.n_tok)), s.pos0, *s.kv, s.logits, false,
                                    m_.options.n_batch);
            else
                m_.forward->eval_step(segs, m_.options.n_batch);
        } catch (...) {
            // The pass failed as a whole: every generation in it ends with the error.
            for (generation* g : owners) {
                fail(*g, std::current_exception());
                ended.push_back(g);
            }
            std::erase_if(active_, [&](const std::unique_ptr<generation>& a) {
                return std::find(ended.begin(), ended.end(), a.get()) != ended.end();
            });
            return true;
        }
        steps_.fetch_add(1);
        rows_.fetch_add(static_cast<uint64_t>(rows));
        if (!m_.hybrid && m_.forward) bytes_.fetch_add(m_.forward->bytes_read() - bytes_before);
        last_rows_.store(rows);
        max_rows_.store(std::max(max_rows_.load(), rows));
    }
    for (size_t i = 0; i < segs.size(); ++i) {
        generation& g = *owners[i];
        g.s.appended(std::span(segs[i].tokens, static_cast<size_t>(segs[i].n_tok)));
        if (!g.decoding) {
            if (g.s.cached.size() < g.prompt.size()) continue;
            g.result.time.prompt_n = static_cast<int>(g.prompt.size() - g.common);
            g.result.time.prompt_ms = ms_since(g.t0);
            g.s.kv.recurrent().checkpoint();  // the prompt's end: where a retried answer starts again
            g.s.account();
            g.t1 = clock_type::now();
            g.decoding = true;
        }
        bool go_on = false;
        try {
            go_on = sample(g);
        } catch (...) {
            fail(g, std::current_exception());
            ended.push_back(&g);
            continue;
        }
        if (!go_on) ended.push_back(&g);
    }
    std::erase_if(active_, [&](const std::unique_ptr<generation>& g) {
        return std::find(ended.begin(), ended.end(), g.get()) != ended.end();
    });
    return !segs.empty() || !ended.empty();
}

bool step_batcher::sample(generation& g) {
    generation_result& r = g.result;
    if (g.s.cancel.load(std::memory_order_relaxed)) {
        r.reason = stop_reason::cancelled;
        finish(g);
        return false;
    }
    const int want_top = g.o.top_logprobs > 0 ? g.o.top_logprobs : (g.o.logprobs ? 0 : -1);
    const tok::sample_result s = g.sampler.sample(g.s.logits, want_top);
    if (!g.o.ignore_eos && m_.tokenizer.is_eog(s.id)) {
        r.reason = stop_reason::eos;
        finish(g);
        return false;
    }
    generated_token t{s.id, s.logprob, {}};
    for (const auto& alt : s.top_logprobs)
        t.top.push_back({alt.id, std::string(m_.tokenizer.token_to_piece(alt.id, true)), alt.logprob});
    r.tokens.push_back(t);
    g.text += g.decoder.push(s.id);
    const tok::stop_scan scan = g.stops.scan(g.text);
    const size_t safe = scan.safe_length;
    const std::string_view piece = safe > g.emitted ? std::string_view(g.text).substr(g.emitted, safe - g.emitted) : "";
    g.emitted = std::max(g.emitted, safe);
    const bool go_on = !g.cb || g.cb({r.tokens.back(), piece});
    if (scan.stopped) {
        g.text.resize(safe);
        r.reason = stop_reason::stop_string;
    } else if (!go_on) {
        r.reason = stop_reason::cancelled;
    } else if (static_cast<int>(g.s.cached.size()) >= m_.options.n_ctx ||
               static_cast<int>(r.tokens.size()) >= g.o.max_tokens) {
        r.reason = stop_reason::length;
    } else {
        g.next_token = s.id;
        return true;
    }
    finish(g);
    return false;
}

void step_batcher::finish(generation& g, bool flush) {
    generation_result& r = g.result;
    try {
        if (flush && r.reason != stop_reason::stop_string) {
            g.text += g.decoder.flush();
            if (g.cb && g.text.size() > g.emitted && !r.tokens.empty())
                g.cb({r.tokens.back(), std::string_view(g.text).substr(g.emitted), true});
        }
    } catch (...) {
        fail(g, std::current_exception());
        return;
    }
    r.text = std::move(g.text);
    r.time.predicted_n = static_cast<int>(r.tokens.size());
    if (g.decoding) r.time.predicted_ms = ms_since(g.t1);
    if (m_.options.phase_timing && !m_.hybrid) {
        for (int p = 0; p < engine::phase_clock::n_parts; ++p)
            r.time.decode_phases.push_back({engine::phase_clock::name(p), 1e3 * g.parts.seconds[p], g.parts.bytes[p]});
        r.time.decode_passes = g.parts.passes;
    }
    const engine::gpu::cache_stats after = g.s.expert_cache_stats();
    r.time.expert_lookups = after.lookups - g.before.lookups;
    r.time.vram_hits = after.hits - g.before.hits;
    g.s.trim();
    g.s.busy.store(false);
    g.done.set_value(std::move(r));
}

void step_batcher::fail(generation& g, std::exception_ptr e) {
    try {
        g.s.trim();
    } catch (...) {
    }
    g.s.busy.store(false);
    g.done.set_exception(e);
}

}  // namespace strata
