// Attention of a batch of query tokens over the KV cache, on the CPU pool, with the tiled kernel of
// kernels/cpu/attention.hpp. Prompt batches are split over (kv head, query tile), each folding the
// cache's chunks in order; small batches (decode) over (kv head, chunk), whose tile states the thread
// of a head's last chunk merges in chunk order; the decode batches of every sequence in a step share
// one pool phase. Both fold the same tiles in the same order, so a token's output is bitwise the same
// whatever the batch size, the other sequences of the step, the pool's slices or its worker count.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "aligned_vector.hpp"
#include "expert_pool.hpp"
#include "model/hparams.hpp"
#include "model/kv_cache.hpp"

namespace strata::engine {

class attention_runner {
public:
    attention_runner(arenas::expert_pool& pool, const hparams& hp);

    // One sequence's part of a step: q [n_tok][n_head * head_dim] (RoPE applied) for positions
    // pos0.., whose keys and values are already in kv; out [n_tok][n_head * head_dim].
    struct job {
        const kv_cache* kv;
        const float* q;
        int n_tok;
        int pos0;
        float* out;
    };

    // Every job of a step: the decode-sized ones share one pool phase (each sequence's items keep
    // their own fold order, so its output is the same as alone); prompts go a query tile at a time.
    void run(int layer, std::span<const job> jobs);

private:
    void run_query_tiles(const kv_cache& kv, int layer, const float* q, int n_tok, int pos0, float* out);
    void run_chunks(int layer, std::span<const job> jobs);

    arenas::expert_pool& pool_;
    const hparams& hp_;
    int group_;     // query heads per kv head
    float scale_;   // 1 / sqrt(head_dim)
    // Work-item scratch, grown geometrically and kept (shape per item, rows = tokens x group):
    aligned_vector<float> q_rows_;  // [items][rows][head_dim] the item's query rows, contiguous
    aligned_vector<float> state_;   // [items][rows][head_dim + 2] acc, then max and sum
    std::vector<int64_t> last_;     // [items][rows] last position each row sees
    std::unique_ptr<std::atomic<int>[]> chunks_left_;  // [jobs][n_head_kv] decode chunks still running per kv head
    size_t chunks_left_size_ = 0;
    std::vector<job> decode_jobs_;                     // run's decode-sized jobs of the step
    struct job_layout {
        int64_t first_item;     // the job's items are [first_item, first_item + n_chunks * n_head_kv)
        int n_chunks;
        size_t q_rows, states, last;  // offsets into q_rows_, state_, last_
    };
    std::vector<job_layout> layout_;
};

}  // namespace strata::engine
