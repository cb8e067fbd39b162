// Raw NUMA system calls (no libnuma link), counted. On non-Linux builds every call is ENOSYS.
#include "numa_policy.hpp"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <string>
#include <string_view>
#include <new>
#include <thread>
#include <utility>

#include "log.hpp"

#ifdef __linux__
#include <sched.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace strata::arenas {

namespace {

// From <linux/mempolicy.h>; spelled out so no libnuma header is needed.
constexpr int mpol_bind = 2;
constexpr unsigned mpol_mf_strict = 1u << 0;
constexpr unsigned mpol_mf_move = 1u << 1;
constexpr unsigned long mpol_f_node = 1ul << 0;
constexpr unsigned long mpol_f_addr = 1ul << 1;
constexpr std::size_t max_nodes = 1024;  // nodemask width in bits
constexpr std::size_t page_bytes = 4096;

std::atomic<std::uint64_t> n_mbind{0}, n_get_mempolicy{0}, n_move_pages{0};

struct nodemask {
    unsigned long bits[max_nodes / (8 * sizeof(unsigned long))] = {};
    explicit nodemask(int node) {
        bits[static_cast<std::size_t>(node) / (8 * sizeof(unsigned long))] |= 1ul << (node % (8 * sizeof(unsigned long)));
    }
};

int result(long rc) { return rc == 0 ? 0 : errno; }

}  // namespace

numa_call_counts numa_calls() {
    return {n_mbind.load(), n_get_mempolicy.load(), n_move_pages.load()};
}

#ifdef __linux__

bool numa_policy_available() { return true; }

int bind_memory(void* addr, std::size_t bytes, int node) {
    if (node < 0 || static_cast<std::size_t>(node) >= max_nodes) return EINVAL;
    nodemask mask(node);
    ++n_mbind;
    return result(syscall(SYS_mbind, addr, bytes, mpol_bind, mask.bits, max_nodes + 1, mpol_mf_strict | mpol_mf_move));
}

int node_of_address(const void* addr) {
    int node = -1;
    ++n_get_mempolicy;
    if (syscall(SYS_get_mempolicy, &node, nullptr, 0, addr, mpol_f_node | mpol_f_addr) != 0) return -errno;
    return node;
}

page_placement sample_page_placement(const void* addr, std::size_t bytes, std::size_t max_samples) {
    page_placement out;
    const auto begin = reinterpret_cast<std::uintptr_t>(addr) & ~(page_bytes - 1);
    const std::size_t n_pages = (reinterpret_cast<std::uintptr_t>(addr) + bytes - begin + page_bytes - 1) / page_bytes;
    const std::size_t n = std::min(n_pages, std::max<std::size_t>(1, max_samples));
    if (bytes == 0) return out;
    std::vector<void*> pages(n);
    std::vector<int> status(n, -1);
    for (std::size_t i = 0; i < n; ++i)
        pages[i] = reinterpret_cast<void*>(begin + (i * n_pages / n) * page_bytes);
    ++n_move_pages;
    out.sampled = n;
    if (syscall(SYS_move_pages, 0, n, pages.data(), nullptr, status.data(), 0) != 0) {
        out.error = errno;
        out.absent = n;
        return out;
    }
    for (int s : status) {
        if (s < 0) { ++out.absent; continue; }
        if (static_cast<std::size_t>(s) >= out.pages_per_node.size()) out.pages_per_node.resize(static_cast<std::size_t>(s) + 1);
        ++out.pages_per_node[static_cast<std::size_t>(s)];
    }
    return out;
}

namespace {

void touch_pages(std::byte* p, std::size_t bytes) {
    for (std::size_t off = 0; off < bytes; off += page_bytes) p[off] = std::byte{0};
}

// First touch from a thread pinned to the node's CPUs (the mbind already decides the node; touching
// there also puts the page tables and any fallback allocation on the node).
void first_touch_on(std::byte* p, std::size_t bytes, const std::vector<int>& cpus, int node) {
    if (cpus.empty()) { touch_pages(p, bytes); return; }
    std::thread toucher([&] {
        cpu_set_t set;
        CPU_ZERO(&set);
        for (int cpu : cpus) CPU_SET(cpu, &set);
        if (sched_setaffinity(0, sizeof(set), &set) != 0)
            logger("arenas")->warn("Pinning the first-touch thread to node {}'s {} CPU(s) failed (errno {}); "
                                   "the buffer is touched unpinned.", node, cpus.size(), errno);
        touch_pages(p, bytes);
    });
    toucher.join();
}

}  // namespace

std::byte* map_huge_aligned(std::size_t bytes) {
    // Over-map by one huge page and trim, so the mapping starts on a 2 MiB boundary.
    const std::size_t span = bytes + huge_page_bytes;
    void* raw = mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) throw std::bad_alloc();
    const auto start = reinterpret_cast<std::uintptr_t>(raw);
    const auto aligned = (start + huge_page_bytes - 1) & ~(huge_page_bytes - 1);
    if (aligned > start) munmap(raw, aligned - start);
    const std::size_t tail = start + span - (aligned + bytes);
    if (tail > 0) munmap(reinterpret_cast<void*>(aligned + bytes), tail);
    auto* data = reinterpret_cast<std::byte*>(aligned);
    madvise(data, bytes, MADV_HUGEPAGE);  // advisory; fails harmlessly when THP is disabled
    return data;
}

