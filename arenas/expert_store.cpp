#include "expert_store.hpp"

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstring>
#include <map>
#include <stdexcept>

#include "formats/types.hpp"
#include "log.hpp"

namespace strata::arenas {

namespace {

constexpr std::size_t part_align = 4096;  // each (layer, part) block starts on a page
constexpr double gib = double(std::size_t{1} << 30);
constexpr std::array<expert_part, 3> all_parts{expert_part::gate, expert_part::up, expert_part::down};

std::size_t align_up(std::size_t n, std::size_t a) { return (n + a - 1) / a * a; }

const char* part_name(expert_part p) { return p == expert_part::gate ? "gate" : p == expert_part::up ? "up" : "down"; }

// Whether the store keeps `t` in the rows16 layout for the prompt GEMM kernels, and the bytes per row
// it then takes.
bool repacks(const expert_tensor& t, bool repack) { return repack && kernels::cpu::can_repack(t.type, t.n_rows); }
std::size_t stored_stride(const expert_tensor& t, bool repack) {
    return repacks(t, repack) ? kernels::cpu::repacked_row_stride(t.type, t.n_cols) : t.row_stride;
}

// A slice's rows of each part: gate and up are cut on n_ff, down on n_embd (moe_runner's ranges).
struct slice_ranges {
    std::array<row_range, 3> part;
};

std::vector<slice_ranges> ranges_of(const pool_plan& plan, const moe_shape& shape) {
    const auto ff = split_rows(plan, shape.n_ff, moe_runner::row_block);
    const auto embd = split_rows(plan, shape.n_embd, moe_runner::row_block);
    std::vector<slice_ranges> out(plan.slices.size());
    for (std::size_t s = 0; s < out.size(); ++s) out[s].part = {ff[s], ff[s], embd[s]};
    return out;
}

// Offsets of every (layer, part) block in a slice's buffer: expert e's rows follow expert e - 1's.
struct slice_layout {
    std::vector<std::array<std::size_t, 3>> offset;  // [layer][part] bytes from the buffer's start
    std::size_t bytes = 0;
};

slice_layout layout_of(const slice_ranges& r, const std::vector<moe_layer>& layers, const moe_shape& shape, bool repack) {
    slice_layout out;
    for (const auto& l : layers) {
        std::array<std::size_t, 3> off{};
        for (int p = 0; p < 3; ++p) {
            const auto& t = l.part(all_parts[static_cast<std::size_t>(p)]);
            const auto rows = static_cast<std::size_t>(r.part[static_cast<std::size_t>(p)].end - r.part[static_cast<std::size_t>(p)].begin);
            out.bytes = align_up(out.bytes, part_align);
            off[static_cast<std::size_t>(p)] = out.bytes;
            out.bytes += stored_stride(t, repack) * rows * static_cast<std::size_t>(shape.n_expert);
        }
        out.offset.push_back(off);
    }
    return out;
}

void check_layers(const moe_shape& shape, const std::vector<moe_layer>& layers) {
    for (std::size_t il = 0; il < layers.size(); ++il)
        for (expert_part p : all_parts) {
            const auto& t = layers[il].part(p);
            const int64_t want_cols = p == expert_part::down ? shape.n_ff : shape.n_embd;
            const int64_t want_rows = p == expert_part::down ? shape.n_embd : shape.n_ff;
            if (t.n_cols != want_cols || t.n_rows != want_rows || t.experts.size() != static_cast<std::size_t>(shape.n_expert) ||
                t.row_stride < formats::row_size(t.type, t.n_cols))
                throw std::invalid_argument("expert store: layer " + std::to_string(il) + " " + part_name(p) + " ('" + t.name +
                                            "') has " + std::to_string(t.experts.size()) + " experts of " +
                                            std::to_string(t.n_rows) + " x " + std::to_string(t.n_cols) +
                                            ", expected " + std::to_string(shape.n_expert) + " of " +
                                            std::to_string(want_rows) + " x " + std::to_string(want_cols));
        }
}

}  // namespace

struct expert_store::slice_store {
    slice_ranges ranges;
    slice_layout layout;
    std::unique_ptr<node_buffer> buffer;  // null when mapped
    std::byte* base = nullptr;
    int node = -1;  // intended node, -1: none
};

bool store_placement::ok() const {
    return std::all_of(nodes.begin(), nodes.end(), [](const node_placement& n) { return n.ok; });
}

std::string store_placement::describe() const {
    if (mode == store_mode::mapped) return "experts read in place from the model file (no copy)";
    std::string out;
    if (nodes.empty()) {
        char buf[96];
        std::snprintf(buf, sizeof buf, "%s, %.2f GiB, no NUMA placement",
                      mode == store_mode::test ? "one copy per test slice" : "one copy", static_cast<double>(bytes) / gib);
        return buf;
    }
    for (const auto& n : nodes) {
        char buf[64];
        std::snprintf(buf, sizeof buf, "%snode %d %.1f %%", out.empty() ? "" : ", ", n.node, 100.0 * n.share);
        out += buf;
    }
    return out;
}

std::vector<std::size_t> expert_store::bytes_per_slice(const pool_plan& plan, const moe_shape& shape,
                                                       const std::vector<moe_layer>& layers, bool repack) {
    std::vector<std::size_t> out;
    for (const auto& r : ranges_of(plan, shape)) out.push_back(layout_of(r, layers, shape, repack).bytes);
    return out;
}

expert_store::expert_store(expert_pool& pool, moe_shape shape, const std::vector<moe_layer>& layers, store_options options)
    : shape_(shape), layers_(layers), options_(std::move(options)) {
    check_layers(shape_, layers_);
    auto log = logger("arenas");
    const pool_plan& plan = pool.plan();
    placement_.mode = plan.split ? store_mode::split : plan.test_mode || plan.slices.size() > 1 ? store_mode::test
                      : options_.mmap_experts ? store_mode::mapped
                                              : store_mode::copy;
    if (options_.mmap_experts && placement_.mode != store_mode::mapped)
        log->warn("--mmap-experts is ignored: the NUMA split ({} slices) reads a copy of the rows in every node.",
                  plan.slices.size());
    if (options_.claimed && placement_.mode != store_mode::copy)
        throw std::invalid_argument("expert store: claimed memory (--numa-hot-node) is only for the split-off pool, "
                                    "this pool has " + std::to_string(plan.slices.size()) + " slice(s)" +
                                    (options_.mmap_experts ? " and --mmap-experts is set" : ""));

    const auto ranges = ranges_of(plan, shape_);
    const bool repack = options_.repack && placement_.mode != store_mode::mapped;
    for (std::size_t s = 0; s < ranges.size(); ++s) {
        auto st = std::make_unique<slice_store>();
        st->ranges = ranges[s];
        st->layout = layout_of(ranges[s], layers_, shape_, repack);
        if (placement_.mode == store_mode::split) st->node = plan.slices[s].node;
        slices_.push_back(std::move(st));
    }
    std::size_t gguf_bytes = 0, stored_bytes = 0, n_repacked = 0;
    for (const auto& l : layers_) {
        std::array<std::size_t, 3> stride{};
        std::array<bool, 3> packed{};
        for (std::size_t p = 0; p < 3; ++p) {
            const expert_tensor& t = l.part(all_parts[p]);
            stride[p] = stored_stride(t, repack);
            packed[p] = repacks(t, repack);
            n_repacked += packed[p];
            gguf_bytes += t.row_stride * static_cast<std::size_t>(t.n_rows) * static_cast<std::size_t>(shape_.n_expert);
            stored_bytes += stride[p] * static_cast<std::size_t>(t.n_rows) * static_cast<std::size_t>(shape_.n_expert);
        }
        stride_.push_back(stride);
        repacked_.push_back(packed);
    }
    if (placement_.mode == store_mode::mapped) {
        log->info("Expert store: {} layers of experts are read in place from the model file (--mmap-experts).", layers_.size());
        return;
    }

    if (placement_.mode == store_mode::split) check_room();
    for (auto& st : slices_) {
        if (options_.claimed) {
            if (options_.claimed->size() < st->layout.bytes)
                throw std::invalid_argument("expert store: the claimed buffer holds " + std::to_string(options_.claimed->size()) +
                                            " bytes, the experts need " + std::to_string(st->layout.bytes));
            st->node = options_.claimed->node();
            st->buffer = std::move(options_.claimed);
        } else {
            // Not touched here: the copy below, on the slice's own threads, touches every page first.
            st->buffer = std::make_unique<node_buffer>(st->layout.bytes, st->node, std::vector<int>{}, first_touch::none);
        }
        st->base = st->buffer->data();
        placement_.bytes += st->layout.bytes;
    }
    copy_layers(pool);
    if (options_.regions)
        for (std::size_t s = 0; s < slices_.size(); ++s) {
            const auto& st = *slices_[s];
            std::string name = placement_.mode == store_mode::copy ? "expert store copy" : "expert store slice " + std::to_string(s);
            if (st.node >= 0) name += " (node " + std::to_string(st.node) + ")";
            options_.regions->add({name, reinterpret_cast<std::uintptr_t>(st.base), st.layout.bytes, st.node});
        }
    log->info("Expert store: copied {:.2f} GiB of expert rows ({} layers) into {} {}.", static_cast<double>(placement_.bytes) / gib,
              layers_.size(), slices_.size(),
              placement_.mode == store_mode::split ? "node-bound slice buffer(s)"
              : placement_.mode == store_mode::test ? "test-mode slice buffer(s) without NUMA placement"
              : slices_[0]->node >= 0 ? "buffer claimed on node " + std::to_string(slices_[0]->node)
                                      : "buffer in anonymous memory");
    if (n_repacked > 0) {
        const double extra = static_cast<double>(stored_bytes) - static_cast<double>(gguf_bytes);
        log->info("Expert store: {} of {} expert matrices repacked for the prompt GEMM kernels (16 rows interleaved); "
                  "they take {:.1f} MiB ({:+.2f} %) more than the GGUF layout, and no copy of the GGUF rows is kept "
                  "(--no-repack turns repacking off).",
                  n_repacked, 3 * layers_.size(), extra / double(1 << 20), 100.0 * extra / static_cast<double>(gguf_bytes));
    } else if (repack) {
        log->info("Expert store: no expert matrix repacked: the {} CPU path has no prompt GEMM kernel for their types "
                  "or row counts.", kernels::cpu::isa_name(kernels::cpu::active_isa()));
    }
    if (std::any_of(slices_.begin(), slices_.end(), [](const auto& st) { return st->node >= 0; })) sample_placement();
}

expert_store::~expert_store() {
    if (options_.regions)
        for (const auto& st : slices_)
            if (st->base) options_.regions->remove(reinterpret_cast<std::uintptr_t>(st->base));
}

void expert_store::check_room() const {
    // Slices that share a node share its memory: the check is per node, before any buffer exists.
    std::map<int, std::size_t> per_node;
    for (const auto& st : slices_) per_node[st->node] += st->layout.bytes;
    for (const auto& [node, bytes] : per_node)
        require_node_room(node, bytes, options_.node_available ? options_.node_available(node) : std::nullopt,
                          options_.headroom_bytes, "its share of the routed experts under the NUMA split",
                          "Free memory on that node, or pass --numa-pool off (one unbound copy of the experts; "
                          "add --mmap-experts to read them from the model file instead).");
}

void expert_store::copy_layers(expert_pool& pool) {
    const std::size_t n_expert = static_cast<std::size_t>(shape_.n_expert);
    // NOTE: run_phase takes one item count per pool slice; under a split-off pool with one store slice
    // the counts line up the same way.
    std::vector<std::size_t> n_items(static_cast<std::size_t>(pool.n_slices()), 0);
    for (std::size_t s = 0; s < slices_.size() && s < n_items.size(); ++s) n_items[s] = 3 * n_expert;
    for (std::size_t il = 0; il < layers_.size(); ++il) {
        const moe_layer& l = layers_[il];
        pool.run_phase(n_items, [&](int s, std::size_t begin, std::size_t end) {
            slice_store& st = *slices_[static_cast<std::size_t>(s)];
            for (std::size_t item = begin; item < end; ++item) {
                const std::size_t p = item / n_expert, e = item % n_expert;
                const expert_tensor& t = l.part(all_parts[p]);
                const row_range r = st.ranges.part[p];
                const std::size_t stride = stride_[il][p];
                const std::size_t bytes = stride * static_cast<std::size_t>(r.end - r.begin);
                const auto* src = t.experts[e] + static_cast<std::size_t>(r.begin) * t.row_stride;
                std::byte* dst = st.base + st.layout.offset[il][p] + e * bytes;
                if (repacked_[il][p])
                    kernels::cpu::repack_rows(t.type, src, t.row_stride, r.end - r.begin, t.n_cols, dst);
                else
                    std::memcpy(dst, src, bytes);
            }
        });
        if (options_.on_layer_copied) options_.on_layer_copied(static_cast<int>(il));
    }
}

void expert_store::sample_placement() {
    auto log = logger("arenas");
    for (std::size_t s = 0; s < slices_.size(); ++s) {
        const auto& st = *slices_[s];
        node_placement n;
        n.slice = static_cast<int>(s);
        n.node = st.node;
        n.bytes = st.layout.bytes;
        if (st.layout.bytes > 0 && st.node >= 0) {
            const auto p = sample_page_placement(st.base, st.layout.bytes, options_.samples_per_slice);
            n.pages_sampled = p.present();
            n.pages_on_node = st.node < static_cast<int>(p.pages_per_node.size()) ? p.pages_per_node[static_cast<std::size_t>(st.node)] : 0;
            n.share = p.share_on(st.node);
            n.ok = n.share >= options_.fail_below;
            if (p.error != 0)
                log->warn("Sampling the placement of slice {} (node {}) failed: move_pages errno {} ({}).", s, st.node, p.error,
                          std::strerror(p.error));
        } else {
            n.share = 1.0;  // nothing to place
        }
        placement_.nodes.push_back(n);
    }
    log->info("NUMA placement: {}.", placement_.describe());
    for (const auto& n : placement_.nodes)
        if (!n.ok)
            log->error("NUMA placement FAILED: node {} holds {:.1f} % of slice {}'s sampled pages ({} of {}), under {:.0f} %; "
                       "its threads will read the rest across the interconnect.",
                       n.node, 100.0 * n.share, n.slice, n.pages_on_node, n.pages_sampled, 100.0 * options_.fail_below);
}

kernels::cpu::matrix expert_store::rows(int layer, expert_part part, int expert, int slice, int64_t begin) const {
    const expert_tensor& t = layers_[static_cast<std::size_t>(layer)].part(part);
    const slice_store& st = *slices_[static_cast<std::size_t>(slice)];
    const auto p = static_cast<std::size_t>(part);
    const row_range r = st.ranges.part[p];
    if (!st.base) {
        kernels::cpu::matrix m = t.expert(expert);
        m.data = static_cast<const uint8_t*>(m.data) + static_cast<std::size_t>(begin) * t.row_stride;
        return m;
    }
    const std::size_t stride = stride_[static_cast<std::size_t>(layer)][p];
    const std::size_t expert_bytes = stride * static_cast<std::size_t>(r.end - r.begin);
    const std::byte* data = st.base + st.layout.offset[static_cast<std::size_t>(layer)][p] +
                            static_cast<std::size_t>(expert) * expert_bytes + static_cast<std::size_t>(begin - r.begin) * stride;
    return {t.type, data, t.n_cols, stride,
            repacked_[static_cast<std::size_t>(layer)][p] ? kernels::cpu::weight_layout::rows16 : kernels::cpu::weight_layout::rows};
}

}  // namespace strata::arenas
