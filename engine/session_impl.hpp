// A session's state, shared by session.cpp and the step batcher (batcher.cpp).
#pragma once

#include <algorithm>
#include <atomic>
#include <memory>
#include <span>
#include <vector>

#include "engine_impl.hpp"

namespace strata {

struct session::impl {
    std::shared_ptr<model> owner;
    model::impl& m;
    engine::kv_cache kv;
    std::vector<int32_t> cached;   // tokens whose keys and values are in kv, from position 0
    std::string scope;             // generation_options::cache_scope of the request that left them
    std::vector<float> logits;     // [n_vocab] after the last evaluated token
    std::atomic<bool> cancel{false};
    std::atomic<bool> busy{false};    // a generation of this session is queued or running
    std::atomic<size_t> n_cached{0};  // cached.size(), readable from any thread
    std::atomic<size_t> kv_bytes{0};  // allocated_kv(), readable from any thread
    std::atomic<size_t> n_checkpoints{0}, checkpoint_bytes{0};  // the recurrent state's, from any thread
    // MTP speculation: the MTP block's own keys and values (one layer, made on first use); its entry at
    // position p is from token p and the trunk's residual at p - 1, valid for p < mtp_filled.
    std::unique_ptr<engine::kv_cache> mtp_kv;
    int mtp_filled = 0;
    // mtp_kv, made empty on first use (one layer of kv's shape and type).
    engine::kv_cache& mtp_cache() {
        if (!mtp_kv) {
            mtp_kv = std::make_unique<engine::kv_cache>(engine::make_mtp_state(m.hp, m.options.n_ctx, m.kv));
            mtp_filled = 0;
        }
        return *mtp_kv;
    }
    // Whether this session's generations may draft with the model's MTP block (and keep mtp_kv).
    bool mtp_capable() const { return !m.hybrid && m.forward && m.forward->has_mtp(); }

    explicit impl(std::shared_ptr<model> o);
    ~impl();

    // The counters above and the model's memory budget follow kv's bytes and the recurrent state's
    // checkpoints; past the budget (checkpoints grow inside a step) snapshots are evicted.
    void account();
    // Makes room in kv for positions [0, n_pos) (on the engine thread). Growth that the memory budget
    // cannot hold, even after evicting every snapshot but `keep`, throws kv_cache_full naming the
    // numbers; kv is left as it was.
    void grow(int n_pos, uint64_t keep = 0);
    // Bytes this session's keys and values take: in VRAM with the GPU hybrid, else in kv.
    size_t allocated_kv() const { return m.hybrid ? m.hybrid->kv_bytes(kv) : kv.bytes(); }
    // Evaluates tokens at the end of the cache (on the engine thread).
    void eval(std::span<const int32_t> tokens, float* out, bool all = false);
    // After `n` tokens were evaluated at the end of the cache by a step: the counters follow.
    void appended(std::span<const int32_t> tokens);
    // Routed lookups and VRAM hits since load (on the engine thread; zero CPU-only).
    engine::gpu::cache_stats expert_cache_stats() const {
        return m.hybrid ? m.hybrid->expert_cache_stats() : engine::gpu::cache_stats{};
    }
    void check_prompt(std::span<const int32_t> prompt) const;
    // The prefix of `prompt` already in kv, from this session's state or a restored snapshot (parking
    // the state first when the prompt would throw most of it away); sets cached and the timings.
    size_t reuse_prefix(std::span<const int32_t> prompt, std::string_view new_scope, timings& t);
    // After a generation (also a failed one) the cache keeps the chunks holding this conversation,
    // which its next turn reuses, and gives the rest back.
    void trim() {
        if (!m.hybrid) kv.shrink(static_cast<int>(cached.size()));
        if (mtp_kv) {
            mtp_kv->shrink(static_cast<int>(cached.size()));
            mtp_filled = std::min(mtp_filled, static_cast<int>(cached.size()));
        }
        account();
    }

private:
    uint64_t charged_kv_ = 0, charged_checkpoints_ = 0;  // what account() last told the budget
};

}  // namespace strata
