#include "fma_peak.hpp"

#include <immintrin.h>

#include <algorithm>
#include <chrono>

#include "cpu/kernels.hpp"

namespace strata::bench {
namespace {

namespace cpu = kernels::cpu;
using clock_type = std::chrono::steady_clock;

// Independent chains per ISA: enough to cover the FMA latency on two pipes, few enough that the chains
// and the two operands stay in registers (AVX2 has 16 ymm; 16 chains spilled two of them and halved
// the figure).
constexpr int kChains512 = 16, kChains256 = 12;
constexpr long kFmaSteps = 4000000;
// Read at run time, so the compiler can neither fold the chains nor keep them out of registers.
volatile float fma_x = 0.9999f, fma_y = 0.0001f;

template <class Run>
double best_gflops(int lanes, int chains, Run run) {
    double best = 1e30;
    for (int rep = 0; rep < 5; ++rep) {
        const auto t0 = clock_type::now();
        run();
        best = std::min(best, std::chrono::duration<double>(clock_type::now() - t0).count());
    }
    return 2.0 * lanes * chains * static_cast<double>(kFmaSteps) / best / 1e9;
}

__attribute__((target("avx512f"))) float fma_chains_avx512() {
    __m512 a[kChains512];
    for (int i = 0; i < kChains512; ++i) a[i] = _mm512_set1_ps(0.001f * static_cast<float>(i));
    const __m512 x = _mm512_set1_ps(fma_x), y = _mm512_set1_ps(fma_y);
    for (long n = 0; n < kFmaSteps; ++n)
        for (auto& v : a) v = _mm512_fmadd_ps(v, x, y);
    float lanes[16], sum = 0;
    for (const auto& v : a) {
        _mm512_storeu_ps(lanes, v);
        sum += lanes[0];
    }
    return sum;
}

__attribute__((target("avx2,fma"))) float fma_chains_avx2() {
    __m256 a[kChains256];
    for (int i = 0; i < kChains256; ++i) a[i] = _mm256_set1_ps(0.001f * static_cast<float>(i));
    const __m256 x = _mm256_set1_ps(fma_x), y = _mm256_set1_ps(fma_y);
    for (long n = 0; n < kFmaSteps; ++n)
        for (auto& v : a) v = _mm256_fmadd_ps(v, x, y);
    float lanes[8], sum = 0;
    for (const auto& v : a) {
        _mm256_storeu_ps(lanes, v);
        sum += lanes[0];
    }
    return sum;
}

}  // namespace

double fma_peak_gflops() {
    switch (cpu::active_isa()) {
        case cpu::isa::avx512: return best_gflops(16, kChains512, [] { volatile float keep = fma_chains_avx512(); (void)keep; });
        case cpu::isa::avx2: return best_gflops(8, kChains256, [] { volatile float keep = fma_chains_avx2(); (void)keep; });
        default: return 0;  // the scalar kernels have no FMA bound worth printing
    }
}

}  // namespace strata::bench
