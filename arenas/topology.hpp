// NUMA topology as the pool plan sees it: nodes, their physical cores, their memory.
// topology.cpp is the only file in strata that calls hwloc.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace strata::arenas {

// One physical core: the PU the pool pins a thread to, and every allowed PU of the core (SMT siblings).
struct core {
    int cpu = -1;           // OS CPU number used for pinning (the core's first allowed PU)
    std::vector<int> pus;   // allowed OS CPU numbers of this core, ascending; pus.front() == cpu
};

struct numa_node {
    int os_index = -1;              // the kernel's node number (what mbind and move_pages use)
    std::vector<core> cores;        // allowed physical cores whose nearest node this is, by OS CPU number
    std::uint64_t memory_total = 0; // bytes of memory local to the node
    std::uint64_t memory_free = 0;  // bytes a bound allocation can get at load time (node_memory_available;
                                    // equal to memory_total for synthetic and XML)

    bool has_cpus() const { return !cores.empty(); }
};

struct topology {
    std::vector<numa_node> nodes;  // every NUMA node, memory-only ones included, ascending os_index
    std::string source;            // "this machine", "synthetic 'pack:2 ...'", "xml /path"

    int n_cpu_nodes() const;                         // nodes with at least one allowed core
    const numa_node* find_node(int os_index) const;  // nullptr when absent
    const numa_node* node_of_cpu(int cpu) const;     // node holding the core that owns PU `cpu`, or nullptr
    const core* core_of_cpu(int cpu) const;          // core owning PU `cpu` (any SMT sibling), or nullptr
    std::string describe() const;                    // one line: "2 NUMA nodes: node 0 = 4 cores, ..."
};

// The CPUs this process may run on (sched_getaffinity); every online CPU on systems without it.
std::vector<int> allowed_cpus();

// Topology of this machine, filtered by `allowed` (default: allowed_cpus()).
// Throws std::runtime_error naming the hwloc call when hwloc cannot load the machine.
topology load_machine_topology(std::optional<std::vector<int>> allowed = std::nullopt);

// Topology from an hwloc synthetic description, e.g. "pack:2 numa:1 core:4 pu:2", or with a
// memory-only node "[numa(memory=1GB)] pack:2 [numa(memory=2GB)] core:2 pu:1". `allowed` filters the
// PUs (default: all). Throws std::invalid_argument when hwloc rejects the description.
topology load_synthetic_topology(std::string_view description,
                                 std::optional<std::vector<int>> allowed = std::nullopt);

// Topology from an hwloc XML export (lstopo foo.xml). Throws std::runtime_error when the file cannot
// be read or parsed.
topology load_xml_topology(const std::string& path, std::optional<std::vector<int>> allowed = std::nullopt);

// Loads "machine", "synthetic:DESC", a path ending in .xml, or a bare synthetic description.
topology load_topology(std::string_view spec, std::optional<std::vector<int>> allowed = std::nullopt);

// Writes the synthetic description as hwloc XML to `path` (tests use it to exercise the XML loader).
void export_synthetic_as_xml(std::string_view description, const std::string& path);

// "0-3,8,10-11" for a sorted CPU list.
std::string format_cpu_list(const std::vector<int>& cpus);

}  // namespace strata::arenas
