// The single-precision FMA peak of one thread: what caps attention at small GQA groups, where every KV
// byte read feeds several FMAs (the benchmarks print it beside the read bandwidth).
#pragma once

namespace strata::bench {

// GFLOP/s of one thread on the CPU kernels' active ISA (AVX-512 or AVX2 FMAs; 0 on the scalar path):
// independent FMA chains, no memory, best of 5 runs of about 30 ms.
double fma_peak_gflops();

}  // namespace strata::bench
