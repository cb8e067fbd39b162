// One tbb::task_arena per slice, and in it one crew member task per worker. Dispatch: the host cuts each
// slice's items into one contiguous share per participant (itself first in its own slice), bumps the
// slice's generation, which members still spinning from the last phase see at once, and enqueues a
// task for each member that has retired. Every participant claims the front of its own share in
// halving chunks, then what is left of the others', so the phase's tail is split, not waited for. A
// member spins `spin` for the next phase before it returns its thread to TBB, so back-to-back phases
// skip TBB's steal, the enqueue and the worker wake-up.
#include "expert_pool.hpp"

#include <sched.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <charconv>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <thread>

#include <oneapi/tbb/global_control.h>
#include <oneapi/tbb/task_arena.h>
#include <oneapi/tbb/task_scheduler_observer.h>

#include "log.hpp"

namespace strata::arenas {

namespace {

using clock_type = std::chrono::steady_clock;

// ThreadSanitizer cannot see the synchronisation inside libtbb (not instrumented): the hand-off of a
// phase to a slice's task and of a chunk's results back to the thread that joins would read as races.
// These annotations state the happens-before edges TBB guarantees; they compile to nothing otherwise.
#if defined(__SANITIZE_THREAD__)
extern "C" void __tsan_acquire(void* addr);
extern "C" void __tsan_release(void* addr);
void happens_after(void* p) { __tsan_acquire(p); }
void happens_before(void* p) { __tsan_release(p); }
#else
void happens_after(void*) {}
void happens_before(void*) {}
#endif

// Chosen with `strata-bench pool` (see the report in tools/bench/bench_pool.cpp): long enough to
// cover the gap between the phases of one MoE layer, short enough that an idle pool sleeps at once.
constexpr std::chrono::microseconds spin_default{50};

void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#else
    std::this_thread::yield();
#endif
}

// CPUs seen by a slice, as an atomic bitset (1024 CPUs).
struct cpu_record {
    std::array<std::atomic<std::uint64_t>, 16> bits{};
    void note() {
        const int cpu = sched_getcpu();
        if (cpu < 0 || cpu >= 1024) return;
        auto& word = bits[static_cast<std::size_t>(cpu) / 64];
        const std::uint64_t bit = std::uint64_t{1} << (cpu % 64);
        if (!(word.load(std::memory_order_relaxed) & bit)) word.fetch_or(bit, std::memory_order_relaxed);
    }
    std::vector<int> cpus() const {
        std::vector<int> out;
        for (int cpu = 0; cpu < 1024; ++cpu)
            if (bits[static_cast<std::size_t>(cpu) / 64].load() & (std::uint64_t{1} << (cpu % 64))) out.push_back(cpu);
        return out;
    }
};

bool pin_to(int cpu) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    return sched_setaffinity(0, sizeof(set), &set) == 0;
}

// Pins every worker that enters a pinned slice's arena to one core: arena slot k -> the k-th core of
// the slice that is not the host's. On leaving, the thread gets the process's mask back, so TBB
// workers that later serve other arenas are not left pinned.
class pinning_observer : public tbb::task_scheduler_observer {
public:
    pinning_observer(tbb::task_arena& arena, const pool_slice& slice, int host_cpu, cpu_set_t process_mask,
                     std::atomic<std::uint64_t>& failures)
        : tbb::task_scheduler_observer(arena), process_mask_(process_mask), failures_(failures) {
        for (int cpu : slice.cores)
            if (!(slice.has_host && cpu == host_cpu)) worker_cores_.push_back(cpu);
        reserved_ = slice.has_host ? 1 : 0;
        happens_before(this);
        observe(true);
    }
    ~pinning_observer() override { observe(false); }

