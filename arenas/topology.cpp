// The only file that calls hwloc. Builds strata's view of the machine: one entry per NUMA node with
// the physical cores for which it is the nearest node (one PU per core; SMT siblings recorded, not
// used for pinning), filtered by the allowed CPUs.
#include "topology.hpp"

#include <hwloc.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <set>
#include <sstream>
#include <stdexcept>

#include "numa_policy.hpp"

namespace strata::arenas {

namespace {

struct topology_deleter {
    void operator()(hwloc_topology* t) const { hwloc_topology_destroy(t); }
};
using topology_handle = std::unique_ptr<hwloc_topology, topology_deleter>;

topology_handle make_handle() {
    hwloc_topology_t t = nullptr;
    if (hwloc_topology_init(&t) != 0) throw std::runtime_error("hwloc_topology_init failed");
    return topology_handle(t);
}

// The NUMA node nearest to a core: among the nodes whose cpuset covers the core, the one with the
// smallest cpuset (a node attached to the whole machine loses to one attached to the core's package),
// ties to the lowest OS index. A node that is nearest to no core is memory-only.
hwloc_obj_t nearest_node(hwloc_topology_t t, hwloc_const_cpuset_t core_set) {
    hwloc_obj_t best = nullptr;
    int best_weight = 0;
    for (hwloc_obj_t n = hwloc_get_next_obj_by_type(t, HWLOC_OBJ_NUMANODE, nullptr); n;
         n = hwloc_get_next_obj_by_type(t, HWLOC_OBJ_NUMANODE, n)) {
        if (!n->cpuset || hwloc_bitmap_iszero(n->cpuset) || !hwloc_bitmap_isincluded(core_set, n->cpuset)) continue;
        int weight = hwloc_bitmap_weight(n->cpuset);
        if (!best || weight < best_weight || (weight == best_weight && n->os_index < best->os_index)) {
            best = n;
            best_weight = weight;
        }
    }
    return best;
}

topology build(hwloc_topology_t t, const std::optional<std::vector<int>>& allowed, bool from_machine,
               std::string source) {
    std::set<int> allowed_set;
    if (allowed) allowed_set.insert(allowed->begin(), allowed->end());
    auto is_allowed = [&](int cpu) { return !allowed || allowed_set.count(cpu) > 0; };

    topology topo;
    topo.source = std::move(source);
    std::vector<hwloc_obj_t> node_objs;
    for (hwloc_obj_t n = hwloc_get_next_obj_by_type(t, HWLOC_OBJ_NUMANODE, nullptr); n;
         n = hwloc_get_next_obj_by_type(t, HWLOC_OBJ_NUMANODE, n)) {
        numa_node node;
        node.os_index = static_cast<int>(n->os_index);
        node.memory_total = n->attr ? n->attr->numanode.local_memory : 0;
        node.memory_free = from_machine ? node_memory_available(static_cast<int>(n->os_index)).value_or(0) : node.memory_total;
        if (from_machine && node.memory_free == 0) node.memory_free = node.memory_total;
        topo.nodes.push_back(std::move(node));
        node_objs.push_back(n);
    }

    // Machines (or XML exports) without Core objects: every PU counts as a core.
    const hwloc_obj_type_t core_type =
        hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_CORE) > 0 ? HWLOC_OBJ_CORE : HWLOC_OBJ_PU;
    for (hwloc_obj_t c = hwloc_get_next_obj_by_type(t, core_type, nullptr); c;
         c = hwloc_get_next_obj_by_type(t, core_type, c)) {
        core entry;
        int pu = -1;
        hwloc_bitmap_foreach_begin(pu, c->cpuset) {
            if (is_allowed(pu)) entry.pus.push_back(pu);
        }
        hwloc_bitmap_foreach_end();
        if (entry.pus.empty()) continue;
        std::sort(entry.pus.begin(), entry.pus.end());
        entry.cpu = entry.pus.front();
        hwloc_obj_t n = nearest_node(t, c->cpuset);
        if (!n) continue;
        auto it = std::find(node_objs.begin(), node_objs.end(), n);
        topo.nodes[static_cast<std::size_t>(it - node_objs.begin())].cores.push_back(std::move(entry));
    }
    for (auto& node : topo.nodes) {
        std::sort(node.cores.begin(), node.cores.end(), [](const core& a, const core& b) { return a.cpu < b.cpu; });
    }
    std::sort(topo.nodes.begin(), topo.nodes.end(),
              [](const numa_node& a, const numa_node& b) { return a.os_index < b.os_index; });
    return topo;
}

}  // namespace

