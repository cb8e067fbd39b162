// The process's region map: every large allocation (name, address, bytes, intended NUMA node),
// published as a JSON file so placement-report --pid can audit placement from outside the process.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace strata::arenas {

struct region {
    std::string name;             // "blk.3.ffn_gate_exps slice 1", "kv cache", ...
    std::uintptr_t address = 0;   // first byte
    std::size_t bytes = 0;
    int node = -1;                // intended NUMA node, -1: no intent (not audited)
};

// Thread-safe. The file is rewritten (write to a temporary, then rename) on every change and removed
// when the map is destroyed.
class region_map {
public:
    // path empty: $STRATA_REGION_MAP if set, else default_path(getpid()).
    explicit region_map(std::string path = {});
    ~region_map();
    region_map(const region_map&) = delete;
    region_map& operator=(const region_map&) = delete;

    void add(region r);
    void remove(std::uintptr_t address);
    std::vector<region> regions() const;
    const std::string& path() const { return path_; }

    // /dev/shm/strata-regions-PID.json, or /tmp/... where /dev/shm does not exist.
    static std::string default_path(int pid);
    // Parses a published map. Throws std::runtime_error naming the file when it cannot be read.
    static std::vector<region> read(const std::string& path);

private:
    void publish() const;  // caller holds mutex_

    mutable std::mutex mutex_;
    std::string path_;
    std::vector<region> regions_;
};

}  // namespace strata::arenas
