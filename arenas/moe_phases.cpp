#include "moe_phases.hpp"

#include <algorithm>
#include <cstring>

namespace strata::arenas {

namespace cpu = kernels::cpu;

namespace {

// Slice-local activation rows for one weight type: [n_rows][row_bytes].
struct act_buffer {
    formats::ggml_type weight_type{};
    size_t row_bytes = 0;
    std::vector<uint8_t> data;

    void reset(formats::ggml_type type, int64_t n_cols, int64_t n_rows) {
        weight_type = type;
        row_bytes = cpu::activation_row_size(type, n_cols);
        const size_t need = row_bytes * static_cast<size_t>(n_rows);
        if (data.size() < need) data.resize(need);
    }
    uint8_t* row(int64_t i) { return data.data() + static_cast<size_t>(i) * row_bytes; }
};

// Runs W rows [0, n) of `m` over the activation rows of `slots` (gathered into a contiguous batch of
// at most max_matvec_tokens) and hands each result row to `emit(slot, y)`.
template <class Emit>
void for_slots(const cpu::matrix& m, int64_t n, act_buffer& act, const std::vector<int32_t>& slots,
               std::vector<uint8_t>& gather, std::vector<float>& y, Emit emit) {
    const int max_tok = cpu::max_matvec_tokens;
    if (gather.size() < act.row_bytes * max_tok) gather.resize(act.row_bytes * max_tok);
    if (y.size() < static_cast<size_t>(n * max_tok)) y.resize(static_cast<size_t>(n * max_tok));
    for (size_t first = 0; first < slots.size(); first += max_tok) {
        const int n_tok = static_cast<int>(std::min<size_t>(max_tok, slots.size() - first));
        for (int i = 0; i < n_tok; ++i)
            std::memcpy(gather.data() + static_cast<size_t>(i) * act.row_bytes, act.row(slots[first + i]),
                        act.row_bytes);
        cpu::matvec_multi(m, 0, n, gather.data(), act.row_bytes, n_tok, y.data(), n);
        for (int i = 0; i < n_tok; ++i) emit(slots[first + i], y.data() + static_cast<size_t>(i) * n);
    }
}

}  // namespace

std::vector<row_range> split_rows(const pool_plan& plan, int64_t n_rows, int64_t align) {
    std::vector<row_range> out;
    const int64_t total = std::max(1, plan.total_threads());
    const int64_t n_align = (n_rows + align - 1) / align;
    int64_t threads_before = 0;
    for (const auto& s : plan.slices) {
        const int64_t begin = std::min(n_rows, n_align * threads_before / total * align);
        threads_before += s.threads();
        const int64_t end = std::min(n_rows, n_align * threads_before / total * align);
        out.push_back({begin, end});
    }
    out.back().end = n_rows;
    return out;
}

kernels::cpu::matrix mapped_expert_rows::rows(int layer, expert_part part, int expert, int, int64_t begin) const {
    const expert_tensor& t = layers_[static_cast<size_t>(layer)].part(part);
    cpu::matrix m = t.expert(expert);
    m.data = static_cast<const uint8_t*>(m.data) + static_cast<size_t>(begin) * t.row_stride;
    return m;
}

struct moe_runner::slice_buffers {
    act_buffer x_gate, x_up;   // x quantized for gate and up, per slot: [n_tok * k]
    act_buffer h;              // h quantized for down, per slot
};

moe_runner::moe_runner(expert_pool& pool, moe_shape shape, const std::vector<moe_layer>& layers,
                       const expert_rows& rows)
    : pool_(pool), shape_(shape), layers_(layers), rows_(rows) {
    ff_ranges_ = split_rows(pool.plan(), shape.n_ff, row_block);
    embd_ranges_ = split_rows(pool.plan(), shape.n_embd, row_block);
    for (int s = 0; s < pool.n_slices(); ++s) slices_.push_back(std::make_unique<slice_buffers>());
    slots_of_.resize(static_cast<size_t>(shape.n_expert));
}

moe_runner::~moe_runner() = default;

void moe_runner::prepare(int layer, int n_tok, const int32_t* ids) {
    const int k = shape_.n_expert_used;
    const moe_layer& l = layers_[static_cast<size_t>(layer)];
    // NOTE: the buffers are allocated (and first touched) by the host thread; the expert store is what
    // places the weights, which are nearly all of the bytes a phase reads.
    for (auto& b : slices_) {
        b->x_gate.reset(l.gate.type, shape_.n_embd, int64_t{n_tok} * k);
        b->x_up.reset(l.up.type, shape_.n_embd, int64_t{n_tok} * k);
        b->h.reset(l.down.type, shape_.n_ff, int64_t{n_tok} * k);
    }
    for (auto& t : slots_of_) t.clear();
    for (int slot = 0; slot < n_tok * k; ++slot) {
        const int32_t e = ids[slot];
        if (e >= 0) slots_of_[static_cast<size_t>(e)].push_back(slot);
    }
    active_.clear();
    for (int e = 0; e < shape_.n_expert; ++e)
        if (!slots_of_[static_cast<size_t>(e)].empty()) active_.push_back(e);
    h_.resize(static_cast<size_t>(n_tok) * k * shape_.n_ff);
    y_.resize(static_cast<size_t>(n_tok) * k * shape_.n_embd);
}

void moe_runner::run(int layer, int n_tok, const float* x, const int32_t* ids, const float* weights, float* out) {
    const int k = shape_.n_expert_used;
    const int n_slots = n_tok * k;
    const int64_t n_embd = shape_.n_embd, n_ff = shape_.n_ff;
    const moe_layer& l = layers_[static_cast<size_t>(layer)];
    prepare(layer, n_tok, ids);
    std::fill(out, out + n_tok * n_embd, 0.0f);
    if (active_.empty()) return;
    const size_t n_slices = slices_.size();

    // Phase 0: every slice quantizes x for its own gate/up rows (slots share their token's row).
    std::vector<size_t> n_items(n_slices, static_cast<size_t>(n_slots));
    pool_.run_phase(n_items, [&](int s, size_t begin, size_t end) {
        slice_buffers& b = *slices_[static_cast<size_t>(s)];
        for (size_t slot = begin; slot < end; ++slot) {
            if (ids[slot] < 0) continue;
            const float* xt = x + static_cast<size_t>(slot / k) * n_embd;
            cpu::quantize_activation(l.gate.type, xt, b.x_gate.row(static_cast<int64_t>(slot)), n_embd);
            if (l.up.type != l.gate.type)
                cpu::quantize_activation(l.up.type, xt, b.x_up.row(static_cast<int64_t>(slot)), n_embd);
        }
    });
    // Phase 1: items are (active expert, block of the slice's n_ff rows).
    std::vector<size_t> ff_blocks(n_slices);
    for (size_t s = 0; s < n_slices; ++s) {
        const int64_t rows = ff_ranges_[s].end - ff_ranges_[s].begin;
        ff_blocks[s] = static_cast<size_t>((rows + row_block - 1) / row_block);
        n_items[s] = ff_blocks[s] * active_.size();
    }
    pool_.run_phase(n_items, [&](int s, size_t begin, size_t end) {
        slice_buffers& b = *slices_[static_cast<size_t>(s)];
        act_buffer& x_up = l.up.type != l.gate.type ? b.x_up : b.x_gate;
        std::vector<uint8_t> gather;
        std::vector<float> g, u;
        std::vector<float> gate_rows;
        for (size_t item = begin; item < end; ++item) {
            const int e = active_[item / ff_blocks[static_cast<size_t>(s)]];
            const int64_t r0 = ff_ranges_[static_cast<size_t>(s)].begin +
                               static_cast<int64_t>(item % ff_blocks[static_cast<size_t>(s)]) * row_block;
            const int64_t n = std::min(row_block, ff_ranges_[static_cast<size_t>(s)].end - r0);
            const auto& slots = slots_of_[static_cast<size_t>(e)];
            gate_rows.resize(slots.size() * static_cast<size_t>(n));
            size_t i = 0;
            for_slots(rows_.rows(layer, expert_part::gate, e, s, r0), n, b.x_gate, slots, gather, g, [&](int32_t, const float* y) {
                std::memcpy(gate_rows.data() + (i++) * static_cast<size_t>(n), y, sizeof(float) * n);
            });
            i = 0;
            for_slots(rows_.rows(layer, expert_part::up, e, s, r0), n, x_up, slots, gather, u, [&](int32_t slot, const float* y) {
                float* h = h_.data() + static_cast<size_t>(slot) * n_ff + r0;
                cpu::silu_mul(gate_rows.data() + (i++) * static_cast<size_t>(n), y, n, h);
            });
        }
    });

    // Phase 1b: every slice quantizes all of h for its own down rows.
    for (size_t s = 0; s < n_slices; ++s) n_items[s] = static_cast<size_t>(n_slots);
    pool_.run_phase(n_items, [&](int s, size_t begin, size_t end) {
        slice_buffers& b = *slices_[static_cast<size_t>(s)];
        for (size_t slot = begin; slot < end; ++slot)
            if (ids[slot] >= 0)
                cpu::quantize_activation(l.down.type, h_.data() + slot * static_cast<size_t>(n_ff),
                                         b.h.row(static_cast<int64_t>(slot)), n_ff);
    });

    // Phase 2: items are blocks of the slice's n_embd rows; each reads those rows of every active expert,
    // then sums the experts per token in routing order.
    for (size_t s = 0; s < n_slices; ++s) {
        const int64_t rows = embd_ranges_[s].end - embd_ranges_[s].begin;
        n_items[s] = static_cast<size_t>((rows + row_block - 1) / row_block);
    }
    pool_.run_phase(n_items, [&](int s, size_t begin, size_t end) {
        slice_buffers& b = *slices_[static_cast<size_t>(s)];
        std::vector<uint8_t> gather;
        std::vector<float> yb;
        for (size_t item = begin; item < end; ++item) {
            const int64_t r0 = embd_ranges_[static_cast<size_t>(s)].begin + static_cast<int64_t>(item) * row_block;
            const int64_t n = std::min(row_block, embd_ranges_[static_cast<size_t>(s)].end - r0);
            for (int e : active_)
                for_slots(rows_.rows(layer, expert_part::down, e, s, r0), n, b.h, slots_of_[static_cast<size_t>(e)], gather, yb,
                          [&](int32_t slot, const float* y) {
                              std::memcpy(y_.data() + static_cast<size_t>(slot) * n_embd + r0, y, sizeof(float) * n);
                          });
            for (int t = 0; t < n_tok; ++t) {
                float* o = out + static_cast<size_t>(t) * n_embd + r0;
                for (int j = 0; j < k; ++j) {
                    const int slot = t * k + j;
                    if (ids[slot] < 0) continue;
                    const float w = weights[slot];
                    const float* y = y_.data() + static_cast<size_t>(slot) * n_embd + r0;
                    for (int64_t r = 0; r < n; ++r) o[r] += w * y[r];
                }
            }
        }
    });
}

}  // namespace strata::arenas
