// A session: one KV cache, prefix reuse across requests, the generation loop.
#include <algorithm>
#include <atomic>
#include <chrono>

#include <spdlog/fmt/fmt.h>

#include "engine_impl.hpp"
#include "log.hpp"
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
    return p;
}

void check_speculation(const speculation_options& so) {
    if (so.type == "mtp")
        throw request_error("speculative decoding with the model's MTP block is not implemented yet; use the spec "
                            "type ngram, auto or off");
    if (so.type != "off" && so.type != "ngram" && so.type != "auto" && so.type != "forced")
        throw request_error(fmt::format("unknown speculation type '{}': expected off, ngram, auto or mtp", so.type));
    if (so.n_max < 1 || so.n_max > engine::spec::cost_table::max_tokens - 1)
        throw request_error(fmt::format("the draft length must be 1..{}, got {}",
                                        engine::spec::cost_table::max_tokens - 1, so.n_max));
    if (so.ngram_min < 1 || so.ngram_min > 4)
        throw request_error(fmt::format("the n-gram drafts' shortest match must be 1..4 tokens, got {}", so.ngram_min));
    if (!(so.min_p >= 0.0f && so.min_p <= 1.0f))
        throw request_error(fmt::format("the draft's minimum probability must be 0..1, got {}", so.min_p));
}

}  // namespace

struct session::impl {
    std::shared_ptr<model> owner;
    model::impl& m;
    engine::kv_cache kv;
    std::vector<int32_t> cached;   // tokens whose keys and values are in kv, from position 0
    std::vector<float> logits;     // [n_vocab] after the last evaluated token
    std::atomic<bool> cancel{false};
    std::atomic<size_t> n_cached{0};  // cached.size(), readable from any thread
    std::atomic<size_t> kv_bytes{0};  // allocated_kv(), readable from any thread
    std::atomic<size_t> n_checkpoints{0}, checkpoint_bytes{0};  // the recurrent state's, from any thread
    // Speculative decoding: the logits of a verification batch [k + 1][n_vocab], the recurrent state
    // before it, and where it starts in `cached`.
    std::vector<float> verify_logits;
    engine::state_checkpoint before_verify;
    size_t verify_start = 0;

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

    // Evaluates `tokens` (the last accepted token, then drafts) as one batch, all logits into
    // verify_logits, and records the pass's cost for the model.
    void verify(std::span<const int32_t> tokens);
    // Keeps the first n_keep positions of the cache, dropping the rejected drafts of the last
    // verification; a recurrent state goes back to before the batch and runs the kept tokens again.
    void drop_rejected(size_t n_keep);

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
    size_t reuse_prefix(std::span<const int32_t> prompt, timings& t);

    generation_result generate(std::span<const int32_t> prompt, const generation_options& o, const token_callback& cb);
};

