// The step batcher: every generation in flight advances in the same forward passes. Each step takes
// the next token of every decoding generation, round-robin and up to the token budget (n_batch), then
// prompt chunks of generations still reading their prompts with what the budget leaves. Steps run on
// the engine thread, one task each, so other engine tasks (statistics, parking) run between them.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <vector>

#include "model/forward.hpp"
#include "prefill_pacer.hpp"
#include "strata/engine.hpp"

namespace strata {

struct generation;

class step_batcher {
public:
    explicit step_batcher(model::impl& m);
    ~step_batcher();

    // Queues a generation of session `s` (validated by the caller); the future holds its result or what
    // it threw. ready: polled before each decode step; false skips this generation for that step.
    std::future<generation_result> submit(session::impl& s, std::vector<int32_t> prompt, const generation_options& o,
                                          token_callback cb, std::function<bool()> ready);

    batch_stats stats() const;

private:
    void pump();                          // one step, then posts itself again while work remains
    void admit();
    bool step();                          // false: nothing could run (every generation paused)
    void finish(generation& g, bool flush = true);
    void fail(generation& g, std::exception_ptr e);
    bool sample(generation& g);           // after a generation's logits: its next tokens; false: it ended
    // Speculative decoding: the step's segment of a decoding generation (its token and drafts), its
    // next batch after a sampled token, dropping drafts not accepted from the cache, the pass costs
    // `auto` reads, and the totals at the end.
    engine::step_segment decode_segment(generation& g);
    void plan_step(generation& g, int32_t token);
    void drop_rejected(generation& g);
    void record_cost(const std::vector<generation*>& owners, int rows, double ms);
    void settle(generation& g);
    // MTP drafts: where a pass writes g's trunk residual rows (null without MTP); the MTP block's
    // entries up to position `last` (logits, unless null: of `last`'s row); up to k drafts chained.
    float* hidden_rows(generation& g, int n_tok);
    void mtp_fill(generation& g, int last, float* logits);
    void mtp_draft(generation& g, int k);

    model::impl& m_;
    mutable std::mutex mutex_;
    std::deque<std::unique_ptr<generation>> pending_;   // submitted, not yet on the engine thread
    bool posted_ = false;                               // a pump task is queued or running
    std::vector<std::unique_ptr<generation>> active_;   // engine thread only
    size_t next_ = 0;                                   // round-robin start
    prefill_pacer pacer_;                               // prompt tokens per step beside decode rows
    engine::phase_clock pass_parts_;                    // the current step's pass (phase timing)
    engine::phase_clock step_parts_;                    // summed over timed steps; under mutex_
    double batcher_seconds_ = 0;                        // their time outside the pass; under mutex_
    bool logged_sequential_ = false;
    std::atomic<uint64_t> steps_{0}, rows_{0}, bytes_{0};
    std::atomic<int> n_active_{0}, last_rows_{0}, max_rows_{0};
};

}  // namespace strata
