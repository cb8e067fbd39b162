// The CUDA emulator's runtime: errors, device memory, streams, events and the runtime API. Kernels run
// in kernels.cpp, the cuBLAS GEMM in cublas.cpp. See cuda_emu.hpp for what it models and checks.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "emu_internal.hpp"

namespace cuemu::detail {

// ---- errors ----

thread_local cudaError_t tl_last_error = cudaSuccess;
namespace {
std::atomic<int> g_sticky{cudaSuccess};
}  // namespace

void report(const std::string& what) { std::fprintf(stderr, "strata CUDA emulator: %s\n", what.c_str()); }

cudaError_t fail(cudaError_t e, const std::string& what) {
    report(what);
    tl_last_error = e;
    return e;
}

cudaError_t sticky() { return static_cast<cudaError_t>(g_sticky.load()); }

void fault(const std::string& what) {
    report("kernel fault: " + what);
    int expected = cudaSuccess;
    g_sticky.compare_exchange_strong(expected, cudaErrorLaunchFailure);
}

void clear_fault() { g_sticky = cudaSuccess; }

size_t env_size(const char* name, size_t fallback) {
    const char* v = std::getenv(name);
    if (!v || !*v) return fallback;
    return static_cast<size_t>(std::strtoull(v, nullptr, 10));
}

// ---- memory ----

memory_map& memory() {
    static memory_map* m = new memory_map;  // outlives every static destructor that might free
    return *m;
}

std::string hex(const void* p) {
    char b[32];
    std::snprintf(b, sizeof b, "%p", p);
    return b;
}

// ---- streams ----

namespace {

// Every stream cudaStreamCreate* made and cudaStreamDestroy has not destroyed (the legacy default
// stream is apart); the blocking ones are those without cudaStreamNonBlocking.
struct stream_registry {
    std::mutex m;
    std::vector<CUstream_st*> list;

    std::vector<CUstream_st*> snapshot(bool blocking_only) {
        std::lock_guard lock(m);
        std::vector<CUstream_st*> out;
        for (CUstream_st* s : list)
            if (!blocking_only || !(s->flags & cudaStreamNonBlocking)) out.push_back(s);
        return out;
    }
    bool contains(cudaStream_t s) {
        std::lock_guard lock(m);
        return std::find(list.begin(), list.end(), s) != list.end();
    }
};
stream_registry& streams() {
    static stream_registry* r = new stream_registry;
    return *r;
}

CUstream_st* legacy_stream() {
    static CUstream_st* s = new CUstream_st(cudaStreamDefault);  // never destroyed: lives to process exit
    return s;
}

}  // namespace

CUstream_st* target(cudaStream_t s) {
    if (!s) {
        for (CUstream_st* x : streams().snapshot(true)) x->drain();
        return legacy_stream();
    }
    if (!(s->flags & cudaStreamNonBlocking)) legacy_stream()->drain();
    return s;
}

}  // namespace cuemu::detail

using namespace cuemu::detail;

// ---- events ----

struct CUevent_st {
    explicit CUevent_st(unsigned f) : flags(f) {}
    const unsigned flags;
    std::mutex m;
    std::condition_variable cv;
    uint64_t recorded = 0, completed = 0;  // generations
    std::chrono::steady_clock::time_point when{};
    int pending = 0;         // queued records and waits that still use this event
    bool destroyed = false;  // cudaEventDestroy came while some were pending: the last one deletes it
};

// ---- runtime API ----

