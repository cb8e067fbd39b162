#include "placement_audit.hpp"

#include <algorithm>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

namespace strata::arenas {

namespace {

std::string read_all(const std::string& path) {
    std::ifstream in(path);
    if (!in) throw std::runtime_error("cannot read " + path);
    std::ostringstream out;
    out << in.rdbuf();
    return out.str();
}

struct vma {
    std::uintptr_t start = 0, end = 0;
    std::uint64_t offset = 0;  // in the file
    std::string path;          // the mapped file ("/..."), else empty
};

std::vector<vma> parse_maps(const std::string& text) {
    std::vector<vma> out;
    std::istringstream lines(text);
    std::string line;
    while (std::getline(lines, line)) {
        vma v;
        char dash = 0;
        std::string perms, dev;
        unsigned long inode = 0;
        std::istringstream fields(line);
        fields >> std::hex >> v.start >> dash >> v.end >> perms >> v.offset >> dev >> std::dec >> inode;
        if (!fields || dash != '-') continue;
        std::getline(fields >> std::ws, v.path);
        if (!v.path.starts_with("/") || v.path.ends_with(" (deleted)")) v.path.clear();
        out.push_back(std::move(v));
    }
    return out;
}

// Bytes of [offset, offset + n) of the file in the page cache (mincore over a mapping of our own:
// residency belongs to the file, not to the process that maps it). 0 when the file cannot be mapped.
std::size_t file_resident_bytes(const std::string& path, std::uint64_t offset, std::size_t n) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    const auto page = static_cast<std::uint64_t>(sysconf(_SC_PAGESIZE));
    const std::uint64_t begin = offset / page * page, end = (offset + n + page - 1) / page * page;
    std::size_t resident = 0;
    void* p = mmap(nullptr, end - begin, PROT_READ, MAP_SHARED, fd, static_cast<off_t>(begin));
    if (p != MAP_FAILED) {
        std::vector<unsigned char> in((end - begin) / page);
        if (mincore(p, end - begin, in.data()) == 0)
            for (unsigned char c : in) resident += (c & 1u) ? page : 0;
        munmap(p, end - begin);
    }
    ::close(fd);
    return std::min(resident, n);
}

}  // namespace

std::vector<numa_maps_entry> parse_numa_maps(const std::string& text) {
    std::vector<numa_maps_entry> out;
    std::istringstream lines(text);
    std::string line;
    while (std::getline(lines, line)) {
        std::istringstream fields(line);
        numa_maps_entry e;
        fields >> std::hex >> e.start >> std::dec;
        if (!fields) continue;
        std::string token;
        while (fields >> token) {
            if (token.size() < 3 || token[0] != 'N' || token.find('=') == std::string::npos) continue;
            const auto eq = token.find('=');
            const std::string node_text = token.substr(1, eq - 1);
            if (node_text.empty() || !std::all_of(node_text.begin(), node_text.end(), ::isdigit)) continue;
            const auto node = static_cast<std::size_t>(std::stoul(node_text));
            if (node >= e.pages_per_node.size()) e.pages_per_node.resize(node + 1);
            e.pages_per_node[node] += static_cast<std::size_t>(std::stoull(token.substr(eq + 1)));
        }
        out.push_back(std::move(e));
    }
    return out;
}

std::vector<region_audit> audit_regions(int pid, const std::vector<region>& regions, double threshold) {
    const std::string proc = "/proc/" + std::to_string(pid);
    const auto vmas = parse_maps(read_all(proc + "/maps"));
    std::map<std::uintptr_t, std::vector<std::size_t>> pages_at;
    for (auto& e : parse_numa_maps(read_all(proc + "/numa_maps"))) pages_at[e.start] = std::move(e.pages_per_node);

    std::vector<region_audit> out;
    for (const auto& r : regions) {
        region_audit a;
        a.where = r;
        const std::uintptr_t end = r.address + r.bytes;
        // NOTE: numa_maps counts whole VMAs; a VMA reaching beyond the region counts all its pages.
        // strata's node-bound buffers are their own VMAs (their mbind policy keeps them unmerged).
        for (const auto& v : vmas) {
            if (v.end <= r.address || v.start >= end) continue;
            if (!v.path.empty()) {  // file-backed: the page cache holds it, wherever the kernel chose
                const std::uintptr_t from = std::max(r.address, v.start), to = std::min(end, v.end);
                a.file = v.path;
                a.file_resident_bytes += file_resident_bytes(v.path, v.offset + (from - v.start), to - from);
            }
            auto it = pages_at.find(v.start);
            if (it == pages_at.end()) continue;
            if (it->second.size() > a.pages_per_node.size()) a.pages_per_node.resize(it->second.size());
            for (std::size_t n = 0; n < it->second.size(); ++n) a.pages_per_node[n] += it->second[n];
        }
        for (auto p : a.pages_per_node) a.pages += p;
        if (a.pages > 0 && r.node >= 0 && static_cast<std::size_t>(r.node) < a.pages_per_node.size())
            a.local_share = static_cast<double>(a.pages_per_node[static_cast<std::size_t>(r.node)]) / static_cast<double>(a.pages);
        a.ok = r.node < 0 || a.local_share >= threshold;
        out.push_back(std::move(a));
    }
    return out;
}

}  // namespace strata::arenas
