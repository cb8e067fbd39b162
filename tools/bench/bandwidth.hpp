// Memory read bandwidth, measured the way the figures it is compared with are: a STREAM-like sum over
// a buffer much larger than the caches, on a given number of threads, median over repeats.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace strata::bench {

// The sum of n 64-bit words, read with the vector loads of the kernels' ISA (the baseline's 16-byte
// loads read 40-50 % less on some Xeons, which would flatter every ratio against them), optionally
// with the kernels' software prefetch.
uint64_t read_words(const uint64_t* p, size_t n, bool prefetch = false);

// GB/s (1e9 bytes per second) reading `bytes` with `threads` threads: the better of the medians of
// `repeats` plain reads and `repeats` reads with the kernels' software prefetch.
double read_bandwidth_gbs(int threads, size_t bytes = size_t{512} << 20, int repeats = 5);

double median(std::vector<double> v);

}  // namespace strata::bench