namespace {

int device_count() { return static_cast<int>(env_size("STRATA_CUDA_EMU_DEVICES", 1)); }
int g_device = 0;

bool known_stream(cudaStream_t s) { return !s || streams().contains(s); }

// Checks a copy's direction and ranges against the allocations; cudaSuccess or the error.
cudaError_t check_copy(const char* call, void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
    const memory_map& mm = memory();
    const bool dst_dev = mm.is_device(dst), src_dev = mm.is_device(src);
    if (kind == cudaMemcpyDefault)
        kind = dst_dev ? (src_dev ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice)
                       : (src_dev ? cudaMemcpyDeviceToHost : cudaMemcpyHostToHost);
    const bool want_dst_dev = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
    const bool want_src_dev = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
    static constexpr const char* kKinds[] = {"HostToHost", "HostToDevice", "DeviceToHost", "DeviceToDevice", "Default"};
    if (dst_dev != want_dst_dev || src_dev != want_src_dev)
        return fail(cudaErrorInvalidValue, std::string(call) + " cudaMemcpy" + kKinds[kind] + " of " +
                                               std::to_string(bytes) + " bytes: destination " + hex(dst) + " is " +
                                               (dst_dev ? "device" : "host") + " memory, source " + hex(src) + " is " +
                                               (src_dev ? "device" : "host") + " memory");
    if (dst_dev && !mm.is_device(dst, bytes))
        return fail(cudaErrorInvalidValue, std::string(call) + ": " + std::to_string(bytes) + " bytes to " + hex(dst) +
                                               " run past the end of its device allocation");
    if (src_dev && !mm.is_device(src, bytes))
        return fail(cudaErrorInvalidValue, std::string(call) + ": " + std::to_string(bytes) + " bytes from " + hex(src) +
                                               " run past the end of its device allocation");
    return cudaSuccess;
}

}  // namespace

const char* cudaGetErrorString(cudaError_t e) {
    switch (e) {
        case cudaSuccess: return "no error";
        case cudaErrorInvalidValue: return "invalid argument";
        case cudaErrorMemoryAllocation: return "out of memory";
        case cudaErrorInvalidConfiguration: return "invalid configuration argument";
        case cudaErrorNoDevice: return "no CUDA-capable device is detected";
        case cudaErrorInvalidDevice: return "invalid device ordinal";
        case cudaErrorInvalidResourceHandle: return "invalid resource handle";
        case cudaErrorNotReady: return "device not ready";
        case cudaErrorHostMemoryAlreadyRegistered: return "part or all of the requested memory range is already mapped";
        case cudaErrorHostMemoryNotRegistered: return "pointer does not correspond to a registered memory region";
        case cudaErrorLaunchFailure: return "unspecified launch failure";
    }
    return "unknown error";
}

cudaError_t cudaGetLastError() {
    const cudaError_t e = tl_last_error;
    tl_last_error = cudaSuccess;
    return e != cudaSuccess ? e : sticky();
}
cudaError_t cudaPeekAtLastError() { return tl_last_error != cudaSuccess ? tl_last_error : sticky(); }

cudaError_t cudaGetDeviceCount(int* count) {
    *count = device_count();
    return *count > 0 ? cudaSuccess : (tl_last_error = cudaErrorNoDevice);
}

cudaError_t cudaSetDevice(int device) {
    if (device < 0 || device >= device_count()) return tl_last_error = cudaErrorInvalidDevice;
    g_device = device;
    return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
    *device = g_device;
    return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
    if (device < 0 || device >= device_count()) return tl_last_error = cudaErrorInvalidDevice;
    *prop = cudaDeviceProp{};
    std::snprintf(prop->name, sizeof prop->name, "strata CUDA emulator");
    prop->totalGlobalMem = memory().capacity();
    prop->major = 9;
    prop->minor = 0;
    prop->multiProcessorCount = 1;
    prop->maxThreadsPerBlock = kMaxThreads;
    prop->warpSize = kWarp;
    return cudaSuccess;
}

