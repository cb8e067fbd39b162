// The expert store: where the CPU expert pool's slices read the routed experts' rows (an expert_rows
// for moe_runner). It keeps the complement resident in RAM:
//  - split on: every slice gets its own rows of every expert (gate/up: its n_ff range, down: its n_embd
//    range, the ranges moe_runner uses) copied into one node_buffer bound to the slice's node, 2 MiB
//    aligned and advised for huge pages. The copy runs as pool phases, layer by layer, so the slice's
//    own pinned threads touch its pages first; on_layer_copied(layer) follows each layer (the engine
//    drops that layer's page cache there). Before: a room check per node, which throws node_room_error
//    when a node cannot hold its slices' rows plus the headroom; after: every slice's pages
//    sampled with move_pages, one "NUMA placement: node 0 100.0 %, node 1 99.6 %." line, and a
//    "NUMA placement FAILED" line for a node under 95 %.
//  - test mode: the same per-slice copies, in plain anonymous memory, without any NUMA system call.
//  - split off: one copy in anonymous memory, or in memory claimed beforehand (hot_node::claim, then
//    placement is sampled on that node), or no copy at all with mmap_experts (rows read in place).
// Every buffer is registered in the region map when one is given (placement-report --pid audits it).
//
// Thread-safety: construct on the pool's host thread (the copy runs pool phases); rows() and
// placement() are read-only and safe from any thread afterwards.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "expert_pool.hpp"
#include "moe_phases.hpp"
#include "numa_policy.hpp"
#include "region_map.hpp"

namespace strata::arenas {

struct store_options {
    // Split off only: read the model's rows in place instead of copying them (--mmap-experts, low RAM).
    bool mmap_experts = false;
    // Keep the experts in the rows16 layout of the prompt GEMM kernels (kernels/cpu/kernels.hpp)
    // where the active ISA has such a kernel and rows split into whole groups; they replace the GGUF rows
    // (decode reads them too). Not with mmap_experts. The engine turns it on by default (--no-repack).
    bool repack = false;
    // Split off only: memory to hold the single copy (from hot_node::claim), at least
    // expert_store::bytes_per_slice(...)[0] bytes; it then belongs to the store. Null: the store maps
    // anonymous memory itself.
    std::unique_ptr<node_buffer> claimed;
    // Called on the host thread after every layer's rows are copied (not with mmap_experts).
    std::function<void(int layer)> on_layer_copied;
    // Registers every buffer (name, address, bytes, intended node) when set; must outlive the store.
    region_map* regions = nullptr;
    // Memory a node can give, for the room check; default node_memory_available (sysfs). Tests inject figures.
    std::function<std::optional<std::uint64_t>(int node)> node_available;
    std::uint64_t headroom_bytes = std::uint64_t{2} << 30;  // kept free on every node besides its share
    double fail_below = 0.95;                               // placement share under which a node FAILED
    std::size_t samples_per_slice = 4096;                   // pages sampled with move_pages per slice
};

// What landed where (statistics, the server's /v1/status).
struct node_placement {
    int slice = 0;
    int node = -1;                 // intended node (-1: no intent)
    std::size_t bytes = 0;         // bytes of expert rows the slice holds
    std::size_t pages_sampled = 0; // pages sampled (present ones)
    std::size_t pages_on_node = 0; // of those, pages found on `node`
    double share = 0;              // pages_on_node / pages_sampled (0..1)
    bool ok = true;                // share >= fail_below
};

enum class store_mode {
    split,   // per-slice copies bound to the slices' nodes, sampled
    test,    // per-slice copies, no NUMA call
    copy,    // one copy (claimed on a hot node when `nodes` is not empty)
    mapped,  // no copy: the model's rows in place (mmap_experts)
};

struct store_placement {
    store_mode mode = store_mode::copy;
    std::size_t bytes = 0;              // bytes copied in total (0 when mapped)
    std::vector<node_placement> nodes;  // sampled placements: one per slice (split), or the hot node
    bool ok() const;                    // every sampled node at or above the threshold
    std::string describe() const;       // "node 0 100.0 %, node 1 99.6 %" or "one copy, 1.2 GiB, unbound"
};

class expert_store final : public expert_rows {
public:
    // Copies the rows now (see above). Throws std::invalid_argument naming the layer, part and numbers
    // when a layer does not match `shape`, or when options.claimed is too small or given under a
    // split; node_room_error (nothing placed) when a node lacks room for its share under the split;
    // std::bad_alloc when memory cannot be mapped.
    expert_store(expert_pool& pool, moe_shape shape, const std::vector<moe_layer>& layers, store_options options = {});
    ~expert_store() override;
    expert_store(const expert_store&) = delete;
    expert_store& operator=(const expert_store&) = delete;

    kernels::cpu::matrix rows(int layer, expert_part part, int expert, int slice, int64_t begin) const override;
    const store_placement& placement() const { return placement_; }

    // Bytes each slice of `plan` holds for these layers (only types and shapes are read, so a dry run
    // can pass layers without data). One entry per slice; under a split off plan, one entry.
    static std::vector<std::size_t> bytes_per_slice(const pool_plan& plan, const moe_shape& shape,
                                                    const std::vector<moe_layer>& layers, bool repack = false);

private:
    struct slice_store;
    void check_room() const;
    void copy_layers(expert_pool& pool);
    void sample_placement();

    moe_shape shape_;
    const std::vector<moe_layer>& layers_;
    store_options options_;
    store_placement placement_;
    std::vector<std::unique_ptr<slice_store>> slices_;
    std::vector<std::array<std::size_t, 3>> stride_;  // [layer][part] bytes per stored row
    std::vector<std::array<bool, 3>> repacked_;       // [layer][part] stored in the rows16 layout
};

}  // namespace strata::arenas