size_t session::impl::reuse_prefix(std::span<const int32_t> prompt, timings& t) {
    // Always evaluate at least the last prompt token, for its logits.
    const size_t limit = prompt.size() - 1;
    size_t common = std::mismatch(cached.begin(), cached.end(), prompt.begin(), prompt.end()).first - cached.begin();
    common = std::min(common, limit);
    // A recurrent state goes back only to one of its checkpoints.
    engine::recurrent_state& rs = kv.recurrent();
    if (!rs.empty()) common = static_cast<size_t>(rs.usable(static_cast<int>(common)));
    t.cache_source = common > 0 ? prefix_source::live : prefix_source::none;
    engine::conversation_cache& cc = *m.conversations;
    bool restored = false;
    if (cc.enabled()) {
        // Park before a prompt discards a tail worth keeping (a regular next turn discards a few tokens).
        if (cached.size() >= common + engine::conversation_cache::min_tail_tokens) cc.park(cached, kv);
        if (const auto best = cc.find(prompt, limit, common)) {
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
    n_cached.store(common);
    kv_bytes.store(allocated_kv());
    store_state_counts();
    t.cache_n = static_cast<int>(common);
    return common;
}

void session::impl::verify(std::span<const int32_t> tokens) {
    engine::recurrent_state& rs = kv.recurrent();
    if (!rs.empty() && tokens.size() > 1) rs.save(before_verify);
    verify_start = cached.size();
    verify_logits.resize(tokens.size() * static_cast<size_t>(m.hp.n_vocab));
    const auto t0 = clock_type::now();
    eval(tokens, verify_logits.data(), true);
    const double ms = ms_since(t0);
    const std::lock_guard lock(m.spec_mutex);
    m.spec_costs.record(static_cast<int>(tokens.size()), ms);
}

void session::impl::drop_rejected(size_t n_keep) {
    if (n_keep >= cached.size()) return;
    engine::recurrent_state& rs = kv.recurrent();
    if (rs.empty()) {
        cached.resize(n_keep);
    } else {
        // NOTE: the state is rebuilt by running the kept tokens again (the sequential DeltaNet form gives
        // the same bits for any split), instead of keeping a copy of it after every verified position.
        const std::vector<int32_t> kept(cached.begin() + static_cast<ptrdiff_t>(verify_start),
                                        cached.begin() + static_cast<ptrdiff_t>(n_keep));
        rs.rewind(before_verify);
        cached.resize(verify_start);
        if (!kept.empty()) eval(kept, logits.data());
    }
    n_cached.store(cached.size());
    store_state_counts();
}

generation_result session::impl::generate(std::span<const int32_t> prompt, const generation_options& o,
                                          const token_callback& cb) {
    generation_result result;
    tok::sampler sampler(to_sampler(o.sampling));
    sampler.accept_prompt(prompt);

    const auto t0 = clock_type::now();
    const size_t common = reuse_prefix(prompt, result.time);
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
    // Speculation: the tokens so far (prompt and generated) for the drafter; the drafts under
    // verification, the row of verify_logits the next token is drawn from, and the positions of the
    // cache that are final (the rest hold drafts not yet accepted).
    const speculation_options& so = o.speculation;
    const bool speculate = so.type != "off" && !m.hybrid;
    engine::spec::controller control(so.type == "auto", so.n_max, m.spec_costs);
    std::vector<int32_t> history(prompt.begin(), prompt.end());
    std::vector<int32_t> drafts, batch;
    size_t row = 0;
    const float* next_logits = logits.data();
    size_t n_final = cached.size();
    bool turned_off = false;
    for (int i = 0; i < o.max_tokens; ++i) {
        if (cancel.load(std::memory_order_relaxed)) {
            result.reason = stop_reason::cancelled;
            break;
        }
        const tok::sample_result s = sampler.sample(std::span(next_logits, logits.size()), want_top);
        if (!o.ignore_eos && m.tokenizer.is_eog(s.id)) {
            result.reason = stop_reason::eos;
            break;
        }
        generated_token g{s.id, s.logprob, {}};
        for (const auto& t : s.top_logprobs)
            g.top.push_back({t.id, std::string(m.tokenizer.token_to_piece(t.id, true)), t.logprob});
        result.tokens.push_back(g);
        history.push_back(s.id);
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
        if (static_cast<int>(n_final) >= n_ctx) {
            result.reason = stop_reason::length;
            break;
        }
        if (i + 1 >= o.max_tokens) continue;
        // A draft the sampler picked: its position is in the cache already, its logits in the batch's.
        if (row < drafts.size() && drafts[row] == s.id) {
            ++row;
            ++n_final;
            ++result.time.spec_accepted;
            next_logits = verify_logits.data() + row * logits.size();
            continue;
        }
        drop_rejected(n_final);
        if (!drafts.empty()) control.record(static_cast<int>(drafts.size()), static_cast<int>(row));
        drafts.clear();
        row = 0;
        if (speculate) {
            // Every draft must be a token the generation may still produce, at a position the context has.
            const int room = std::min(o.max_tokens - 2 - i, n_ctx - 1 - static_cast<int>(n_final));
            const int k = std::min(control.draft_length(), room);
            if (!control.turned_off().empty() && !turned_off) {
                turned_off = true;
                logger("engine")->info("Speculative decoding turned itself off at generated token {}: {}.",
                                       result.tokens.size(), control.turned_off());
            }
            if (k > 0 && so.type == "forced") {
                const size_t from = std::min(result.tokens.size(), so.forced.size());
                drafts.assign(so.forced.begin() + static_cast<ptrdiff_t>(from),
                              so.forced.begin() + static_cast<ptrdiff_t>(std::min(so.forced.size(), from + static_cast<size_t>(k))));
            } else if (k > 0) {
                drafts = engine::spec::ngram_draft(history, k, {so.ngram_min, std::max(so.ngram_min, 4)});
            }
        }
        batch.assign(1, s.id);
        batch.insert(batch.end(), drafts.begin(), drafts.end());
        try {
            if (drafts.empty()) {
                const auto t_step = clock_type::now();
                eval(std::span(&s.id, 1), logits.data());
                const double ms = ms_since(t_step);
                next_logits = logits.data();
                const std::lock_guard lock(m.spec_mutex);
                m.spec_costs.record(1, ms);
            } else {
                verify(batch);
                next_logits = verify_logits.data();
                result.time.spec_drafted += static_cast<int>(drafts.size());
                ++result.time.spec_verifications;
            }
            ++n_final;
        } catch (const engine::kv_cache_full& e) {
            // Out of memory growing the cache: what was generated stands, the generation ends here.
            logger("engine")->warn("The generation stops at {} tokens: {}.", result.tokens.size(), e.what());
            drafts.clear();
            result.reason = stop_reason::length;
            break;
        }
    }
    drop_rejected(n_final);
    if (!drafts.empty()) control.record(static_cast<int>(drafts.size()), static_cast<int>(row));
    {
        const std::lock_guard lock(m.spec_mutex);
        m.spec_totals.drafted += static_cast<uint64_t>(result.time.spec_drafted);
        m.spec_totals.accepted += static_cast<uint64_t>(result.time.spec_accepted);
        m.spec_totals.verifications += static_cast<uint64_t>(result.time.spec_verifications);
        m.spec_totals.turned_off += turned_off ? 1 : 0;
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
    check_speculation(options.speculation);
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
        if (!impl_->cached.empty()) id = impl_->m.conversations->park(impl_->cached, impl_->kv);
    });
    return id;
}

size_t session::cached_tokens() const { return impl_->n_cached.load(); }

size_t session::kv_bytes() const { return impl_->kv_bytes.load(); }

size_t session::state_checkpoints() const { return impl_->n_checkpoints.load(); }

size_t session::state_checkpoint_bytes() const { return impl_->checkpoint_bytes.load(); }

}  // namespace strata
