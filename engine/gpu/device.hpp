// The CUDA device strata runs on: selection by index (--gpu N) with the reason when none is usable,
// and the device's NUMA node from sysfs (for --numa-hot-node auto and the host thread's placement).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace strata::engine::gpu {

struct device_info {
    int index = -1;
    std::string name;
    std::string pci_bus_id;   // sysfs spelling: "0000:65:00.0"
    int compute_major = 0, compute_minor = 0;
    uint64_t total_bytes = 0;
    uint64_t free_bytes = 0;
    int numa_node = -1;       // -1: unknown or a one-node machine
};

// The NUMA node of a PCI device: <sysfs_root>/bus/pci/devices/<bus_id>/numa_node, -1 when the file is
// missing, unreadable or says -1. bus_id in CUDA's or sysfs's spelling (case and an 8-digit domain
// are normalised).
int pci_numa_node(const std::string& bus_id, const std::string& sysfs_root = "/sys");
// "00000000:65:00.0" or "0000:65:00.0" (any case) -> "0000:65:00.0".
std::string sysfs_bus_id(const std::string& bus_id);

// Device `index` if it is usable (it exists and answers), made current on the calling thread; else
// nullopt and *why says why in one sentence with the numbers (no device, index out of range, driver
// error, a build without CUDA).
std::optional<device_info> select_device(int index, std::string* why);

}  // namespace strata::engine::gpu
