// A session: one KV cache, prefix reuse across requests, the generation loop.
#include <algorithm>
#include <atomic>
#include <chrono>

#include <spdlog/fmt/fmt.h>

#include "engine_impl.hpp"
#include "log.hpp"
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
    return p;
}

}  // namespace

struct session::impl {
    std::shared_ptr<model> owner;
    model::impl& m;
    engine::kv_cache kv;
    std::vector<int32_t> cached;   // tokens whose keys and values are in kv, from position 0
    std::string scope;             // generation_options::cache_scope of the request that left them
    std::vector<float> logits;     // [n_vocab] after the last evaluated token
    std::atomic<bool> cancel{false};
    std::atomic<size_t> n_cached{0};  // cached.size(), readable from any thread
    std::atomic<size_t> kv_bytes{0};  // allocated_kv(), readable from any thread
    std::atomic<size_t> n_checkpoints{0}, checkpoint_bytes{0};  // the recurrent state's, from any thread

    void store_state_counts() {
        n_checkpoints.store(kv.recurrent().checkpoints().size());
        checkpoint_bytes.store(kv.recurrent().checkpoint_bytes());
    }

    explicit impl(std::shared_ptr<model> o)
        : owner(std::move(o)),
          m(*owner->impl_),
          kv(engine::make_sequence_state(m.hp, m.options.n_ctx, m.kv)),
          logits(static_cast<size_t>(m.hp.n_vocab)) {}

    // Bytes this session's keys and values take: in VRAM with the GPU hybrid, else in kv.
    size_t allocated_kv() const { return m.hybrid ? m.hybrid->kv_bytes(kv) : kv.bytes(); }

    // Evaluates tokens at the end of the cache (on the engine thread).
    void eval(std::span<const int32_t> tokens, float* out, bool all = false) {
        if (m.hybrid)
            m.hybrid->eval(tokens, static_cast<int>(cached.size()), kv, out, all, m.options.n_batch);
        else
            m.forward->eval(tokens, static_cast<int>(cached.size()), kv, out, all, m.options.n_batch);
        cached.insert(cached.end(), tokens.begin(), tokens.end());
        n_cached.store(cached.size());
        kv_bytes.store(allocated_kv());
        store_state_counts();
        m.tokens_evaluated += tokens.size();
    }

    // Routed lookups and VRAM hits since load (on the engine thread; zero CPU-only).
    engine::gpu::cache_stats expert_cache_stats() const {
        return m.hybrid ? m.hybrid->expert_cache_stats() : engine::gpu::cache_stats{};
    }

    void check_prompt(std::span<const int32_t> prompt) const {
        const int n_ctx = m.options.n_ctx;
        if (prompt.empty()) throw request_error("the prompt is empty: it needs at least one token");
        if (static_cast<int64_t>(prompt.size()) >= n_ctx)
            throw request_error(fmt::format("the prompt has {} tokens, but the context holds {} (and at least one "
                                            "token must be generated)",
                                            prompt.size(), n_ctx));
        for (int32_t id : prompt)
            if (id < 0 || id >= m.hp.n_vocab)
                throw request_error(fmt::format("token id {} is outside the vocabulary (0..{})", id, m.hp.n_vocab - 1));
    }

    // The prefix of `prompt` already in kv, from this session's state or a restored snapshot (parking
    // the state first when the prompt would throw most of it away); sets cached and the timings.
    size_t reuse_prefix(std::span<const int32_t> prompt, std::string_view new_scope, timings& t);

    generation_result generate(std::span<const int32_t> prompt, const generation_options& o, const token_callback& cb);
};

