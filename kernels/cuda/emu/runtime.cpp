// The CUDA emulator's runtime: device memory, streams, events, the fiber scheduler that runs kernels,
// and the cuBLAS GEMM. See cuda_emu.hpp for what it models and checks.
#include <sys/mman.h>
#include <ucontext.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "cuda_emu_device.hpp"

// ---- errors ----

namespace {

thread_local cudaError_t tl_last_error = cudaSuccess;
// A kernel that broke a rule (a shuffle with an inactive lane, a barrier not every thread reaches)
// poisons the device as a GPU fault would: every later call returns this error.
std::atomic<int> g_sticky{cudaSuccess};

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

size_t env_size(const char* name, size_t fallback) {
    const char* v = std::getenv(name);
    if (!v || !*v) return fallback;
    return static_cast<size_t>(std::strtoull(v, nullptr, 10));
}

// ---- memory ----

enum class mem_kind { device, pinned };

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
    bool is_device(const void* p, size_t bytes = 0) const { return find(p, bytes, mem_kind::device) != nullptr; }
    // Inside some device allocation at all (for "which side is this pointer on").
    bool on_device(const void* p) const { return is_device(p, 0); }

    size_t used() const {
        std::lock_guard lock(m_);
        return used_;
    }

private:
    mutable std::mutex m_;
    std::map<uintptr_t, allocation> map_;
    size_t used_ = 0;
};

memory_map& memory() {
    static memory_map* m = new memory_map;  // outlives every static destructor that might free
    return *m;
}

std::string hex(const void* p) {
    char b[32];
    std::snprintf(b, sizeof b, "%p", p);
    return b;
}

}  // namespace

// ---- streams ----

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

namespace {

struct stream_registry {
    std::mutex m;
    std::vector<CUstream_st*> blocking;  // created without cudaStreamNonBlocking
};
stream_registry& streams() {
    static stream_registry* r = new stream_registry;
    return *r;
}

CUstream_st* legacy_stream() {
    static CUstream_st* s = new CUstream_st(cudaStreamDefault);  // never destroyed: lives to process exit
    return s;
}

// The stream work goes to, with the legacy default stream's ordering: work on it waits for the
// blocking streams, and work on a blocking stream waits for it (host-side waits: stricter, never looser).
CUstream_st* target(cudaStream_t s) {
    if (!s) {
        std::vector<CUstream_st*> b;
        {
            std::lock_guard lock(streams().m);
            b = streams().blocking;
        }
        for (CUstream_st* x : b) x->drain();
        return legacy_stream();
    }
    if (!(s->flags & cudaStreamNonBlocking)) legacy_stream()->drain();
    return s;
}

}  // namespace

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

namespace {

// Every non-blocking stream too, for cudaDeviceSynchronize.
struct all_streams {
    std::mutex m;
    std::vector<CUstream_st*> list;
};
all_streams& every_stream() {
    static all_streams* a = new all_streams;
    return *a;
}

// ---- kernels: fibers ----
//
// A CUDA thread is a fiber with its own stack. On x86-64 the switch is a few instructions (callee-saved
// registers and the stack pointer; swapcontext would add a signal-mask system call per switch, and a
// kernel switches per shuffle); elsewhere ucontext.

constexpr int kWarp = 32;
constexpr int kMaxThreads = 1024;
constexpr size_t kStackBytes = 64 << 10;

void fiber_entry();

#if defined(__x86_64__)
}  // namespace

// strata_cuemu_switch(&save, next): saves the callee-saved registers on the current stack, stores the
// stack pointer in *save and resumes the stack `next` (made by switch_to or by fiber_context::start).
extern "C" void strata_cuemu_switch(void** save, void* next);
asm(R"(
    .text
    .globl strata_cuemu_switch
    .type strata_cuemu_switch, @function
strata_cuemu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size strata_cuemu_switch, .-strata_cuemu_switch
    .section .note.GNU-stack,"",@progbits
    .text
)");