// STRATA_CUDA_EMU_PCI_BUS_ID (default 0000:00:00.0): lets tests point the NUMA lookup at a device.
cudaError_t cudaDeviceGetPCIBusId(char* bus_id, int len, int device) {
    if (device < 0 || device >= device_count()) return tl_last_error = cudaErrorInvalidDevice;
    const char* v = std::getenv("STRATA_CUDA_EMU_PCI_BUS_ID");
    std::snprintf(bus_id, static_cast<size_t>(len), "%s", v && *v ? v : "0000:00:00.0");
    return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
    *total_bytes = memory().capacity();
    *free_bytes = *total_bytes - std::min(memory().used(), *total_bytes);
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize() {
    legacy_stream()->drain();
    for (CUstream_st* s : streams().snapshot(false)) s->drain();
    return sticky();
}

cudaError_t cudaDeviceReset() {
    cudaDeviceSynchronize();
    clear_fault();
    tl_last_error = cudaSuccess;
    return cudaSuccess;
}

cudaError_t cudaMalloc(void** p, size_t bytes) {
    if (const cudaError_t e = sticky(); e != cudaSuccess) return e;
    return memory().allocate(p, bytes, mem_kind::device);
}
cudaError_t cudaFree(void* p) {
    cudaDeviceSynchronize();  // as CUDA: freeing waits for the device
    return memory().release(p, mem_kind::device);
}
cudaError_t cudaMallocHost(void** p, size_t bytes) { return memory().allocate(p, bytes, mem_kind::pinned); }
cudaError_t cudaFreeHost(void* p) {
    cudaDeviceSynchronize();
    return memory().release(p, mem_kind::pinned);
}
cudaError_t cudaHostRegister(void* p, size_t bytes, unsigned flags) {
    constexpr unsigned known = cudaHostRegisterPortable | cudaHostRegisterMapped | cudaHostRegisterIoMemory |
                               cudaHostRegisterReadOnly;
    if (!p || bytes == 0 || (flags & ~known))
        return fail(cudaErrorInvalidValue, "cudaHostRegister of " + std::to_string(bytes) + " bytes at " + hex(p) +
                                               " with flags " + std::to_string(flags));
    return memory().add_registered(p, bytes);
}
cudaError_t cudaHostUnregister(void* p) {
    // No implicit synchronisation: a copy still queued on the range is the owner's bug, as on a GPU.
    return memory().remove_registered(p);
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t s) {
    if (const cudaError_t e = sticky(); e != cudaSuccess) return e;
    if (!known_stream(s)) return fail(cudaErrorInvalidResourceHandle, "cudaMemcpyAsync on a destroyed stream");
    if (const cudaError_t e = check_copy("cudaMemcpyAsync", dst, src, bytes, kind); e != cudaSuccess) return e;
    const memory_map& mm = memory();
    const bool src_pageable = !mm.is_device(src) && !mm.is_page_locked(src, bytes);
    const bool dst_pageable = !mm.is_device(dst) && !mm.is_page_locked(dst, bytes);
    CUstream_st* t = target(s);
    if (src_pageable) {
        // As CUDA: a pageable source is staged before the call returns, so the caller may reuse it.
        auto staged = std::make_shared<std::vector<uint8_t>>(static_cast<const uint8_t*>(src),
                                                             static_cast<const uint8_t*>(src) + bytes);
        t->push([dst, staged] { std::memcpy(dst, staged->data(), staged->size()); });
    } else {
        t->push([dst, src, bytes] { std::memcpy(dst, src, bytes); });
    }
    if (dst_pageable) t->drain();  // as CUDA: a copy into pageable memory returns once it is done
    return cudaSuccess;
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
    if (const cudaError_t e = cudaMemcpyAsync(dst, src, bytes, kind, nullptr); e != cudaSuccess) return e;
    return cudaStreamSynchronize(nullptr);
}

cudaError_t cudaMemcpy2D(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t height,
                         cudaMemcpyKind kind) {
    if (const cudaError_t e = sticky(); e != cudaSuccess) return e;
    if (width > dpitch || width > spitch)
        return fail(cudaErrorInvalidValue, "cudaMemcpy2D: width " + std::to_string(width) + " exceeds a pitch (" +
                                               std::to_string(dpitch) + ", " + std::to_string(spitch) + ")");
    if (height == 0 || width == 0) return cudaSuccess;
    const size_t dspan = dpitch * (height - 1) + width, sspan = spitch * (height - 1) + width;
    if (const cudaError_t e = check_copy("cudaMemcpy2D", dst, src, 0, kind); e != cudaSuccess) return e;
    const memory_map& mm = memory();
    if ((mm.is_device(dst) && !mm.is_device(dst, dspan)) || (mm.is_device(src) && !mm.is_device(src, sspan)))
        return fail(cudaErrorInvalidValue, "cudaMemcpy2D of " + std::to_string(height) + " rows of " +
                                               std::to_string(width) + " bytes runs past the end of a device allocation");
    auto* d = static_cast<uint8_t*>(dst);
    const auto* s = static_cast<const uint8_t*>(src);
    target(nullptr)->push([=] {
        for (size_t r = 0; r < height; ++r) std::memcpy(d + r * dpitch, s + r * spitch, width);
    });
    return cudaStreamSynchronize(nullptr);
}

cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t s) {
    if (const cudaError_t e = sticky(); e != cudaSuccess) return e;
    if (!memory().is_device(p, bytes))
        return fail(cudaErrorInvalidValue,
                    "cudaMemsetAsync of " + std::to_string(bytes) + " bytes at " + hex(p) + " is not inside device memory");
    target(s)->push([p, value, bytes] { std::memset(p, value, bytes); });
    return cudaSuccess;
}