size_t session::impl::reuse_prefix(std::span<const int32_t> prompt, std::string_view new_scope, timings& t) {
    // Always evaluate at least the last prompt token, for its logits.
    const size_t limit = prompt.size() - 1;
    size_t common = std::mismatch(cached.begin(), cached.end(), prompt.begin(), prompt.end()).first - cached.begin();
    // Another scope's state is not reused (it is parked under its own scope below).
    common = new_scope == scope ? std::min(common, limit) : 0;
    // A recurrent state goes back only to one of its checkpoints.
    engine::recurrent_state& rs = kv.recurrent();
    if (!rs.empty()) common = static_cast<size_t>(rs.usable(static_cast<int>(common)));
    t.cache_source = common > 0 ? prefix_source::live : prefix_source::none;
    engine::conversation_cache& cc = *m.conversations;
    bool restored = false;
    if (cc.enabled()) {
        // Park before a prompt discards a tail worth keeping (a regular next turn discards a few tokens).
        if (cached.size() >= common + engine::conversation_cache::min_tail_tokens) cc.park(cached, kv, scope);
        if (const auto best = cc.find(prompt, limit, common, new_scope)) {
            try {
                kv.reserve(static_cast<int>(best->n_tokens));
                cc.restore(best->id, common, best->n_tokens, kv);
                common = best->n_tokens;
                restored = true;
                t.cache_source = prefix_source::snapshot;
                t.cache_snapshot = best->id;
            } catch (const engine::kv_cache_full& e) {
                logger("engine")->warn("Conversation snapshot {} was not restored: {}.", best->id, e.what());
            }
        }
    }
    if (!rs.empty() && !restored) rs.cut_back(static_cast<int>(common));
    // Where this prompt's new tokens start (a new turn): a state to come back to if it is edited.
    if (!rs.empty() && common > 0) rs.checkpoint();
    cached.assign(prompt.begin(), prompt.begin() + static_cast<ptrdiff_t>(common));
    scope = new_scope;
    n_cached.store(common);
    kv_bytes.store(allocated_kv());
    store_state_counts();
    t.cache_n = static_cast<int>(common);
    return common;
}

generation_result session::impl::generate(std::span<const int32_t> prompt, const generation_options& o,
                                          const token_callback& cb) {
    generation_result result;
    tok::sampler sampler(to_sampler(o.sampling));
    sampler.accept_prompt(prompt);

    const auto t0 = clock_type::now();
    const size_t common = reuse_prefix(prompt, o.cache_scope, result.time);
    // One batch at a time, so a cancellation (a client gone, a shutdown) also stops a long prompt.
    for (std::span<const int32_t> rest = prompt.subspan(common); !rest.empty();) {
        if (cancel.load(std::memory_order_relaxed)) {
            result.reason = stop_reason::cancelled;
            result.time.prompt_n = static_cast<int>(cached.size() - common);
            result.time.prompt_ms = ms_since(t0);
            return result;
        }
        const size_t n = std::min(rest.size(), static_cast<size_t>(m.options.n_batch));
        try {
            eval(rest.first(n), logits.data());
        } catch (const engine::kv_cache_full& e) {
            kv_bytes.store(allocated_kv());
            throw request_error(fmt::format("the prompt's {} tokens do not fit: {}", prompt.size(), e.what()));
        }
        rest = rest.subspan(n);
    }
    result.time.prompt_n = static_cast<int>(prompt.size() - common);
    result.time.prompt_ms = ms_since(t0);
    kv.recurrent().checkpoint();  // the prompt's end: where a retried answer starts again
    store_state_counts();

    const auto t1 = clock_type::now();
    // Decode passes by part (model_options::phase_timing, CPU forward pass only).
    engine::phase_clock parts;
    struct clock_attachment {
        engine::forward_pass* f;
        ~clock_attachment() {
            if (f) f->set_clock(nullptr);
        }
    } attached{m.options.phase_timing && m.forward && !m.hybrid ? m.forward.get() : nullptr};
    if (attached.f) attached.f->set_clock(&parts);
    const int n_ctx = m.options.n_ctx;
    tok::stream_decoder decoder(m.tokenizer);
    std::string text;        // everything decoded so far
    size_t emitted = 0;      // bytes of `text` already handed to the callback
    tok::stop_matcher stops(o.stop);
    const int want_top = o.top_logprobs > 0 ? o.top_logprobs : (o.logprobs ? 0 : -1);
    result.reason = stop_reason::length;
    for (int i = 0; i < o.max_tokens; ++i) {
        if (cancel.load(std::memory_order_relaxed)) {
            result.reason = stop_reason::cancelled;
            break;
        }
        const tok::sample_result s = sampler.sample(logits, want_top);
        if (!o.ignore_eos && m.tokenizer.is_eog(s.id)) {
            result.reason = stop_reason::eos;
            break;
        }
        generated_token g{s.id, s.logprob, {}};
        for (const auto& t : s.top_logprobs)
            g.top.push_back({t.id, std::string(m.tokenizer.token_to_piece(t.id, true)), t.logprob});
        result.tokens.push_back(g);
        text += decoder.push(s.id);
        const tok::stop_scan scan = stops.scan(text);
        const size_t safe = scan.safe_length;
        const std::string_view piece = safe > emitted ? std::string_view(text).substr(emitted, safe - emitted) : "";
        emitted = std::max(emitted, safe);
        const bool go_on = !cb || cb({result.tokens.back(), piece});
        if (scan.stopped) {
            text.resize(safe);
            result.reason = stop_reason::stop_string;
            break;
        }
        if (!go_on) {
            result.reason = stop_reason::cancelled;
            break;
        }
        if (static_cast<int>(cached.size()) >= n_ctx) {
            result.reason = stop_reason::length;
            break;
        }
        if (i + 1 < o.max_tokens) {
            try {
                eval(std::span(&s.id, 1), logits.data());
            } catch (const engine::kv_cache_full& e) {
                // Out of memory growing the cache: what was generated stands, the generation ends here.
                logger("engine")->warn("The generation stops at {} tokens: {}.", result.tokens.size(), e.what());
                result.reason = stop_reason::length;
                break;
            }
        }
    }
    if (result.reason != stop_reason::stop_string) {
        text += decoder.flush();
        if (cb && text.size() > emitted && !result.tokens.empty())
            cb({result.tokens.back(), std::string_view(text).substr(emitted), true});
    }
    result.text = std::move(text);
    result.time.predicted_n = static_cast<int>(result.tokens.size());
    result.time.predicted_ms = ms_since(t1);
    if (attached.f) {
        for (int p = 0; p < engine::phase_clock::n_parts; ++p)
            result.time.decode_phases.push_back({engine::phase_clock::name(p), 1e3 * parts.seconds[p], parts.bytes[p]});
        result.time.decode_passes = parts.passes;
    }
    return result;
}

