#include "batcher.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>
#include <string>
#include <thread>

#include <spdlog/fmt/fmt.h>

#include "log.hpp"
#include "session_impl.hpp"
#include "spec/controller.hpp"
#include "spec/ngram.hpp"
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
          sampler(to_sampler(o.sampling)), decoder(s.m.tokenizer), stops(o.stop),
          control(o.speculation.type == "auto", o.speculation.n_max, s.m.spec_costs),
          history(prompt),
          mtp(!s.m.hybrid && s.m.forward && s.m.forward->has_mtp() &&
              (o.speculation.type == "mtp" || o.speculation.type == "auto")) {}

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
    bool decoding = false;      // the prompt is in; `batch` waits for its step
    size_t common = 0;          // prompt tokens reused
    std::string text;           // everything decoded so far
    size_t emitted = 0;         // bytes of `text` already handed to the callback
    clock_type::time_point t0, t1;
    engine::gpu::cache_stats before;
    engine::phase_clock parts;  // decode passes by part (model_options::phase_timing, alone in a step)
    engine::phase_clock prompt_parts;  // the prompt's passes by part (the same, while alone in a step)
    // Speculative decoding: the next step's tokens (the sampled token, then its drafts), the drafts of
    // the last verification and their logits [k + 1][n_vocab], the row the next token is drawn from,
    // and how many positions of the cache are final (past them: drafts not accepted yet).
    engine::spec::controller control;
    std::vector<int32_t> history;  // prompt and generated tokens, for the n-gram drafter
    std::vector<int32_t> batch, drafts;
    std::vector<float> verify_logits;
    size_t row = 0;
    size_t n_final = 0;
    const float* next_logits = nullptr;
    bool verifying = false;                  // the step in flight verifies drafts
    // MTP drafts: the trunk's residual rows of this generation's last pass, from position h_pos0.
    const bool mtp;
    std::vector<float> hidden, mtp_h, mtp_h_out, mtp_logits;
    int h_pos0 = 0;
    double mtp_ms = 0;                       // an MTP pass's wall time (moving average)
    bool turned_off = false;
    bool settled = false;                    // rejected drafts dropped, totals counted
};

