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
    if (hp.ple_layer >= 0) {
        ple_conv_floats_ = static_cast<size_t>(hp.ple_conv_kernel - 1) * hp.ple_ngram * static_cast<size_t>(hp.hc_dim());
        ple_window_floats_ = static_cast<size_t>(hp.ple_ngram - 1);
    }
    hc_floats_ = static_cast<size_t>(hp.hc_dim());
    data_.assign(static_cast<size_t>(n_layer_) * layer_floats() + ple_conv_floats_ + ple_window_floats_ + hc_floats_,
                 0.0f);
}

void recurrent_state::reset() {
    std::fill(data_.begin(), data_.end(), 0.0f);
    pos_ = 0;
    checkpoints_.clear();
    trace_on_ = false;
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

void recurrent_state::start_trace(int n) {
    trace_pos_ = pos_;
    trace_n_ = std::max(0, n);
    trace_.resize(static_cast<size_t>(trace_n_) * data_.size());
    trace_on_ = trace_n_ > 0;
}

void recurrent_state::release_trace() {
    trace_on_ = false;
    trace_n_ = 0;
    std::vector<float>().swap(trace_);
}

float* recurrent_state::traced(int pos, const float* live) {
    if (!trace_on_ || pos < trace_pos_ || pos >= trace_pos_ + trace_n_) return nullptr;
    return trace_.data() + static_cast<size_t>(pos - trace_pos_) * data_.size() + (live - data_.data());
}

bool recurrent_state::restore_traced(int n_pos) {
    const int i = n_pos - 1 - trace_pos_;
    if (i < 0 || i >= trace_n_) return false;
    const auto from = trace_.begin() + static_cast<ptrdiff_t>(static_cast<size_t>(i) * data_.size());
    std::copy(from, from + static_cast<ptrdiff_t>(data_.size()), data_.begin());
    pos_ = n_pos;
    std::erase_if(checkpoints_, [&](const state_checkpoint& k) { return k.pos > n_pos; });
    return true;
}

void recurrent_state::assign(const state_checkpoint& c, std::vector<state_checkpoint> others) {
    if (c.data.size() != data_.size())
        throw std::logic_error(fmt::format("recurrent state of {} floats given one of {}", data_.size(), c.data.size()));
    data_ = c.data;
    pos_ = c.pos;
    checkpoints_ = std::move(others);
    while (checkpoints_.size() > max_checkpoints_) checkpoints_.erase(checkpoints_.begin());
}

std::unique_ptr<state_part> recurrent_state::park() const {
    auto p = std::make_unique<recurrent_state>();
    p->n_layer_ = n_layer_;
    p->conv_floats_ = conv_floats_;
    p->ssm_floats_ = ssm_floats_;
    p->ple_conv_floats_ = ple_conv_floats_;
    p->ple_window_floats_ = ple_window_floats_;
    p->hc_floats_ = hc_floats_;
    p->data_ = data_;
    p->pos_ = pos_;
    for (const state_checkpoint& c : checkpoints_)
        if (c.pos < pos_) p->checkpoints_.push_back(c);
    return p;
}

void recurrent_state::restore(const state_part& parked, int to) {
    const auto* p = dynamic_cast<const recurrent_state*>(&parked);
    if (!p) throw std::logic_error(fmt::format("a recurrent state restored from a parked {}", parked.kind()));
    std::vector<state_checkpoint> before;
    for (const state_checkpoint& c : p->checkpoints_)
        if (c.pos < to) before.push_back(c);
    if (p->pos_ == to) {
        assign({p->pos_, p->data_}, std::move(before));
        return;
    }
    const auto at = std::find_if(p->checkpoints_.begin(), p->checkpoints_.end(),
                                 [&](const state_checkpoint& c) { return c.pos == to; });
    if (at == p->checkpoints_.end()) throw std::logic_error(fmt::format("no recurrent state parked at {}", to));
    assign(*at, std::move(before));
}

size_t recurrent_state_bytes(const hparams& hp) {
    if (!hp.hybrid()) return 0;
    const size_t conv = static_cast<size_t>(hp.ssm_conv_kernel - 1) * static_cast<size_t>(hp.ssm_conv_dim());
    const size_t ssm = static_cast<size_t>(hp.ssm_n_v_head) * static_cast<size_t>(hp.ssm_d_state) * hp.ssm_d_state;
    size_t extra = static_cast<size_t>(hp.hc_dim());
    if (hp.ple_layer >= 0)
        extra += static_cast<size_t>(hp.ple_conv_kernel - 1) * hp.ple_ngram * static_cast<size_t>(hp.hc_dim()) +
                 static_cast<size_t>(hp.ple_ngram - 1);
    return (static_cast<size_t>(hp.n_recurrent()) * (conv + ssm) + extra) * sizeof(float);
}

}  // namespace strata::engine
