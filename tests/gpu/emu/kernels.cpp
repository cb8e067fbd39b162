// The CUDA emulator's kernels: every CUDA thread of a block is a fiber with its own stack, and
// __syncthreads / __shfl_xor_sync switch between them. Kernels run one at a time, one block at a time.
//
// Stricter than a GPU where that hides bugs: shared memory is filled with NaN bytes before every block,
// the fibers between two barriers run in an order shuffled per round (seeded by STRATA_CUDA_EMU_SEED,
// reproducible), and a barrier reached from two different call sites is a kernel fault.
//
// On x86-64 the switch is a few instructions (callee-saved registers and the stack pointer;
// swapcontext would add a signal-mask system call per switch, and a kernel switches per shuffle);
// elsewhere ucontext.
#include <sys/mman.h>
#include <ucontext.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <random>
#include <vector>

#include "cuda_emu_device.hpp"
#include "emu_internal.hpp"

using namespace cuemu::detail;

// Bounds of the section that holds every __shared__ variable (cuda_emu_device.hpp), from the linker;
// null when no kernel in the program has shared memory.
extern "C" char __start_strata_cuemu_shared[] __attribute__((weak));
extern "C" char __stop_strata_cuemu_shared[] __attribute__((weak));

namespace {

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
    const char* barrier_file = nullptr;  // where the threads now waiting at __syncthreads called it
    int barrier_line = 0, barrier_thread = -1;
    std::mt19937_64 order_rng;           // the order fibers run in between barriers
    std::vector<size_t> order;
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
    g_block.barrier_file = nullptr;
}

void poison_shared_memory() {
    if (__start_strata_cuemu_shared && __stop_strata_cuemu_shared)
        std::memset(__start_strata_cuemu_shared, 0xff, static_cast<size_t>(__stop_strata_cuemu_shared - __start_strata_cuemu_shared));
}

void release_warp(warp_state& w, int warp) {
    for (int i = 0; i < w.size; ++i) {
        fiber& x = g_block.fibers[static_cast<size_t>(warp * kWarp + i)];
        if (x.state == fiber_state::at_warp_barrier) x.state = fiber_state::runnable;
    }
    w.arrived = 0;
}

void run_block(const cuemu::launch_config& c, dim3 block_idx, const std::function<void()>& body, uint64_t seed) {
    const int n = static_cast<int>(c.block.x * c.block.y * c.block.z);
    block_run& b = g_block;
    b.fibers.resize(static_cast<size_t>(n));
    b.warps.assign(static_cast<size_t>((n + kWarp - 1) / kWarp), warp_state{});
    b.live = n;
    b.at_barrier = 0;
    b.barrier_file = nullptr;
    b.body = &body;
    b.order_rng.seed(seed);
    b.order.resize(static_cast<size_t>(n));
    for (size_t i = 0; i < b.order.size(); ++i) b.order[i] = i;
    poison_shared_memory();
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
        std::shuffle(b.order.begin(), b.order.end(), b.order_rng);
        for (const size_t i : b.order) {
            fiber& f = b.fibers[i];
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

void syncthreads(const char* file, int line) {
    block_run& b = g_block;
    const int thread = static_cast<int>(b.current - b.fibers.data());
    if (!b.barrier_file) {
        b.barrier_file = file;
        b.barrier_line = line;
        b.barrier_thread = thread;
    } else if (line != b.barrier_line || std::strcmp(file, b.barrier_file) != 0) {
        kernel_fault("__syncthreads reached at " + std::string(file) + ":" + std::to_string(line) + " by thread " +
                     std::to_string(thread) + " while thread " + std::to_string(b.barrier_thread) + " waits at " +
                     b.barrier_file + ":" + std::to_string(b.barrier_line) + " (undefined on a GPU)");
    }
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
        if (p && !memory().is_device(p))
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
        static const uint64_t seed = env_size("STRATA_CUDA_EMU_SEED", 1);
        static uint64_t launches = 0;  // under g_kernel_mutex
        g_block.kernel = c.kernel;
        g_block.failed = false;
        std::mt19937_64 block_seeds(seed * 0x9e3779b97f4a7c15ull + ++launches);
        for (unsigned z = 0; z < c.grid.z && !g_block.failed; ++z)
            for (unsigned y = 0; y < c.grid.y && !g_block.failed; ++y)
                for (unsigned x = 0; x < c.grid.x && !g_block.failed; ++x)
                    run_block(c, dim3(x, y, z), body, block_seeds());
    });
    return cudaSuccess;
}

}  // namespace cuemu
