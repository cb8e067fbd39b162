#include "gpu/stream_manager.hpp"

#include <algorithm>
#include <cstring>

#include "cuda_kernels.hpp"

namespace strata::engine::gpu {

namespace cu = kernels::cuda;
using clock_type = std::chrono::steady_clock;

stream_manager::stream_manager(const hparams& hp, const dev_model& dense, const std::vector<arenas::moe_layer>& layers,
                               arenas::moe_runner& cpu_experts, expert_cache& cache, const slot_layout& layout,
                               const uint8_t* slots, int max_tok, routing_counts& routing,
                               const arenas::hot_node* hot)
    : hp_(hp),
      dense_(dense),
      layers_(layers),
      cpu_(cpu_experts),
      cache_(cache),
      layout_(layout),
      slots_(slots),
      routing_(routing),
      max_tok_(max_tok),
      events_(static_cast<size_t>(hp.n_layer)) {
    const size_t t = static_cast<size_t>(max_tok), k = static_cast<size_t>(hp.n_expert_used);
    const size_t n_embd = static_cast<size_t>(hp.n_embd), n_ff = static_cast<size_t>(hp.n_ff_exp);
    const size_t n_sh = static_cast<size_t>(std::max(hp.n_ff_shexp, 1)), jobs = t * k;
    logits_ = device_buffer<float>(t * static_cast<size_t>(hp.n_expert));
    ids_ = device_buffer<int32_t>(t * k);
    weights_ = device_buffer<float>(t * k);
    jobs_ = device_buffer<cu::matvec_gather_job>(3 * jobs);
    token_jobs_ = device_buffer<cu::matvec_job>(3 * jobs);
    job_weight_ = device_buffer<float>(jobs);
    job_begin_ = device_buffer<int32_t>(t + 1);
    gate_ = device_buffer<float>(jobs * n_ff);
    up_ = device_buffer<float>(jobs * n_ff);
    y_ = device_buffer<float>(jobs * n_embd);
    gpu_out_ = device_buffer<float>(t * n_embd);
    cpu_out_ = device_buffer<float>(t * n_embd);
    if (hp.n_ff_shexp > 0) {
        sh_gate_ = device_buffer<float>(t * n_sh);
        sh_up_ = device_buffer<float>(t * n_sh);
        sh_out_ = device_buffer<float>(t * n_embd);
        sh_g_ = device_buffer<float>(t);
    }
    staging_ = host_arrays()
                   .add(h_xn_, t * n_embd)
                   .add(h_ids_, t * k)
                   .add(h_weights_, t * k)
                   .add(h_complement_, t * k)
                   .add(h_cpu_out_, t * n_embd)
                   .add(h_jobs_, 3 * jobs)
                   .add(h_token_jobs_, 3 * jobs)
                   .add(h_job_weight_, jobs)
                   .add(h_job_begin_, t + 1)
                   .allocate(hot, "GPU MoE staging (pinned)");
}

void stream_manager::moe_layer(int il, int n_tok, const float* xn, float* x, bool timed) {
    const size_t li = static_cast<size_t>(il);
    // The experts' own index (the cache's, the slots', the CPU pool's): the MoE layers after the dense ones.
    const int ml = il - hp_.n_layer_dense_lead;
    const size_t mi = static_cast<size_t>(ml);
    const int k = hp_.n_expert_used, n_expert = hp_.n_expert;
    const int64_t n_embd = hp_.n_embd, n_ff = hp_.n_ff_exp;
    const size_t nt = static_cast<size_t>(n_tok), nk = nt * static_cast<size_t>(k);
    const dev_layer& dl = dense_.layers[li];
    layer_events& ev = events_[li];
    ev.used = timed;

    // 1. Router on the GPU.
    cu::matvec(dl.router.view(), xn, n_embd, n_tok, logits_.data(), n_expert, compute_.raw());
    cu::route_params rp;
    rp.sigmoid = hp_.gating == gating_func::sigmoid;
    rp.bias = dl.exp_probs_b.size() ? dl.exp_probs_b.data() : nullptr;
    rp.normalize = hp_.expert_weights_norm;
    rp.scale = hp_.expert_weights_scale;
    rp.n_group = hp_.n_expert_groups;
    rp.n_group_used = hp_.n_group_used;
    cu::route_topk(logits_.data(), n_tok, n_expert, k, rp, ids_.data(), weights_.data(), compute_.raw());
    ev.routed.record(compute_);

    // 2. Normed activation and routing to pinned host memory.
    check(cudaStreamWaitEvent(copy_, ev.routed, 0), "cudaStreamWaitEvent");
    ev.d2h_start.record(copy_);
    copy_to_host(h_xn_.data(), xn, nt * static_cast<size_t>(n_embd), copy_);
    copy_to_host(h_ids_.data(), ids_.data(), nk, copy_);
    copy_to_host(h_weights_.data(), weights_.data(), nk, copy_);
    ev.d2h_done.record(copy_);
    ev.d2h_done.synchronize();

    // 3. Split into resident experts (GPU jobs) and the complement (CPU pool).
    uint64_t* counts = routing_.counts.data() + li * static_cast<size_t>(n_expert);
    for (size_t i = 0; i < nk; ++i) ++counts[h_ids_.data()[i]];
    if (jobs_in_flight_) jobs_copied_.synchronize();  // the previous layer's job arrays have been read
    cache_.split(ml, n_tok, k, h_ids_.data(), h_weights_.data(), h_complement_.data(), resident_);
    const int n_jobs = static_cast<int>(resident_.size());
    if (timed) {  // the decode token's own lookups (a prompt batch before it is not timed)
        hits_ += n_jobs;
        lookups_ += static_cast<int>(nk);
    }
    const size_t slot_bytes = layout_.slot_bytes, nj = resident_.size();
    std::fill(h_job_begin_.data(), h_job_begin_.data() + nt + 1, 0);
    for (size_t j = 0; j < nj; ++j) {
        h_job_weight_.data()[j] = resident_[j].weight;
        ++h_job_begin_.data()[resident_[j].token + 1];
    }
    for (size_t t = 0; t < nt; ++t) h_job_begin_.data()[t + 1] += h_job_begin_.data()[t];
    // One gathered job per expert and up to kGatherTokens of its tokens, so a batch reads an expert once
    // per kGatherTokens tokens; output rows stay in resident_ order (token-major) for weighted_sum. A
    // one-token step (decode) needs no grouping: each expert serves that token alone.
    groups_.clear();
    if (nt > 1) {
        by_slot_.resize(nj);
        for (size_t j = 0; j < nj; ++j) by_slot_[j] = static_cast<uint32_t>(j);
        std::stable_sort(by_slot_.begin(), by_slot_.end(),
                         [&](uint32_t a, uint32_t b) { return resident_[a].slot < resident_[b].slot; });
        for (uint32_t a = 0; a < nj;) {
            uint32_t b = a + 1;
            while (b < nj && b - a < cu::kGatherTokens && resident_[by_slot_[b]].slot == resident_[by_slot_[a]].slot)
                ++b;
            groups_.emplace_back(a, b);
            a = b;
        }
    }
    const size_t ng = nt > 1 ? groups_.size() : nj;
    // Every expert serving one token: one-token jobs, a quarter of the bytes to copy.
    const bool one_token = ng == nj;
    for (size_t g = 0; g < ng && !one_token; ++g) {
        const auto [a, b] = groups_[g];
        const uint8_t* slot = slots_ + static_cast<size_t>(resident_[by_slot_[a]].slot) * slot_bytes;
        const int32_t n = static_cast<int32_t>(b - a);
        cu::matvec_gather_job& gate = h_jobs_.data()[g] = {slot + layout_.gate[mi], xn, gate_.data(), {}, {}, n};
        cu::matvec_gather_job& up = h_jobs_.data()[ng + g] = {slot + layout_.up[mi], xn, up_.data(), {}, {}, n};
        cu::matvec_gather_job& down = h_jobs_.data()[2 * ng + g] = {slot + layout_.down[mi], gate_.data(), y_.data(),
                                                                     {}, {}, n};
        for (int32_t i = 0; i < n; ++i) {
            const uint32_t j = by_slot_[a + static_cast<uint32_t>(i)];
            gate.x_row[i] = up.x_row[i] = resident_[j].token;
            gate.y_row[i] = up.y_row[i] = down.x_row[i] = down.y_row[i] = static_cast<int32_t>(j);
        }
    }
    for (size_t j = 0; j < nj && one_token; ++j) {
        const resident_job& r = resident_[j];
        const uint8_t* slot = slots_ + static_cast<size_t>(r.slot) * slot_bytes;
        const float* xt = xn + static_cast<size_t>(r.token) * static_cast<size_t>(n_embd);
        float* g = gate_.data() + j * static_cast<size_t>(n_ff);
        h_token_jobs_.data()[j] = {slot + layout_.gate[mi], xt, g};
        h_token_jobs_.data()[nj + j] = {slot + layout_.up[mi], xt, up_.data() + j * static_cast<size_t>(n_ff)};
        h_token_jobs_.data()[2 * nj + j] = {slot + layout_.down[mi], g, y_.data() + j * static_cast<size_t>(n_embd)};
    }

    // 4. Resident experts and the shared expert on the expert stream.
    check(cudaStreamWaitEvent(experts_, ev.routed, 0), "cudaStreamWaitEvent");
    ev.gpu_start.record(experts_);
    if (n_jobs > 0) {
        const arenas::moe_layer& el = layers_[mi];
        if (one_token)
            copy_to_device(token_jobs_.data(), h_token_jobs_.data(), 3 * nj, experts_);
        else
            copy_to_device(jobs_.data(), h_jobs_.data(), 3 * ng, experts_);
        copy_to_device(job_weight_.data(), h_job_weight_.data(), nj, experts_);
        copy_to_device(job_begin_.data(), h_job_begin_.data(), nt + 1, experts_);
        jobs_copied_.record(experts_);
        jobs_in_flight_ = true;
        const int g = static_cast<int>(ng);
        void* es = experts_.raw();
        if (one_token) {
            const cu::matvec_job* tj = token_jobs_.data();
            cu::matvec_batched(el.gate.type, n_ff, n_embd, layout_.gate_stride[mi], tj, n_jobs, es);
            cu::matvec_batched(el.up.type, n_ff, n_embd, layout_.up_stride[mi], tj + nj, n_jobs, es);
        } else if (el.gate.type == el.up.type && layout_.gate_stride[mi] == layout_.up_stride[mi]) {  // one launch
            cu::matvec_gathered(el.gate.type, n_ff, n_embd, layout_.gate_stride[mi], n_embd, n_ff, jobs_.data(), 2 * g, es);
        } else {
            cu::matvec_gathered(el.gate.type, n_ff, n_embd, layout_.gate_stride[mi], n_embd, n_ff, jobs_.data(), g, es);
            cu::matvec_gathered(el.up.type, n_ff, n_embd, layout_.up_stride[mi], n_embd, n_ff, jobs_.data() + ng, g, es);
        }
        cu::silu_mul(gate_.data(), up_.data(), static_cast<int64_t>(nj) * n_ff, gate_.data(), es);
        if (one_token)
            cu::matvec_batched(el.down.type, n_embd, n_ff, layout_.down_stride[mi], token_jobs_.data() + 2 * nj, n_jobs,
                               es);
        else
            cu::matvec_gathered(el.down.type, n_embd, n_ff, layout_.down_stride[mi], n_ff, n_embd, jobs_.data() + 2 * ng,
                                g, es);
        cu::weighted_sum(y_.data(), job_weight_.data(), job_begin_.data(), n_tok, n_embd, gpu_out_.data(),
                         experts_.raw());
    } else {
        check(cudaMemsetAsync(gpu_out_.data(), 0, nt * static_cast<size_t>(n_embd) * sizeof(float), experts_),
              "cudaMemsetAsync");
    }
    if (dl.shexp_gate.present()) shared_expert(il, n_tok, xn);
    ev.gpu_done.record(experts_);

    // 5. The complement on the CPU pool meanwhile, then its partial sum to VRAM.
    const auto t0 = clock_type::now();
    const bool any_cpu = std::any_of(h_complement_.data(), h_complement_.data() + nk, [](int32_t e) { return e >= 0; });
    if (any_cpu) cpu_.run(ml, n_tok, h_xn_.data(), h_complement_.data(), h_weights_.data(), h_cpu_out_.data());
    ev.cpu_ms = std::chrono::duration<double, std::milli>(clock_type::now() - t0).count();
    ev.h2d_start.record(copy_);
    if (any_cpu) copy_to_device(cpu_out_.data(), h_cpu_out_.data(), nt * static_cast<size_t>(n_embd), copy_);
    ev.h2d_done.record(copy_);

    // 6. Both shares into the residual stream.
    check(cudaStreamWaitEvent(compute_, ev.gpu_done, 0), "cudaStreamWaitEvent");
    check(cudaStreamWaitEvent(compute_, ev.h2d_done, 0), "cudaStreamWaitEvent");
    const int64_t n = int64_t{n_tok} * n_embd;
    cu::add(x, gpu_out_.data(), n, compute_.raw());
    if (any_cpu) cu::add(x, cpu_out_.data(), n, compute_.raw());
}

// out = down(silu(shexp_gate xn) * shexp_up xn), times sigmoid(gate_inp . xn) where the layer has that
// gate (qwen2moe; glm4moe's shared expert is ungated), added to gpu_out.
void stream_manager::shared_expert(int il, int n_tok, const float* xn) {
    const dev_layer& dl = dense_.layers[static_cast<size_t>(il)];
    const int64_t n_embd = hp_.n_embd, n_sh = hp_.n_ff_shexp, n = int64_t{n_tok} * n_embd;
    void* s = experts_.raw();
    cu::matvec(dl.shexp_gate.view(), xn, n_embd, n_tok, sh_gate_.data(), n_sh, s);
    cu::matvec(dl.shexp_up.view(), xn, n_embd, n_tok, sh_up_.data(), n_sh, s);
    cu::silu_mul(sh_gate_.data(), sh_up_.data(), int64_t{n_tok} * n_sh, sh_gate_.data(), s);
    cu::matvec(dl.shexp_down.view(), sh_gate_.data(), n_sh, n_tok, sh_out_.data(), n_embd, s);
    if (dl.shexp_gate_inp.size()) {
        const cu::weight_view gate_inp{formats::ggml_type::F32, dl.shexp_gate_inp.data(), 1, n_embd,
                                       static_cast<size_t>(n_embd) * sizeof(float)};
        cu::matvec(gate_inp, xn, n_embd, n_tok, sh_g_.data(), 1, s);
        cu::scale_by_sigmoid(sh_out_.data(), sh_g_.data(), n_embd, n_tok, s);
    }
    cu::add(gpu_out_.data(), sh_out_.data(), n, s);
}

token_timing stream_manager::collect_timing() {
    token_timing t;
    for (layer_events& ev : events_) {
        if (!ev.used) continue;
        t.gpu_experts_ms += ev.gpu_done.ms_since(ev.gpu_start);
        t.copy_ms += ev.d2h_done.ms_since(ev.d2h_start) + ev.h2d_done.ms_since(ev.h2d_start);
        t.gpu_wait_ms += std::max(0.0f, ev.h2d_done.ms_since(ev.gpu_done));
        t.cpu_complement_ms += ev.cpu_ms;
        ev.used = false;
    }
    t.hits = hits_;
    t.lookups = lookups_;
    hits_ = lookups_ = 0;
    return t;
}

}  // namespace strata::engine::gpu
