#include "model/forward.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include <spdlog/fmt/fmt.h>

#include "formats/quant.hpp"
#include "model/parallel.hpp"

namespace strata::engine {

namespace cpu = kernels::cpu;

namespace {

constexpr int64_t kDenseGrain = 16;  // rows per work item of a dense matmul

}  // namespace

const mixer_kind& mixer_kind_of(const hparams& hp, int il) {
    if (hp.is_recurrent(il)) return gated_delta_net::layer_kind();
    if (hp.mla()) return latent_attention_mixer::layer_kind();
    if (hp.qwen4() && hp.qsa_ratio[static_cast<size_t>(il)] > 0) return sparse_attention_mixer::layer_kind();
    return attention_mixer::layer_kind();
}

namespace {

// hp's mixer kinds, each once, in the order of the layers.
std::vector<const mixer_kind*> mixer_kinds(const hparams& hp) {
    std::vector<const mixer_kind*> kinds;
    for (int il = 0; il < hp.n_layer; ++il)
        if (const mixer_kind* k = &mixer_kind_of(hp, il); std::find(kinds.begin(), kinds.end(), k) == kinds.end())
            kinds.push_back(k);
    return kinds;
}

}  // namespace

kv_rows sequence_rows(const hparams& hp) {
    for (const mixer_kind* k : mixer_kinds(hp))
        if (const kv_rows r = k->rows(hp); r.n_head_kv > 0) return r;
    return attention_mixer::layer_kind().rows(hp);
}

int n_recurrent_layers(const hparams& hp) {
    int n = 0;
    for (int il = 0; il < hp.n_layer; ++il) n += mixer_kind_of(hp, il).recurrent() ? 1 : 0;
    return n;
}

size_t sequence_state_bytes(const hparams& hp) {
    size_t n = 0;
    for (const mixer_kind* k : mixer_kinds(hp)) n += k->state_bytes(hp);
    return n;
}

std::string gpu_unsupported(const hparams& hp) {
    for (const mixer_kind* k : mixer_kinds(hp))
        if (std::string why = k->gpu_unsupported(hp); !why.empty()) return why;
    return {};
}

kv_cache make_sequence_state(const hparams& hp, int n_ctx, kv_type kv) {
    const kv_rows rows = sequence_rows(hp);
    kv_cache c(hp.n_kv_layer(), n_ctx, rows.n_head_kv, rows.head_dim, kv, rows.latent);
    // Each mixer kind's part beside the rows, once per kind.
    for (const mixer_kind* k : mixer_kinds(hp))
        if (std::unique_ptr<state_part> part = k->make_state(hp)) c.add_state(std::move(part));
    return c;
}

kv_cache make_mtp_state(const hparams& hp, int n_ctx, kv_type kv) {
    const kv_rows rows = sequence_rows(hp);
    return kv_cache(1, n_ctx, rows.n_head_kv, rows.head_dim, kv, rows.latent);
}

std::vector<arenas::moe_layer> moe_layers(const model_weights& w) {
    std::vector<arenas::moe_layer> layers;
    for (const auto& l : w.layers)
        if (l.router.present()) layers.push_back({l.gate, l.up, l.down});
    return layers;
}

forward_pass::forward_pass(arenas::expert_pool& pool, const hparams& hp, const model_weights& w,
                           const arenas::expert_rows& rows)
    : pool_(pool),
      hp_(hp),
      w_(w),
      moe_layers_(moe_layers(w)),
      moe_(pool, {hp.n_embd, hp.n_ff_exp, hp.n_expert, hp.n_expert_used}, moe_layers_, rows),
      attn_(pool, hp) {
    routing_.counts.assign(static_cast<size_t>(hp.n_layer) * hp.n_expert, 0);
    // The layer list: each layer's mixer, FFN and add-ons, from the file's hyper-parameters.
    attention_ = std::make_unique<attention_mixer>(*this);
    dense_ffn_ = std::make_unique<dense_ffn>(*this);
    moe_ffn_ = std::make_unique<moe_ffn>(*this, *dense_ffn_);
    if (hp.qwen4())
        residual_ = std::make_unique<hc_residual>(*this);
    else
        residual_ = std::make_unique<plain_residual>(*this);
    for (int il = 0; il < hp.n_layer; ++il) {
        layer_kind k;
        const mixer_kind& mk = mixer_kind_of(hp, il);
        if (&mk == &gated_delta_net::layer_kind()) {
            if (!delta_net_) delta_net_ = std::make_unique<gated_delta_net>(*this);
            k.mixer = delta_net_.get();
        } else if (&mk == &latent_attention_mixer::layer_kind()) {
            if (!latent_attention_) latent_attention_ = std::make_unique<latent_attention_mixer>(*this);
            k.mixer = latent_attention_.get();
        } else if (&mk == &sparse_attention_mixer::layer_kind()) {
            if (!sparse_attention_) sparse_attention_ = std::make_unique<sparse_attention_mixer>(*this, *attention_);
            k.mixer = sparse_attention_.get();
        } else {
            k.mixer = attention_.get();
        }
        k.ffn = hp.is_moe_layer(il) ? static_cast<ffn_block*>(moe_ffn_.get()) : dense_ffn_.get();
        k.ple = il == hp.ple_layer;
        batches_ = batches_ && k.mixer->batches_sequences();
        layers_.push_back(k);
    }
    batches_ = batches_ && residual_->batches_sequences();
    if (!w.nextn.empty() && w.nextn[0].layer.router.present() && (!hp.qwen4() || w.nextn[0].hc_head.present())) {
        const layer_weights& l = w.nextn[0].layer;
        // The block's mixer: the kind of the trunk's attention layers (dense for qwen4exp, as llama.cpp runs it).
        mtp_mixer_ = latent_attention_ ? static_cast<token_mixer*>(latent_attention_.get()) : attention_.get();
        mtp_moe_layers_.push_back({l.gate, l.up, l.down});
        mtp_rows_ = std::make_unique<arenas::mapped_expert_rows>(mtp_moe_layers_);
        mtp_moe_ = std::make_unique<arenas::moe_runner>(
            pool, arenas::moe_shape{hp.n_embd, hp.n_ff_exp, hp.n_expert, hp.n_expert_used}, mtp_moe_layers_, *mtp_rows_);
    }
}

const char* phase_clock::name(int p) {
    static const char* const names[n_parts] = {"attention projections", "attention", "router", "experts: quantize",
                                               "experts: gate+up", "experts: down", "shared expert", "dense FFN",
                                               "output head", "PLE rows (cold table)", "QSA indexer",
                                               "other"};
    return p >= 0 && p < n_parts ? names[p] : "?";
}

void forward_pass::set_clock(phase_clock* clock) {
    clock_ = clock;
    moe_.set_phase_seconds(clock ? &clock->seconds[phase_clock::experts_quantize] : nullptr);
}

void forward_pass::matmul(const weight_matrix& w, int n_tok, const float* in, float* y) {
    const weight_matrix* const ws[] = {&w};
    float* const ys[] = {y};
    matmul_same_input(ws, n_tok, in, ys);
}

void forward_pass::each_row(int n_tok, arenas::function_ref<void(int64_t t0, int64_t t1)> fn) {
    constexpr int kPoolRows = 32;  // fewer rows stay on the host
    constexpr int64_t kRowGrain = 8;
    if (n_tok < kPoolRows)
        fn(0, n_tok);
    else
        parallel_rows(pool_, n_tok, kRowGrain, fn);
}

void forward_pass::matmul_same_input(std::span<const weight_matrix* const> w, int n_tok, const float* in,
                                     std::span<float* const> y) {
    // The input is quantized once per activation format the matrices read (at most kMaxFormats).
    constexpr size_t kMaxFormats = 4, kMaxMatrices = 8;
    formats::ggml_type fmt_weight[kMaxFormats];
    size_t offsets[kMaxFormats], row_bytes[kMaxFormats], n_formats = 0, total_bytes = 0;
    size_t format_of[kMaxMatrices] = {};
    int64_t total = 0;
    bool fuse = w.size() <= kMaxMatrices;
    for (size_t i = 0; i < w.size(); ++i) {  // one matrix always runs as one phase
        const cpu::matrix& m = w[i]->cpu();
        const auto act = cpu::activation_type(m.type);
        size_t f = 0;
        while (f < n_formats && cpu::activation_type(fmt_weight[f]) != act) ++f;
        if (f == n_formats && n_formats < kMaxFormats) {
            fmt_weight[f] = m.type;
            row_bytes[f] = cpu::activation_row_size(m.type, m.n_cols);
            offsets[f] = total_bytes;
            total_bytes += row_bytes[f] * static_cast<size_t>(n_tok);
            ++n_formats;
        }
        fuse = fuse && f < n_formats && m.n_cols == w[0]->cpu().n_cols && (w.size() == 1 || w[i]->n_rows % kDenseGrain == 0);
        if (i < kMaxMatrices) format_of[i] = f;
        total += w[i]->n_rows;
    }
    if (!fuse) {
        for (size_t i = 0; i < w.size(); ++i) matmul(*w[i], n_tok, in, y[i]);
        return;
    }
    const int64_t n_cols = w[0]->cpu().n_cols;
    if (act_.size() < total_bytes) act_.resize(total_bytes);
    each_row(n_tok, [&](int64_t t0, int64_t t1) {
        for (size_t f = 0; f < n_formats; ++f)
            for (int64_t t = t0; t < t1; ++t)
                cpu::quantize_activation(fmt_weight[f], in + static_cast<size_t>(t) * n_cols,
                                         act_.data() + offsets[f] + t * row_bytes[f], n_cols);
    });
    // Rows of the matrices one after the other; a range is cut where one matrix ends.
    parallel_rows(pool_, total, kDenseGrain, [&](int64_t r0, int64_t r1) {
        int64_t first = 0;
        for (size_t i = 0; i < w.size() && r0 < r1; ++i) {
            const int64_t n = w[i]->n_rows;
            if (r0 < first + n) {
                const int64_t end = std::min(r1, first + n);
                cpu::matmul(w[i]->cpu(), r0 - first, end - first, act_.data() + offsets[format_of[i]], row_bytes[format_of[i]],
                            n_tok, y[i] + (r0 - first), n);
                r0 = end;
            }
            first += n;
        }
    });
}

void forward_pass::eval(std::span<const int32_t> tokens, int pos0, kv_cache& kv, float* logits, bool all_logits,
                        int n_batch, float* hidden) {
    const int n = static_cast<int>(tokens.size());
    if (pos0 < 0 || int64_t{pos0} + n > kv.n_ctx())
        throw kv_cache_full(fmt::format("positions {}..{} do not fit the context of {}", pos0, int64_t{pos0} + n - 1,
                                        kv.n_ctx()));
    const bool positioned = kv.state_pos() >= 0;  // a part beside the rows holds a position of its own
    if (positioned && kv.state_pos() != pos0)
        throw std::logic_error(fmt::format("the recurrent state holds {} positions, the batch starts at {}",
                                           kv.state_pos(), pos0));
    kv.reserve(pos0 + n);
    const int every = positioned ? checkpoint_interval_ : 0;
    for (int first = 0, n_tok = 0; first < n; first += n_tok) {
        n_tok = std::min(n_batch, n - first);
        if (every > 0) n_tok = std::min(n_tok, every - (pos0 + first) % every);
        const bool last = first + n_tok == n;
        float* out = nullptr;
        if (all_logits)
            out = logits + static_cast<size_t>(first) * hp_.n_vocab;
        else if (last)
            out = logits;
        eval_batch(tokens.data() + first, n_tok, pos0 + first, kv, out, all_logits,
                   hidden ? hidden + static_cast<size_t>(first) * hp_.residual_width() : nullptr);
        if (!positioned) continue;
        kv.set_state_pos(pos0 + first + n_tok);
        if (every > 0 && (pos0 + first + n_tok) % every == 0) kv.checkpoint();
    }
}

void forward_pass::eval_step(std::span<const step_segment> segments, int n_batch) {
    const auto each_alone = [&] {
        for (const step_segment& g : segments)
            eval(std::span(g.tokens, static_cast<size_t>(g.n_tok)), g.pos0, *g.kv, g.logits, g.all_logits, n_batch,
                 g.hidden);
    };
    if (!batches_sequences() || segments.size() == 1) {
        each_alone();
        return;
    }
    for (const step_segment& g : segments) {
        if (g.pos0 < 0 || int64_t{g.pos0} + g.n_tok > g.kv->n_ctx())
            throw kv_cache_full(fmt::format("positions {}..{} do not fit the context of {}", g.pos0,
                                            int64_t{g.pos0} + g.n_tok - 1, g.kv->n_ctx()));
    }
    // A sequence with a recurrent state (positioned) must continue at its state's position; eval() cuts
    // its calls at the checkpoint interval, so a segment across a multiple of it is evaluated alone.
    const int every = checkpoint_interval_;
    for (const step_segment& g : segments) {
        if (g.kv->state_pos() < 0) continue;
        if (g.kv->state_pos() != g.pos0)
            throw std::logic_error(fmt::format("the recurrent state holds {} positions, the segment starts at {}",
                                               g.kv->state_pos(), g.pos0));
        if (every > 0 && (g.pos0 / every + 1) * every < g.pos0 + g.n_tok) {
            each_alone();
            return;
        }
    }
    for (const step_segment& g : segments) g.kv->reserve(g.pos0 + g.n_tok);
    timed_layers(segments);
    for (const step_segment& g : segments) {
        if (g.kv->state_pos() < 0) continue;
        g.kv->set_state_pos(g.pos0 + g.n_tok);
        if (every > 0 && (g.pos0 + g.n_tok) % every == 0) g.kv->checkpoint();
    }
}

void forward_pass::eval_batch(const int32_t* tokens, int n_tok, int pos0, kv_cache& kv, float* logits,
                              bool all_logits, float* hidden) {
    const step_segment one{tokens, n_tok, pos0, &kv, logits, all_logits, hidden};
    timed_layers(std::span(&one, 1));
}

void forward_pass::timed_layers(std::span<const step_segment> segs) {
    double total = 0, parts_before = 0;
    if (clock_) {
        for (double x : clock_->seconds) parts_before += x;
        ++clock_->passes;
    }
    {
        arenas::scoped_seconds whole(clock_ ? &total : nullptr);
        eval_layers(segs);
    }
    if (clock_) {
        double parts = 0;
        for (double x : clock_->seconds) parts += x;
        clock_->seconds[phase_clock::other] += total - (parts - parts_before);
    }
}

void forward_pass::eval_layers(std::span<const step_segment> segs) {
    int n_tok = 0;
    for (const step_segment& g : segs) n_tok += g.n_tok;
    const size_t n_embd = static_cast<size_t>(hp_.n_embd);
    const size_t nt = static_cast<size_t>(n_tok);
    x_.resize(nt * n_embd);
    xn_.resize(nt * n_embd);
    q_.resize(nt * hp_.n_q());
    att_.resize(nt * std::max({hp_.n_q(), hp_.n_v(), hp_.ssm_value_dim()}));
    k_.resize(nt * hp_.n_kv());
    v_.resize(nt * hp_.n_kv());
    tmp_.resize(nt * n_embd);
    tmp2_.resize(nt * static_cast<size_t>(std::max({hp_.n_ff_shexp, hp_.n_ff, 1})));
    router_.resize(nt * hp_.n_expert);
    ids_.resize(nt * hp_.n_expert_used);
    weights_.resize(nt * hp_.n_expert_used);

    // Every layer turns q and k by the same angles at a position: computed once per row.
    rope_cs_.resize(nt * static_cast<size_t>(hp_.n_rot));
    tok_.clear();
    for (const step_segment& g : segs)
        for (int t = 0; t < g.n_tok; ++t) {
            cpu::rope_angles(hp_.n_rot, g.pos0 + t, hp_.rope, rope_cs_.data() + tok_.size() * hp_.n_rot);
            tok_.push_back(g.tokens[t]);
        }

    residual_stream& res = *residual_;
    res.begin(segs, n_tok);
    for (int il = 0; il < hp_.n_layer; ++il) {
        const layer_weights& l = w_.layers[static_cast<size_t>(il)];
        const layer_kind& kind = layers_[static_cast<size_t>(il)];
        if (kind.ple) ple_block(l, segs, n_tok);
        res.block_input(l, false, n_tok);
        kind.mixer->eval(il, segs, n_tok);
        {
            arenas::scoped_seconds t(seconds(phase_clock::attn_proj));
            matmul(l.wo, n_tok, att_.data(), tmp_.data());
        }
        add_bytes(phase_clock::attn_proj, l.wq.bytes() + l.wk.bytes() + l.wv.bytes() + l.wo.bytes() + l.wq_a.bytes() +
                                              l.wq_b.bytes() + l.wkv_a.bytes() + l.wqkv.bytes() + l.wz.bytes() +
                                              l.ssm_in.bytes() + l.ssm_beta.bytes() + l.ssm_alpha.bytes() +
                                              l.ssm_ba.bytes());
        res.add(tmp_.data(), true, n_tok);
        res.end_block(n_tok);

        res.block_input(l, true, n_tok);
        kind.ffn->eval(il, n_tok, res);
        res.end_block(n_tok);
    }
    res.finish(segs, n_tok);
}

void forward_pass::output_head(std::span<const step_segment> segs) {
    const size_t n_embd = static_cast<size_t>(hp_.n_embd);
    // The rows that want logits, normed into the front of xn_ (a row's slot never runs ahead of it).
    const int n_out = for_logit_rows(segs, [&](int row, int k) {
        cpu::rms_norm(x_.data() + static_cast<size_t>(row) * n_embd, w_.output_norm, hp_.rms_eps, hp_.n_embd,
                      xn_.data() + static_cast<size_t>(k) * n_embd);
    });
    if (n_out == 0) return;
    arenas::scoped_seconds t_head(seconds(phase_clock::head));
    head_logits(segs, n_out);
}

void forward_pass::head_logits(std::span<const step_segment> segs, int n_out) {
    const size_t n_vocab = static_cast<size_t>(hp_.n_vocab);
    add_bytes(phase_clock::head, w_.output.bytes());
    if (segs.size() == 1) {
        matmul(w_.output, n_out, xn_.data(), segs[0].logits);
        return;
    }
    head_out_.resize(static_cast<size_t>(n_out) * n_vocab);
    matmul(w_.output, n_out, xn_.data(), head_out_.data());
    for (size_t done = 0; const step_segment& g : segs) {
        if (!g.logits) continue;
        const size_t n = g.all_logits ? static_cast<size_t>(g.n_tok) : 1;
        std::memcpy(g.logits, head_out_.data() + done * n_vocab, n * n_vocab * sizeof(float));
        done += n;
    }
}

void forward_pass::moe(const layer_weights& l, arenas::moe_runner& runner, const std::vector<arenas::moe_layer>& layers,
                       int pool_layer, uint64_t* counts, int n_tok) {
    moe_ffn_->experts(l, runner, layers, pool_layer, counts, n_tok);
}

void forward_pass::shared_expert(const layer_weights& l, int n_tok) { moe_ffn_->shared_expert(l, n_tok); }

}  // namespace strata::engine
