// A session: one KV cache, prefix reuse across requests; its generations run in the step batcher.
#include <algorithm>
#include <atomic>
#include <chrono>

#include <spdlog/fmt/fmt.h>

#include "batcher.hpp"
#include "log.hpp"
#include "session_impl.hpp"
#include "spec/controller.hpp"

namespace strata {

session::impl::impl(std::shared_ptr<model> o)
    : owner(std::move(o)),
      m(*owner->impl_),
      kv(engine::make_sequence_state(m.hp, m.options.n_ctx, m.kv)),
      logits(static_cast<size_t>(m.hp.n_vocab)) {}

session::impl::~impl() {
    m.budget->change(engine::memory_budget::use::kv, charged_kv_, 0);
    m.budget->change(engine::memory_budget::use::checkpoints, charged_checkpoints_, 0);
}

void session::impl::account() {
    // The MTP block's own cache (speculation) counts as this session's KV.
    const uint64_t host_kv = (m.hybrid ? 0 : kv.bytes()) + (mtp_kv ? mtp_kv->bytes() : 0);
    const uint64_t states = kv.checkpoint_bytes();
    m.budget->change(engine::memory_budget::use::kv, charged_kv_, host_kv);
    m.budget->change(engine::memory_budget::use::checkpoints, charged_checkpoints_, states);
    charged_kv_ = host_kv;
    charged_checkpoints_ = states;
    kv_bytes.store(allocated_kv());
    n_checkpoints.store(kv.n_checkpoints());
    checkpoint_bytes.store(states);
    if (!m.budget->fits(0)) m.conversations->make_room(0);
}

void session::impl::grow(int n_pos, uint64_t keep) {
    const int chunk = engine::kv_cache::chunk_tokens;
    const int want = (std::min(n_pos, kv.n_ctx()) + chunk - 1) / chunk;
    const auto more_of = [&](const engine::kv_cache& c) {
        return want <= c.n_chunks() ? 0 : uint64_t(want - c.n_chunks()) * uint64_t(c.n_layer()) * c.chunk_bytes();
    };
    const uint64_t more = m.hybrid ? 0 : more_of(kv) + (mtp_kv ? more_of(*mtp_kv) : 0);
    if (more > 0 && !m.conversations->make_room(more, keep)) {
        m.budget->count_refusal();
        throw engine::kv_cache_full(fmt::format("growing the KV cache to {} positions needs {:.1f} MiB more, and {}; "
                                                "no conversation snapshot is left to evict",
                                                n_pos, double(more) / (1 << 20), m.budget->describe()));
    }
    kv.reserve(n_pos);
    if (mtp_kv && !m.hybrid) mtp_kv->reserve(std::min(n_pos, mtp_kv->n_ctx()));
    account();
}

void session::impl::eval(std::span<const int32_t> tokens, float* out, bool all) {
    if (!m.hybrid) grow(static_cast<int>(cached.size() + tokens.size()));
    if (m.hybrid)
        m.hybrid->eval(tokens, static_cast<int>(cached.size()), kv, out, all, m.options.n_batch);
    else
        m.forward->eval(tokens, static_cast<int>(cached.size()), kv, out, all, m.options.n_batch);
    appended(tokens);
}

void session::impl::appended(std::span<const int32_t> tokens) {
    cached.insert(cached.end(), tokens.begin(), tokens.end());
    n_cached.store(cached.size());
    account();
    m.tokens_evaluated += tokens.size();
}

void session::impl::check_prompt(std::span<const int32_t> prompt) const {
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

size_t session::impl::reuse_prefix(std::span<const int32_t> prompt, std::string_view new_scope, timings& t) {
    // Always evaluate at least the last prompt token, for its logits.
    const size_t limit = prompt.size() - 1;
    size_t common = std::mismatch(cached.begin(), cached.end(), prompt.begin(), prompt.end()).first - cached.begin();
    // Another scope's state is not reused (it is parked under its own scope below).
    common = new_scope == scope ? std::min(common, limit) : 0;
    // The sequence's state goes back only where every mixer kind's can (a recurrent state: a checkpoint).
    common = static_cast<size_t>(kv.usable(static_cast<int>(common)));
    // The MTP entries of the kept prefix stay (a restored snapshot brings those it parked).
    const int mtp_parked = std::min(mtp_filled, static_cast<int>(cached.size()));
    mtp_filled = std::min(mtp_filled, static_cast<int>(common));
    t.cache_source = common > 0 ? prefix_source::live : prefix_source::none;
    engine::conversation_cache& cc = *m.conversations;
    bool restored = false;
    if (cc.enabled()) {
        // Park before a prompt discards a tail worth keeping (a regular next turn discards a few tokens).
        if (cached.size() >= common + engine::conversation_cache::min_tail_tokens)
            cc.park(cached, kv, scope, mtp_kv.get(), static_cast<size_t>(mtp_parked));
        if (const auto best = cc.find(prompt, limit, common, new_scope)) {
            try {
                if (mtp_capable()) mtp_cache();  // grown with kv below, to take the snapshot's MTP rows
                grow(static_cast<int>(best->n_tokens), best->id);
                mtp_filled = static_cast<int>(cc.restore(best->id, common, best->n_tokens, kv, mtp_kv.get(),
                                                         static_cast<size_t>(mtp_filled)));
                common = best->n_tokens;
                restored = true;
                t.cache_source = prefix_source::snapshot;
                t.cache_snapshot = best->id;
            } catch (const engine::kv_cache_full& e) {
                logger("engine")->warn("Conversation snapshot {} was not restored: {}.", best->id, e.what());
            }
        }
    }
    if (!restored) kv.cut_back(static_cast<int>(common));
    // Where this prompt's new tokens start (a new turn): a state to come back to if it is edited.
    if (common > 0) kv.checkpoint();
    cached.assign(prompt.begin(), prompt.begin() + static_cast<ptrdiff_t>(common));
    scope = new_scope;
    n_cached.store(common);
    account();
    t.cache_n = static_cast<int>(common);
    return common;
}

namespace {

void check_speculation(const speculation_options& so, const model::impl& m) {
    const std::string why = m.forward ? m.forward->mtp_refusal() : m.weights.nextn_error;
    if (so.type == "mtp" && !(m.forward && m.forward->has_mtp()))
        throw request_error(m.hp.n_layer_nextn > 0
                                ? fmt::format("the file's MTP block cannot draft ({}); use the spec type ngram, "
                                              "auto or off",
                                              why)
                                : std::string("the model file has no MTP block (nextn_predict_layers): use the spec "
                                              "type ngram, auto or off"));
    if (so.type != "off" && so.type != "ngram" && so.type != "auto" && so.type != "mtp" && so.type != "forced")
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

session::session(std::shared_ptr<model> m) : impl_(std::make_unique<impl>(std::move(m))) {}
session::~session() = default;

generation_result session::generate(std::span<const int32_t> prompt, const generation_options& options,
                                    const token_callback& on_token) {
    return start(prompt, options, on_token).get();
}

std::future<generation_result> session::start(std::span<const int32_t> prompt, const generation_options& options,
                                              token_callback on_token, std::function<bool()> ready) {
    impl_->check_prompt(prompt);
    if (options.max_tokens < 1)
        throw request_error(fmt::format("max_tokens must be at least 1, got {}", options.max_tokens));
    if (options.top_logprobs < 0 || options.top_logprobs > 20)
        throw request_error(fmt::format("top_logprobs must be 0..20, got {}", options.top_logprobs));
    check_speculation(options.speculation, impl_->m);
    if (impl_->busy.exchange(true))
        throw std::logic_error("session::start: this session already has a generation in flight");
    impl_->cancel.store(false);
    try {
        return impl_->m.batcher->submit(*impl_, std::vector<int32_t>(prompt.begin(), prompt.end()), options,
                                        std::move(on_token), std::move(ready));
    } catch (...) {
        impl_->busy.store(false);
        throw;
    }
}

void session::cancel() { impl_->cancel.store(true); }

std::vector<float> session::evaluate(std::span<const int32_t> prompt, bool all) {
    impl_->check_prompt(prompt);
    std::vector<float> out((all ? prompt.size() : 1) * static_cast<size_t>(impl_->m.hp.n_vocab));
    impl_->m.thread.run([&] {
        impl_->cached.clear();
        impl_->n_cached.store(0);
        impl_->mtp_filled = 0;
        impl_->kv.reset_state();
        impl_->eval(prompt, out.data(), all);
    });
    return out;
}

void session::fill_synthetic(std::span<const int32_t> tokens, uint64_t seed) {
    if (!tokens.empty()) impl_->check_prompt(tokens);
    if (impl_->m.hybrid || !impl_->m.forward)
        throw request_error("a synthetic fill needs the CPU forward pass; this model runs on the GPU hybrid");
    if (impl_->busy.load()) throw std::logic_error("session::fill_synthetic: a generation of this session is in flight");
    impl_->m.thread.run([&] {
        impl_->cached.clear();
        impl_->n_cached.store(0);
        impl_->mtp_filled = 0;
        impl_->kv.reset_state();
        impl_->grow(static_cast<int>(tokens.size()));
        impl_->m.forward->fill_synthetic(tokens, impl_->kv, seed);
        impl_->cached.assign(tokens.begin(), tokens.end());
        impl_->n_cached.store(impl_->cached.size());
        impl_->account();
    });
}

uint64_t session::park() {
    uint64_t id = 0;
    impl_->m.thread.run([&] {
        if (!impl_->cached.empty())
            id = impl_->m.conversations->park(impl_->cached, impl_->kv, impl_->scope, impl_->mtp_kv.get(),
                                              static_cast<size_t>(std::min<int64_t>(impl_->mtp_filled,
                                                                                    int64_t(impl_->cached.size()))));
    });
    return id;
}

size_t session::cached_tokens() const { return impl_->n_cached.load(); }

size_t session::kv_bytes() const { return impl_->kv_bytes.load(); }

size_t session::state_checkpoints() const { return impl_->n_checkpoints.load(); }

size_t session::state_checkpoint_bytes() const { return impl_->checkpoint_bytes.load(); }

}  // namespace strata
