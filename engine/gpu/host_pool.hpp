// Internal to the CUDA backend: the pinned host memory of the GPU path (the stream manager's staging,
// the host copies the forward pass streams, the expert copier's staging ring). Each pool comes from
// hot_node::allocate_hot: mapped, bound to the hot node and first touched by a thread on it under
// --numa-hot-node (anonymous memory, and not one NUMA system call, when off), listed in the region map
// so placement-report --pid sees it; then page-locked with cudaHostRegister so copies from and to it
// run asynchronously. The destructor unregisters it before the memory is unmapped.
#pragma once

#include <cstddef>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "hot_node.hpp"

namespace strata::engine::gpu {

// Move-only. The owner makes sure no copy still uses the pool when it is destroyed.
class host_pool {
public:
    host_pool() = default;
    // hot nullptr: anonymous memory, listed nowhere (as --numa-hot-node off without a region map).
    // Throws std::runtime_error naming the pool and CUDA's message when cudaHostRegister fails.
    host_pool(const arenas::hot_node* hot, std::size_t bytes, std::string name);
    ~host_pool();
    host_pool(host_pool&& other) noexcept;
    host_pool& operator=(host_pool&& other) noexcept;

    std::byte* data() const { return buffer_.data(); }
    std::size_t size() const { return buffer_.size(); }
    int node() const { return buffer_.node(); }  // -1: not bound
    bool bound() const { return buffer_.bound(); }

private:
    void unregister();

    arenas::placed_buffer buffer_;
    bool registered_ = false;
};

// One host_pool cut into typed arrays, each 256-byte aligned: name the arrays, then allocate once.
//   host_arrays a;
//   a.add(h_xn_, t * n_embd).add(h_ids_, t * k);
//   pool_ = a.allocate(hot, "GPU MoE staging");  // h_xn_ and h_ids_ now point into pool_
class host_arrays {
public:
    template <class T>
    host_arrays& add(std::span<T>& array, std::size_t n) {
        const std::size_t offset = (bytes_ + kAlign - 1) / kAlign * kAlign;
        bytes_ = offset + n * sizeof(T);
        assign_.push_back([&array, offset, n](std::byte* base) { array = {reinterpret_cast<T*>(base + offset), n}; });
        return *this;
    }
    std::size_t bytes() const { return bytes_; }
    // The arrays point into the returned pool from here on.
    host_pool allocate(const arenas::hot_node* hot, std::string name) const;

private:
    static constexpr std::size_t kAlign = 256;
    std::size_t bytes_ = 0;
    std::vector<std::function<void(std::byte*)>> assign_;
};

}  // namespace strata::engine::gpu