step_batcher::step_batcher(model::impl& m) : m_(m), pacer_(m.options.prefill_pace) {}
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
    if (step_parts_.passes > 0) {
        for (int p = 0; p < engine::phase_clock::n_parts; ++p)
            b.step_phases.push_back({engine::phase_clock::name(p), 1e3 * step_parts_.seconds[p], step_parts_.bytes[p]});
        b.step_phases.push_back({"batcher", 1e3 * batcher_seconds_, 0});
        b.timed_steps = static_cast<uint64_t>(step_parts_.passes);
    }
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
    int rows = 0, n_decode = 0, prompt_left = 0;
    const auto reserve = [&](generation& g, int n_tok) {
        g.s.grow(static_cast<int>(g.s.cached.size()) + n_tok);
    };
    // Decode rows first, then prompt chunks (as many tokens as the pacer allows), each round-robin from next_.
    for (int pass = 0; pass < 2; ++pass) {
        if (pass == 1) {
            n_decode = rows;
            prompt_left = pacer_.prompt_tokens(n_decode, budget);
        }
        for (size_t i = 0; i < n && rows < budget && (pass == 0 || prompt_left > 0); ++i) {
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
                    reserve(g, static_cast<int>(g.batch.size()));
                } catch (const engine::kv_cache_full& e) {
                    logger("engine")->warn("The generation stops at {} tokens: {}.", g.result.tokens.size(), e.what());
                    g.result.reason = stop_reason::length;
                    finish(g);
                    ended.push_back(&g);
                    continue;
                }
                segs.push_back(decode_segment(g));
            } else {
                const size_t fed = g.s.cached.size();
                const int n_tok = std::min(static_cast<int>(g.prompt.size() - fed), prompt_left);
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
                                last || m_.hybrid ? g.s.logits.data() : nullptr, false, hidden_rows(g, n_tok)});
            }
            owners.push_back(&g);
            rows += segs.back().n_tok;
            if (pass == 1) prompt_left -= segs.back().n_tok;
        }
    }
    if (n > 0) next_ = (next_ + 1) % n;
    const clock_type::time_point t_step = clock_type::now();
    bool timed_step = false;
    if (!segs.empty()) {
        // Phase timing describes one generation's decode passes: only while it is alone in the step.
        generation* timed = m_.options.phase_timing && !m_.hybrid && owners.size() == 1 ? owners[0] : nullptr;
        // Steps of several decode rows are timed into step_parts_ (batch_stats::step_phases).
        timed_step = m_.options.phase_timing && !m_.hybrid && owners.size() > 1 && n_decode == rows;
        if (timed_step) pass_parts_ = {};
        if (timed || timed_step)
            m_.forward->set_clock(!timed ? &pass_parts_ : timed->decoding ? &timed->parts : &timed->prompt_parts);
        struct detach {
            engine::forward_pass* f;
            ~detach() {
                if (f) f->set_clock(nullptr);
            }
        } detached{timed || timed_step ? m_.forward.get() : nullptr};
        const uint64_t bytes_before = m_.forward ? m_.forward->bytes_read() : 0;
        try {
            const auto t_step = clock_type::now();
            if (m_.hybrid)
                for (const engine::step_segment& s : segs)
                    m_.hybrid->eval(std::span(s.tokens, static_cast<size_t>(s.n_tok)), s.pos0, *s.kv, s.logits,
                                    s.all_logits, m_.options.n_batch);
            else
                m_.forward->eval_step(segs, m_.options.n_batch);
            record_cost(owners, rows, ms_since(t_step));
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
        if (!g.decoding && g.mtp) {
            // The MTP entries of the chunk's positions whose next token is known (all but the prompt's last).
            g.h_pos0 = segs[i].pos0;
            try {
                mtp_fill(g, std::min(segs[i].pos0 + segs[i].n_tok, static_cast<int>(g.prompt.size()) - 1), nullptr);
            } catch (...) {
                fail(g, std::current_exception());
                ended.push_back(&g);
                continue;
            }
        }
        if (g.decoding) {
            g.h_pos0 = segs[i].pos0;
            g.s.kv.stop_trace();
            ++g.n_final;
            g.row = 0;
            g.next_logits = g.verifying ? g.verify_logits.data() : g.s.logits.data();
            if (g.verifying) {
                g.result.time.spec_drafted += static_cast<int>(g.drafts.size());
                ++g.result.time.spec_verifications;
            }
        } else {
            if (g.s.cached.size() < g.prompt.size()) continue;
            g.result.time.prompt_n = static_cast<int>(g.prompt.size() - g.common);
            g.result.time.prompt_ms = ms_since(g.t0);
            g.s.kv.checkpoint();  // the prompt's end: where a retried answer starts again
            g.s.account();
            g.t1 = clock_type::now();
            g.decoding = true;
            g.n_final = g.s.cached.size();
            g.next_logits = g.s.logits.data();
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
    if (!segs.empty()) {
        const double ms = ms_since(t_step);
        pacer_.observe(n_decode, rows - n_decode, ms);
        if (n_decode > 0 && rows > n_decode)
            logger("engine")->debug("Step: {} decode rows and {} prompt tokens in {:.1f} ms (decode-only step {:.1f} ms, "
                                    "{:.2f} ms per prompt token).", n_decode, rows - n_decode, ms, pacer_.decode_ms(),
                                    pacer_.token_ms());
    }
    if (timed_step) {
        double pass = 0;
        for (double x : pass_parts_.seconds) pass += x;
        std::lock_guard lock(mutex_);
        for (int p = 0; p < engine::phase_clock::n_parts; ++p) {
            step_parts_.seconds[p] += pass_parts_.seconds[p];
            step_parts_.bytes[p] += pass_parts_.bytes[p];
        }
        ++step_parts_.passes;
        batcher_seconds_ += ms_since(t_step) / 1e3 - pass;
    }
    std::erase_if(active_, [&](const std::unique_ptr<generation>& g) {
        return std::find(ended.begin(), ended.end(), g.get()) != ended.end();
    });
    return !segs.empty() || !ended.empty();
}

bool step_batcher::sample(generation& g) {
    generation_result& r = g.result;
    const int want_top = g.o.top_logprobs > 0 ? g.o.top_logprobs : (g.o.logprobs ? 0 : -1);
    // Each accepted draft's logits are in the verification's already: its next token is drawn at once.
    for (;;) {
        if (g.s.cancel.load(std::memory_order_relaxed)) {
            r.reason = stop_reason::cancelled;
            finish(g);
            return false;
        }
        const tok::sample_result s =
            g.sampler.sample(std::span(g.next_logits, static_cast<size_t>(m_.hp.n_vocab)), want_top);
        if (!g.o.ignore_eos && m_.tokenizer.is_eog(s.id)) {
            r.reason = stop_reason::eos;
            finish(g);
            return false;
        }
        generated_token t{s.id, s.logprob, {}};
        for (const auto& alt : s.top_logprobs)
            t.top.push_back({alt.id, std::string(m_.tokenizer.token_to_piece(alt.id, true)), alt.logprob});
        r.tokens.push_back(t);
        g.history.push_back(s.id);
        g.text += g.decoder.push(s.id);
        const tok::stop_scan scan = g.stops.scan(g.text);
        const size_t safe = scan.safe_length;
        const std::string_view piece =
            safe > g.emitted ? std::string_view(g.text).substr(g.emitted, safe - g.emitted) : "";
        g.emitted = std::max(g.emitted, safe);
        const bool go_on = !g.cb || g.cb({r.tokens.back(), piece});
        if (scan.stopped) {
            g.text.resize(safe);
            r.reason = stop_reason::stop_string;
        } else if (!go_on) {
            r.reason = stop_reason::cancelled;
        } else if (static_cast<int>(g.n_final) >= m_.options.n_ctx ||
                   static_cast<int>(r.tokens.size()) >= g.o.max_tokens) {
            r.reason = stop_reason::length;
        } else if (g.row < g.drafts.size() && g.drafts[g.row] == s.id) {
            // A draft the sampler picked: its position is in the cache, its logits in the next row.
            ++g.row;
            ++g.n_final;
            ++r.time.spec_accepted;
            g.next_logits = g.verify_logits.data() + g.row * static_cast<size_t>(m_.hp.n_vocab);
            continue;
        } else {
            plan_step(g, s.id);
            return true;
        }
        finish(g);
        return false;
    }
}

engine::step_segment step_batcher::decode_segment(generation& g) {
    g.verifying = g.batch.size() > 1;
    if (g.verifying) {
        g.verify_logits.resize(g.batch.size() * static_cast<size_t>(m_.hp.n_vocab));
        // The state after each draft's position but the last, where a rejection goes back to.
        g.s.kv.start_trace(static_cast<int>(g.drafts.size()));
    }
    return {g.batch.data(), static_cast<int>(g.batch.size()), static_cast<int>(g.s.cached.size()), &g.s.kv,
            g.verifying ? g.verify_logits.data() : g.s.logits.data(), g.verifying,
            hidden_rows(g, static_cast<int>(g.batch.size()))};
}

float* step_batcher::hidden_rows(generation& g, int n_tok) {
    if (!g.mtp) return nullptr;
    g.hidden.resize(static_cast<size_t>(n_tok) * static_cast<size_t>(m_.hp.residual_width()));
    return g.hidden.data();
}

void step_batcher::mtp_fill(generation& g, int last, float* logits) {
    session::impl& s = g.s;
    s.mtp_cache();
    const size_t width = static_cast<size_t>(m_.hp.residual_width());  // a residual row (qwen4exp: hc streams)
    const int n_rows = static_cast<int>(g.hidden.size() / width);
    // Position p's entry: token p with the residual at p - 1 (zeros at position 0 and at h_pos0 when
    // its residual was in an earlier pass). Positions before h_pos0 that have no entry (steps that
    // drafted nothing, a restored prefix) keep what the cache holds there: that costs acceptance only.
    for (int from = std::max(std::min(s.mtp_filled, logits ? last : last + 1), std::min(g.h_pos0, last)); from <= last;) {
        const int n = std::min(last + 1 - from, std::max(1, m_.options.n_batch));
        g.mtp_h.assign(static_cast<size_t>(n) * width, 0.0f);
        for (int t = 0; t < n; ++t) {
            const int row = from + t - 1 - g.h_pos0;
            if (row >= 0 && row < n_rows)
                std::copy_n(g.hidden.data() + static_cast<size_t>(row) * width, width,
                            g.mtp_h.data() + static_cast<size_t>(t) * width);
        }
        const bool end = from + n > last;
        if (end && logits) g.mtp_h_out.resize(static_cast<size_t>(n) * width);
        m_.forward->mtp(g.history.data() + from, g.mtp_h.data(), n, from, *s.mtp_kv,
                        end && logits ? g.mtp_h_out.data() : nullptr, end ? logits : nullptr);
        from += n;
    }
    s.mtp_filled = std::max(s.mtp_filled, last + 1);
}

namespace {

// The most probable token of logits [n] (ties: the lower id) and its probability.
std::pair<int32_t, float> argmax_prob(const float* logits, int n) {
    int32_t best = 0;
    for (int i = 1; i < n; ++i)
        if (logits[i] > logits[best]) best = i;
    double sum = 0;
    for (int i = 0; i < n; ++i) sum += std::exp(double(logits[i]) - double(logits[best]));
    return {best, static_cast<float>(1.0 / sum)};
}

}  // namespace

void step_batcher::mtp_draft(generation& g, int k) {
    const clock_type::time_point t0 = clock_type::now();
    int passes = 1;
    const size_t width = static_cast<size_t>(m_.hp.residual_width()), n_vocab = static_cast<size_t>(m_.hp.n_vocab);
    const float min_p = g.o.speculation.min_p;
    g.mtp_logits.resize(n_vocab);
    // The entries up to the sampled token's position; its row's logits give the first draft.
    const int pos = static_cast<int>(g.n_final);
    mtp_fill(g, pos, g.mtp_logits.data());
    std::vector<float> h(g.mtp_h_out.end() - static_cast<ptrdiff_t>(width), g.mtp_h_out.end());
    for (int i = 0; i < k; ++i) {
        if (i > 0) {
            // A chained draft: the previous draft at the next position, over the block's own output residual.
            const int32_t tok = g.drafts.back();
            g.mtp_h_out.resize(width);
            m_.forward->mtp(&tok, h.data(), 1, pos + i, *g.s.mtp_kv, g.mtp_h_out.data(), g.mtp_logits.data(), false,
                            true);
            h.assign(g.mtp_h_out.begin(), g.mtp_h_out.end());
            ++passes;
        }
        const auto [id, p] = argmax_prob(g.mtp_logits.data(), static_cast<int>(n_vocab));
        if (p < min_p) break;
        g.drafts.push_back(id);
    }
    // A draft's cost for `auto`, in decode steps: the MTP passes' time (a moving average) over a step's.
    const double ms = ms_since(t0) / passes;
    g.mtp_ms = g.mtp_ms > 0 ? g.mtp_ms + 0.2 * (ms - g.mtp_ms) : ms;
    const std::lock_guard lock(m_.spec_mutex);
    if (m_.spec_costs.measured(1)) g.control.set_draft_cost(g.mtp_ms / m_.spec_costs.ms(1));
}

void step_batcher::plan_step(generation& g, int32_t token) {
    drop_rejected(g);
    const speculation_options& so = g.o.speculation;
    g.drafts.clear();
    g.row = 0;
    if (so.type != "off" && !m_.hybrid) {
        // Every draft must be a token the generation may still produce, at a position the context has.
        const int room = std::min(g.o.max_tokens - 1 - static_cast<int>(g.result.tokens.size()),
                                  m_.options.n_ctx - 1 - static_cast<int>(g.n_final));
        const int k = std::min(g.control.draft_length(), room);
        if (!g.control.turned_off().empty() && !g.turned_off) {
            g.turned_off = true;
            logger("engine")->info("Speculative decoding turned itself off at generated token {}: {}.",
                                   g.result.tokens.size(), g.control.turned_off());
        }
        if (k > 0 && so.type == "forced") {
            const size_t from = std::min(g.result.tokens.size(), so.forced.size());
            const size_t to = std::min(so.forced.size(), from + static_cast<size_t>(k));
            g.drafts.assign(so.forced.begin() + static_cast<ptrdiff_t>(from), so.forced.begin() + static_cast<ptrdiff_t>(to));
        } else if (k > 0 && g.mtp) {
            mtp_draft(g, k);
            // No draft sure enough (--spec-min-p): the MTP pass was paid for nothing, a miss for `auto`.
            if (g.drafts.empty()) g.control.record(1, 0);
        } else if (k > 0) {
            g.drafts = engine::spec::ngram_draft(g.history, k, {so.ngram_min, std::max(so.ngram_min, 4)});
        }
    }
    g.batch.assign(1, token);
    g.batch.insert(g.batch.end(), g.drafts.begin(), g.drafts.end());
}

void step_batcher::drop_rejected(generation& g) {
    if (!g.drafts.empty()) g.control.record(static_cast<int>(g.drafts.size()), static_cast<int>(g.row));
    session::impl& s = g.s;
    const size_t n_keep = g.n_final;
    if (!g.decoding || n_keep >= s.cached.size()) return;
    // The sequence's state goes back to its copy after the last kept position (no evaluation).
    if (!s.kv.back_to_traced(static_cast<int>(n_keep)))
        throw std::logic_error(fmt::format("the sequence state kept no copy at position {} (verified from {})",
                                           n_keep, s.kv.state_pos()));
    s.cached.resize(n_keep);
    s.n_cached.store(s.cached.size());
    s.account();
}

void step_batcher::record_cost(const std::vector<generation*>& owners, int rows, double ms) {
    // A pass's cost by its rows, for `auto`'s draft lengths: decode steps only, and only where the
    // rows run as one pass (the hybrid families run each sequence's rows in turn).
    const bool one_pass = owners.size() == 1 || (!m_.hybrid && m_.forward->batches_sequences());
    if (!one_pass || std::any_of(owners.begin(), owners.end(), [](const generation* g) { return !g->decoding; }))
        return;
    const std::lock_guard lock(m_.spec_mutex);
    m_.spec_costs.record(rows, ms);
}

void step_batcher::settle(generation& g) {
    if (g.settled) return;
    g.settled = true;
    drop_rejected(g);
    g.drafts.clear();
    g.s.kv.release_trace();
    const timings& t = g.result.time;
    const std::lock_guard lock(m_.spec_mutex);
    m_.spec_totals.drafted += static_cast<uint64_t>(t.spec_drafted);
    m_.spec_totals.accepted += static_cast<uint64_t>(t.spec_accepted);
    m_.spec_totals.verifications += static_cast<uint64_t>(t.spec_verifications);
    m_.spec_totals.turned_off += g.turned_off ? 1 : 0;
}

void step_batcher::finish(generation& g, bool flush) {
    generation_result& r = g.result;
    try {
        settle(g);
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
        for (int p = 0; p < engine::phase_clock::n_parts; ++p)
            r.time.prompt_phases.push_back(
                {engine::phase_clock::name(p), 1e3 * g.prompt_parts.seconds[p], g.prompt_parts.bytes[p]});
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
        settle(g);
        g.s.trim();
    } catch (...) {
    }
    g.s.busy.store(false);
    g.done.set_exception(e);
}

}  // namespace strata
