// numa_policy: the only place in strata that issues mbind, get_mempolicy or move_pages.
// Every such call is counted, so "no NUMA system call without --numa-hot-node" is testable. Builds on
// systems without these calls compile; the calls then fail with ENOSYS and numa_policy_available()
// is false.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string_view>
#include <vector>

namespace strata::arenas {

struct numa_call_counts {
    std::uint64_t mbind = 0;
    std::uint64_t get_mempolicy = 0;
    std::uint64_t move_pages = 0;

    std::uint64_t total() const { return mbind + get_mempolicy + move_pages; }
};

// Calls issued by this process through numa_policy since it started. Thread-safe.
numa_call_counts numa_calls();

// True when the NUMA system calls exist in this build (Linux).
bool numa_policy_available();

inline constexpr std::size_t huge_page_bytes = std::size_t{2} << 20;

// mbind(MPOL_BIND) of [addr, addr + bytes) to `node`, moving pages already present. `addr` must be
// page-aligned. Returns 0 or the errno (EINVAL: bad node or range, ENOSYS: not Linux, EIO: pages
// could not be moved).
int bind_memory(void* addr, std::size_t bytes, int node);

// get_mempolicy(MPOL_F_NODE | MPOL_F_ADDR): the node holding the page at `addr`, or -errno.
int node_of_address(const void* addr);

// Where the pages of a range live, from move_pages(nodes = NULL) over up to `max_samples` pages spread
// evenly over the range (every page when the range is smaller).
struct page_placement {
    std::vector<std::size_t> pages_per_node;  // [max node + 1] pages found on each node
    std::size_t sampled = 0;                   // pages asked about
    std::size_t absent = 0;                    // pages not present (never touched) or not queryable
    int error = 0;                             // errno of a failed move_pages call, else 0

    std::size_t present() const { return sampled - absent; }
    // Share (0..1) of the present sampled pages that live on `node`; 0 when nothing is present.
    double share_on(int node) const;
};

page_placement sample_page_placement(const void* addr, std::size_t bytes, std::size_t max_samples = 4096);

// Memory `node` can give a bound allocation, from /sys/devices/system/node/nodeN/meminfo: MemFree
// plus the page cache and reclaimable slab the kernel evicts before it fails one (Active(file),
// Inactive(file), SReclaimable). No system call of the counted kind; nullopt where the file does not
// exist (not Linux, no such node).
std::optional<std::uint64_t> node_memory_available(int node);

// A node without room for what was to be bound to it (require_node_room).
class node_room_error : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

// Before binding `share_bytes` to `node`: a buffer bound strictly to a full node is not refused by
// mmap or mbind but ends in an OOM kill when its pages are touched, so this throws node_room_error
// when the node's available memory (`available`, else node_memory_available) is short of the share
// plus `headroom_bytes`. The message names the node, both figures, `what` and `remedy` (the flag that
// avoids it). Nothing is checked when no figure can be read.
void require_node_room(int node, std::uint64_t share_bytes, std::optional<std::uint64_t> available,
                       std::uint64_t headroom_bytes, std::string_view what, std::string_view remedy);

// Zeroed anonymous memory of `bytes` starting on a 2 MiB boundary and advised for transparent huge
// pages, so every whole 2 MiB of it can be one; no NUMA binding. Throws std::bad_alloc. Freed only by
// unmap_huge_aligned with the same size.
std::byte* map_huge_aligned(std::size_t bytes);
void unmap_huge_aligned(std::byte* data, std::size_t bytes);

// Who touches a node_buffer's pages first.
enum class first_touch {
    pinned,  // the constructor: a thread pinned to node_cpus (the caller when node_cpus is empty)
    none,    // nobody yet: the owner writes it from threads of its choice (the expert store's copy
             // runs on the slice's own pinned pool threads)
};

// Memory bound to one NUMA node: mmap'd, 2 MiB-aligned and a multiple of 2 MiB (so no transparent
// huge page straddles two buffers), advised for huge pages, mbind'ed to the node, then first touched
// by a thread pinned to the node's CPUs. Failures degrade: the buffer still exists, bound() says
// whether mbind succeeded, and a warning names the node and the errno. Move-only.
class node_buffer {
public:
    node_buffer() = default;
    // node < 0: no binding (and no NUMA system call); node_cpus empty: first touch by the caller.
    // Throws std::bad_alloc when mmap fails.
    node_buffer(std::size_t bytes, int node, const std::vector<int>& node_cpus, first_touch touch = first_touch::pinned);
    ~node_buffer();
    node_buffer(node_buffer&& other) noexcept;
    node_buffer& operator=(node_buffer&& other) noexcept;
    node_buffer(const node_buffer&) = delete;
    node_buffer& operator=(const node_buffer&) = delete;

    std::byte* data() const { return data_; }
    std::size_t size() const { return bytes_; }        // bytes asked for
    std::size_t mapped() const { return mapped_; }     // bytes mapped (rounded up to 2 MiB)
    int node() const { return node_; }
    bool bound() const { return bound_; }

private:
    void release();

    std::byte* data_ = nullptr;
    std::size_t bytes_ = 0;
    std::size_t mapped_ = 0;
    int node_ = -1;
    bool bound_ = false;
};

}  // namespace strata::arenas