session::session(std::shared_ptr<model> m) : impl_(std::make_unique<impl>(std::move(m))) {}
session::~session() = default;

generation_result session::generate(std::span<const int32_t> prompt, const generation_options& options,
                                    const token_callback& on_token) {
    impl_->check_prompt(prompt);
    if (options.max_tokens < 1)
        throw request_error(fmt::format("max_tokens must be at least 1, got {}", options.max_tokens));
    if (options.top_logprobs < 0 || options.top_logprobs > 20)
        throw request_error(fmt::format("top_logprobs must be 0..20, got {}", options.top_logprobs));
    generation_result result;
    impl_->cancel.store(false);
    impl_->m.thread.run([&] {
        // Afterwards (also after a failure) the cache keeps the chunks holding this conversation, which
        // its next turn reuses, and gives the rest back.
        struct trim_after {
            impl& s;
            ~trim_after() {
                if (!s.m.hybrid) s.kv.shrink(static_cast<int>(s.cached.size()));
                s.kv_bytes.store(s.allocated_kv());
            }
        } trim{*impl_};
        const engine::gpu::cache_stats before = impl_->expert_cache_stats();
        result = impl_->generate(prompt, options, on_token);
        const engine::gpu::cache_stats after = impl_->expert_cache_stats();
        result.time.expert_lookups = after.lookups - before.lookups;
        result.time.vram_hits = after.hits - before.hits;
    });
    return result;
}

void session::cancel() { impl_->cancel.store(true); }

std::vector<float> session::evaluate(std::span<const int32_t> prompt, bool all) {
    impl_->check_prompt(prompt);
    std::vector<float> out((all ? prompt.size() : 1) * static_cast<size_t>(impl_->m.hp.n_vocab));
    impl_->m.thread.run([&] {
        impl_->cached.clear();
        impl_->n_cached.store(0);
        impl_->kv.recurrent().reset();
        impl_->eval(prompt, out.data(), all);
    });
    return out;
}

uint64_t session::park() {
    uint64_t id = 0;
    impl_->m.thread.run([&] {
        if (!impl_->cached.empty()) id = impl_->m.conversations->park(impl_->cached, impl_->kv, impl_->scope);
    });
    return id;
}

size_t session::cached_tokens() const { return impl_->n_cached.load(); }

size_t session::kv_bytes() const { return impl_->kv_bytes.load(); }

size_t session::state_checkpoints() const { return impl_->n_checkpoints.load(); }

size_t session::state_checkpoint_bytes() const { return impl_->checkpoint_bytes.load(); }

}  // namespace strata
