// Internal to the CUDA backend: the model's dense weights in VRAM, the expert slots, the copier that
// fills them from the mapped file through pinned staging, and the dense matmul (matvec kernels for a
// few tokens, dequantise-to-f16 + cuBLAS for prompt batches).
#pragma once

#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <span>
#include <thread>
#include <vector>

#include "cuda_kernels.hpp"
#include "gpu/cuda_raii.hpp"
#include "gpu/expert_cache.hpp"
#include "gpu/host_pool.hpp"
#include "hot_node.hpp"
#include "model/hparams.hpp"
#include "model/weights.hpp"
#include "moe_phases.hpp"

namespace strata::engine::gpu {

struct dev_matrix {
    formats::ggml_type type{};
    device_buffer<uint8_t> data;  // [n_rows][row_stride]
    int64_t n_rows = 0, n_cols = 0;
    size_t row_stride = 0;        // = formats::row_size(type, n_cols)
    bool present() const { return data.size() != 0; }
    kernels::cuda::weight_view view() const { return {type, data.data(), n_rows, n_cols, row_stride}; }
};

struct dev_layer {
    device_buffer<float> attn_norm, ffn_norm;       // [n_embd]
    device_buffer<float> bq, bk, bv;                // [n_q], [n_kv], [n_kv] (qwen2moe, glm4moe)
    device_buffer<float> q_norm, k_norm;            // [head_dim] (qwen3moe, glm4moe)
    device_buffer<float> shexp_gate_inp;            // [n_embd] (qwen2moe)
    device_buffer<float> exp_probs_b;               // [n_expert] selection bias (glm4moe)
    dev_matrix wq, wk, wv, wo, router, shexp_gate, shexp_up, shexp_down;
    dev_matrix ffn_gate, ffn_up, ffn_down;          // a leading dense layer's FFN: [n_ff x n_embd] x2, [n_embd x n_ff]
};

struct dev_model {
    std::vector<dev_layer> layers;
    device_buffer<float> output_norm;               // [n_embd]
    dev_matrix output;                              // [n_vocab x n_embd]
    uint64_t bytes = 0;                             // everything above
};

// Throws std::invalid_argument naming the tensor and the types the CUDA kernels take when a dense
// weight's type has no kernel.
dev_model upload_dense(const hparams& hp, const model_weights& w);

// Where expert e of a layer lives inside a slot: gate, up, down back to back.
struct slot_layout {
    std::vector<size_t> gate, up, down;  // [n_layer] byte offsets
    std::vector<size_t> gate_stride, up_stride, down_stride;  // [n_layer] row bytes
    size_t slot_bytes = 0;               // the largest layer's expert
};
slot_layout layout_slots(const std::vector<arenas::moe_layer>& layers);

// expert_copier over VRAM slots: the expert's rows are gathered from the CPU pool's copy of the experts
// (the expert store, so the model file whose page cache was dropped is not read again) into one of a
// ring of pinned staging buffers (one host_pool on the hot node), then copied on the copier's own stream after the compute stream's
// last use of the slot; each copy's landing is an event. With `background` (--adapt-async 1) a worker
// thread does the gathering and queues the copy, so start() returns at once and the decode step pays
// for neither the gather nor the wait; without it start() gathers on the calling thread.
//
// Thread-safety: start(), landed() and wait() are called by one thread (the engine thread).
class slot_copier final : public expert_copier {
public:
    // `rows` over `plan`: where the CPU pool reads the experts (the expert store's copies), which the
    // gathering reads too; `rows` must outlive the copier.
    slot_copier(const std::vector<arenas::moe_layer>& layers, const arenas::expert_rows& rows, arenas::pool_plan plan,
                arenas::moe_shape shape, const slot_layout& layout, uint8_t* slots, int n_staging, bool background, const arenas::hot_node* hot);
    ~slot_copier() override;
    slot_copier(const slot_copier&) = delete;
    slot_copier& operator=(const slot_copier&) = delete;
    void set_after(cudaStream_t compute) { compute_ = compute; }
    ticket start(int slot, expert_key key) override;
    bool landed(ticket t) override;
    void wait(ticket t) override;

private:
    struct staging {
        std::span<uint8_t> host;               // [slot_bytes] in ring_
        event compute_done = event::create();  // the compute stream's point the copy waits for
        event done = event::create();          // the latest copy out of this buffer
        bool used = false;                     // done has been recorded at least once
    };
    struct job {
        ticket id;
        int slot;
        expert_key key;
        size_t staging;
    };
    void gather_and_copy(const job& j);  // waits for the buffer's previous copy, gathers, queues the copy
    void work();                         // the background worker's loop
    bool queued(ticket t);               // t's copy is on the stream

    const std::vector<arenas::moe_layer>& layers_;
    const arenas::expert_rows& rows_;
    arenas::pool_plan plan_;
    arenas::moe_shape shape_;
    const slot_layout& layout_;
    uint8_t* slots_;
    stream stream_ = stream::create();
    cudaStream_t compute_ = nullptr;
    std::vector<staging> staging_;
    host_pool ring_;             // the staging buffers' host memory
    std::deque<job> in_flight_;  // started, not yet known to have landed (engine thread only)
    size_t next_staging_ = 0;
    ticket next_ = 0;

    // Background gathering: jobs for the worker, and how many tickets it has queued on the stream.
    bool background_;
    std::mutex m_;
    std::condition_variable cv_;
    std::deque<job> todo_;
    ticket queued_ = 0;  // tickets below this are on the stream
    bool stop_ = false;
    std::exception_ptr error_;  // a failed gather or copy, rethrown by the next call
    std::thread worker_;
};

// Dense y = W x for n_tok activation rows: the matvec kernel below kGemmTokens tokens, else the
// weight dequantised to f16 into scratch and one cuBLAS GEMM (f32 accumulation).
class dense_matmul {
public:
    static constexpr int kGemmTokens = 16;
    dense_matmul(int64_t max_weight_elems, int64_t max_act_elems);
    // x: [n_tok][n_cols] f32, y: [n_tok][y_stride] f32.
    void run(const dev_matrix& w, const float* x, int n_tok, float* y, int64_t y_stride, cudaStream_t s);
    uint64_t bytes() const { return w16_.bytes() + x16_.bytes(); }

private:
    cublas blas_;
    device_buffer<uint16_t> w16_;   // [n_rows][n_cols] dequantised weight
    device_buffer<uint16_t> x16_;   // [n_tok][n_cols] activations in f16
};

}  // namespace strata::engine::gpu
