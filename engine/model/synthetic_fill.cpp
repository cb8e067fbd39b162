// forward_pass::fill_synthetic: a sequence's state at a depth without evaluating its tokens, so that
// strata-bench model can time decode at depths a 2-core machine could never fill for real.
#include <cmath>

#include <spdlog/fmt/fmt.h>

#include "model/forward.hpp"
#include "model/ple.hpp"

namespace strata::engine {

namespace {

// splitmix64 draws, mapped to uniform values of mean 0 and standard deviation `scale`.
class synthetic_values {
public:
    explicit synthetic_values(uint64_t seed) : s_(seed) {}
    void fill(float* out, size_t n, float scale) {
        const float half_width = scale * std::sqrt(3.0f);
        for (size_t i = 0; i < n; ++i) {
            const double u = static_cast<double>(next() >> 11) * 0x1.0p-53;  // [0, 1)
            out[i] = static_cast<float>((2.0 * u - 1.0) * half_width);
        }
    }

private:
    uint64_t next() {
        uint64_t z = (s_ += 0x9e3779b97f4a7c15ULL);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
        return z ^ (z >> 31);
    }
    uint64_t s_;
};

// The DeltaNet matrices' scale: a state that has folded many tokens, well inside f32's range.
constexpr float kStateScale = 0.1f;

}  // namespace

void forward_pass::fill_synthetic(std::span<const int32_t> tokens, kv_cache& kv, uint64_t seed) {
    const int n = static_cast<int>(tokens.size());
    if (kv.state_pos() > 0)
        throw std::logic_error(fmt::format("fill_synthetic on a state at position {}, not 0", kv.state_pos()));
    kv.reserve(n);
    synthetic_values rnd(seed);
    // Keys and values (or latent rows) of every cached layer, unit scale as after the QK norms.
    const size_t width = static_cast<size_t>(hp_.kv_heads()) * hp_.kv_head_dim();
    std::vector<float> k(width), v(width);
    for (int layer = 0; layer < kv.n_layer(); ++layer)
        for (int pos = 0; pos < n; ++pos) {
            rnd.fill(k.data(), width, 1.0f);
            if (kv.latent()) {
                kv.store_latent(layer, pos, k.data());
                continue;
            }
            rnd.fill(v.data(), width, 1.0f);
            kv.store(layer, pos, k.data(), v.data());
        }
    // The QSA indexer's raw keys; its block keys follow from them as in a real pass.
    for (int il = 0; il < hp_.n_layer && sparse_attention_; ++il)
        if (layers_[static_cast<size_t>(il)].mixer == sparse_attention_.get()) {
            std::vector<float> keys(static_cast<size_t>(n) * hp_.idx_head_dim);
            rnd.fill(keys.data(), keys.size(), 1.0f);
            sparse_attention_->fill_keys(kv, il, std::move(keys), n);
        }
    recurrent_state* found = kv.find_state<recurrent_state>();
    if (!found || found->empty()) return;
    recurrent_state& rs = *found;
    // [DeltaNet conv | ssm] per layer and qwen4exp's PLE conv inputs, then its n-gram window (the
    // tokens' real last ids: they choose the table rows the next token gathers) and wide residual.
    float* const state = rs.conv(0);
    rnd.fill(state, static_cast<size_t>(rs.ple_window() - state), kStateScale);
    if (hp_.ple_layer >= 0) ple_push_window(hp_, rs.ple_window(), tokens.data(), n);
    const size_t hc_floats = rs.data().size() - static_cast<size_t>(rs.hc_last() - state);
    rnd.fill(rs.hc_last(), hc_floats, 1.0f);
    kv.set_state_pos(n);
}

}  // namespace strata::engine