namespace {

struct fiber_context {
    void* sp = nullptr;
    // A fresh stack whose first switch enters fiber_entry (as if called: rsp = 8 mod 16 at entry).
    void start(void* stack, size_t bytes) {
        auto top = (reinterpret_cast<uintptr_t>(stack) + bytes) & ~uintptr_t{15};
        auto* slots = reinterpret_cast<void**>(top);
        slots[-1] = nullptr;                                     // fiber_entry's return address: never used
        slots[-2] = reinterpret_cast<void*>(&fiber_entry);      // popped by ret
        for (int i = 3; i <= 8; ++i) slots[-i] = nullptr;        // rbp, rbx, r12..r15
        sp = &slots[-8];
    }
};
void switch_to(fiber_context& save, fiber_context& next) { strata_cuemu_switch(&save.sp, next.sp); }
#else
struct fiber_context {
    ucontext_t uc;
    void start(void* stack, size_t bytes) {
        getcontext(&uc);
        uc.uc_stack.ss_sp = stack;
        uc.uc_stack.ss_size = bytes;
        uc.uc_link = nullptr;
        makecontext(&uc, &fiber_entry, 0);
    }
};
void switch_to(fiber_context& save, fiber_context& next) { swapcontext(&save.uc, &next.uc); }
#endif

enum class fiber_state { runnable, at_block_barrier, at_warp_barrier, done };

struct fiber {
    fiber_context ctx;
    cuemu::thread_coords coords;
    fiber_state state = fiber_state::runnable;
    int warp = 0, lane = 0;
    uint32_t shuffles = 0;  // this thread's shuffle count (selects the exchange buffer)
};

struct warp_state {
    int size = 0, live = 0, arrived = 0;
    uint64_t values[2][kWarp];
};

// The block being run (one at a time, under g_kernel_mutex).
struct block_run {
    fiber_context scheduler;
    std::vector<fiber> fibers;
    std::vector<warp_state> warps;
    int live = 0, at_barrier = 0;
    const std::function<void()>* body = nullptr;
    fiber* current = nullptr;
    const char* kernel = "";
    bool failed = false;
};

std::mutex g_kernel_mutex;
block_run g_block;
std::vector<void*> g_stacks;  // kMaxThreads stacks, mapped on first use (untouched pages cost nothing)

void* stack(size_t i) {
    while (g_stacks.size() <= i) {
        void* p = mmap(nullptr, kStackBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p == MAP_FAILED) throw std::bad_alloc();
        g_stacks.push_back(p);
    }
    return g_stacks[i];
}

void kernel_fault(const std::string& what) {
    if (!g_block.failed) fault(std::string(g_block.kernel) + ": " + what);
    g_block.failed = true;
}

void yield_to_scheduler() {
    fiber* f = g_block.current;
    switch_to(f->ctx, g_block.scheduler);
}

// Runs the kernel body as the current fiber's thread, then hands back for good.
void fiber_entry() {
    (*g_block.body)();
    fiber* f = g_block.current;
    f->state = fiber_state::done;
    switch_to(f->ctx, g_block.scheduler);
    std::abort();  // a finished fiber is never resumed
}

void release_block_barrier() {
    for (fiber& x : g_block.fibers)
        if (x.state == fiber_state::at_block_barrier) x.state = fiber_state::runnable;
    g_block.at_barrier = 0;
}

void release_warp(warp_state& w, int warp) {
    for (int i = 0; i < w.size; ++i) {
        fiber& x = g_block.fibers[static_cast<size_t>(warp * kWarp + i)];
        if (x.state == fiber_state::at_warp_barrier) x.state = fiber_state::runnable;
    }
    w.arrived = 0;
}

void run_block(const cuemu::launch_config& c, dim3 block_idx, const std::function<void()>& body) {
    const int n = static_cast<int>(c.block.x * c.block.y * c.block.z);
    block_run& b = g_block;
    b.fibers.resize(static_cast<size_t>(n));
    b.warps.assign(static_cast<size_t>((n + kWarp - 1) / kWarp), warp_state{});
    b.live = n;
    b.at_barrier = 0;
    b.body = &body;
    for (int i = 0; i < n; ++i) {
        fiber& f = b.fibers[static_cast<size_t>(i)];
        f.state = fiber_state::runnable;
        f.warp = i / kWarp;
        f.lane = i % kWarp;
        f.shuffles = 0;
        f.coords.thread_idx = dim3(static_cast<unsigned>(i) % c.block.x, (static_cast<unsigned>(i) / c.block.x) % c.block.y,
                                   static_cast<unsigned>(i) / (c.block.x * c.block.y));
        f.coords.block_idx = block_idx;
        f.coords.block_dim = c.block;
        f.coords.grid_dim = c.grid;
        ++b.warps[static_cast<size_t>(f.warp)].size;
        ++b.warps[static_cast<size_t>(f.warp)].live;
        f.ctx.start(stack(static_cast<size_t>(i)), kStackBytes);
    }
    while (b.live > 0) {
        bool ran = false;
        for (fiber& f : b.fibers) {
            if (f.state != fiber_state::runnable) continue;
            ran = true;
            b.current = &f;
            cuemu::tl_coords = &f.coords;
            switch_to(b.scheduler, f.ctx);
            if (f.state == fiber_state::done) {
                --b.live;
                warp_state& w = b.warps[static_cast<size_t>(f.warp)];
                --w.live;
                if (w.arrived > 0) {
                    kernel_fault("thread " + std::to_string(&f - b.fibers.data()) +
                                 " exited while lanes of its warp wait in __shfl_xor_sync");
                    release_warp(w, f.warp);
                }
                if (b.at_barrier > 0 && b.at_barrier == b.live) release_block_barrier();
            }
        }
        if (!ran && b.live > 0) {
            kernel_fault("deadlock: " + std::to_string(b.live) + " threads wait at barriers that cannot complete (" +
                         std::to_string(b.at_barrier) + " at __syncthreads)");
            // Unwinding a fiber is not possible: abandon the block (its stacks are reused).
            break;
        }
    }
    cuemu::tl_coords = nullptr;
}

}  // namespace

