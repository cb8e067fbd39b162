// Routed experts on the CPU expert pool, in two phases per MoE layer (docs/ARCHITECTURE.md):
//   phase 1: h[t,j] = silu(gate_e x_t) * (up_e x_t), each slice over its own rows of n_ff;
//   phase 2: out[t] = sum_j w[t,j] * down_e h[t,j], each slice over its own rows of n_embd,
//            experts summed in routing order per row.
// No partial sum crosses a slice, so the result is bitwise identical for any slicing, worker count
// or timing. Activations (x, then h) are quantized once per slice into that slice's own buffers. Steps
// that are a token's worth of work (quantizing x or h, the weighted sum) run on the host alone.
//
// Thread-safety: run() is called by the pool's host thread, one call at a time.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "cpu/kernels.hpp"
#include "expert_pool.hpp"

namespace strata::arenas {

// One expert matrix kind (gate, up or down) of one layer: n_expert matrices of n_rows x n_cols of
// one type; experts[e] points at expert e's first row (a 3-D tensor or one tensor per expert).
struct expert_tensor {
    std::string name;
    formats::ggml_type type{};
    int64_t n_cols = 0;
    int64_t n_rows = 0;
    size_t row_stride = 0;
    std::vector<const uint8_t*> experts;

    kernels::cpu::matrix expert(int e) const { return {type, experts[static_cast<size_t>(e)], n_cols, row_stride}; }
};

enum class expert_part { gate = 0, up = 1, down = 2 };

struct moe_layer {
    expert_tensor gate;  // [n_ff x n_embd] per expert
    expert_tensor up;    // [n_ff x n_embd]
    expert_tensor down;  // [n_embd x n_ff]

    const expert_tensor& part(expert_part p) const { return p == expert_part::gate ? gate : p == expert_part::up ? up : down; }
};

struct moe_shape {
    int n_embd = 0;
    int n_ff = 0;
    int n_expert = 0;
    int n_expert_used = 0;
};

// Adds the wall time of its scope to *seconds; with seconds null it reads no clock.
class scoped_seconds {
public:
    explicit scoped_seconds(double* seconds) : seconds_(seconds) {
        if (seconds_) t0_ = std::chrono::steady_clock::now();
    }
    ~scoped_seconds() {
        if (seconds_) *seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
    }
    scoped_seconds(const scoped_seconds&) = delete;
    scoped_seconds& operator=(const scoped_seconds&) = delete;

private:
    double* seconds_;
    std::chrono::steady_clock::time_point t0_;
};

struct row_range {
    int64_t begin = 0;
    int64_t end = 0;
};

// Cuts [0, n_rows) into one contiguous range per slice of the plan, proportional to each slice's
// threads, every boundary but the last a multiple of `align`.
std::vector<row_range> split_rows(const pool_plan& plan, int64_t n_rows, int64_t align = 1);
// The same into `out` (its capacity reused: no allocation once it has held as many slices).
void split_rows(const pool_plan& plan, int64_t n_rows, int64_t align, std::vector<row_range>& out);

// Where a slice finds its rows of an expert matrix. The default reads the model's tensors in place;
// the expert store substitutes copies placed in each slice's NUMA node.
class expert_rows {
public:
    virtual ~expert_rows() = default;
    // Rows [begin, ...) of `part` of expert e in `layer`, as seen by `slice`: a matrix whose row 0 is
    // row `begin`. begin lies in the slice's own range.
    virtual kernels::cpu::matrix rows(int layer, expert_part part, int expert, int slice, int64_t begin) const = 0;
};

// Copies every row of `part` of `expert` in `layer` to dst (row r at dst + r * dst_stride, the first
// dst_stride bytes of each row), slice by slice through `rows` over `plan`'s row ranges: from the
// expert store's copies when `rows` is one, so the model file is not read again.
void gather_expert(const expert_rows& rows, const pool_plan& plan, const moe_shape& shape, int layer, expert_part part,
                   int expert, std::uint8_t* dst, std::size_t dst_stride);

class mapped_expert_rows final : public expert_rows {
public:
    explicit mapped_expert_rows(const std::vector<moe_layer>& layers) : layers_(layers) {}
    kernels::cpu::matrix rows(int layer, expert_part part, int expert, int slice, int64_t begin) const override;

private:
    const std::vector<moe_layer>& layers_;
};

class moe_runner {
public:
    static constexpr int64_t row_block = 32;  // rows per work item; slice boundaries are multiples of it

