#include "model/recurrent_state.hpp"

#include <algorithm>
#include <stdexcept>

#include <spdlog/fmt/fmt.h>

namespace strata::engine {

recurrent_state::recurrent_state(const hparams& hp) {
    if (!hp.hybrid()) return;
    n_layer_ = hp.n_recurrent();
    conv_floats_ = static_cast<size_t>(hp.ssm_conv_kernel - 1) * static_cast<size_t>(hp.ssm_conv_dim());
    ssm_floats_ = static_cast<size_t>(hp.ssm_n_v_head) * static_cast<size_t>(hp.ssm_d_state) * hp.ssm_d_state;
    data_.assign(static_cast<size_t>(n_layer_) * layer_floats(), 0.0f);
}

void recurrent_state::reset() {
    std::fill(data_.begin(), data_.end(), 0.0f);
    pos_ = 0;
    checkpoints_.clear();
}

void recurrent_state::checkpoint() {
    if (empty()) return;
    std::erase_if(checkpoints_, [&](const state_checkpoint& c) { return c.pos == pos_; });
    if (max_checkpoints_ == 0) return;
    while (checkpoints_.size() >= max_checkpoints_) checkpoints_.erase(checkpoints_.begin());
    checkpoints_.push_back({pos_, data_});
}

int recurrent_state::usable(int n_pos) const {
    if (n_pos >= pos_) return pos_;
    int best = 0;
    for (const state_checkpoint& c : checkpoints_)
        if (c.pos <= n_pos) best = std::max(best, c.pos);
    return best;
}

int recurrent_state::cut_back(int n_pos) {
    if (n_pos >= pos_) return pos_;
    std::erase_if(checkpoints_, [&](const state_checkpoint& c) { return c.pos > n_pos; });
    if (checkpoints_.empty()) {
        std::fill(data_.begin(), data_.end(), 0.0f);
        pos_ = 0;
        return 0;
    }
    data_ = checkpoints_.back().data;
    pos_ = checkpoints_.back().pos;
    return pos_;
}

void recurrent_state::save(state_checkpoint& out) const {
    out.pos = pos_;
    out.data.assign(data_.begin(), data_.end());
}

void recurrent_state::rewind(const state_checkpoint& c) {
    if (c.data.size() != data_.size())
        throw std::logic_error(fmt::format("recurrent state of {} floats given one of {}", data_.size(), c.data.size()));
    std::copy(c.data.begin(), c.data.end(), data_.begin());
    pos_ = c.pos;
    std::erase_if(checkpoints_, [&](const state_checkpoint& k) { return k.pos > c.pos; });
}

void recurrent_state::assign(const state_checkpoint& c, std::vector<state_checkpoint> others) {
    if (c.data.size() != data_.size())
        throw std::logic_error(fmt::format("recurrent state of {} floats given one of {}", data_.size(), c.data.size()));
    data_ = c.data;
    pos_ = c.pos;
    checkpoints_ = std::move(others);
    while (checkpoints_.size() > max_checkpoints_) checkpoints_.erase(checkpoints_.begin());
}

size_t recurrent_state_bytes(const hparams& hp) {
    if (!hp.hybrid()) return 0;
    const size_t conv = static_cast<size_t>(hp.ssm_conv_kernel - 1) * static_cast<size_t>(hp.ssm_conv_dim());
    const size_t ssm = static_cast<size_t>(hp.ssm_n_v_head) * static_cast<size_t>(hp.ssm_d_state) * hp.ssm_d_state;
    return static_cast<size_t>(hp.n_recurrent()) * (conv + ssm) * sizeof(float);
}

}  // namespace strata::engine
