// The recurrent state of a sequence in the hybrid families' gated DeltaNet layers: per layer the conv
// state (the last conv_kernel - 1 inputs of the depthwise conv) and one d_state x d_state matrix per
// value head, all f32. Unlike a KV cache it cannot be cut back to an earlier position, so it keeps
// checkpoints: copies of itself at chosen positions, restored to go back. It is the gated DeltaNet
// mixer kind's part of a sequence's state (sequence_state.hpp); qwen4exp's PLE conv and n-gram window
// and its last wide residual ride in it, so they are checkpointed, parked and traced with it.
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <vector>

#include "model/hparams.hpp"
#include "model/sequence_state.hpp"

namespace strata::engine {

struct state_checkpoint {
    int pos = 0;               // tokens folded into it
    std::vector<float> data;   // the whole state, as recurrent_state::data()
};

class recurrent_state final : public state_part {
public:
    static constexpr size_t default_max_checkpoints = 16;

    recurrent_state() = default;
    // The state of hp's DeltaNet layers (none for other families), zero at position 0.
    explicit recurrent_state(const hparams& hp);

    const char* kind() const override { return "gated DeltaNet recurrent state"; }
    bool empty() const { return n_layer_ == 0; }
    int n_layer() const { return n_layer_; }
    size_t bytes() const { return data_.size() * sizeof(float); }
    float* conv(int r) { return data_.data() + static_cast<size_t>(r) * layer_floats(); }
    float* ssm(int r) { return conv(r) + conv_floats_; }
    // qwen4exp's state past the DeltaNet layers: the PLE conv's last inputs [(kernel - 1) x ngram][hc * n_embd],
    // the PLE n-gram window (the last ngram - 1 token ids + 1; 0: none), the last token's wide residual [hc * n_embd].
    float* ple_conv() { return data_.data() + static_cast<size_t>(n_layer_) * layer_floats(); }
    float* ple_window() { return ple_conv() + ple_conv_floats_; }
    float* hc_last() { return ple_window() + ple_window_floats_; }
    std::span<const float> data() const { return data_; }

    int pos() const override { return pos_; }
    void set_pos(int pos) override { pos_ = pos; }
    void reset() override;  // zero, position 0, no checkpoints

    // Keeps a copy of the state at pos() (replacing one already there); beyond max_checkpoints the
    // oldest goes.
    void checkpoint() override;
    // The position cut_back(n_pos) would go back to.
    int usable(int n_pos) const override;
    // Goes back to the newest checkpoint at or before n_pos (the zero state at 0 when none), drops
    // the checkpoints after it, and returns its position.
    int cut_back(int n_pos) override;
    size_t n_checkpoints() const override { return checkpoints_.size(); }

    // Parked: the state at pos() and the checkpoints before it; restored at pos() or at one of them
    // (the checkpoints before that one kept).
    std::unique_ptr<state_part> park() const override;
    void restore(const state_part& parked, int to) override;
    size_t parked_bytes() const override { return n_states() * state_bytes(); }
    size_t n_states() const override { return checkpoints_.size() + 1; }
    size_t state_bytes() const override { return bytes(); }
    // Per-position copies for speculative decoding: while a trace of n positions from pos() is on, the
    // passes write the state after each of the tokens at positions pos() .. pos() + n - 1 into it, so
    // rejected drafts are dropped by going back to one of them instead of evaluating the kept ones again.
    void start_trace(int n) override;
    void stop_trace() override { trace_on_ = false; }  // the copies stay until the next start_trace
    void release_trace() override;                      // off, and its memory given back
    // Where the part of the state at `live` (a pointer into data()) goes in the copy after the token at
    // position pos; nullptr when no trace is on or pos is outside it.
    float* traced(int pos, const float* live);
    // Goes to the state after n_pos tokens, from the trace (n_pos - 1 within it), and drops the
    // checkpoints past it. False when the trace does not hold it.
    bool restore_traced(int n_pos);
    bool back_to_traced(int n_pos) override { return restore_traced(n_pos); }
    size_t trace_bytes() const { return trace_.size() * sizeof(float); }
    // Sets the state to `c` (whose size must match) and keeps `others` as the checkpoints.
    void assign(const state_checkpoint& c, std::vector<state_checkpoint> others);

    const std::vector<state_checkpoint>& checkpoints() const { return checkpoints_; }
    size_t checkpoint_bytes() const override { return checkpoints_.size() * bytes(); }
    void set_max_checkpoints(size_t n) { max_checkpoints_ = n; }

private:
    size_t layer_floats() const { return conv_floats_ + ssm_floats_; }

    int n_layer_ = 0;
    size_t conv_floats_ = 0, ssm_floats_ = 0;
    size_t ple_conv_floats_ = 0, ple_window_floats_ = 0, hc_floats_ = 0;
    std::vector<float> data_;  // [n_layer][conv | ssm]
    int pos_ = 0;
    std::vector<state_checkpoint> checkpoints_;  // by position
    size_t max_checkpoints_ = default_max_checkpoints;
    std::vector<float> trace_;  // [trace_n_][data_.size()]
    int trace_pos_ = 0, trace_n_ = 0;
    bool trace_on_ = false;
};

// Bytes of one sequence's recurrent state of hp (0 for families without DeltaNet layers).
size_t recurrent_state_bytes(const hparams& hp);

}  // namespace strata::engine
