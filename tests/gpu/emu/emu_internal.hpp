// Internal to the CUDA emulator: what its runtime (runtime.cpp), kernel scheduler (kernels.cpp) and
// cuBLAS (cublas.cpp) share: error reporting, the device-memory map, and streams.
#pragma once

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include "cuda_emu.hpp"

namespace cuemu::detail {

constexpr int kWarp = 32;          // threads per warp
constexpr int kMaxThreads = 1024;  // threads per block

// ---- errors ----

extern thread_local cudaError_t tl_last_error;  // what cudaGetLastError returns

void report(const std::string& what);  // one line on stderr
cudaError_t fail(cudaError_t e, const std::string& what);  // reports, sets the last error, returns e
// A kernel that broke a rule (a shuffle with an inactive lane, a barrier not every thread reaches)
// poisons the device as a GPU fault would: every later call returns this error (cudaDeviceReset clears it).
cudaError_t sticky();
void fault(const std::string& what);
void clear_fault();
size_t env_size(const char* name, size_t fallback);
std::string hex(const void* p);

// ---- memory ----

enum class mem_kind {
    device,
    pinned,      // cudaMallocHost: allocated (and freed) by the emulator
    registered,  // cudaHostRegister: the caller's memory, only listed
};

struct allocation {
    size_t bytes;
    mem_kind kind;
};

class memory_map {
public:
    size_t capacity() const { return env_size("STRATA_CUDA_EMU_MEM_MIB", 2048) << 20; }

    cudaError_t allocate(void** p, size_t bytes, mem_kind kind) {
        std::lock_guard lock(m_);
        if (kind == mem_kind::device && used_ + bytes > capacity())
            return fail(cudaErrorMemoryAllocation,
                        "cudaMalloc of " + std::to_string(bytes) + " bytes: " + std::to_string(capacity() - used_) +
                            " of " + std::to_string(capacity()) + " bytes are free");
        void* q = std::aligned_alloc(256, std::max<size_t>((bytes + 255) / 256 * 256, 256));
        if (!q) return fail(cudaErrorMemoryAllocation, "host allocation of " + std::to_string(bytes) + " bytes failed");
        map_[reinterpret_cast<uintptr_t>(q)] = {bytes, kind};
        if (kind == mem_kind::device) used_ += bytes;
        *p = q;
        return cudaSuccess;
    }

    // cudaHostRegister: lists [p, p + bytes) unless it overlaps a listed range.
    cudaError_t add_registered(void* p, size_t bytes) {
        std::lock_guard lock(m_);
        const uintptr_t a = reinterpret_cast<uintptr_t>(p);
        auto it = map_.lower_bound(a + bytes);  // the first range starting at or after the end
        if (it != map_.begin()) {
            --it;  // the last range starting before the end: the only one that can overlap
            if (it->first + it->second.bytes > a)
                return it->second.kind == mem_kind::device
                           ? fail(cudaErrorInvalidValue, "cudaHostRegister of " + std::to_string(bytes) + " bytes at " +
                                                             hex(p) + ": the range is device memory")
                           : fail(cudaErrorHostMemoryAlreadyRegistered,
                                  "cudaHostRegister of " + std::to_string(bytes) + " bytes at " + hex(p) +
                                      " overlaps a page-locked range of " + std::to_string(it->second.bytes) +
                                      " bytes at " + hex(reinterpret_cast<void*>(it->first)));
        }
        map_[a] = {bytes, mem_kind::registered};
        return cudaSuccess;
    }

    // cudaHostUnregister: p must start a registered range.
    cudaError_t remove_registered(void* p) {
        std::lock_guard lock(m_);
        const auto it = map_.find(reinterpret_cast<uintptr_t>(p));
        if (it == map_.end() || it->second.kind != mem_kind::registered)
            return fail(cudaErrorHostMemoryNotRegistered,
                        "cudaHostUnregister of " + hex(p) + ", which does not start a registered range");
        map_.erase(it);
        return cudaSuccess;
    }

    cudaError_t release(void* p, mem_kind kind) {
        if (!p) return cudaSuccess;
        std::lock_guard lock(m_);
        const auto it = map_.find(reinterpret_cast<uintptr_t>(p));
        if (it == map_.end() || it->second.kind != kind)
            return fail(cudaErrorInvalidValue, std::string(kind == mem_kind::device ? "cudaFree" : "cudaFreeHost") +
                                                   " of a pointer that is not the start of such an allocation");
        if (kind == mem_kind::device) used_ -= it->second.bytes;
        map_.erase(it);
        std::free(p);
        return cudaSuccess;
    }

    // The allocation holding [p, p + bytes), if one does.
    const allocation* find(const void* p, size_t bytes, mem_kind kind) const {
        std::lock_guard lock(m_);
        const uintptr_t a = reinterpret_cast<uintptr_t>(p);
        auto it = map_.upper_bound(a);
        if (it == map_.begin()) return nullptr;
        --it;
        if (it->second.kind != kind) return nullptr;
        const uintptr_t end = it->first + it->second.bytes;
        if (a > end || bytes > end - a) return nullptr;
        if (a == end && bytes > 0) return nullptr;
        return &it->second;
    }
    // [p, p + bytes) lies in one device allocation; bytes 0: p is inside (or at the end of) one.
    bool is_device(const void* p, size_t bytes = 0) const { return find(p, bytes, mem_kind::device) != nullptr; }
    // [p, p + bytes) lies in one cudaMallocHost allocation or one registered range.
    bool is_page_locked(const void* p, size_t bytes) const {
        return find(p, bytes, mem_kind::pinned) || find(p, bytes, mem_kind::registered);
    }

    size_t used() const {
        std::lock_guard lock(m_);
        return used_;
    }

private:
    mutable std::mutex m_;
    std::map<uintptr_t, allocation> map_;
    size_t used_ = 0;
};

memory_map& memory();

// The stream work goes to, with the legacy default stream's ordering: work on it waits for the
// blocking streams, and work on a blocking stream waits for it (host-side waits: stricter, never looser).
CUstream_st* target(cudaStream_t s);

}  // namespace cuemu::detail

// ---- streams: one worker thread each, running its queue in order ----

struct CUstream_st {
    explicit CUstream_st(unsigned f) : flags(f), worker([this] { run(); }) {}
    ~CUstream_st() {
        {
            std::lock_guard lock(m);
            stop = true;
        }
        cv.notify_all();
        worker.join();
    }

    void push(std::function<void()> task) {
        {
            std::lock_guard lock(m);
            q.push_back(std::move(task));
        }
        cv.notify_all();
    }
    void drain() {
        std::unique_lock lock(m);
        cv.wait(lock, [&] { return q.empty() && !busy; });
    }

    const unsigned flags;
    std::mutex m;
    std::condition_variable cv;
    std::deque<std::function<void()>> q;
    bool busy = false, stop = false;
    std::thread worker;

private:
    void run() {
        std::unique_lock lock(m);
        for (;;) {
            cv.wait(lock, [&] { return stop || !q.empty(); });
            if (q.empty()) return;
            std::function<void()> task = std::move(q.front());
            q.pop_front();
            busy = true;
            lock.unlock();
            task();
            lock.lock();
            busy = false;
            cv.notify_all();
        }
    }
};
