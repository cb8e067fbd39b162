#include "memory_budget.hpp"

#include <algorithm>
#include <fstream>
#include <limits>

#include <spdlog/fmt/fmt.h>

namespace strata::engine {

namespace {

constexpr uint64_t unknown = std::numeric_limits<uint64_t>::max();

double mib(uint64_t bytes) { return double(bytes) / (1 << 20); }

// The first number of a file ("max" and a missing file: unknown).
uint64_t first_number(const std::string& path) {
    std::ifstream f(path);
    uint64_t n = 0;
    return f >> n ? n : unknown;
}

// The value after `key` in a file of "key value" lines, or unknown.
uint64_t keyed_value(const std::string& path, const std::string& key) {
    std::ifstream f(path);
    std::string k;
    uint64_t v = 0;
    while (f >> k >> v) {
        if (k == key) return v;
        f.ignore(std::numeric_limits<std::streamsize>::max(), '\n');
    }
    return unknown;
}

// Room left under the memory limits of cgroup `dir` and of every cgroup above it.
uint64_t cgroup_room(std::string dir, bool v2) {
    const std::string root = v2 ? "/sys/fs/cgroup" : "/sys/fs/cgroup/memory";
    uint64_t room = unknown;
    for (;;) {
        const uint64_t limit = first_number(dir + (v2 ? "/memory.max" : "/memory.limit_in_bytes"));
        const uint64_t used = first_number(dir + (v2 ? "/memory.current" : "/memory.usage_in_bytes"));
        if (limit != unknown && used != unknown) {
            const uint64_t file = keyed_value(dir + "/memory.stat", v2 ? "inactive_file" : "total_inactive_file");
            const uint64_t held = used - std::min(used, file == unknown ? 0 : file);
            room = std::min(room, limit > held ? limit - held : 0);
        }
        if (dir.size() <= root.size()) return room;
        dir.resize(dir.rfind('/'));
    }
}

}  // namespace

std::string memory_budget::describe() const {
    return fmt::format("the memory budget of {:.1f} MiB (--mem-budget) holds {:.1f} MiB: KV caches {:.1f} MiB, "
                       "recurrent-state checkpoints {:.1f} MiB, conversation snapshots {:.1f} MiB",
                       mib(limit_), mib(used()), mib(of(use::kv)), mib(of(use::checkpoints)), mib(of(use::snapshots)));
}

memory_budget_stats memory_budget::stats() const {
    memory_budget_stats s;
    s.budget_bytes = limit_;
    s.kv_bytes = of(use::kv);
    s.checkpoint_bytes = of(use::checkpoints);
    s.snapshot_bytes = of(use::snapshots);
    s.evictions = evictions_.load(std::memory_order_relaxed);
    s.refusals = refusals_.load(std::memory_order_relaxed);
    return s;
}

uint64_t committable_memory() {
    const uint64_t available_kib = keyed_value("/proc/meminfo", "MemAvailable:");
    uint64_t room = available_kib == unknown ? unknown : available_kib * 1024;
    std::ifstream self("/proc/self/cgroup");
    for (std::string line; std::getline(self, line);) {
        const size_t a = line.find(':'), b = line.find(':', a + 1);
        if (a == std::string::npos || b == std::string::npos) continue;
        const std::string controllers = line.substr(a + 1, b - a - 1);
        const bool v2 = line.compare(0, a, "0") == 0 && controllers.empty();
        if (!v2 && controllers.find("memory") == std::string::npos) continue;
        std::string path = line.substr(b + 1);
        if (path == "/") path.clear();
        room = std::min(room, cgroup_room((v2 ? "/sys/fs/cgroup" : "/sys/fs/cgroup/memory") + path, v2));
    }
    return room;
}

uint64_t memory_budget_bytes(int mem_budget_mib) {
    if (mem_budget_mib >= 0) return static_cast<uint64_t>(mem_budget_mib) << 20;
    const uint64_t room = committable_memory();
    return room == unknown ? 0 : room / 10 * 9;
}

}  // namespace strata::engine
