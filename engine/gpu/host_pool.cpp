#include "gpu/host_pool.hpp"

#include <utility>

#include <spdlog/fmt/fmt.h>

#include "gpu/cuda_raii.hpp"

namespace strata::engine::gpu {

host_pool::host_pool(const arenas::hot_node* hot, std::size_t bytes, std::string name) {
    if (bytes == 0) return;
    const std::string what = fmt::format("cudaHostRegister of the {} ({:.1f} MiB)", name, double(bytes) / (1 << 20));
    buffer_ = hot ? hot->allocate_hot(bytes, std::move(name))
                  : arenas::placed_buffer(arenas::node_buffer(bytes, -1, {}), std::move(name), nullptr);
    check(cudaHostRegister(buffer_.data(), bytes, cudaHostRegisterDefault), what.c_str());
    registered_ = true;
}

host_pool::~host_pool() { unregister(); }

host_pool::host_pool(host_pool&& other) noexcept
    : buffer_(std::move(other.buffer_)), registered_(std::exchange(other.registered_, false)) {}

host_pool& host_pool::operator=(host_pool&& other) noexcept {
    if (this != &other) {
        unregister();
        buffer_ = std::move(other.buffer_);  // unmaps (and unlists) the old buffer, now unregistered
        registered_ = std::exchange(other.registered_, false);
    }
    return *this;
}

void host_pool::unregister() {
    if (registered_) cudaHostUnregister(buffer_.data());  // before the buffer is unmapped
    registered_ = false;
}

host_pool host_arrays::allocate(const arenas::hot_node* hot, std::string name) const {
    host_pool pool(hot, bytes_, std::move(name));
    for (const auto& assign : assign_) assign(pool.data());
    return pool;
}

}  // namespace strata::engine::gpu
