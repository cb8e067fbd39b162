// The CUDA-free half of device.hpp: reading a PCI device's NUMA node from sysfs.
#include <algorithm>
#include <cctype>
#include <fstream>

#include "gpu/device.hpp"

namespace strata::engine::gpu {

std::string sysfs_bus_id(const std::string& bus_id) {
    std::string s = bus_id;
    std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    const size_t colon = s.find(':');
    if (colon == 8 && s.compare(0, 4, "0000") == 0) s.erase(0, 4);  // NVML's 8-digit domain
    return s;
}

int pci_numa_node(const std::string& bus_id, const std::string& sysfs_root) {
    std::ifstream in(sysfs_root + "/bus/pci/devices/" + sysfs_bus_id(bus_id) + "/numa_node");
    int node = -1;
    if (!(in >> node) || node < 0) return -1;
    return node;
}

}  // namespace strata::engine::gpu
