// The hybrid forward pass with the CUDA backend: dense layers on the GPU, routed experts split
// between VRAM slots and the CPU pool by the stream manager.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <list>

#include <spdlog/fmt/fmt.h>

#include "cuda_kernels.hpp"
#include "formats/quant.hpp"
#include "gpu/cuda_raii.hpp"
#include "gpu/device.hpp"
#include "gpu/gpu_model.hpp"
#include "gpu/host_pool.hpp"
#include "gpu/hybrid_forward.hpp"
#include "gpu/stream_manager.hpp"
#include "log.hpp"

namespace strata::engine::gpu {

namespace {

namespace cu = kernels::cuda;
using clock_type = std::chrono::steady_clock;

constexpr double kMiB = 1024.0 * 1024.0;
constexpr int kAttnChunk = 64;  // tokens per attention launch (bounds the score scratch)

// A configuration the user asked for that cannot be met: reported, not degraded to CPU-only.
struct config_error : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// One session's keys and values in VRAM: per layer rows of n_kv halves or Q8_0 blocks, row r holding
// position r, grown (moved into larger buffers) as the session fills.
struct session_kv {
    const kv_cache* owner = nullptr;
    int n_valid = 0;   // positions written
    int capacity = 0;  // positions every layer's buffers hold
    std::vector<device_buffer<uint8_t>> k, v;
    uint64_t bytes() const {
        uint64_t b = 0;
        for (const auto* bufs : {&k, &v})
            for (const auto& x : *bufs) b += x.bytes();
        return b;
    }
};

cu::kv_format kv_format_of(kv_type t) { return t == kv_type::int8 ? cu::kv_format::q8_0 : cu::kv_format::f16; }

class cuda_hybrid final : public hybrid_forward {
public:
    cuda_hybrid(arenas::expert_pool& pool, const hparams& hp, const model_weights& w,
                const std::vector<arenas::moe_layer>& layers, const arenas::expert_rows& rows,
                const hybrid_options& o, const device_info& dev, const expert_profile* profile);
    // Work still queued reads buffers about to be freed: let it finish first.
    ~cuda_hybrid() override { cudaDeviceSynchronize(); }
    cuda_hybrid(const cuda_hybrid&) = delete;
    cuda_hybrid& operator=(const cuda_hybrid&) = delete;

    void eval(std::span<const int32_t> tokens, int pos0, kv_cache& kv, float* logits, bool all_logits,
              int n_batch) override;
    const routing_counts& routing() const override { return routing_; }
    cache_stats expert_cache_stats() const override { return cache_->stats(); }
    int device_numa_node() const override { return dev_.numa_node; }
    uint64_t kv_bytes(const kv_cache& kv) const override;
    uint64_t kv_bytes_max() const override;

private:
    void eval_batch(const int32_t* tokens, int n_tok, int pos0, session_kv& s, float* logits, bool all_logits,
                    bool timed);
    void attention(int il, int n_tok, int pos0, session_kv& s);
    void dense_ffn(int il, int n_tok);
    session_kv& session_for(const kv_cache& kv, int pos0);
    void reserve(session_kv& s, int n_pos);
    bool grow_to(session_kv& s, int capacity);
    size_t kv_row() const { return cu::kv_row_bytes(kv_format_of(o_.kv), hp_.n_kv()); }
    cudaStream_t cs() const { return sm_->compute(); }

    const hparams& hp_;
    const model_weights& w_;
    hybrid_options o_;
    device_info dev_;
    int max_tok_;
    routing_counts routing_;
    dev_model dense_;
    slot_layout layout_;
    arenas::moe_runner cpu_moe_;

    // Scratch, [max_tok][...] per token.
    device_buffer<float> x_, xn_, q_, k_, v_, att_, tmp_;  // n_embd, n_embd, n_q, n_kv, n_kv, n_q, n_embd
    device_buffer<float> att_scores_;  // [tokens][n_head][positions]: kAttnChunk x kv_reserved_ctx at least
    device_buffer<float> ff_gate_, ff_up_;                  // [max_tok][n_ff] (leading dense layers only)
    device_buffer<float> logits_;                           // [max_tok][n_vocab]
    std::unique_ptr<dense_matmul> mm_;
    std::span<float> h_x_;                                  // [max_tok][n_embd] embedded tokens
    std::span<float> h_logits_;                             // [max_tok][n_vocab]
    host_pool host_copies_;                                 // holds h_x_ and h_logits_
    std::list<session_kv> sessions_;                        // most recently used first

