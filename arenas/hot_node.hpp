// The hot node (--numa-hot-node N|off), for the split-off pool on a multi-node machine: the resident
// complement is claimed on node N (mmap -> mbind -> pre-touch) before the model's other data is read,
// the pinned host pools touched every token go to N too, and conversation snapshots to the first other
// (cold) node. Off (the default): every allocation is plain anonymous memory and not one NUMA system
// call is issued (numa_calls() proves it).
//
// Thread-safety: a hot_node is immutable after construction; its allocators may be called from any
// thread (the region map they register in is thread-safe).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "numa_policy.hpp"
#include "region_map.hpp"
#include "topology.hpp"

namespace strata::arenas {

// "off" or "" -> nullopt; "N" -> N. Throws std::invalid_argument naming the value otherwise.
std::optional<int> parse_hot_node(std::string_view value);

// Live totals of bound buffers (hot_node::describe_placed counts its hot pools with one).
struct placed_tally {
    std::atomic<std::uint64_t> bytes{0};
    std::atomic<int> buffers{0};
};

// A node_buffer listed in a region map while it lives (no map: just the buffer), and counted in
// `tally` (optional, must outlive it) while it lives if its binding held. Move-only.
class placed_buffer {
public:
    placed_buffer() = default;
    placed_buffer(node_buffer buffer, std::string name, region_map* regions, placed_tally* tally = nullptr);
    ~placed_buffer();
    placed_buffer(placed_buffer&& other) noexcept;
    placed_buffer& operator=(placed_buffer&& other) noexcept;

    std::byte* data() const { return buffer_.data(); }
    std::size_t size() const { return buffer_.size(); }
    int node() const { return buffer_.node(); }
    bool bound() const { return buffer_.bound(); }

private:
    void unlist();

    node_buffer buffer_;
    region_map* regions_ = nullptr;
    placed_tally* tally_ = nullptr;
};

class hot_node {
public:
    // node nullopt: off. Throws std::invalid_argument when `node` is not a node of `topo`.
    // `regions` (optional, must outlive the hot_node) lists the hot and cold buffers.
    hot_node(std::optional<int> node, const topology& topo, region_map* regions = nullptr);

    bool active() const { return node_ >= 0; }
    int node() const { return node_; }        // -1 when off
    int cold_node() const { return cold_; }   // first other node with memory; -1 when off or none

    // The resident complement on the hot node, `bytes` mapped, bound and pre-touched by a thread pinned
    // to the node's CPUs; hand it to the expert store (store_options::claimed), which registers it.
    // Throws node_room_error (nothing claimed) when the node lacks room for it plus `headroom_bytes`.
    // Off: nullptr (the store then maps its own copy).
    std::unique_ptr<node_buffer> claim_complement(std::size_t bytes, std::uint64_t headroom_bytes = std::uint64_t{2} << 30) const;

    // Pinned host pools touched every token (GPU staging): on the hot node. Off: anonymous memory.
    // engine/gpu page-locks them (host_pool.hpp); arenas itself knows no CUDA. The buffers must not
    // outlive the hot_node (it counts them while they live).
    placed_buffer allocate_hot(std::size_t bytes, std::string name) const;
    // Conversation snapshots: on the cold node (anonymous memory when off or there is none).
    placed_buffer allocate_cold(std::size_t bytes, std::string name) const;

    // What is on the hot node (the claimed complement, the allocate_hot buffers alive now, each only if
    // its binding held), as one sentence for the load log: "NUMA hot node 1: the resident complement (812.0 MiB)
    // and 3 pinned host pools (41.0 MiB) are bound to node 1; conversation snapshots go to node 0."
    // "" when off.
    std::string describe_placed() const;

private:
    placed_buffer allocate_on(int node, std::size_t bytes, std::string name, placed_tally* tally = nullptr) const;

    int node_ = -1;
    int cold_ = -1;
    std::vector<int> hot_cpus_, cold_cpus_;
    region_map* regions_ = nullptr;
    mutable std::atomic<std::uint64_t> complement_bytes_{0};  // for describe_placed()
    mutable placed_tally hot_pools_;
};

}  // namespace strata::arenas