    void on_scheduler_entry(bool is_worker) override {
        happens_after(this);
        if (!is_worker || worker_cores_.empty()) return;
        const int slot = std::max(0, tbb::this_task_arena::current_thread_index() - reserved_);
        const int cpu = worker_cores_[static_cast<std::size_t>(slot) % worker_cores_.size()];
        if (!pin_to(cpu)) failures_.fetch_add(1);
    }
    void on_scheduler_exit(bool is_worker) override {
        if (is_worker) sched_setaffinity(0, sizeof(process_mask_), &process_mask_);
    }

private:
    std::vector<int> worker_cores_;
    int reserved_ = 0;
    cpu_set_t process_mask_;
    std::atomic<std::uint64_t>& failures_;
};

struct alignas(64) member_slot {
    std::atomic<bool> alive{false};  // a task of this member is queued or running in the arena
};

// One participant's share of a slice's items. Its owner claims from the front; so do the others once
// their own shares are gone, so the tail of a phase is split rather than waited for.
struct alignas(64) item_share {
    std::atomic<std::size_t> next{0};
    std::size_t end = 0;
};

struct alignas(64) slice_runtime {
    std::unique_ptr<tbb::task_arena> arena;
    std::unique_ptr<pinning_observer> observer;
    cpu_record cpus;
    // Participants: the host first where the slice has it, then one crew member per worker.
    int n_participants = 0;
    int first_member = 0;  // participant index of member 0
    std::unique_ptr<member_slot[]> members;
    std::unique_ptr<item_share[]> shares;
    alignas(64) std::atomic<std::uint64_t> generation{0};  // bumped when a phase opens
    std::atomic<bool> open{false};                          // members may join the current phase
    std::atomic<int> active{0};                             // members inside the current phase
    std::atomic<int> tasks{0};                              // member tasks queued or running
    alignas(64) std::atomic<std::size_t> items_done{0};
    std::size_t items_total = 0;
    std::atomic<bool> failed{false};
    std::exception_ptr error;  // the first exception, written by the participant that set `failed`
};

}  // namespace

std::chrono::microseconds pool_options::default_spin() { return spin_default; }

