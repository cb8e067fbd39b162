#include "moe_phases.hpp"

#include <algorithm>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>

#include "aligned_vector.hpp"

namespace strata::arenas {

namespace cpu = kernels::cpu;

namespace {

// Slice-local activation rows for one weight type: [n_rows][row_bytes].
struct act_buffer {
    formats::ggml_type weight_type{};
    size_t row_bytes = 0;
    aligned_vector<uint8_t> data;

    // Bytes needed for n_rows rows of n_cols elements; grows only on the slice's own threads (first touch).
    size_t need(formats::ggml_type type, int64_t n_cols, int64_t n_rows) const {
        return cpu::activation_row_size(type, n_cols) * static_cast<size_t>(n_rows);
    }
    void reset(formats::ggml_type type, int64_t n_cols, int64_t n_rows) {
        weight_type = type;
        row_bytes = cpu::activation_row_size(type, n_cols);
        const size_t bytes = need(type, n_cols, n_rows);
        if (data.size() < bytes) data.resize(bytes);
    }
    uint8_t* row(int64_t i) { return data.data() + static_cast<size_t>(i) * row_bytes; }
};

}  // namespace

std::vector<row_range> split_rows(const pool_plan& plan, int64_t n_rows, int64_t align) {
    std::vector<row_range> out;
    split_rows(plan, n_rows, align, out);
    return out;
}

void split_rows(const pool_plan& plan, int64_t n_rows, int64_t align, std::vector<row_range>& out) {
    out.clear();
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
}

kernels::cpu::matrix mapped_expert_rows::rows(int layer, expert_part part, int expert, int, int64_t begin) const {
    const expert_tensor& t = layers_[static_cast<size_t>(layer)].part(part);
    cpu::matrix m = t.expert(expert);
    m.data = static_cast<const uint8_t*>(m.data) + static_cast<size_t>(begin) * t.row_stride;
    return m;
}

void gather_expert(const expert_rows& rows, const pool_plan& plan, const moe_shape& shape, int layer, expert_part part,
                   int expert, std::uint8_t* dst, std::size_t dst_stride) {
    const auto ranges = split_rows(plan, part == expert_part::down ? shape.n_embd : shape.n_ff, moe_runner::row_block);
    for (std::size_t s = 0; s < ranges.size(); ++s) {
        const row_range r = ranges[s];
        if (r.end <= r.begin) continue;
        const cpu::matrix m = rows.rows(layer, part, expert, static_cast<int>(s), r.begin);
        const auto* src = static_cast<const std::uint8_t*>(m.data);
        if (m.layout == cpu::weight_layout::rows16) {  // the store keeps these rows repacked
            cpu::unpack_rows(m.type, src, r.end - r.begin, m.n_cols, dst + static_cast<std::size_t>(r.begin) * dst_stride, dst_stride);
            continue;
        }
        for (int64_t row = r.begin; row < r.end; ++row)
            std::memcpy(dst + static_cast<std::size_t>(row) * dst_stride,
                        src + static_cast<std::size_t>(row - r.begin) * m.row_stride, dst_stride);
    }
}

struct moe_runner::slice_buffers {
    act_buffer x_gate, x_up;  // x quantized for gate and for up, per position: [n_pos]
    act_buffer h;             // h quantized for down, per position: [n_pos]
};

moe_runner::moe_runner(expert_pool& pool, moe_shape shape, const std::vector<moe_layer>& layers,
                       const expert_rows& rows)
    : pool_(pool), shape_(shape), layers_(layers), rows_(rows) {
    ff_ranges_ = split_rows(pool.plan(), shape.n_ff, row_block);
    embd_ranges_ = split_rows(pool.plan(), shape.n_embd, row_block);
    for (int s = 0; s < pool.n_slices(); ++s) slices_.push_back(std::make_unique<slice_buffers>());
    count_of_.resize(static_cast<size_t>(shape.n_expert));
    first_of_.resize(static_cast<size_t>(shape.n_expert));
}

moe_runner::~moe_runner() = default;

void moe_runner::prepare(int layer, int n_tok, const int32_t* ids) {
    const int k = shape_.n_expert_used;
    const int n_slots = n_tok * k;
    std::fill(count_of_.begin(), count_of_.end(), 0);
    for (int slot = 0; slot < n_slots; ++slot) {
        const int32_t e = ids[slot];
        if (e >= shape_.n_expert)
            throw std::out_of_range("moe_runner: token " + std::to_string(slot / k) + " routes slot " + std::to_string(slot % k) +
                                    " to expert " + std::to_string(e) + ", the layer has " +
                                    std::to_string(shape_.n_expert) + " experts");
        if (e >= 0) ++count_of_[static_cast<size_t>(e)];
    }
    active_.clear();
    n_pos_ = 0;
    for (int e = 0; e < shape_.n_expert; ++e) {
        first_of_[static_cast<size_t>(e)] = n_pos_;
        n_pos_ += count_of_[static_cast<size_t>(e)];
        if (count_of_[static_cast<size_t>(e)] > 0) active_.push_back(e);
    }
    pos_of_slot_.resize(static_cast<size_t>(n_slots));
    std::vector<int32_t>& next = count_of_;  // reused as the next free position per expert
    for (int e = 0; e < shape_.n_expert; ++e) next[static_cast<size_t>(e)] = first_of_[static_cast<size_t>(e)];
    for (int slot = 0; slot < n_slots; ++slot)
        pos_of_slot_[static_cast<size_t>(slot)] = ids[slot] >= 0 ? next[static_cast<size_t>(ids[slot])]++ : -1;
    for (int e = 0; e < shape_.n_expert; ++e) next[static_cast<size_t>(e)] -= first_of_[static_cast<size_t>(e)];  // counts again

    // Only ever grown: a resize down for a decode step would zero-fill them again at the next prompt.
    grown(h_, static_cast<size_t>(n_pos_) * shape_.n_ff);
    grown(y_, static_cast<size_t>(n_pos_) * shape_.n_embd);
    // Slice buffers grow on the slice's own threads, so their pages are first touched in the slice's
    // node; this costs a phase only when a batch is larger than any before.
    const moe_layer& l = layers_[static_cast<size_t>(layer)];
    bool grow = false;
    for (auto& b : slices_) {
        grow |= b->x_gate.data.size() < b->x_gate.need(l.gate.type, shape_.n_embd, n_pos_) ||
                b->x_up.data.size() < b->x_up.need(l.up.type, shape_.n_embd, n_pos_) ||
                b->h.data.size() < b->h.need(l.down.type, shape_.n_ff, n_pos_);
    }
    auto reset = [&](slice_buffers& b) {
        b.x_gate.reset(l.gate.type, shape_.n_embd, n_pos_);
        b.x_up.reset(l.up.type, shape_.n_embd, n_pos_);
        b.h.reset(l.down.type, shape_.n_ff, n_pos_);
    };
    if (grow) pool_.run_phase(1, [&](int s, size_t, size_t) { reset(*slices_[static_cast<size_t>(s)]); });
    else
        for (auto& b : slices_) reset(*b);
}

void moe_runner::run_small(std::span<const size_t> n_items, int64_t cols, const expert_pool::phase_fn& fn) {
    // Small enough for the host alone (a token's quantization or weighted sum): a pool phase would cost
    // more in dispatch and join than it saves.
    constexpr int64_t kHostElements = 16384;
    int64_t elements = 0;
    for (size_t n : n_items) elements += static_cast<int64_t>(n) * cols;
    if (elements > kHostElements) {
        pool_.run_phase(n_items, fn);
        return;
    }
    for (size_t s = 0; s < n_items.size(); ++s)
        if (n_items[s] > 0) fn(static_cast<int>(s), 0, n_items[s]);
}

void moe_runner::run(int layer, int n_tok, const float* x, const int32_t* ids, const float* weights, float* out) {
    const int k = shape_.n_expert_used;
    const int64_t n_embd = shape_.n_embd, n_ff = shape_.n_ff;
    const moe_layer& l = layers_[static_cast<size_t>(layer)];
    prepare(layer, n_tok, ids);
    if (active_.empty()) {
        std::fill(out, out + n_tok * n_embd, 0.0f);
        return;
    }
    const size_t n_slices = slices_.size();
    // Gate and up read the same activation bytes when their weight types share an activation format.
    const bool separate_up = cpu::activation_type(l.up.type) != cpu::activation_type(l.gate.type);
    constexpr int max_tok = cpu::max_matvec_tokens;

    // Phase 0: every slice quantizes each token's x once and copies it to the token's positions.
    double* const clock = phase_seconds_;
    std::vector<size_t>& n_items = n_items_;
    n_items.assign(n_slices, static_cast<size_t>(n_tok));
    std::optional<scoped_seconds> timer;
    timer.emplace(clock);
    const auto quantize_x = [&](int s, size_t begin, size_t end) {
        slice_buffers& b = *slices_[static_cast<size_t>(s)];
        for (size_t t = begin; t < end; ++t) {
            const float* xt = x + t * static_cast<size_t>(n_embd);
            int32_t first = -1;
            for (int j = 0; j < k; ++j) {
                const int32_t pos = pos_of_slot_[t * static_cast<size_t>(k) + static_cast<size_t>(j)];
                if (pos < 0) continue;
                if (first < 0) {
                    first = pos;
                    cpu::quantize_activation(l.gate.type, xt, b.x_gate.row(pos), n_embd);
                    if (separate_up) cpu::quantize_activation(l.up.type, xt, b.x_up.row(pos), n_embd);
                    continue;
                }
                std::memcpy(b.x_gate.row(pos), b.x_gate.row(first), b.x_gate.row_bytes);
                if (separate_up) std::memcpy(b.x_up.row(pos), b.x_up.row(first), b.x_up.row_bytes);
            }
        }
    };
    run_small(n_items, n_embd * (separate_up ? 2 : 1), quantize_x);

    timer.emplace(clock ? clock + 1 : nullptr);
    // Phase 1: items are (active expert, block of the slice's n_ff rows). Gate goes straight into h,
    // up into a block-sized scratch, then h = silu(h) * up in place. An item reads gate and up as two
    // alternating streams, which memory serves slower the shorter each run is: blocks take up to
    // kMaxFfBlocks (kMaxFfBlocksOnePass) row blocks while each thread of the slice still gets 8 items or
    // more, and an item starts both streams before it reads either.
    std::vector<size_t>& row_blocks = row_blocks_;  // row blocks per slice: of n_ff rows, then of n_embd rows
    std::vector<int64_t>& ff_block = ff_block_rows_;
    row_blocks.resize(n_slices);
    ff_block.resize(n_slices);
    // A phase's items over each slice's ranges: blocks of up to max_blocks row blocks, each thread 8 or more.
    int32_t most_tokens = 0;
    for (const int32_t e : active_) most_tokens = std::max(most_tokens, count_of_[static_cast<size_t>(e)]);
    const int64_t max_blocks = most_tokens <= max_tok ? kMaxFfBlocksOnePass : kMaxFfBlocks;
    const auto size_items = [&](const std::vector<row_range>& ranges) {
        for (size_t s = 0; s < n_slices; ++s) {
            const int64_t rows = ranges[s].end - ranges[s].begin;
            const int64_t per_thread = 8 * std::max(pool_.plan().slices[s].threads(), 1);
            const int64_t unit =
                std::clamp<int64_t>(int64_t((rows / row_block) * active_.size()) / per_thread, 1, max_blocks);
            ff_block[s] = unit * row_block;
            row_blocks[s] = static_cast<size_t>((rows + ff_block[s] - 1) / ff_block[s]);
            n_items[s] = row_blocks[s] * active_.size();
        }
    };
    size_items(ff_ranges_);
    pool_.run_phase(n_items, [&](int s, size_t begin, size_t end) {
        slice_buffers& b = *slices_[static_cast<size_t>(s)];
        act_buffer& x_up = separate_up ? b.x_up : b.x_gate;
        const row_range range = ff_ranges_[static_cast<size_t>(s)];
        const size_t blocks = row_blocks[static_cast<size_t>(s)];
        const int64_t block = ff_block[static_cast<size_t>(s)];
        float up[max_tok * kMaxFfBlocksOnePass * row_block];  // [n_tok of the chunk][n] up x
        for (size_t item = begin; item < end; ++item) {
            const int e = active_[item / blocks];
            const int64_t r0 = range.begin + static_cast<int64_t>(item % blocks) * block;
            const int64_t n = std::min(block, range.end - r0);
            const cpu::matrix gate = rows_.rows(layer, expert_part::gate, e, s, r0);
            const cpu::matrix upm = rows_.rows(layer, expert_part::up, e, s, r0);
            cpu::prefetch_rows(gate, 0, n);
            cpu::prefetch_rows(upm, 0, n);
            const int32_t first = first_of_[static_cast<size_t>(e)], count = count_of_[static_cast<size_t>(e)];
            for (int32_t c = 0; c < count; c += max_tok) {
                const int nt = std::min(max_tok, count - c);
                float* h = h_.data() + static_cast<size_t>(first + c) * n_ff + r0;
                cpu::matvec_multi(gate, 0, n, b.x_gate.row(first + c), b.x_gate.row_bytes, nt, h, n_ff);
                cpu::matvec_multi(upm, 0, n, x_up.row(first + c), x_up.row_bytes, nt, up, n);
                for (int i = 0; i < nt; ++i) cpu::silu_mul(h + i * n_ff, up + i * n, n, h + i * n_ff);
            }
        }
    });

    timer.emplace(clock);
    // Phase 1b: every slice quantizes all of h for its own down rows.
    for (size_t s = 0; s < n_slices; ++s) n_items[s] = static_cast<size_t>(n_pos_);
    run_small(n_items, n_ff, [&](int s, size_t begin, size_t end) {
        slice_buffers& b = *slices_[static_cast<size_t>(s)];
        for (size_t pos = begin; pos < end; ++pos)
            cpu::quantize_activation(l.down.type, h_.data() + pos * static_cast<size_t>(n_ff), b.h.row(static_cast<int64_t>(pos)), n_ff);
    });

    timer.emplace(clock ? clock + 2 : nullptr);
    // Phase 2: items are (active expert, block of the slice's n_embd rows), as in phase 1, so a thread's
    // consecutive items read one expert's down rows as one stream (cycling through every active expert
    // per row block reads them as many short streams, which memory serves slower). Blocks grow as in
    // phase 1: a decode token's down rows are short (n_ff columns), so a 32-row item costs as much in
    // dispatch and kernel setup as in reading.
    size_items(embd_ranges_);
    pool_.run_phase(n_items, [&](int s, size_t begin, size_t end) {
        slice_buffers& b = *slices_[static_cast<size_t>(s)];
        const row_range range = embd_ranges_[static_cast<size_t>(s)];
        const size_t blocks = row_blocks[static_cast<size_t>(s)];
        const int64_t block = ff_block[static_cast<size_t>(s)];
        for (size_t item = begin; item < end; ++item) {
            const int e = active_[item / blocks];
            const int64_t r0 = range.begin + static_cast<int64_t>(item % blocks) * block;
            const int64_t n = std::min(block, range.end - r0);
            const cpu::matrix down = rows_.rows(layer, expert_part::down, e, s, r0);
            cpu::prefetch_rows(down, 0, n);
            const int32_t first = first_of_[static_cast<size_t>(e)], count = count_of_[static_cast<size_t>(e)];
            for (int32_t c = 0; c < count; c += max_tok)
                cpu::matvec_multi(down, 0, n, b.h.row(first + c), b.h.row_bytes, std::min(max_tok, count - c),
                                  y_.data() + static_cast<size_t>(first + c) * n_embd + r0, n_embd);
        }
    });

    // Phase 3: items are tokens; each sums its experts over the slice's n_embd rows in routing order (a
    // fixed order: bitwise reproducible). A token's rows are whole runs of y, read as streams.
    int64_t slice_rows = 0;
    for (size_t s = 0; s < n_slices; ++s) {
        n_items[s] = static_cast<size_t>(n_tok);
        slice_rows = std::max(slice_rows, embd_ranges_[s].end - embd_ranges_[s].begin);
    }
    run_small(n_items, slice_rows * k, [&](int s, size_t begin, size_t end) {
        const row_range range = embd_ranges_[static_cast<size_t>(s)];
        const int64_t n = range.end - range.begin;
        for (size_t t = begin; t < end; ++t) {
            float* o = out + t * static_cast<size_t>(n_embd) + range.begin;
            std::fill(o, o + n, 0.0f);
            for (size_t j = 0; j < static_cast<size_t>(k); ++j) {
                const int32_t pos = pos_of_slot_[t * static_cast<size_t>(k) + j];
                if (pos < 0) continue;
                const float w = weights[t * static_cast<size_t>(k) + j];
                const float* y = y_.data() + static_cast<size_t>(pos) * n_embd + range.begin;
                for (int64_t r = 0; r < n; ++r) o[r] += w * y[r];
            }
        }
    });
}

}  // namespace strata::arenas
