// The CUDA emulator itself (STRATA_CUDA=EMU builds only): kernels run with real block and warp
// cooperation, streams run concurrently and events order them, and the checks that stand in for a
// GPU's failures (launch limits, host pointers, copy ranges, memory capacity, broken shuffles, a
// barrier reached from two places) fail the call with CUDA's error codes; shared memory starts as NaN
// bytes in every block and threads run in a shuffled order between barriers.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <numeric>
#include <thread>
#include <vector>

#include "common.cuh"
#include "gpu/cuda_raii.hpp"

namespace strata::kernels::cuda {
namespace {

using detail::kWarp;
using engine::gpu::device_buffer;
using engine::gpu::event;
using engine::gpu::stream;

// out[blockIdx.x] = sum of in[blockIdx.x * blockDim.x + threadIdx.x] over the block, by
// detail::block_sum (shared memory, __syncthreads and warp shuffles).
__global__ void block_sums(const float* in, float* out) {
    __shared__ float shared[kWarp];
    const float v = in[blockIdx.x * blockDim.x + threadIdx.x];
    const float s = detail::block_sum(v, shared);
    if (threadIdx.x == 0) out[blockIdx.x] = s;
}

// out[i] = in[i] + 1, after thread 0 of block 0 slept `ms` (a slow kernel).
__global__ void slow_increment(const int* in, int* out, int n, int ms) {
    if (blockIdx.x == 0 && threadIdx.x == 0) std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    __syncthreads();
    const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
    if (i < n) out[i] = in[i] + 1;
}

// Lanes 16..31 leave before the others shuffle with the full mask: undefined on a GPU.
__global__ void broken_shuffle(float* out) {
    if (threadIdx.x >= 16) return;
    out[threadIdx.x] = detail::warp_sum(1.0f);
}

// out[blockIdx.x] = what thread 0 reads from shared memory before any thread of the block wrote it;
// then every thread writes its slot (which a later block must not see).
__global__ void read_shared_first(float* out) {
    __shared__ float shared[kWarp];
    if (threadIdx.x == 0) out[blockIdx.x] = shared[0];
    __syncthreads();
    shared[threadIdx.x % kWarp] = 1.0f;
}

// order[k] = the thread that ran k-th up to the kernel's first barrier (fibers run one at a time).
__global__ void record_order(int* order, int* counter) {
    order[(*counter)++] = static_cast<int>(threadIdx.x);
    __syncthreads();
}

// Half the block waits at one __syncthreads, half at another: undefined on a GPU.
__global__ void split_barrier(float* out) {
    if (threadIdx.x < 16) {
        __syncthreads();
    } else {
        __syncthreads();
    }
    out[threadIdx.x] = 1.0f;
}

template <class T>
std::vector<T> download(const device_buffer<T>& d) {
    std::vector<T> v(d.size());
    EXPECT_EQ(cudaMemcpy(v.data(), d.data(), d.bytes(), cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
}

TEST(CudaEmulator, BlockReductionsAndShufflesRunAsWritten) {
    for (const unsigned threads : {32u, 96u, 256u, 1024u}) {
        const unsigned blocks = 3;
        std::vector<float> in(size_t{blocks} * threads);
        std::iota(in.begin(), in.end(), 1.0f);
        device_buffer<float> d_in(in.size()), d_out(blocks);
        ASSERT_EQ(cudaMemcpy(d_in.data(), in.data(), d_in.bytes(), cudaMemcpyHostToDevice), cudaSuccess);
        STRATA_LAUNCH(block_sums, blocks, threads, nullptr)(d_in.data(), d_out.data());
        ASSERT_EQ(cudaGetLastError(), cudaSuccess);
        const std::vector<float> out = download(d_out);
        for (unsigned b = 0; b < blocks; ++b) {
            const double first = double(b) * threads + 1, last = first + threads - 1;
            EXPECT_DOUBLE_EQ(out[b], (first + last) * threads / 2) << threads << " threads, block " << b;
        }
    }
}

TEST(CudaEmulator, StreamsRunConcurrentlyAndEventsOrderThem) {
    const int n = 256;
    std::vector<int> host(n, 41);
    device_buffer<int> a(n), b(n), c(n);
    ASSERT_EQ(cudaMemcpy(a.data(), host.data(), a.bytes(), cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemset(b.data(), 0, b.bytes()), cudaSuccess);
    const stream s1 = stream::create(), s2 = stream::create();
    const event done = event::create();
    // s1: a slow kernel writes b = 42. s2 copies b to c only after `done`.
    STRATA_LAUNCH(slow_increment, 1, n, s1.get())(a.data(), b.data(), n, 1000);
    done.record(s1);
    ASSERT_EQ(cudaStreamWaitEvent(s2, done, 0), cudaSuccess);
    ASSERT_EQ(cudaMemcpyAsync(c.data(), b.data(), c.bytes(), cudaMemcpyDeviceToDevice, s2), cudaSuccess);
    // Meanwhile the host sees the slow kernel still running: the event is not complete.
    EXPECT_EQ(cudaEventQuery(done), cudaErrorNotReady);
    s2.synchronize();
    EXPECT_EQ(cudaEventQuery(done), cudaSuccess);
    for (int v : download(c)) ASSERT_EQ(v, 42);
}

TEST(CudaEmulator, LaunchChecksFailWithCudaErrors) {
    device_buffer<float> out(64);
    std::vector<float> host(64 * 1024);
    STRATA_LAUNCH(block_sums, 1, 2048, nullptr)(out.data(), out.data());  // more than 1024 threads
    EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // read and cleared
    STRATA_LAUNCH(block_sums, dim3(1, 70000), 32, nullptr)(out.data(), out.data());  // grid.y above 65535
    EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
    STRATA_LAUNCH(block_sums, 1, 32, nullptr)(host.data(), out.data());  // a host pointer as argument
    EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

TEST(CudaEmulator, CopiesMustMatchTheirAllocations) {
    device_buffer<uint8_t> d(100);
    std::vector<uint8_t> h(200, 7);
    EXPECT_EQ(cudaMemcpy(d.data(), h.data(), 100, cudaMemcpyHostToDevice), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(d.data(), h.data(), 101, cudaMemcpyHostToDevice), cudaErrorInvalidValue);  // past the end
    EXPECT_EQ(cudaMemcpy(d.data() + 50, h.data(), 51, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
    EXPECT_EQ(cudaMemcpy(h.data(), d.data(), 10, cudaMemcpyHostToDevice), cudaErrorInvalidValue);  // wrong direction
    EXPECT_EQ(cudaMemcpy(d.data(), h.data(), 10, cudaMemcpyDeviceToHost), cudaErrorInvalidValue);
    EXPECT_EQ(cudaMemcpy(h.data(), d.data(), 10, cudaMemcpyDefault), cudaSuccess);  // inferred
    uint8_t* p = nullptr;
    ASSERT_EQ(cudaMallocHost(reinterpret_cast<void**>(&p), 100), cudaSuccess);
    const stream s = stream::create();
    EXPECT_EQ(cudaMemcpyAsync(p, d.data(), 100, cudaMemcpyDeviceToHost, s), cudaSuccess);
    EXPECT_EQ(cudaMemsetAsync(d.data() + 1, 0, 100, s), cudaErrorInvalidValue);
    s.synchronize();
    EXPECT_EQ(p[99], 7);
    EXPECT_EQ(cudaFreeHost(p), cudaSuccess);
}

// cudaHostRegister / cudaHostUnregister with CUDA's error codes; a registered range is page-locked:
// a copy into it returns before it lands (a copy into pageable memory waits for it).
TEST(CudaEmulator, HostRegistrationFailsAsCuda) {
    std::vector<uint8_t> host(4096, 0);
    uint8_t* h = host.data();
    ASSERT_EQ(cudaHostRegister(h, 1024, cudaHostRegisterDefault), cudaSuccess);
    EXPECT_EQ(cudaHostRegister(h, 1024, cudaHostRegisterDefault), cudaErrorHostMemoryAlreadyRegistered);
    EXPECT_EQ(cudaGetLastError(), cudaErrorHostMemoryAlreadyRegistered);
    EXPECT_EQ(cudaHostRegister(h + 512, 1024, 0), cudaErrorHostMemoryAlreadyRegistered);  // overlaps the end
    EXPECT_EQ(cudaHostRegister(h + 1024, 1024, 0), cudaSuccess);                          // adjacent: fine
    EXPECT_EQ(cudaHostUnregister(h + 1024), cudaSuccess);
    EXPECT_EQ(cudaHostUnregister(h + 8), cudaErrorHostMemoryNotRegistered);  // not where the range starts
    EXPECT_EQ(cudaHostRegister(nullptr, 64, 0), cudaErrorInvalidValue);
    EXPECT_EQ(cudaHostRegister(h + 2048, 0, 0), cudaErrorInvalidValue);
    EXPECT_EQ(cudaHostRegister(h + 2048, 64, 0x100), cudaErrorInvalidValue);  // unknown flag
    cudaGetLastError();

    device_buffer<uint8_t> d(1024);
    EXPECT_EQ(cudaHostRegister(d.data(), 64, 0), cudaErrorInvalidValue);  // device memory
    void* pinned = nullptr;
    ASSERT_EQ(cudaMallocHost(&pinned, 256), cudaSuccess);
    EXPECT_EQ(cudaHostRegister(pinned, 256, 0), cudaErrorHostMemoryAlreadyRegistered);
    EXPECT_EQ(cudaHostUnregister(pinned), cudaErrorHostMemoryNotRegistered);
    EXPECT_EQ(cudaFreeHost(h), cudaErrorInvalidValue);  // registered memory is not the emulator's to free
    EXPECT_EQ(cudaFreeHost(pinned), cudaSuccess);
    cudaGetLastError();

    // The copy into the registered range is asynchronous: it lands after the slow kernel, not before
    // cudaMemcpyAsync returns.
    const int n = 256;
    std::vector<int> ones(n, 1);
    device_buffer<int> a(n), b(n);
    ASSERT_EQ(cudaMemcpy(a.data(), ones.data(), a.bytes(), cudaMemcpyHostToDevice), cudaSuccess);
    const stream s = stream::create();
    STRATA_LAUNCH(slow_increment, 1, n, s.get())(a.data(), b.data(), n, 300);
    ASSERT_EQ(cudaMemcpyAsync(h, b.data(), 16, cudaMemcpyDeviceToHost, s), cudaSuccess);
    EXPECT_EQ(h[0], 0) << "a copy into registered memory must not wait for the stream";
    s.synchronize();
    EXPECT_EQ(h[0], 2);
    EXPECT_EQ(cudaHostUnregister(h), cudaSuccess);
    EXPECT_EQ(cudaHostUnregister(h), cudaErrorHostMemoryNotRegistered);  // twice
    cudaGetLastError();
}

TEST(CudaEmulator, DeviceMemoryHasACapacity) {
    size_t free_before = 0, total = 0;
    ASSERT_EQ(cudaMemGetInfo(&free_before, &total), cudaSuccess);
    EXPECT_GT(total, 0u);
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, total + 1), cudaErrorMemoryAllocation);
    cudaGetLastError();
    ASSERT_EQ(cudaMalloc(&p, 10 << 20), cudaSuccess);
    size_t free_after = 0;
    ASSERT_EQ(cudaMemGetInfo(&free_after, &total), cudaSuccess);
    EXPECT_EQ(free_before - free_after, size_t{10} << 20);
    EXPECT_EQ(cudaFree(p), cudaSuccess);
}

// Last: a kernel fault poisons the device until cudaDeviceReset, as on a GPU.
TEST(CudaEmulator, ShuffleWithInactiveLanesFaultsTheDevice) {
    device_buffer<float> out(32);
    STRATA_LAUNCH(broken_shuffle, 1, 32, nullptr)(out.data());  // the launch itself is accepted
    EXPECT_EQ(cudaDeviceSynchronize(), cudaErrorLaunchFailure);
    EXPECT_EQ(cudaMemcpy(out.data(), out.data(), 4, cudaMemcpyDeviceToDevice), cudaErrorLaunchFailure);
    EXPECT_EQ(cudaDeviceReset(), cudaSuccess);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

TEST(CudaEmulator, SharedMemoryIsPoisonedAtEveryBlockStart) {
    device_buffer<float> out(3);
    STRATA_LAUNCH(read_shared_first, 3, 64, nullptr)(out.data());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    for (const float v : download(out)) EXPECT_TRUE(std::isnan(v)) << "shared memory read before a write gave " << v;
}

TEST(CudaEmulator, ThreadsRunInAVaryingOrderBetweenBarriers) {
    constexpr int n = 64;
    device_buffer<int> order(n), counter(1);
    std::vector<std::vector<int>> runs;
    for (int launch = 0; launch < 2; ++launch) {
        ASSERT_EQ(cudaMemset(counter.data(), 0, counter.bytes()), cudaSuccess);
        STRATA_LAUNCH(record_order, 1, n, nullptr)(order.data(), counter.data());
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        runs.push_back(download(order));
        std::vector<int> sorted = runs.back();
        std::sort(sorted.begin(), sorted.end());
        std::vector<int> identity(n);
        std::iota(identity.begin(), identity.end(), 0);
        EXPECT_EQ(sorted, identity) << "every thread runs exactly once";
        EXPECT_NE(runs.back(), identity) << "threads ran in index order";
    }
    EXPECT_NE(runs[0], runs[1]) << "two launches ran their threads in the same order";
}

TEST(CudaEmulator, BarrierFromTwoCallSitesFaultsTheDevice) {
    device_buffer<float> out(32);
    STRATA_LAUNCH(split_barrier, 1, 32, nullptr)(out.data());
    EXPECT_EQ(cudaDeviceSynchronize(), cudaErrorLaunchFailure);
    EXPECT_EQ(cudaDeviceReset(), cudaSuccess);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

}  // namespace
}  // namespace strata::kernels::cuda
