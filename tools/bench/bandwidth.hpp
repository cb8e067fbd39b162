// Memory read bandwidth, measured the way the figures it is compared with are: a STREAM-like sum over
// a buffer much larger than the caches, on a given number of threads, median over repeats.
#pragma once

#include <cstddef>
#include <vector>

namespace strata::bench {

// GB/s (1e9 bytes per second) reading `bytes` with `threads` threads; median of `repeats` runs.
double read_bandwidth_gbs(int threads, size_t bytes = size_t{512} << 20, int repeats = 5);

double median(std::vector<double> v);

}  // namespace strata::bench
