// Attention of a batch of query tokens over the KV cache, on the CPU pool, with the tiled kernel of
// kernels/cpu/attention.hpp. Prompt batches are split over (kv head, query tile), each folding the
// cache's chunks in order; small batches (decode) over (kv head, chunk), whose tile states the thread
// of a head's last chunk merges in chunk order. Both fold the same tiles in the same order, so a
// token's output is bitwise the same whatever the batch size, the pool's slices or its worker count.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "expert_pool.hpp"
#include "model/hparams.hpp"
#include "model/kv_cache.hpp"

namespace strata::engine {

class attention_runner {
public:
    attention_runner(arenas::expert_pool& pool, const hparams& hp);

    // q: [n_tok][n_head * head_dim] (RoPE applied) for positions pos0.., whose keys and values are
    // already in kv; out: [n_tok][n_head * head_dim].
    void run(const kv_cache& kv, int layer, const float* q, int n_tok, int pos0, float* out);

private:
    void run_query_tiles(const kv_cache& kv, int layer, const float* q, int n_tok, int pos0, float* out);
    void run_chunks(const kv_cache& kv, int layer, const float* q, int n_tok, int pos0, float* out);

    arenas::expert_pool& pool_;
    const hparams& hp_;
    int group_;     // query heads per kv head
    float scale_;   // 1 / sqrt(head_dim)
    // Work-item scratch, grown geometrically and kept (shape per item, rows = tokens x group):
    std::vector<float> q_rows_;     // [items][rows][head_dim] the item's query rows, contiguous
    std::vector<float> state_;      // [items][rows][head_dim + 2] acc, then max and sum
    std::vector<int64_t> last_;     // [items][rows] last position each row sees
    std::unique_ptr<std::atomic<int>[]> chunks_left_;  // [n_head_kv] decode chunks still running per kv head
    size_t chunks_left_size_ = 0;
};

}  // namespace strata::engine
