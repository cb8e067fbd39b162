// QSA (qwen4exp's sparse attention): the indexer scores every complete block of compress_ratio past
// tokens by sum over its heads of relu(q_h . k_block) / sqrt(key_length), where k_block is the mean of
// the block's raw indexer keys, RMS-normed and rotated to the block's first position; a query attends
// to the top_k / ratio best blocks (ties: the earlier block) and the incomplete tail block.
#pragma once

#include <vector>

namespace strata::engine {

// The blocks kept of n_blocks scored ones, ascending: all when n_blocks <= k.
std::vector<int> qsa_pick_blocks(const float* scores, int n_blocks, int k);

}  // namespace strata::engine
