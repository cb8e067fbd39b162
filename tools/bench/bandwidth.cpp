#include "bandwidth.hpp"

#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <thread>

#include <sys/mman.h>

namespace strata::bench {

namespace {

// Sums 64-bit words with 8 independent accumulators (vectorised by the compiler).
uint64_t read_words(const uint64_t* p, size_t n) {
    uint64_t acc[8] = {};
    for (size_t i = 0; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; ++k) acc[k] += p[i + k];
    uint64_t s = 0;
    for (uint64_t a : acc) s += a;
    return s;
}

}  // namespace

double median(std::vector<double> v) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

double read_bandwidth_gbs(int threads, size_t bytes, int repeats) {
    constexpr size_t kHugePage = size_t{2} << 20;
    bytes = (bytes + kHugePage - 1) / kHugePage * kHugePage;
    std::unique_ptr<uint64_t, decltype(&std::free)> buf(static_cast<uint64_t*>(std::aligned_alloc(kHugePage, bytes)),
                                                        &std::free);
    if (!buf) throw std::bad_alloc();
    madvise(buf.get(), bytes, MADV_HUGEPAGE);
    const size_t n_words = bytes / sizeof(uint64_t);
    for (size_t i = 0; i < n_words; ++i) buf.get()[i] = i;

    std::barrier sync(threads + 1);
    std::vector<uint64_t> sink(static_cast<size_t>(threads));
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t)
        pool.emplace_back([&, t] {
            const size_t begin = n_words * static_cast<size_t>(t) / threads;
            const size_t end = n_words * static_cast<size_t>(t + 1) / threads;
            for (int r = 0; r <= repeats; ++r) {  // one warm-up round, then the timed ones
                sync.arrive_and_wait();
                sink[static_cast<size_t>(t)] += read_words(buf.get() + begin, end - begin);
                sync.arrive_and_wait();
            }
        });
    std::vector<double> gbs;
    for (int r = 0; r <= repeats; ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        sync.arrive_and_wait();
        sync.arrive_and_wait();
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (r > 0) gbs.push_back(double(bytes) / s / 1e9);
    }
    for (auto& th : pool) th.join();
    return median(gbs);
}

}  // namespace strata::bench
