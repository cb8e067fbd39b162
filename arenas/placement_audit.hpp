// Audits where a process's published regions really live: its region map (region_map.hpp) against
// /proc/PID/maps and /proc/PID/numa_maps. Used by placement-report --pid; no NUMA system call.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "region_map.hpp"

namespace strata::arenas {

struct region_audit {
    region where;
    std::vector<std::size_t> pages_per_node;  // resident pages of the VMAs overlapping the region, per node
    std::size_t pages = 0;                    // their sum
    double local_share = 0;                   // pages on where.node / pages (0 when no page is resident)
    bool ok = false;                          // local_share >= threshold (regions without intent are ok)
    std::string file;                         // a file-backed region (a cold one, e.g. the PLE table): the file
    std::size_t file_resident_bytes = 0;      // of the region's bytes, those in the page cache
};

// One entry per region. `threshold` is a share (0.95 for 95 %). Throws std::runtime_error naming the
// file when /proc/PID/maps or numa_maps cannot be read.
std::vector<region_audit> audit_regions(int pid, const std::vector<region>& regions, double threshold);

// Parses numa_maps text: for each VMA start address, pages per node ("N0=12 N1=3").
struct numa_maps_entry {
    std::uintptr_t start = 0;
    std::vector<std::size_t> pages_per_node;
};
std::vector<numa_maps_entry> parse_numa_maps(const std::string& text);

}  // namespace strata::arenas
