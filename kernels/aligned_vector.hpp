// Vectors on 64-byte boundaries, for activation rows: where a row is a multiple of 64 bytes long, every row
// starts on a cache line, so the float kernels' 64-byte loads are never split across two lines (a
// std::vector's data starts 16 bytes into one, which halved those kernels' speed).
#pragma once

#include <algorithm>
#include <cstddef>
#include <new>
#include <vector>

namespace strata {

template <class T>
struct cache_aligned_allocator {
    using value_type = T;
    static constexpr std::align_val_t alignment{64};

    cache_aligned_allocator() = default;
    template <class U>
    cache_aligned_allocator(const cache_aligned_allocator<U>&) noexcept {}
    T* allocate(std::size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), alignment)); }
    void deallocate(T* p, std::size_t) noexcept { ::operator delete(p, alignment); }
    template <class U>
    bool operator==(const cache_aligned_allocator<U>&) const noexcept { return true; }
};

template <class T>
using aligned_vector = std::vector<T, cache_aligned_allocator<T>>;

// Scratch that only grows: at least n elements, growing geometrically; returns its data.
template <class T, class A>
T* grown(std::vector<T, A>& v, std::size_t n) {
    if (v.size() < n) v.resize(std::max(n, v.size() * 2));
    return v.data();
}

}  // namespace strata
