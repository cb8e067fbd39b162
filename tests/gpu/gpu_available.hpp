// GPU tests skip, with the reason, where no CUDA device answers (CI, laptops).
#pragma once

#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <string>

namespace strata::test {

// Empty when a device is usable, else why not.
inline std::string gpu_unavailable() {
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) return std::string("no usable CUDA device: ") + cudaGetErrorString(e);
    if (n == 0) return "no CUDA device is present";
    return {};
}

}  // namespace strata::test

#define STRATA_REQUIRE_GPU()                                                   \
    do {                                                                       \
        if (const std::string why = ::strata::test::gpu_unavailable(); !why.empty()) \
            GTEST_SKIP() << "GPU test skipped: " << why;                       \
    } while (0)