int topology::n_cpu_nodes() const {
    return static_cast<int>(std::count_if(nodes.begin(), nodes.end(), [](const numa_node& n) { return n.has_cpus(); }));
}

const numa_node* topology::find_node(int os_index) const {
    for (const auto& n : nodes)
        if (n.os_index == os_index) return &n;
    return nullptr;
}

const core* topology::core_of_cpu(int cpu) const {
    for (const auto& n : nodes)
        for (const auto& c : n.cores)
            if (std::find(c.pus.begin(), c.pus.end(), cpu) != c.pus.end()) return &c;
    return nullptr;
}

const numa_node* topology::node_of_cpu(int cpu) const {
    for (const auto& n : nodes)
        for (const auto& c : n.cores)
            if (std::find(c.pus.begin(), c.pus.end(), cpu) != c.pus.end()) return &n;
    return nullptr;
}

std::string topology::describe() const {
    std::ostringstream out;
    out << nodes.size() << " NUMA node(s) (" << source << "):";
    for (std::size_t i = 0; i < nodes.size(); ++i) {
        const auto& n = nodes[i];
        std::vector<int> cpus;
        for (const auto& c : n.cores) cpus.push_back(c.cpu);
        out << (i ? "," : "") << " node " << n.os_index << " = ";
        if (n.has_cpus()) out << n.cores.size() << " cores [" << format_cpu_list(cpus) << "]";
        else out << "memory only";
        out << ", " << (n.memory_total >> 20) << " MiB";
    }
    return out.str();
}

std::string format_cpu_list(const std::vector<int>& cpus) {
    std::ostringstream out;
    for (std::size_t i = 0; i < cpus.size();) {
        std::size_t j = i;
        while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
        out << (i ? "," : "") << cpus[i];
        if (j > i) out << "-" << cpus[j];
        i = j + 1;
    }
    return out.str();
}

std::vector<int> allowed_cpus() {
    std::vector<int> cpus;
#ifdef __linux__
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof(set), &set) == 0) {
        for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu)
            if (CPU_ISSET(cpu, &set)) cpus.push_back(cpu);
        return cpus;
    }
#endif
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    for (long cpu = 0; cpu < std::max(1L, n); ++cpu) cpus.push_back(static_cast<int>(cpu));
    return cpus;
}

topology load_machine_topology(std::optional<std::vector<int>> allowed) {
    auto t = make_handle();
    if (hwloc_topology_load(t.get()) != 0) throw std::runtime_error("hwloc_topology_load failed on this machine");
    if (!allowed) allowed = allowed_cpus();
    return build(t.get(), allowed, true, "this machine");
}

topology load_synthetic_topology(std::string_view description, std::optional<std::vector<int>> allowed) {
    auto t = make_handle();
    std::string desc(description);
    if (hwloc_topology_set_synthetic(t.get(), desc.c_str()) != 0)
        throw std::invalid_argument("hwloc rejected the synthetic topology '" + desc + "'");
    if (hwloc_topology_load(t.get()) != 0)
        throw std::runtime_error("hwloc_topology_load failed for the synthetic topology '" + desc + "'");
    return build(t.get(), allowed, false, "synthetic '" + desc + "'");
}

topology load_xml_topology(const std::string& path, std::optional<std::vector<int>> allowed) {
    auto t = make_handle();
    if (hwloc_topology_set_xml(t.get(), path.c_str()) != 0)
        throw std::runtime_error("hwloc cannot read the XML topology " + path);
    if (hwloc_topology_load(t.get()) != 0) throw std::runtime_error("hwloc cannot parse the XML topology " + path);
    return build(t.get(), allowed, false, "xml " + path);
}

topology load_topology(std::string_view spec, std::optional<std::vector<int>> allowed) {
    if (spec.empty() || spec == "machine") return load_machine_topology(std::move(allowed));
    if (spec.starts_with("synthetic:")) return load_synthetic_topology(spec.substr(10), std::move(allowed));
    if (spec.ends_with(".xml")) return load_xml_topology(std::string(spec), std::move(allowed));
    return load_synthetic_topology(spec, std::move(allowed));
}

void export_synthetic_as_xml(std::string_view description, const std::string& path) {
    auto t = make_handle();
    std::string desc(description);
    if (hwloc_topology_set_synthetic(t.get(), desc.c_str()) != 0 || hwloc_topology_load(t.get()) != 0)
        throw std::invalid_argument("hwloc rejected the synthetic topology '" + desc + "'");
    if (hwloc_topology_export_xml(t.get(), path.c_str(), 0) != 0)
        throw std::runtime_error("hwloc cannot write the XML topology " + path);
}

}  // namespace strata::arenas