    device_buffer<uint8_t> slots_;                          // [n_slots][slot_bytes]
    std::unique_ptr<slot_copier> copier_;
    std::unique_ptr<expert_cache> cache_;
    std::unique_ptr<stream_manager> sm_;
};

// The profile's rows of the MoE layers: it counts every layer of the model (the dense ones hold zeros),
// the expert cache only the MoE layers.
expert_profile moe_layers_of(const expert_profile& p, int n_dense_lead) {
    expert_profile m;
    m.n_layer = p.n_layer - n_dense_lead;
    m.n_expert = p.n_expert;
    m.counts.assign(p.counts.begin() + static_cast<std::ptrdiff_t>(n_dense_lead) * p.n_expert, p.counts.end());
    return m;
}

uint64_t session_kv_bytes(const hparams& hp, int n_ctx, kv_type type) {
    return 2ull * static_cast<uint64_t>(hp.n_layer) * static_cast<uint64_t>(n_ctx) *
           cu::kv_row_bytes(kv_format_of(type), hp.n_kv());
}

cuda_hybrid::cuda_hybrid(arenas::expert_pool& pool, const hparams& hp, const model_weights& w,
                         const std::vector<arenas::moe_layer>& layers, const arenas::expert_rows& rows,
                         const hybrid_options& o, const device_info& dev, const expert_profile* profile)
    : hp_(hp),
      w_(w),
      o_(o),
      dev_(dev),
      max_tok_(std::max(o.n_batch, 1)),
      dense_(upload_dense(hp, w)),
      layout_(layout_slots(layers)),
      cpu_moe_(pool, {hp.n_embd, hp.n_ff_exp, hp.n_expert, hp.n_expert_used}, layers, rows) {
    if (o_.kv_reserved_ctx <= 0 || o_.kv_reserved_ctx > o_.n_ctx) o_.kv_reserved_ctx = o_.n_ctx;
    o_.kv_grow_tokens = std::max(o_.kv_grow_tokens, 1);
    routing_.counts.assign(static_cast<size_t>(hp.n_layer) * hp.n_expert, 0);
    const size_t t = static_cast<size_t>(max_tok_), n_embd = static_cast<size_t>(hp.n_embd);
    const size_t n_q = static_cast<size_t>(hp.n_q()), n_kv = static_cast<size_t>(hp.n_kv());
    x_ = device_buffer<float>(t * n_embd);
    xn_ = device_buffer<float>(t * n_embd);
    q_ = device_buffer<float>(t * n_q);
    k_ = device_buffer<float>(t * n_kv);
    v_ = device_buffer<float>(t * n_kv);
    att_ = device_buffer<float>(t * n_q);
    tmp_ = device_buffer<float>(t * n_embd);
    att_scores_ =
        device_buffer<float>(static_cast<size_t>(kAttnChunk) * hp.n_head * static_cast<size_t>(o_.kv_reserved_ctx));
    logits_ = device_buffer<float>(t * static_cast<size_t>(hp.n_vocab));
    if (hp.n_layer_dense_lead > 0) {
        ff_gate_ = device_buffer<float>(t * static_cast<size_t>(hp.n_ff));
        ff_up_ = device_buffer<float>(t * static_cast<size_t>(hp.n_ff));
    }
    int64_t max_w = 0, max_cols = 0;
    auto consider = [&](const dev_matrix& m) {
        max_w = std::max(max_w, m.n_rows * m.n_cols);
        max_cols = std::max(max_cols, m.n_cols);
    };
    for (const dev_layer& l : dense_.layers)
        for (const dev_matrix* m : {&l.wq, &l.wk, &l.wv, &l.wo, &l.ffn_gate, &l.ffn_up, &l.ffn_down}) consider(*m);
    consider(dense_.output);
    mm_ = std::make_unique<dense_matmul>(max_tok_ >= dense_matmul::kGemmTokens ? max_w : 0,
                                         max_tok_ >= dense_matmul::kGemmTokens ? max_tok_ * max_cols : 0);
    host_copies_ = host_arrays()
                       .add(h_x_, t * n_embd)
                       .add(h_logits_, t * static_cast<size_t>(hp.n_vocab))
                       .allocate(o.hot, "GPU host copies (pinned)");
    const uint64_t scratch = (x_.bytes() + xn_.bytes() + q_.bytes() + k_.bytes() + v_.bytes() + att_.bytes() +
                              tmp_.bytes() + att_scores_.bytes() + ff_gate_.bytes() + ff_up_.bytes() + logits_.bytes() +
                              mm_->bytes());
    // The stream manager's buffers: about 3 [max_tok * k][max(n_ff, n_embd)] arrays plus per-token rows.
    const uint64_t moe_scratch = t * static_cast<uint64_t>(hp.n_expert_used) *
                                     (2ull * hp.n_ff_exp + hp.n_embd) * sizeof(float) +
                                 t * (4ull * n_embd + 2ull * std::max(hp.n_ff_shexp, 1) + hp.n_expert) * sizeof(float);

    const vram_budget budget{dev.free_bytes, static_cast<uint64_t>(o.vram_reserve_mib) << 20,
                             dense_.bytes + scratch + moe_scratch, session_kv_bytes(hp, o_.kv_reserved_ctx, o.kv),
                             o.gpu_sessions};
    const uint64_t kv_bytes = budget.kv_bytes();
    cache_size size;
    try {
        size = size_expert_cache(budget, o.expert_cache_gib, layout_.slot_bytes, hp.n_moe_layer() * hp.n_expert);
    } catch (const std::runtime_error& e) {
        if (o.expert_cache_gib && budget.reserve_bytes + budget.dense_bytes + budget.kv_bytes() <= budget.free_bytes)
            throw config_error(e.what());
        throw;
    }
    slots_ = device_buffer<uint8_t>(static_cast<size_t>(size.n_slots) * layout_.slot_bytes);
    sm_ = nullptr;
    copier_ = std::make_unique<slot_copier>(layers, rows, pool.plan(),
                                            arenas::moe_shape{hp.n_embd, hp.n_ff_exp, hp.n_expert, hp.n_expert_used},
                                            layout_, slots_.data(), std::max(o.adapt.swaps, 1) + 1,
                                            o.adapt.async, o.hot);
    cache_ = std::make_unique<expert_cache>(hp.n_moe_layer(), hp.n_expert, size.n_slots, o.adapt, *copier_);
    sm_ = std::make_unique<stream_manager>(hp, dense_, layers, cpu_moe_, *cache_, layout_, slots_.data(), max_tok_,
                                           routing_, o.hot);
    copier_->set_after(sm_->compute());
    std::optional<expert_profile> moe_profile;
    if (profile) moe_profile = moe_layers_of(*profile, hp.n_layer_dense_lead);
    cache_->fill(fill_order(hp.n_moe_layer(), hp.n_expert, profile ? &*moe_profile : nullptr));

    const int total = hp.n_moe_layer() * hp.n_expert;
    logger("gpu")->info(
        "GPU {} ({}, compute {}.{}, {:.0f} of {:.0f} MiB free, NUMA node {}): dense weights {:.0f} MiB, scratch "
        "{:.0f} MiB, KV cache ({}) {:.0f} MiB set aside for {} session(s) of {} positions (grown in steps of {} as "
        "a session fills, up to {} positions, {:.0f} MiB each); expert cache {} slots of {:.2f} MiB ({:.0f} MiB) "
        "hold {} of {} routed experts ({:.0f} %), filled {}.",
        dev.index, dev.name, dev.compute_major, dev.compute_minor, double(dev.free_bytes) / kMiB,
        double(dev.total_bytes) / kMiB, dev.numa_node, double(dense_.bytes) / kMiB,
        double(scratch + moe_scratch) / kMiB, kv_type_name(o.kv), double(kv_bytes) / kMiB, o.gpu_sessions,
        o_.kv_reserved_ctx, o_.kv_grow_tokens, o_.n_ctx, double(kv_bytes_max()) / kMiB,
        size.n_slots,
        double(layout_.slot_bytes) / kMiB, double(slots_.bytes()) / kMiB, size.n_slots, total,
        100.0 * size.n_slots / std::max(total, 1),
        profile ? "from the expert profile " + o.expert_profile : std::string("in the default order"));
}

session_kv& cuda_hybrid::session_for(const kv_cache& kv, int pos0) {
    auto it = std::find_if(sessions_.begin(), sessions_.end(), [&](const session_kv& s) { return s.owner == &kv; });
    if (it == sessions_.end()) {
        if (pos0 != 0)
            throw std::runtime_error(fmt::format(
                "this session's KV cache is no longer in VRAM (it was given to a newer session; VRAM holds {}), so "
                "it cannot continue at position {}: start it again from position 0",
                o_.gpu_sessions, pos0));
        if (static_cast<int>(sessions_.size()) >= o_.gpu_sessions) {
            sessions_.splice(sessions_.begin(), sessions_, std::prev(sessions_.end()));  // reuse the least recent
        } else {
            session_kv s;
            s.k.resize(static_cast<size_t>(hp_.n_layer));
            s.v.resize(static_cast<size_t>(hp_.n_layer));
            sessions_.push_front(std::move(s));
        }
        it = sessions_.begin();
        it->owner = &kv;
        it->n_valid = 0;
    } else {
        sessions_.splice(sessions_.begin(), sessions_, it);
        it = sessions_.begin();
    }
    if (pos0 > it->n_valid)
        throw std::runtime_error(fmt::format("position {} is past the {} positions of this session's VRAM KV cache",
                                             pos0, it->n_valid));
    return *it;
}

uint64_t cuda_hybrid::kv_bytes(const kv_cache& kv) const {
    for (const session_kv& s : sessions_)
        if (s.owner == &kv) return s.bytes();
    return 0;
}

uint64_t cuda_hybrid::kv_bytes_max() const { return session_kv_bytes(hp_, o_.n_ctx, o_.kv); }

// Room for positions [0, n_pos): a quarter more than before in whole steps (at most n_ctx), or just
// the steps n_pos needs when VRAM has no room for that.
void cuda_hybrid::reserve(session_kv& s, int n_pos) {
    if (n_pos <= s.capacity) return;
    const int step = o_.kv_grow_tokens;
    const auto steps = [&](int n) { return std::min(o_.n_ctx, (n + step - 1) / step * step); };
    const int needed = steps(n_pos);
    check(cudaStreamSynchronize(cs()), "cudaStreamSynchronize");  // queued work reads the buffers replaced
    if (grow_to(s, steps(std::max(n_pos, s.capacity + s.capacity / 4))) || grow_to(s, needed)) return;
    size_t free_bytes = 0, total_bytes = 0;
    check(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
    throw kv_cache_full(fmt::format(
        "the GPU's KV cache cannot grow to {} positions ({:.0f} MiB for this session, which holds {} positions): "
        "{:.0f} MiB of VRAM are free; load with --ctx {} to set VRAM aside for that many positions, or with a "
        "smaller --expert-cache",
        n_pos, double(session_kv_bytes(hp_, needed, o_.kv)) / kMiB, s.capacity, double(free_bytes) / kMiB, needed));
}

// Moves every layer's keys and values into buffers of `capacity` positions, one buffer at a time (the
// old one freed before the next is allocated); false when VRAM runs out, with the session intact (the
// layers already moved keep their larger buffers).
bool cuda_hybrid::grow_to(session_kv& s, int capacity) {
    const size_t row = kv_row(), rows = static_cast<size_t>(capacity);
    const size_t scores = static_cast<size_t>(hp_.n_head) * rows;
    if (att_scores_.size() < scores) {  // one token's scores at the deepest position
        auto b = device_buffer<float>::try_allocate(scores);
        if (!b.data()) return false;
        att_scores_ = std::move(b);
    }
    for (auto* bufs : {&s.k, &s.v})
        for (device_buffer<uint8_t>& b : *bufs) {
            if (b.bytes() >= rows * row) continue;
            auto moved = device_buffer<uint8_t>::try_allocate(rows * row);
            if (!moved.data()) return false;
            if (s.n_valid > 0) {
                check(cudaMemcpyAsync(moved.data(), b.data(), static_cast<size_t>(s.n_valid) * row,
                                      cudaMemcpyDeviceToDevice, cs()),
                      "cudaMemcpyAsync device to device");
                check(cudaStreamSynchronize(cs()), "cudaStreamSynchronize");
            }
            b = std::move(moved);
        }
    s.capacity = capacity;
    return true;
}

void cuda_hybrid::eval(std::span<const int32_t> tokens, int pos0, kv_cache& kv, float* logits, bool all_logits,
                       int n_batch) {
    const int n = static_cast<int>(tokens.size());
    if (pos0 + n > o_.n_ctx)
        throw std::runtime_error(fmt::format("positions {}..{} exceed the context of {}", pos0, pos0 + n - 1, o_.n_ctx));
    session_kv& s = session_for(kv, pos0);
    reserve(s, pos0 + n);
    const int batch = std::clamp(n_batch, 1, max_tok_);
    for (int first = 0; first < n; first += batch) {
        const int n_tok = std::min(batch, n - first);
        float* out = all_logits ? logits + static_cast<size_t>(first) * hp_.n_vocab
                                : (first + n_tok == n ? logits : nullptr);
        const auto t0 = clock_type::now();
        const bool decode = n == 1;
        eval_batch(tokens.data() + first, n_tok, pos0 + first, s, out, all_logits, decode && o_.decode_timing);
        s.n_valid = pos0 + first + n_tok;
        if (decode) {
            cache_->end_decode_step();
            if (o_.decode_timing) {
                const token_timing t = sm_->collect_timing();
                const double ms = std::chrono::duration<double, std::milli>(clock_type::now() - t0).count();
                logger("gpu")->info(
                    "decode token at position {}: {:.2f} ms; GPU experts {:.2f} ms, CPU complement {:.2f} ms, copies "
                    "{:.2f} ms, GPU waited {:.2f} ms for the CPU; {} of {} routed experts served from VRAM.",
                    pos0, ms, t.gpu_experts_ms, t.cpu_complement_ms, t.copy_ms, t.gpu_wait_ms, t.hits, t.lookups);
            }
        }
    }
}

void cuda_hybrid::eval_batch(const int32_t* tokens, int n_tok, int pos0, session_kv& s, float* logits,
                             bool all_logits, bool timed) {
    const int64_t n_embd = hp_.n_embd;
    const size_t ne = static_cast<size_t>(n_embd);
    check(cudaStreamSynchronize(cs()), "cudaStreamSynchronize");  // h_x_ is free again
    const kernels::cpu::matrix& embd = w_.tok_embd.m;
    for (int t = 0; t < n_tok; ++t) {
        const auto* row = static_cast<const uint8_t*>(embd.data) + static_cast<size_t>(tokens[t]) * embd.row_stride;
        formats::dequantize_row(embd.type, row, h_x_.data() + static_cast<size_t>(t) * ne, n_embd);
    }
    copy_to_device(x_.data(), h_x_.data(), static_cast<size_t>(n_tok) * ne, cs());
    for (int il = 0; il < hp_.n_layer; ++il) {
        const dev_layer& l = dense_.layers[static_cast<size_t>(il)];
        cu::rms_norm(x_.data(), l.attn_norm.data(), hp_.rms_eps, n_embd, n_tok, xn_.data(), cs());
        attention(il, n_tok, pos0, s);
        mm_->run(l.wo, att_.data(), n_tok, tmp_.data(), n_embd, cs());
        cu::add(x_.data(), tmp_.data(), n_tok * n_embd, cs());
        cu::rms_norm(x_.data(), l.ffn_norm.data(), hp_.rms_eps, n_embd, n_tok, xn_.data(), cs());
        if (hp_.is_moe_layer(il))
            sm_->moe_layer(il, n_tok, xn_.data(), x_.data(), timed);
        else
            dense_ffn(il, n_tok);
    }
    if (logits) {
        const int first = all_logits ? 0 : n_tok - 1, n_out = n_tok - first;
        const size_t n_vocab = static_cast<size_t>(hp_.n_vocab);
        cu::rms_norm(x_.data() + static_cast<size_t>(first) * ne, dense_.output_norm.data(), hp_.rms_eps, n_embd, n_out,
                     xn_.data(), cs());
        mm_->run(dense_.output, xn_.data(), n_out, logits_.data(), hp_.n_vocab, cs());
        copy_to_host(h_logits_.data(), logits_.data(), static_cast<size_t>(n_out) * n_vocab, cs());
        check(cudaStreamSynchronize(cs()), "cudaStreamSynchronize");
        std::memcpy(logits, h_logits_.data(), static_cast<size_t>(n_out) * n_vocab * sizeof(float));
    } else {
        check(cudaStreamSynchronize(cs()), "cudaStreamSynchronize");
    }
}

void cuda_hybrid::attention(int il, int n_tok, int pos0, session_kv& s) {
    const dev_layer& l = dense_.layers[static_cast<size_t>(il)];
    const int hd = hp_.head_dim, n_q = hp_.n_q(), n_kv = hp_.n_kv();
    mm_->run(l.wq, xn_.data(), n_tok, q_.data(), n_q, cs());
    mm_->run(l.wk, xn_.data(), n_tok, k_.data(), n_kv, cs());
    mm_->run(l.wv, xn_.data(), n_tok, v_.data(), n_kv, cs());
    if (l.bq.size()) {
        cu::add_bias(q_.data(), l.bq.data(), n_q, n_tok, cs());
        cu::add_bias(k_.data(), l.bk.data(), n_kv, n_tok, cs());
        cu::add_bias(v_.data(), l.bv.data(), n_kv, n_tok, cs());
    }
    if (l.q_norm.size()) {
        cu::rms_norm(q_.data(), l.q_norm.data(), hp_.rms_eps, hd, int64_t{n_tok} * hp_.n_head, q_.data(), cs());
        cu::rms_norm(k_.data(), l.k_norm.data(), hp_.rms_eps, hd, int64_t{n_tok} * hp_.n_head_kv, k_.data(), cs());
    }
    const bool neox = hp_.arch.rope == kernels::cpu::rope_style::neox;
    cu::rope(q_.data(), n_tok, hp_.n_head, hd, hp_.n_rot, pos0, hp_.rope, neox, cs());
    cu::rope(k_.data(), n_tok, hp_.n_head_kv, hd, hp_.n_rot, pos0, hp_.rope, neox, cs());
    uint8_t* kc = s.k[static_cast<size_t>(il)].data();
    uint8_t* vc = s.v[static_cast<size_t>(il)].data();
    const cu::kv_format kvf = kv_format_of(o_.kv);
    cu::kv_store(kvf, k_.data(), v_.data(), n_tok, n_kv, pos0, kc, vc, cs());
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    // Tokens per launch: as many as the score scratch holds at the batch's deepest position (reserve()
    // keeps room for one).
    const size_t per_token = static_cast<size_t>(hp_.n_head) * static_cast<size_t>(pos0 + n_tok);
    const int chunk = static_cast<int>(std::clamp<size_t>(att_scores_.size() / per_token, 1, kAttnChunk));
    for (int c = 0; c < n_tok; c += chunk) {
        const int nc = std::min(chunk, n_tok - c);
        const size_t off = static_cast<size_t>(c) * static_cast<size_t>(n_q);
        cu::attention(kvf, q_.data() + off, kc, vc, nc, pos0 + c, hp_.n_head, hp_.n_head_kv, hd, scale,
                          att_scores_.data(), att_.data() + off, cs());
    }
}

// A leading dense layer's FFN on the compute stream: x += down(silu(gate xn) * up xn).
void cuda_hybrid::dense_ffn(int il, int n_tok) {
    const dev_layer& l = dense_.layers[static_cast<size_t>(il)];
    const int64_t n_ff = hp_.n_ff;
    mm_->run(l.ffn_gate, xn_.data(), n_tok, ff_gate_.data(), n_ff, cs());
    mm_->run(l.ffn_up, xn_.data(), n_tok, ff_up_.data(), n_ff, cs());
    cu::silu_mul(ff_gate_.data(), ff_up_.data(), n_tok * n_ff, ff_gate_.data(), cs());
    mm_->run(l.ffn_down, ff_gate_.data(), n_tok, tmp_.data(), hp_.n_embd, cs());
    cu::add(x_.data(), tmp_.data(), n_tok * int64_t{hp_.n_embd}, cs());
}

}  // namespace

std::unique_ptr<hybrid_forward> hybrid_forward::create(arenas::expert_pool& pool, const hparams& hp,
                                                       const model_weights& w,
                                                       const std::vector<arenas::moe_layer>& layers,
                                                       const arenas::expert_rows& rows, const hybrid_options& options,
                                                       std::string* why) {
    std::optional<expert_profile> profile;
    if (!options.expert_profile.empty()) profile = load_profile(options.expert_profile, hp.n_layer, hp.n_expert);
    const std::optional<device_info> dev = options.device ? options.device : select_device(options.gpu, why);
    if (!dev) return nullptr;
    try {
        return std::make_unique<cuda_hybrid>(pool, hp, w, layers, rows, options, *dev, profile ? &*profile : nullptr);
    } catch (const config_error&) {
        throw;
    } catch (const std::exception& e) {
        if (why) *why = fmt::format("GPU {} ({}) cannot run this model: {}", dev->index, dev->name, e.what());
        return nullptr;
    }
}

}  // namespace strata::engine::gpu