pool_options read_pool_options(const env_lookup& env) {
    pool_options options;
    auto parse = [](const char* name, const std::string& v) {
        long long out = 0;
        auto [ptr, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
        if (ec != std::errc() || ptr != v.data() + v.size() || out < 0)
            throw std::invalid_argument(std::string(name) + "='" + v + "' is not an integer >= 0");
        return out;
    };
    if (auto v = env("STRATA_POOL_SPIN_US"); v && !v->empty())
        options.spin = std::chrono::microseconds(parse("STRATA_POOL_SPIN_US", *v));
    if (auto v = env("STRATA_POOL_STALL_MS"); v && !v->empty())
        options.stall_after = std::chrono::milliseconds(std::max(1LL, parse("STRATA_POOL_STALL_MS", *v)));
    if (auto v = env("STRATA_POOL_TBB_LIMIT"); v && !v->empty()) {
        if (*v != "raise" && *v != "keep")
            throw std::invalid_argument("STRATA_POOL_TBB_LIMIT='" + *v + "' is not 'raise' or 'keep'");
        options.raise_tbb_limit = *v == "raise";
    }
    return options;
}

struct expert_pool::impl {
    pool_plan plan;
    pool_options options;
    std::vector<std::unique_ptr<slice_runtime>> slices;
    std::unique_ptr<tbb::global_control> thread_limit;
    std::atomic<std::uint64_t> pin_failures{0};
    std::uint64_t phases = 0;
    std::atomic<std::uint64_t> stalls{0};

    // The current phase, written by the host before it hands the phase out.
    const phase_fn* fn = nullptr;
    std::size_t grain = 1;
    std::vector<std::size_t> same_items;  // run_phase(n_items_per_slice)'s counts, one per slice

    // Join: slices with items left; the host sleeps on `done_cv` once its spin runs out.
    std::atomic<int> remaining{0};
    std::mutex done_mutex;
    std::condition_variable done_cv;

    // Watchdog for stalled phases.
    std::thread watchdog;
    std::mutex watch_mutex;
    std::condition_variable watch_cv;
    bool phase_active = false;
    bool stopping = false;

    cpu_set_t host_mask_before{};
    bool host_pinned = false;

    // Claims the front of `share`: half of what is left, at least `grain` items. false: nothing left.
    static bool claim(item_share& share, std::size_t grain, std::size_t& begin, std::size_t& end) {
        std::size_t cur = share.next.load(std::memory_order_relaxed);
        while (cur < share.end) {
            const std::size_t left = share.end - cur;
            const std::size_t take = std::min(left, std::max(grain, (left / 2 + grain - 1) / grain * grain));
            if (share.next.compare_exchange_weak(cur, cur + take, std::memory_order_relaxed)) {
                begin = cur;
                end = cur + take;
                return true;
            }
        }
        return false;
    }

    void finish_slice() {
        if (remaining.fetch_sub(1, std::memory_order_acq_rel) == 1) {
            std::lock_guard lock(done_mutex);
            done_cv.notify_one();
        }
    }

    // Slice s's items as participant p: its own share first, then whatever the others have left.
    void take_part(int s, int p) {
        auto& rt = *slices[static_cast<std::size_t>(s)];
        rt.cpus.note();
        const int n = rt.n_participants;
        for (int k = 0; k < n; ++k) {
            auto& share = rt.shares[static_cast<std::size_t>((p + k) % n)];
            std::size_t begin = 0, end = 0;
            while (claim(share, grain, begin, end)) {
                // After a failure the rest of the phase is skipped, as a cancelled parallel_for would.
                if (!rt.failed.load(std::memory_order_relaxed)) {
                    try {
                        (*fn)(s, begin, end);
                    } catch (...) {
                        if (!rt.failed.exchange(true, std::memory_order_relaxed)) rt.error = std::current_exception();
                    }
                }
                const std::size_t n_done = end - begin;
                if (rt.items_done.fetch_add(n_done, std::memory_order_acq_rel) + n_done == rt.items_total) finish_slice();
            }
        }
    }

    // A crew member's task in slice s's arena: take part in every phase opened while it spins, and
    // retire once none opens within the spin time. The host re-enqueues a retired member (open_slice).
    void serve(int s, int m) {
        happens_after(this);
        auto& rt = *slices[static_cast<std::size_t>(s)];
        auto& me = rt.members[static_cast<std::size_t>(m)];
        std::uint64_t seen = 0;
        auto deadline = clock_type::now() + options.spin;
        for (;;) {
            const std::uint64_t g = rt.generation.load(std::memory_order_seq_cst);
            if (g != seen) {
                seen = g;
                rt.active.fetch_add(1, std::memory_order_seq_cst);
                if (rt.open.load(std::memory_order_seq_cst)) take_part(s, rt.first_member + m);
                rt.active.fetch_sub(1, std::memory_order_seq_cst);
                deadline = clock_type::now() + options.spin;
                continue;
            }
            if (clock_type::now() < deadline) {
                cpu_relax();
                continue;
            }
            // Retire, unless a phase opened meanwhile and the host did not enqueue a new task for it.
            me.alive.store(false, std::memory_order_seq_cst);
            if (rt.generation.load(std::memory_order_seq_cst) != seen) {
                bool expected = false;
                if (me.alive.compare_exchange_strong(expected, true, std::memory_order_seq_cst)) {
                    deadline = clock_type::now() + options.spin;
                    continue;
                }
            }
            break;
        }
        rt.tasks.fetch_sub(1, std::memory_order_release);  // the last touch of the pool's memory
    }

    // Publishes slice s's phase (its shares are set) and wakes its crew: spinning members see the new
    // generation; a retired one gets a new task in the slice's arena.
    void open_slice(int s) {
        auto& rt = *slices[static_cast<std::size_t>(s)];
        rt.open.store(true, std::memory_order_seq_cst);
        rt.generation.fetch_add(1, std::memory_order_seq_cst);
        for (int m = 0; m < rt.n_participants - rt.first_member; ++m) {
            auto& slot = rt.members[static_cast<std::size_t>(m)];
            if (slot.alive.load(std::memory_order_seq_cst)) continue;
            bool expected = false;
            if (!slot.alive.compare_exchange_strong(expected, true, std::memory_order_seq_cst)) continue;
            rt.tasks.fetch_add(1, std::memory_order_relaxed);
            happens_before(this);
            rt.arena->enqueue([this, s, m] { serve(s, m); });
        }
    }

    // After every item is done: members that join from now on leave at once.
    void close_slice(int s) { slices[static_cast<std::size_t>(s)]->open.store(false, std::memory_order_seq_cst); }

    // Before the host rewrites a slice's phase: members still in the last one (finding its shares empty)
    // have left. Waiting here rather than at the join keeps their exit off the phase's time.
    void await_members(int s) {
        const auto& rt = *slices[static_cast<std::size_t>(s)];
        while (rt.active.load(std::memory_order_seq_cst) != 0) cpu_relax();
    }

    void wait_for_slices() {
        const auto deadline = clock_type::now() + options.spin;
        while (remaining.load(std::memory_order_acquire) != 0 && clock_type::now() < deadline) cpu_relax();
        std::unique_lock lock(done_mutex);
        done_cv.wait(lock, [&] { return remaining.load(std::memory_order_acquire) == 0; });
    }

    void watch() {
        std::vector<std::size_t> last_done(slices.size());
        std::vector<clock_type::time_point> last_change(slices.size(), clock_type::now());
        std::unique_lock lock(watch_mutex);
        const auto period = std::max<std::chrono::milliseconds>(std::chrono::milliseconds(1), options.stall_after / 4);
        while (!stopping) {
            watch_cv.wait_for(lock, period);
            if (stopping) break;
            const auto now = clock_type::now();
            for (std::size_t s = 0; s < slices.size(); ++s) {
                const auto& rt = *slices[s];
                const std::size_t done = rt.items_done.load(std::memory_order_relaxed);
                if (!phase_active || done != last_done[s] || done >= rt.items_total) {
                    last_done[s] = done;
                    last_change[s] = now;
                    continue;
                }
                if (now - last_change[s] < options.stall_after) continue;
                stall_report report{static_cast<int>(s), plan.slices[s].node, done, rt.items_total,
                                    std::chrono::duration<double>(now - last_change[s]).count()};
                last_change[s] = now;
                stalls.fetch_add(1);
                lock.unlock();
                if (options.on_stall) options.on_stall(report);
                else
                    logger("arenas")->error("Expert pool phase stalled: slice {} (node {}) has finished {} of {} items "
                                            "and made no progress for {:.1f} s.",
                                            report.slice, report.node, report.items_done, report.items_total,
                                            report.seconds);
                lock.lock();
            }
        }
    }
};

expert_pool::expert_pool(pool_plan plan, pool_options options) : impl_(std::make_unique<impl>()) {
    auto& m = *impl_;
    m.plan = std::move(plan);
    m.options = std::move(options);
    if (m.plan.slices.empty()) throw std::invalid_argument("the pool plan has no slice");

    // Make sure TBB's worker pool is large enough for every slice's workers at once (test mode may
    // ask for more threads than the machine has cores).
    const int needed = m.plan.total_threads();
    const auto allowed = tbb::global_control::active_value(tbb::global_control::max_allowed_parallelism);
    if (needed > static_cast<int>(allowed)) {
        if (!m.options.raise_tbb_limit)
            throw std::invalid_argument("the expert pool needs " + std::to_string(needed) +
                                        " TBB threads but tbb::global_control allows " + std::to_string(allowed) +
                                        " and the pool may not raise it (raise_tbb_limit off); ask for fewer "
                                        "--pool-workers or allow more threads");
        m.thread_limit = std::make_unique<tbb::global_control>(tbb::global_control::max_allowed_parallelism,
                                                               static_cast<std::size_t>(needed));
        // The smallest active limit wins: an application's lower one stands, and the slices would starve.
        if (const auto now = tbb::global_control::active_value(tbb::global_control::max_allowed_parallelism);
            now < static_cast<std::size_t>(needed))
            throw std::invalid_argument("the expert pool needs " + std::to_string(needed) +
                                        " TBB threads but a tbb::global_control of the application allows " +
                                        std::to_string(now) + "; ask for fewer --pool-workers or allow more threads");
    }

    cpu_set_t process_mask;
    CPU_ZERO(&process_mask);
    sched_getaffinity(0, sizeof(process_mask), &process_mask);
    if (m.plan.split && m.options.pin_host) {
        m.host_mask_before = process_mask;
        m.host_pinned = pin_to(m.plan.host_cpu);
        if (!m.host_pinned) m.pin_failures.fetch_add(1);
    }

    for (const auto& s : m.plan.slices) {
        if (s.threads() < 1)
            throw std::invalid_argument("pool slice for node " + std::to_string(s.node) + " has no thread (" +
                                        std::to_string(s.workers) + " workers, no host)");
        auto rt = std::make_unique<slice_runtime>();
        const int reserved = s.has_host ? 1 : 0;
        rt->arena = std::make_unique<tbb::task_arena>(std::max(1, s.threads()), reserved);
        rt->arena->initialize();
        if (s.pinned)
            rt->observer = std::make_unique<pinning_observer>(*rt->arena, s, m.plan.host_cpu, process_mask, m.pin_failures);
        rt->first_member = s.has_host ? 1 : 0;
        rt->n_participants = rt->first_member + std::max(0, s.workers);
        rt->members = std::make_unique<member_slot[]>(static_cast<std::size_t>(std::max(0, s.workers)));
        rt->shares = std::make_unique<item_share[]>(static_cast<std::size_t>(std::max(1, rt->n_participants)));
        m.slices.push_back(std::move(rt));
    }
    m.watchdog = std::thread([this] { impl_->watch(); });
}

expert_pool::~expert_pool() {
    auto& m = *impl_;
    {
        std::lock_guard lock(m.watch_mutex);
        m.stopping = true;
    }
    m.watch_cv.notify_all();
    m.watchdog.join();
    // Let spinning members retire before the arenas go away.
    for (auto& rt : m.slices) {
        while (rt->tasks.load(std::memory_order_acquire) != 0) cpu_relax();
        rt->observer.reset();
        rt->arena->terminate();
    }
    if (m.host_pinned) sched_setaffinity(0, sizeof(m.host_mask_before), &m.host_mask_before);
}

std::unique_ptr<expert_pool> expert_pool::create(const topology& topo, pool_requests requests, pool_options options) {
    auto log = logger("arenas");
    auto emit = [&](const pool_plan& plan) {
        for (const auto& line : plan.log) {
            if (line.level == log_level::warn) log->warn("{}", line.text);
            else log->info("{}", line.text);
        }
    };
    pool_plan plan = plan_pool(topo, requests);
    emit(plan);
    auto pool = std::make_unique<expert_pool>(plan, options);
    if (!plan.split) return pool;
    // Wake every worker once so each is pinned now rather than in the first real phase.
    pool->run_phase(static_cast<std::size_t>(4 * std::max(1, plan.total_threads())), [](int, std::size_t, std::size_t) {
        std::this_thread::sleep_for(std::chrono::microseconds(200));
    });
    if (pool->pin_failures() == 0) return pool;
    log->warn("Pinning failed for {} of the pool's {} threads.", pool->pin_failures(), plan.total_threads());
    pool.reset();
    requests.pinning_failed = true;
    plan = plan_pool(topo, requests);
    emit(plan);
    return std::make_unique<expert_pool>(plan, options);
}

const pool_plan& expert_pool::plan() const { return impl_->plan; }
int expert_pool::n_slices() const { return static_cast<int>(impl_->slices.size()); }

void expert_pool::run_phase(std::size_t n_items_per_slice, const phase_fn& fn, std::size_t grain) {
    auto& n = impl_->same_items;  // grows once; phases never nest
    n.assign(impl_->slices.size(), n_items_per_slice);
    run_phase(n, fn, grain);
}

void expert_pool::run_phase(std::span<const std::size_t> n_items, const phase_fn& fn, std::size_t grain) {
    auto& m = *impl_;
    if (n_items.size() != m.slices.size())
        throw std::invalid_argument("run_phase got item counts for " + std::to_string(n_items.size()) +
                                    " slices, the pool has " + std::to_string(m.slices.size()));
    for (std::size_t s = 0; s < m.slices.size(); ++s) m.await_members(static_cast<int>(s));
    m.fn = &fn;
    m.grain = std::max<std::size_t>(1, grain);
    const int host = m.plan.host_slice;
    int busy = 0;
    for (std::size_t s = 0; s < m.slices.size(); ++s) {
        auto& rt = *m.slices[s];
        rt.items_total = n_items[s];
        rt.items_done.store(0, std::memory_order_relaxed);
        rt.failed.store(false, std::memory_order_relaxed);
        rt.error = nullptr;
        if (n_items[s] == 0) continue;
        ++busy;
        // Contiguous shares in whole grains, one per participant: each thread streams its own rows.
        const std::size_t grains = (n_items[s] + m.grain - 1) / m.grain;
        const auto parts = static_cast<std::size_t>(std::max(1, rt.n_participants));
        for (std::size_t p = 0; p < parts; ++p) {
            rt.shares[p].next.store(std::min(n_items[s], grains * p / parts * m.grain), std::memory_order_relaxed);
            rt.shares[p].end = std::min(n_items[s], grains * (p + 1) / parts * m.grain);
        }
    }
    m.remaining.store(busy, std::memory_order_release);
    happens_before(&m);
    {
        std::lock_guard lock(m.watch_mutex);
        m.phase_active = true;
    }
    auto& own = *m.slices[static_cast<std::size_t>(host)];
    for (std::size_t s = 0; s < m.slices.size(); ++s)
        if (n_items[s] > 0 && (static_cast<int>(s) != host || own.n_participants > own.first_member))
            m.open_slice(static_cast<int>(s));
    if (n_items[static_cast<std::size_t>(host)] > 0 && own.first_member == 1) m.take_part(host, 0);
    m.wait_for_slices();
    for (std::size_t s = 0; s < m.slices.size(); ++s)
        if (n_items[s] > 0) m.close_slice(static_cast<int>(s));
    {
        std::lock_guard lock(m.watch_mutex);
        m.phase_active = false;
    }
    ++m.phases;
    for (auto& rt : m.slices)
        if (rt->error) std::rethrow_exception(rt->error);
}

std::vector<std::vector<int>> expert_pool::cpus_seen() const {
    std::vector<std::vector<int>> out;
    for (const auto& rt : impl_->slices) out.push_back(rt->cpus.cpus());
    return out;
}

bool expert_pool::affinity_ok(std::string* why) const {
    const auto seen = cpus_seen();
    for (std::size_t s = 0; s < seen.size(); ++s) {
        const auto& slice = impl_->plan.slices[s];
        if (!slice.pinned) continue;
        for (int cpu : seen[s]) {
            if (std::find(slice.cores.begin(), slice.cores.end(), cpu) != slice.cores.end()) continue;
            if (why)
                *why = "slice " + std::to_string(s) + " (node " + std::to_string(slice.node) + ") ran on CPU " +
                       std::to_string(cpu) + ", outside its cores " + format_cpu_list(slice.cores);
            return false;
        }
    }
    return true;
}

std::uint64_t expert_pool::pin_failures() const { return impl_->pin_failures.load(); }
std::uint64_t expert_pool::phases_run() const { return impl_->phases; }
std::uint64_t expert_pool::stalls_reported() const { return impl_->stalls.load(); }

}  // namespace strata::arenas
