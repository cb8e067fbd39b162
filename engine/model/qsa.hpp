// QSA (qwen4exp's sparse attention): the indexer scores every complete block of compress_ratio past
// tokens by sum over its heads of relu(q_h . k_block) / sqrt(key_length), where k_block is the mean of
// the block's raw indexer keys, RMS-normed and rotated to the block's first position; a query attends
// to the top_k / ratio best blocks (ties: the earlier block) and the incomplete tail block.
#pragma once

#include <memory>
#include <vector>

#include "model/sequence_state.hpp"

namespace strata::engine {

// The QSA mixer kind's part of a sequence's state: per QSA layer two f32 stores, the raw indexer key of
// every position [pos][key_length] and the key of every complete block, kernels::cpu::qsa_group blocks
// to a group [group][key_length][qsa_group] (the scoring kernel's layout: one vector of blocks per
// dim), with the count of complete blocks. They are rewritten with the positions (a cut back store is
// overwritten before it is read), so the part follows the rows; parked and restored whole.
class indexer_keys final : public state_part {
public:
    const char* kind() const override { return "QSA indexer keys"; }
    std::unique_ptr<state_part> park() const override { return std::make_unique<indexer_keys>(*this); }
    void restore(const state_part& parked, int to) override;
    size_t parked_bytes() const override;

    std::vector<std::vector<float>> stores;  // [2 * qsa layer + (0: raw keys, 1: block keys)]
    std::vector<int> blocks;                 // [qsa layer] complete blocks in its block key store
};

// The blocks kept of n_blocks scored ones, ascending: all when n_blocks <= k.
std::vector<int> qsa_pick_blocks(const float* scores, int n_blocks, int k);

}  // namespace strata::engine
