// Internal to the CUDA backend: the per-MoE-layer overlap of GPU-resident experts with the CPU
// complement (docs/ARCHITECTURE.md):
//
//   compute stream: ... ffn_norm -> router -> top-k ------------------------------ wait -> add -> ...
//   copy stream:                              \-> xn, ids, weights to pinned host      /  CPU sum to VRAM
//   host:                                        split -> jobs to VRAM -> CPU pool (complement) -/
//   expert stream:                                        resident experts + shared expert -----/
//
// The critical path per layer is max(GPU experts, copies + CPU complement); with
// STRATA_DECODE_TIMING=1 every decode token logs the four shares summed over its layers.
#pragma once

#include <chrono>
#include <span>
#include <vector>

#include "gpu/cuda_raii.hpp"
#include "gpu/expert_cache.hpp"
#include "gpu/gpu_model.hpp"
#include "gpu/host_pool.hpp"
#include "hot_node.hpp"
#include "model/forward.hpp"
#include "model/hparams.hpp"
#include "moe_phases.hpp"

namespace strata::engine::gpu {

struct token_timing {
    double gpu_experts_ms = 0;   // resident + shared experts on the expert stream
    double cpu_complement_ms = 0;
    double copy_ms = 0;          // activation/routing down, CPU partial sum up
    double gpu_wait_ms = 0;      // how long the GPU's experts were done before the CPU sum landed
    int hits = 0, lookups = 0;
};

class stream_manager {
public:
    stream_manager(const hparams& hp, const dev_model& dense, const std::vector<arenas::moe_layer>& layers,
                   arenas::moe_runner& cpu_experts, expert_cache& cache, const slot_layout& layout,
                   const uint8_t* slots, int max_tok, routing_counts& routing, const arenas::hot_node* hot);

    cudaStream_t compute() const { return compute_; }

    // MoE block of model layer `layer` (one past the leading dense layers) for xn: [n_tok][n_embd] on the device (compute stream). Routes, overlaps
    // the resident experts and shared expert with the CPU complement, and adds the result into
    // x: [n_tok][n_embd] on the compute stream. Returns once the CPU's share is enqueued.
    void moe_layer(int layer, int n_tok, const float* xn, float* x, bool timed);

    // Reads the timing events of the last token's layers (after the compute stream synchronised).
    token_timing collect_timing();

private:
    struct layer_events {
        event routed = event::create(), d2h_start = event::create(true), d2h_done = event::create(true);
        event gpu_start = event::create(true), gpu_done = event::create(true);
        event h2d_start = event::create(true), h2d_done = event::create(true);
        double cpu_ms = 0;
        bool used = false;
    };
    void shared_expert(int layer, int n_tok, const float* xn);

    const hparams& hp_;
    const dev_model& dense_;
    const std::vector<arenas::moe_layer>& layers_;
    arenas::moe_runner& cpu_;
    expert_cache& cache_;
    const slot_layout& layout_;
    const uint8_t* slots_;
    routing_counts& routing_;
    int max_tok_;

    stream compute_ = stream::create(), experts_ = stream::create(), copy_ = stream::create();
    std::vector<layer_events> events_;   // [n_layer]
    std::vector<resident_job> resident_;
    std::vector<uint32_t> by_slot_;      // resident_ indices ordered by slot, token order kept
    std::vector<std::pair<uint32_t, uint32_t>> groups_;  // [begin, end) of by_slot_ per gathered job
    event jobs_copied_ = event::create();  // the pinned job arrays may be rewritten once this is done
    bool jobs_in_flight_ = false;
    int hits_ = 0, lookups_ = 0;

    // Device buffers (shape per routed slot j of this layer's jobs, or per token).
    device_buffer<float> logits_;        // [max_tok][n_expert]
    device_buffer<int32_t> ids_;         // [max_tok][k]
    device_buffer<float> weights_;       // [max_tok][k]
    device_buffer<kernels::cuda::matvec_gather_job> jobs_;  // gate [G], up [G], down [G]; G <= J = max_tok * k
    device_buffer<kernels::cuda::matvec_job> token_jobs_;   // gate [J], up [J], down [J]: one token per expert
    device_buffer<float> job_weight_;    // [J]
    device_buffer<int32_t> job_begin_;   // [max_tok + 1]
    device_buffer<float> gate_, up_;     // [J][n_ff]
    device_buffer<float> y_;             // [J][n_embd]
    device_buffer<float> gpu_out_;       // [max_tok][n_embd] resident experts + shared expert
    device_buffer<float> cpu_out_;       // [max_tok][n_embd] the CPU's partial sum
    device_buffer<float> sh_gate_, sh_up_, sh_out_, sh_g_;  // shared expert: [max_tok][n_ff_shexp] x2, [max_tok][n_embd], [max_tok]

    // Pinned host staging: arrays of one host_pool on the hot node.
    std::span<float> h_xn_;              // [max_tok][n_embd]
    std::span<int32_t> h_ids_;           // [max_tok][k]
    std::span<float> h_weights_;         // [max_tok][k]
    std::span<int32_t> h_complement_;    // [max_tok][k], -1 where resident
    std::span<float> h_cpu_out_;         // [max_tok][n_embd]
    std::span<kernels::cuda::matvec_gather_job> h_jobs_;  // [3 J]
    std::span<kernels::cuda::matvec_job> h_token_jobs_;   // [3 J]
    std::span<float> h_job_weight_;      // [J]
    std::span<int32_t> h_job_begin_;     // [max_tok + 1]
    host_pool staging_;                  // holds the arrays above
};

}  // namespace strata::engine::gpu
