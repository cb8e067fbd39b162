#include "bandwidth.hpp"

#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <thread>

#include <immintrin.h>
#include <sys/mman.h>

#include "cpu/kernels.hpp"

namespace strata::bench {

namespace {

// The kernels' software prefetch distance, one prefetch per line.
constexpr int kPrefetchBytes = kernels::cpu::weight_prefetch_bytes;

// Sums 64-bit words with 8 independent accumulators (vectorised by the compiler for the baseline ISA).
uint64_t read_words_scalar(const uint64_t* p, size_t n, bool prefetch) {
    uint64_t acc[8] = {};
    for (size_t i = 0; i + 8 <= n; i += 8) {
        if (prefetch) _mm_prefetch(reinterpret_cast<const char*>(p + i) + kPrefetchBytes, _MM_HINT_T0);
        for (int k = 0; k < 8; ++k) acc[k] += p[i + k];
    }
    uint64_t s = 0;
    for (uint64_t a : acc) s += a;
    return s;
}

// The same sum with the vector loads the kernels use: the baseline's 16-byte loads read about 40 %
// less than a core can on some Xeons, which would flatter every ratio against this probe.
__attribute__((target("avx2"))) uint64_t read_words_avx2(const uint64_t* p, size_t n, bool prefetch) {
    __m256i a[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256()};
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        if (prefetch) {
            _mm_prefetch(reinterpret_cast<const char*>(p + i) + kPrefetchBytes, _MM_HINT_T0);
            _mm_prefetch(reinterpret_cast<const char*>(p + i) + kPrefetchBytes + 64, _MM_HINT_T0);
        }
        for (int k = 0; k < 4; ++k)
            a[k] = _mm256_add_epi64(a[k], _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 4 * k)));
    }
    const __m256i s = _mm256_add_epi64(_mm256_add_epi64(a[0], a[1]), _mm256_add_epi64(a[2], a[3]));
    alignas(32) uint64_t w[4];
    _mm256_store_si256(reinterpret_cast<__m256i*>(w), s);
    return w[0] + w[1] + w[2] + w[3] + read_words_scalar(p + i, n - i, false);
}

__attribute__((target("avx512f"))) uint64_t read_words_avx512(const uint64_t* p, size_t n, bool prefetch) {
    __m512i a[4] = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512()};
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        if (prefetch)
            for (int k = 0; k < 4; ++k)
                _mm_prefetch(reinterpret_cast<const char*>(p + i + 8 * k) + kPrefetchBytes, _MM_HINT_T0);
        for (int k = 0; k < 4; ++k) a[k] = _mm512_add_epi64(a[k], _mm512_loadu_si512(p + i + 8 * k));
    }
    const __m512i s = _mm512_add_epi64(_mm512_add_epi64(a[0], a[1]), _mm512_add_epi64(a[2], a[3]));
    alignas(64) uint64_t w[8];
    _mm512_store_si512(w, s);
    uint64_t sum = 0;
    for (uint64_t x : w) sum += x;
    return sum + read_words_scalar(p + i, n - i, false);
}

}  // namespace

uint64_t read_words(const uint64_t* p, size_t n, bool prefetch) {
    switch (kernels::cpu::active_isa()) {
        case kernels::cpu::isa::avx512: return read_words_avx512(p, n, prefetch);
        case kernels::cpu::isa::avx2: return read_words_avx2(p, n, prefetch);
        default: return read_words_scalar(p, n, prefetch);
    }
}

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

    // Rounds alternate a plain read and one with the kernels' software prefetch; the better median is the
    // baseline (as `strata-bench kernels` takes it): where the hardware prefetchers alone fall short, the
    // kernels read faster than a plain read would say memory can.
    std::barrier sync(threads + 1);
    std::vector<uint64_t> sink(static_cast<size_t>(threads));
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t)
        pool.emplace_back([&, t] {
            const size_t begin = n_words * static_cast<size_t>(t) / threads;
            const size_t end = n_words * static_cast<size_t>(t + 1) / threads;
            for (int r = 0; r < 2 * (repeats + 1); ++r) {  // one warm-up round each, then the timed ones
                sync.arrive_and_wait();
                sink[static_cast<size_t>(t)] += read_words(buf.get() + begin, end - begin, r % 2 == 1);
                sync.arrive_and_wait();
            }
        });
    std::vector<double> gbs[2];
    for (int r = 0; r < 2 * (repeats + 1); ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        sync.arrive_and_wait();
        sync.arrive_and_wait();
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (r >= 2) gbs[r % 2].push_back(double(bytes) / s / 1e9);
    }
    for (auto& th : pool) th.join();
    return std::max(median(gbs[0]), median(gbs[1]));
}

}  // namespace strata::bench
