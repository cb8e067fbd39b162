#include "hot_node.hpp"

#include <charconv>
#include <stdexcept>
#include <utility>

#include <spdlog/fmt/fmt.h>

#include "log.hpp"

namespace strata::arenas {

namespace {

std::vector<int> cpus_of(const numa_node& n) {
    std::vector<int> out;
    for (const auto& c : n.cores) out.push_back(c.cpu);
    return out;
}

}  // namespace

std::optional<int> parse_hot_node(std::string_view value) {
    if (value.empty() || value == "off") return std::nullopt;
    int node = -1;
    auto [ptr, ec] = std::from_chars(value.data(), value.data() + value.size(), node);
    if (ec != std::errc() || ptr != value.data() + value.size() || node < 0)
        throw std::invalid_argument("--numa-hot-node '" + std::string(value) + "' must be a NUMA node number or 'off'");
    return node;
}

placed_buffer::placed_buffer(node_buffer buffer, std::string name, region_map* regions, placed_tally* tally)
    : buffer_(std::move(buffer)), regions_(regions), tally_(buffer_.bound() ? tally : nullptr) {
    if (regions_) regions_->add({std::move(name), reinterpret_cast<std::uintptr_t>(buffer_.data()), buffer_.size(), buffer_.node()});
    if (tally_) {
        tally_->bytes += buffer_.size();
        ++tally_->buffers;
    }
}

placed_buffer::~placed_buffer() { unlist(); }

placed_buffer::placed_buffer(placed_buffer&& other) noexcept { *this = std::move(other); }

placed_buffer& placed_buffer::operator=(placed_buffer&& other) noexcept {
    if (this != &other) {
        unlist();
        buffer_ = std::move(other.buffer_);
        regions_ = std::exchange(other.regions_, nullptr);
        tally_ = std::exchange(other.tally_, nullptr);
    }
    return *this;
}

void placed_buffer::unlist() {
    if (!buffer_.data()) return;
    if (regions_) regions_->remove(reinterpret_cast<std::uintptr_t>(buffer_.data()));
    if (tally_) {
        tally_->bytes -= buffer_.size();
        --tally_->buffers;
    }
    regions_ = nullptr;
    tally_ = nullptr;
}

hot_node::hot_node(std::optional<int> node, const topology& topo, region_map* regions) : regions_(regions) {
    if (!node) return;
    const numa_node* hot = topo.find_node(*node);
    if (!hot) throw std::invalid_argument("--numa-hot-node " + std::to_string(*node) + ": this machine has no NUMA node " +
                                          std::to_string(*node) + " (" + topo.describe() + ")");
    node_ = *node;
    hot_cpus_ = cpus_of(*hot);
    for (const auto& n : topo.nodes)
        if (n.os_index != node_ && n.memory_total > 0) {
            cold_ = n.os_index;
            cold_cpus_ = cpus_of(n);
            break;
        }
}

std::unique_ptr<node_buffer> hot_node::claim_complement(std::size_t bytes, std::uint64_t headroom_bytes) const {
    if (!active()) return nullptr;
    require_node_room(node_, bytes, std::nullopt, headroom_bytes, "the resident complement of routed experts",
                      "Free memory on that node, or pass --numa-hot-node with another node or off.");
    auto claimed = std::make_unique<node_buffer>(bytes, node_, hot_cpus_, first_touch::pinned);
    if (claimed->bound()) complement_bytes_ += bytes;
    return claimed;
}

placed_buffer hot_node::allocate_on(int node, std::size_t bytes, std::string name, placed_tally* tally) const {
    // node < 0: no binding and no NUMA system call; the caller's thread touches the pages.
    const std::vector<int> none;
    return placed_buffer(node_buffer(bytes, node, node == node_ ? hot_cpus_ : node == cold_ ? cold_cpus_ : none),
                         std::move(name), regions_, tally);
}

placed_buffer hot_node::allocate_hot(std::size_t bytes, std::string name) const {
    return allocate_on(active() ? node_ : -1, bytes, std::move(name), &hot_pools_);
}

placed_buffer hot_node::allocate_cold(std::size_t bytes, std::string name) const {
    return allocate_on(active() ? cold_ : -1, bytes, std::move(name));
}

std::string hot_node::describe_placed() const {
    if (!active()) return {};
    const auto mib = [](std::uint64_t b) { return static_cast<double>(b) / (1 << 20); };
    std::vector<std::string> moved;
    if (complement_bytes_ > 0) moved.push_back(fmt::format("the resident complement ({:.1f} MiB)", mib(complement_bytes_)));
    if (const int pools = hot_pools_.buffers; pools > 0)
        moved.push_back(fmt::format("{} pinned host pool{} ({:.1f} MiB)", pools, pools == 1 ? "" : "s",
                                    mib(hot_pools_.bytes)));
    const std::string what = moved.empty() ? fmt::format("nothing is bound to node {}", node_)
                             : moved.size() == 1
                                 ? fmt::format("{} is bound to node {}", moved[0], node_)
                                 : fmt::format("{} and {} are bound to node {}", moved[0], moved[1], node_);
    const std::string cold = cold_ >= 0 ? fmt::format("node {}", cold_) : "anonymous memory (no other node)";
    return fmt::format("NUMA hot node {}: {}; conversation snapshots go to {}.", node_, what, cold);
}

}  // namespace strata::arenas
