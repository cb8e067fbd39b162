#include "hot_node.hpp"

#include <charconv>
#include <stdexcept>
#include <utility>

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

placed_buffer::placed_buffer(node_buffer buffer, std::string name, region_map* regions)
    : buffer_(std::move(buffer)), regions_(regions) {
    if (regions_) regions_->add({std::move(name), reinterpret_cast<std::uintptr_t>(buffer_.data()), buffer_.size(), buffer_.node()});
}

placed_buffer::~placed_buffer() {
    if (regions_ && buffer_.data()) regions_->remove(reinterpret_cast<std::uintptr_t>(buffer_.data()));
}

placed_buffer::placed_buffer(placed_buffer&& other) noexcept { *this = std::move(other); }

placed_buffer& placed_buffer::operator=(placed_buffer&& other) noexcept {
    if (this != &other) {
        if (regions_ && buffer_.data()) regions_->remove(reinterpret_cast<std::uintptr_t>(buffer_.data()));
        buffer_ = std::move(other.buffer_);
        regions_ = std::exchange(other.regions_, nullptr);
    }
    return *this;
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
    logger("arenas")->info("NUMA hot node {}: the resident complement and the pinned host pools go to node {}, "
                           "conversation snapshots to {}.", node_, node_,
                           cold_ >= 0 ? "node " + std::to_string(cold_) : std::string("anonymous memory (no other node)"));
}

std::unique_ptr<node_buffer> hot_node::claim_complement(std::size_t bytes) const {
    if (!active()) return nullptr;
    check_node_room(node_, bytes, std::nullopt);
    return std::make_unique<node_buffer>(bytes, node_, hot_cpus_, first_touch::pinned);
}

placed_buffer hot_node::allocate_on(int node, std::size_t bytes, std::string name) const {
    // node < 0: no binding and no NUMA system call; the caller's thread touches the pages.
    const std::vector<int> none;
    return placed_buffer(node_buffer(bytes, node, node == node_ ? hot_cpus_ : node == cold_ ? cold_cpus_ : none),
                         std::move(name), regions_);
}

placed_buffer hot_node::allocate_hot(std::size_t bytes, std::string name) const {
    return allocate_on(active() ? node_ : -1, bytes, std::move(name));
}

placed_buffer hot_node::allocate_cold(std::size_t bytes, std::string name) const {
    return allocate_on(active() ? cold_ : -1, bytes, std::move(name));
}

}  // namespace strata::arenas