void unmap_huge_aligned(std::byte* data, std::size_t bytes) {
    if (data) munmap(data, bytes);
}

node_buffer::node_buffer(std::size_t bytes, int node, const std::vector<int>& node_cpus, first_touch touch)
    : bytes_(bytes), node_(node) {
    mapped_ = std::max(huge_page_bytes, (bytes + huge_page_bytes - 1) / huge_page_bytes * huge_page_bytes);
    data_ = map_huge_aligned(mapped_);

    if (node_ >= 0) {
        const int err = bind_memory(data_, mapped_, node_);
        bound_ = (err == 0);
        if (!bound_)
            logger("arenas")->warn("Binding a {:.1f} MiB buffer to NUMA node {} failed (mbind errno {}: {}); "
                                   "it stays where first touch puts it.",
                                   static_cast<double>(mapped_) / (1 << 20), node_, err, std::strerror(err));
    }
    if (touch == first_touch::pinned) first_touch_on(data_, mapped_, node_cpus, node_);
}

#else  // not Linux: no NUMA calls, plain allocations

bool numa_policy_available() { return false; }
int bind_memory(void*, std::size_t, int) { return ENOSYS; }
int node_of_address(const void*) { return -ENOSYS; }
page_placement sample_page_placement(const void*, std::size_t, std::size_t) {
    page_placement out;
    out.error = ENOSYS;
    return out;
}

std::byte* map_huge_aligned(std::size_t bytes) {
    auto* data = static_cast<std::byte*>(::operator new(bytes, std::align_val_t(huge_page_bytes)));
    std::memset(data, 0, bytes);
    return data;
}

void unmap_huge_aligned(std::byte* data, std::size_t) {
    if (data) ::operator delete(data, std::align_val_t(huge_page_bytes));
}

node_buffer::node_buffer(std::size_t bytes, int node, const std::vector<int>&, first_touch) : bytes_(bytes), node_(node) {
    mapped_ = std::max(huge_page_bytes, (bytes + huge_page_bytes - 1) / huge_page_bytes * huge_page_bytes);
    data_ = map_huge_aligned(mapped_);
}

#endif

void node_buffer::release() {
    unmap_huge_aligned(data_, mapped_);
    data_ = nullptr;
}

node_buffer::~node_buffer() { release(); }

node_buffer::node_buffer(node_buffer&& other) noexcept { *this = std::move(other); }

node_buffer& node_buffer::operator=(node_buffer&& other) noexcept {
    if (this != &other) {
        release();
        data_ = std::exchange(other.data_, nullptr);
        bytes_ = std::exchange(other.bytes_, 0);
        mapped_ = std::exchange(other.mapped_, 0);
        node_ = std::exchange(other.node_, -1);
        bound_ = std::exchange(other.bound_, false);
    }
    return *this;
}

std::optional<std::uint64_t> node_memory_available(int node) {
    std::ifstream in("/sys/devices/system/node/node" + std::to_string(node) + "/meminfo");
    if (!in) return std::nullopt;
    // "Node 0 MemFree:         1234567 kB"
    constexpr std::string_view counted[] = {"MemFree:", "Active(file):", "Inactive(file):", "SReclaimable:"};
    std::uint64_t kib = 0;
    int found = 0;
    std::string line;
    while (std::getline(in, line))
        for (const auto key : counted)
            if (const auto at = line.find(key); at != std::string::npos) {
                kib += std::stoull(line.substr(at + key.size()));
                ++found;
            }
    if (found == 0) return std::nullopt;
    return kib * 1024;
}

void require_node_room(int node, std::uint64_t share_bytes, std::optional<std::uint64_t> available,
                       std::uint64_t headroom_bytes, std::string_view what, std::string_view remedy) {
    if (!available) available = node_memory_available(node);
    if (!available || *available >= share_bytes + headroom_bytes) return;
    constexpr double gib = double(std::uint64_t{1} << 30);
    throw node_room_error(fmt::format(
        "NUMA node {} has {:.2f} GiB available (free memory and reclaimable page cache), {} needs {:.2f} GiB there "
        "plus {:.2f} GiB kept free; memory bound to a full node ends in an out-of-memory kill, so nothing was placed. {}",
        node, static_cast<double>(*available) / gib, what, static_cast<double>(share_bytes) / gib,
        static_cast<double>(headroom_bytes) / gib, remedy));
}

double page_placement::share_on(int node) const {
    if (present() == 0 || node < 0 || static_cast<std::size_t>(node) >= pages_per_node.size()) return 0.0;
    return static_cast<double>(pages_per_node[static_cast<std::size_t>(node)]) / static_cast<double>(present());
}

}  // namespace strata::arenas