    moe_runner(expert_pool& pool, moe_shape shape, const std::vector<moe_layer>& layers, const expert_rows& rows);
    ~moe_runner();

    // x: [n_tok][n_embd]; ids, weights: [n_tok][n_expert_used] (ids < 0 are skipped: computed
    // elsewhere, e.g. by experts resident on the GPU); out: [n_tok][n_embd], overwritten (zero for a
    // token whose slots are all skipped). Throws std::out_of_range naming the token and id when an id
    // is >= n_expert, and rethrows what a phase threw.
    void run(int layer, int n_tok, const float* x, const int32_t* ids, const float* weights, float* out);

    // While set: run() adds the wall seconds of its quantize phases (x and h) to seconds[0], of gate/up
    // to seconds[1] and of down to seconds[2]. nullptr: no clock reads.
    void set_phase_seconds(double* seconds) { phase_seconds_ = seconds; }
    // Experts the last run() computed (with at least one slot).
    size_t n_active() const { return active_.size(); }

    const std::vector<row_range>& ff_ranges() const { return ff_ranges_; }
    const std::vector<row_range>& embd_ranges() const { return embd_ranges_; }

private:
    struct slice_buffers;
    void prepare(int layer, int n_tok, const int32_t* ids);
    // fn over n_items[s] items of `cols` elements per slice: a pool phase, or the calling thread alone
    // when the whole is small.
    void run_small(std::span<const size_t> n_items, int64_t cols, const expert_pool::phase_fn& fn);

    expert_pool& pool_;
    moe_shape shape_;
    const std::vector<moe_layer>& layers_;
    const expert_rows& rows_;
    std::vector<row_range> ff_ranges_;    // per slice: its rows of gate/up
    std::vector<row_range> embd_ranges_;  // per slice: its rows of down
    std::vector<std::unique_ptr<slice_buffers>> slices_;

    // The current call's routing in expert order. A "position" is one routed (token, expert) slot;
    // positions of one expert are consecutive (ascending slot), experts ascending, so each expert's
    // activations are one contiguous batch for matvec_multi.
    std::vector<int32_t> count_of_;     // [n_expert] slots routed to each expert
    std::vector<int32_t> first_of_;     // [n_expert] first position of each expert
    std::vector<int32_t> active_;       // experts with at least one slot, ascending
    std::vector<int32_t> pos_of_slot_;  // [n_tok * n_expert_used] position, -1 for a skipped slot
    std::vector<size_t> n_items_;       // [n_slices] a phase's items per slice (scratch)
    // Row blocks per gate/up or down work item at most: where some expert has more tokens than one
    // kernel pass takes, each pass re-reads the item's rows from cache, so they must fit in L2; where
    // every expert's tokens fit one pass (decode), each row is read once, and longer items start fewer
    // streams (each start waits on memory until the kernel's prefetch is that far ahead).
    static constexpr int64_t kMaxFfBlocks = 4;
    static constexpr int64_t kMaxFfBlocksOnePass = 12;
    std::vector<int64_t> ff_block_rows_;  // [n_slices] rows per work item of the phase running (scratch)
    std::vector<size_t> row_blocks_;     // [n_slices] row blocks of each slice's gate/up, then down rows (scratch)
    int32_t n_pos_ = 0;
    std::vector<float> h_;              // [n_pos][n_ff] silu(gate x) * up x
    std::vector<float> y_;              // [n_pos][n_embd] down h, before the routing weights
    double* phase_seconds_ = nullptr;
};

}  // namespace strata::arenas