namespace cuemu {

thread_local const thread_coords* tl_coords = nullptr;

void syncthreads() {
    block_run& b = g_block;
    if (++b.at_barrier == b.live) {
        release_block_barrier();
        return;
    }
    b.current->state = fiber_state::at_block_barrier;
    yield_to_scheduler();
}

uint64_t shuffle_xor(unsigned mask, uint64_t bits, int lane_mask, int width) {
    block_run& b = g_block;
    fiber& f = *b.current;
    warp_state& w = b.warps[static_cast<size_t>(f.warp)];
    if (mask != 0xffffffffu || width != kWarp)
        kernel_fault("__shfl_xor_sync with mask " + hex(reinterpret_cast<void*>(uintptr_t{mask})) + " and width " +
                     std::to_string(width) + " (the emulator takes the full warp only)");
    if (w.size != kWarp || w.live != kWarp)
        kernel_fault("__shfl_xor_sync with the full mask in a warp of " + std::to_string(w.live) + " active of " +
                     std::to_string(w.size) + " threads (undefined on a GPU)");
    const uint32_t buf = f.shuffles++ & 1u;
    w.values[buf][f.lane] = bits;
    if (++w.arrived == w.live) {
        release_warp(w, f.warp);
    } else {
        f.state = fiber_state::at_warp_barrier;
        yield_to_scheduler();
    }
    const int src = f.lane ^ lane_mask;
    return src < w.size ? w.values[buf][src] : bits;
}

cudaError_t enqueue_kernel(const launch_config& c, const std::vector<const void*>& pointer_args,
                           std::function<void()> body) {
    if (const cudaError_t e = sticky(); e != cudaSuccess) return tl_last_error = e;
    const uint64_t threads = uint64_t{c.block.x} * c.block.y * c.block.z;
    if (threads == 0 || threads > kMaxThreads || c.block.z > 64 || c.grid.x == 0 || c.grid.y == 0 || c.grid.z == 0 ||
        c.grid.y > 65535 || c.grid.z > 65535)
        return fail(cudaErrorInvalidConfiguration,
                    std::string(c.kernel) + ": invalid launch configuration grid (" + std::to_string(c.grid.x) + ", " +
                        std::to_string(c.grid.y) + ", " + std::to_string(c.grid.z) + ") block (" +
                        std::to_string(c.block.x) + ", " + std::to_string(c.block.y) + ", " +
                        std::to_string(c.block.z) + ")");
    for (size_t i = 0; i < pointer_args.size(); ++i) {
        const void* p = pointer_args[i];
        if (p && !memory().on_device(p))
            return fail(cudaErrorInvalidValue, std::string(c.kernel) + ": pointer argument " + std::to_string(i) + " (" +
                                                   hex(p) + ") is not device memory");
    }
    CUstream_st* s = target(c.stream);
    s->push([c, body = std::move(body)] {
        if (sticky() != cudaSuccess) return;
        std::lock_guard lock(g_kernel_mutex);
        static const bool trace = env_size("STRATA_CUDA_EMU_TRACE", 0) != 0;
        if (trace)
            std::fprintf(stderr, "strata CUDA emulator: %s grid (%u, %u, %u) block (%u, %u, %u)\n", c.kernel, c.grid.x,
                         c.grid.y, c.grid.z, c.block.x, c.block.y, c.block.z);
        g_block.kernel = c.kernel;
        g_block.failed = false;
        for (unsigned z = 0; z < c.grid.z && !g_block.failed; ++z)
            for (unsigned y = 0; y < c.grid.y && !g_block.failed; ++y)
                for (unsigned x = 0; x < c.grid.x && !g_block.failed; ++x) run_block(c, dim3(x, y, z), body);
    });
    return cudaSuccess;
}

}  // namespace cuemu