cudaError_t cudaMemset(void* p, int value, size_t bytes) {
    if (const cudaError_t e = cudaMemsetAsync(p, value, bytes, nullptr); e != cudaSuccess) return e;
    return cudaStreamSynchronize(nullptr);
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned flags) {
    *s = new CUstream_st(flags);
    std::lock_guard lock(streams().m);
    streams().list.push_back(*s);
    return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t* s) { return cudaStreamCreateWithFlags(s, cudaStreamDefault); }

cudaError_t cudaStreamDestroy(cudaStream_t s) {
    if (!s || !known_stream(s)) return fail(cudaErrorInvalidResourceHandle, "cudaStreamDestroy of an unknown stream");
    s->drain();  // CUDA lets queued work finish
    {
        std::lock_guard lock(streams().m);
        auto& l = streams().list;
        l.erase(std::find(l.begin(), l.end(), s));
    }
    delete s;
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s) {
    if (!known_stream(s)) return fail(cudaErrorInvalidResourceHandle, "cudaStreamSynchronize of an unknown stream");
    (s ? s : legacy_stream())->drain();
    return sticky();
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned flags) {
    *e = new CUevent_st(flags);
    return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t* e) { return cudaEventCreateWithFlags(e, cudaEventDefault); }
cudaError_t cudaEventDestroy(cudaEvent_t e) {
    if (!e) return fail(cudaErrorInvalidResourceHandle, "cudaEventDestroy of a null event");
    bool now;
    {
        std::lock_guard lock(e->m);
        e->destroyed = true;
        now = e->pending == 0;
    }
    if (now) delete e;  // else, as CUDA, once the queued work using it is done
    return cudaSuccess;
}

namespace {

// The end of a queued record or wait on e: deletes e if it was destroyed meanwhile and this was the last.
void release_pending(cudaEvent_t e, std::unique_lock<std::mutex>& lock) {
    const bool last = --e->pending == 0 && e->destroyed;
    lock.unlock();
    e->cv.notify_all();
    if (last) delete e;
}

}  // namespace

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
    if (!e) return fail(cudaErrorInvalidResourceHandle, "cudaEventRecord of a null event");
    if (!known_stream(s)) return fail(cudaErrorInvalidResourceHandle, "cudaEventRecord on a destroyed stream");
    uint64_t gen;
    {
        std::lock_guard lock(e->m);
        gen = ++e->recorded;
        ++e->pending;
    }
    target(s)->push([e, gen] {
        std::unique_lock lock(e->m);
        e->completed = std::max(e->completed, gen);
        e->when = std::chrono::steady_clock::now();
        release_pending(e, lock);
    });
    return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t e) {
    std::lock_guard lock(e->m);
    return e->completed >= e->recorded ? sticky() : cudaErrorNotReady;
}

cudaError_t cudaEventSynchronize(cudaEvent_t e) {
    std::unique_lock lock(e->m);
    const uint64_t gen = e->recorded;
    e->cv.wait(lock, [&] { return e->completed >= gen; });
    return sticky();
}

cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned) {
    if (!known_stream(s)) return fail(cudaErrorInvalidResourceHandle, "cudaStreamWaitEvent on a destroyed stream");
    uint64_t gen;
    {
        std::lock_guard lock(e->m);
        gen = e->recorded;  // the record most recently issued (none: nothing to wait for)
        ++e->pending;
    }
    target(s)->push([e, gen] {
        std::unique_lock lock(e->m);
        e->cv.wait(lock, [&] { return e->completed >= gen; });
        release_pending(e, lock);
    });
    return cudaSuccess;
}

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
    if ((start->flags & cudaEventDisableTiming) || (end->flags & cudaEventDisableTiming))
        return fail(cudaErrorInvalidResourceHandle, "cudaEventElapsedTime of an event created without timing");
    std::scoped_lock lock(start->m, end->m);
    if (start->recorded == 0 || end->recorded == 0)
        return fail(cudaErrorInvalidResourceHandle, "cudaEventElapsedTime of an event never recorded");
    if (start->completed < start->recorded || end->completed < end->recorded) return cudaErrorNotReady;
    *ms = std::chrono::duration<float, std::milli>(end->when - start->when).count();
    return cudaSuccess;
}