// ---- runtime API ----

namespace {

int device_count() { return static_cast<int>(env_size("STRATA_CUDA_EMU_DEVICES", 1)); }
int g_device = 0;

bool known_stream(cudaStream_t s) {
    if (!s) return true;
    std::lock_guard lock(every_stream().m);
    return std::find(every_stream().list.begin(), every_stream().list.end(), s) != every_stream().list.end();
}

// Checks a copy's direction and ranges against the allocations; cudaSuccess or the error.
cudaError_t check_copy(const char* call, void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
    const memory_map& mm = memory();
    const bool dst_dev = mm.on_device(dst), src_dev = mm.on_device(src);
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
    std::vector<CUstream_st*> list;
    {
        std::lock_guard lock(every_stream().m);
        list = every_stream().list;
    }
    for (CUstream_st* s : list) s->drain();
    return sticky();
}

cudaError_t cudaDeviceReset() {
    cudaDeviceSynchronize();
    g_sticky = cudaSuccess;
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

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t s) {
    if (const cudaError_t e = sticky(); e != cudaSuccess) return e;
    if (!known_stream(s)) return fail(cudaErrorInvalidResourceHandle, "cudaMemcpyAsync on a destroyed stream");
    if (const cudaError_t e = check_copy("cudaMemcpyAsync", dst, src, bytes, kind); e != cudaSuccess) return e;
    const memory_map& mm = memory();
    const bool src_pageable = !mm.on_device(src) && !mm.find(src, bytes, mem_kind::pinned);
    const bool dst_pageable = !mm.on_device(dst) && !mm.find(dst, bytes, mem_kind::pinned);
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
    if ((mm.on_device(dst) && !mm.is_device(dst, dspan)) || (mm.on_device(src) && !mm.is_device(src, sspan)))
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
    {
        std::lock_guard lock(every_stream().m);
        every_stream().list.push_back(*s);
    }
    if (!(flags & cudaStreamNonBlocking)) {
        std::lock_guard lock(streams().m);
        streams().blocking.push_back(*s);
    }
    return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t* s) { return cudaStreamCreateWithFlags(s, cudaStreamDefault); }

cudaError_t cudaStreamDestroy(cudaStream_t s) {
    if (!s || !known_stream(s)) return fail(cudaErrorInvalidResourceHandle, "cudaStreamDestroy of an unknown stream");
    s->drain();  // CUDA lets queued work finish
    {
        std::lock_guard lock(every_stream().m);
        auto& l = every_stream().list;
        l.erase(std::find(l.begin(), l.end(), s));
    }
    {
        std::lock_guard lock(streams().m);
        auto& l = streams().blocking;
        l.erase(std::remove(l.begin(), l.end(), s), l.end());
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

// ---- cuBLAS ----

struct cublasContext {
    cudaStream_t stream = nullptr;
};

cublasStatus_t cublasCreate(cublasHandle_t* handle) {
    *handle = new cublasContext;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasDestroy(cublasHandle_t handle) {
    delete handle;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t s) {
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    handle->stream = s;
    return CUBLAS_STATUS_SUCCESS;
}

namespace {

size_t type_bytes(cudaDataType_t t) { return t == CUDA_R_32F ? 4 : 2; }

float load(const void* p, cudaDataType_t t, size_t i) {
    if (t == CUDA_R_32F) return static_cast<const float*>(p)[i];
    const uint16_t bits = static_cast<const uint16_t*>(p)[i];
    if (t == CUDA_R_16F) return __half2float(__ushort_as_half(bits));
    return __uint_as_float(uint32_t{bits} << 16);
}

cublasStatus_t blas_fail(const std::string& what) {
    report("cublasGemmEx: " + what);
    return CUBLAS_STATUS_INVALID_VALUE;
}

}  // namespace

cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                            int k, const void* alpha, const void* A, cudaDataType_t Atype, int lda, const void* B,
                            cudaDataType_t Btype, int ldb, const void* beta, void* C, cudaDataType_t Ctype, int ldc,
                            cublasComputeType_t compute, cublasGemmAlgo_t) {
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (sticky() != cudaSuccess) return CUBLAS_STATUS_EXECUTION_FAILED;
    if (m < 0 || n < 0 || k < 0) return blas_fail("negative dimension");
    if (transa == CUBLAS_OP_C || transb == CUBLAS_OP_C) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (Ctype != CUDA_R_32F || compute != CUBLAS_COMPUTE_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
    // Stored shapes (column-major): op(A) is m x k, op(B) is k x n.
    const int a_rows = transa == CUBLAS_OP_N ? m : k, a_cols = transa == CUBLAS_OP_N ? k : m;
    const int b_rows = transb == CUBLAS_OP_N ? k : n, b_cols = transb == CUBLAS_OP_N ? n : k;
    if (lda < std::max(1, a_rows) || ldb < std::max(1, b_rows) || ldc < std::max(1, m))
        return blas_fail("leading dimensions lda " + std::to_string(lda) + ", ldb " + std::to_string(ldb) + ", ldc " +
                         std::to_string(ldc) + " are below the rows " + std::to_string(a_rows) + ", " +
                         std::to_string(b_rows) + ", " + std::to_string(m));
    if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;
    auto span = [](int ld, int rows, int cols) { return cols == 0 ? 0 : size_t(ld) * size_t(cols - 1) + size_t(rows); };
    const memory_map& mm = memory();
    if (k > 0 && !mm.is_device(A, span(lda, a_rows, a_cols) * type_bytes(Atype)))
        return blas_fail("A (" + std::to_string(a_rows) + " x " + std::to_string(a_cols) + ", lda " +
                         std::to_string(lda) + ") is not inside one device allocation");
    if (k > 0 && !mm.is_device(B, span(ldb, b_rows, b_cols) * type_bytes(Btype)))
        return blas_fail("B (" + std::to_string(b_rows) + " x " + std::to_string(b_cols) + ", ldb " +
                         std::to_string(ldb) + ") is not inside one device allocation");
    if (!mm.is_device(C, span(ldc, m, n) * 4))
        return blas_fail("C (" + std::to_string(m) + " x " + std::to_string(n) + ", ldc " + std::to_string(ldc) +
                         ") is not inside one device allocation");
    const float a = *static_cast<const float*>(alpha), bt = *static_cast<const float*>(beta);
    target(handle->stream)->push([=] {
        std::lock_guard lock(g_kernel_mutex);
        auto* c = static_cast<float*>(C);
        for (int j = 0; j < n; ++j)
            for (int i = 0; i < m; ++i) {
                float sum = 0.0f;
                for (int p = 0; p < k; ++p) {
                    const size_t ai = transa == CUBLAS_OP_N ? size_t(p) * lda + i : size_t(i) * lda + p;
                    const size_t bi = transb == CUBLAS_OP_N ? size_t(j) * ldb + p : size_t(p) * ldb + j;
                    sum += load(A, Atype, ai) * load(B, Btype, bi);
                }
                float& out = c[size_t(j) * ldc + i];
                out = bt == 0.0f ? a * sum : a * sum + bt * out;  // beta 0: C is not read, as cuBLAS
            }
    });
    return CUBLAS_STATUS_SUCCESS;
}
