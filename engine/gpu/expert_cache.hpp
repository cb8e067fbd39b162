// The VRAM expert cache's bookkeeping, free of CUDA so that it builds and is tested everywhere:
// sizing, the residency table (layer x expert -> slot or none), the initial fill from an expert
// profile, hit-rate accounting, the split of a token's routing into resident experts and the CPU
// complement, and the adaptive tier that swaps experts in as the routing drifts.
//
// A slot holds one whole expert (gate, up and down of one layer). Copies into slots are started
// through an expert_copier (the CUDA one in gpu_backend.cpp, a scripted fake in the tests); the table
// points at a slot only once its copy has landed, so a lookup never reads a half-written slot.
//
// Thread-safety: none; the engine thread drives it between forward passes.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace strata::engine::gpu {

// ---- sizing ----

// "--expert-cache auto|GIB": nullopt for auto, else the size in GiB (>= 0). Throws
// std::invalid_argument naming the value.
std::optional<double> parse_expert_cache(const std::string& value);

struct vram_budget {
    uint64_t free_bytes = 0;     // free VRAM on the device before strata allocates
    uint64_t reserve_bytes = 0;  // --vram-reserve-mib: left for the driver, cuBLAS, other processes
    uint64_t dense_bytes = 0;    // attention, router, shared expert, norms, output head, scratch
    uint64_t kv_bytes_per_session = 0;  // one session's KV cache in VRAM (every layer, the whole context)
    int n_sessions = 1;          // --gpu-sessions: sessions whose KV caches VRAM holds at once
    uint64_t kv_bytes() const { return kv_bytes_per_session * static_cast<uint64_t>(n_sessions < 0 ? 0 : n_sessions); }
};

struct cache_size {
    int n_slots = 0;
    uint64_t slot_bytes = 0;
    uint64_t available_bytes = 0;  // free - reserve - dense - KV
};

// auto: as many slots as fit available_bytes; GIB: that many bytes of slots, which must fit.
// At most n_experts_total slots. Throws std::invalid_argument when n_sessions < 1, std::runtime_error
// with every number when dense + KV + reserve exceed the free VRAM, or when an explicit size exceeds
// what is available.
cache_size size_expert_cache(const vram_budget& budget, std::optional<double> gib, uint64_t slot_bytes,
                             int n_experts_total);

// ---- profile ----

// Routed counts per layer and expert. File format (text): a line "strata-expert-profile 1 <n_layer>
// <n_expert>", then one line of n_expert counts per layer.
struct expert_profile {
    int n_layer = 0;
    int n_expert = 0;
    std::vector<uint64_t> counts;  // [n_layer][n_expert]
};

void save_profile(const std::string& path, const expert_profile& profile);  // throws naming the path
// Throws std::runtime_error naming the path and the numbers when the file is unreadable, malformed, or
// for a model of another shape than n_layer x n_expert.
expert_profile load_profile(const std::string& path, int n_layer, int n_expert);

struct expert_key {
    int layer = 0;
    int expert = 0;
    bool operator==(const expert_key&) const = default;
};

// Every expert, most wanted first. With a profile: by count descending (ties: lower layer, then lower
// expert). Without one, the default order: expert 0 of every layer, then expert 1 of every layer, ...,
// so every layer gets the same number of residents.
std::vector<expert_key> fill_order(int n_layer, int n_expert, const expert_profile* profile);

// ---- copies ----

class expert_copier {
public:
    using ticket = uint64_t;
    virtual ~expert_copier() = default;
    // Starts copying expert `key` into `slot`; the slot's previous content must no longer be read by
    // work issued after this call.
    virtual ticket start(int slot, expert_key key) = 0;
    virtual bool landed(ticket t) = 0;  // non-blocking
    virtual void wait(ticket t) = 0;    // blocks until landed
};

// ---- the cache ----

struct adapt_options {
    int every = 0;        // --adapt-every: decode steps between adaptations (0: off)
    int swaps = 4;        // --adapt-swaps: experts replaced per adaptation at most
    bool async = false;   // --adapt-async 1: do not wait for the copies at the adaptation step
};

// One routed (token, expert) served from VRAM.
struct resident_job {
    int token = 0;
    int slot_in_token = 0;   // j in [0, n_expert_used)
    int slot = 0;            // VRAM slot
    float weight = 0;        // routing weight
};

struct cache_stats {
    uint64_t lookups = 0;        // routed (token, expert) lookups
    uint64_t hits = 0;           // of those, served from VRAM
    uint64_t swaps_started = 0;
    uint64_t swaps_landed = 0;
    int n_slots = 0;
    int n_resident = 0;
    double hit_rate() const { return lookups ? double(hits) / double(lookups) : 0.0; }
};

class expert_cache {
public:
    expert_cache(int n_layer, int n_expert, int n_slots, adapt_options adapt, expert_copier& copier);

    // Copies the first n_slots experts of `order` into the slots and waits until all have landed.
    void fill(const std::vector<expert_key>& order);

    // The slot holding (layer, expert), or -1 when it is not resident (or its copy has not landed).
    int slot_of(int layer, int expert) const { return table_[index(layer, expert)]; }

    // Splits routing ids/weights [n_tok][k] of one layer: resident (token, expert) pairs are appended
    // to `resident` (cleared first) in token-major order; complement [n_tok][k] receives the ids with -1
    // where resident (the CPU pool's input). Counts lookups, hits and the adaptive tier's routing.
    void split(int layer, int n_tok, int k, const int32_t* ids, const float* weights, int32_t* complement,
               std::vector<resident_job>& resident);

    // After each decode step: commits copies that have landed; every adapt.every steps starts up to
    // adapt.swaps swaps (waiting for them unless adapt.async).
    void end_decode_step();
    // Waits for every copy in flight and commits it.
    void drain();

    const cache_stats& stats() const { return stats_; }
    int n_slots() const { return n_slots_; }
    int n_pending() const { return static_cast<int>(pending_.size()); }
    // What slot s holds (or will hold once its copy lands); layer -1 when empty.
    expert_key slot_content(int slot) const { return slots_[static_cast<size_t>(slot)]; }

private:
    struct pending_copy {
        int slot;
        expert_key key;
        expert_copier::ticket ticket;
    };
    size_t index(int layer, int expert) const { return static_cast<size_t>(layer) * n_expert_ + expert; }
    void adapt();
    void commit(const pending_copy& p);

    int n_layer_, n_expert_, n_slots_;
    adapt_options adapt_;
    expert_copier& copier_;
    std::vector<int32_t> table_;       // [n_layer][n_expert] slot or -1 (landed copies only)
    std::vector<expert_key> slots_;    // [n_slots] content, {-1, -1} when empty
    std::vector<pending_copy> pending_;
    std::vector<uint64_t> recent_;     // [n_layer][n_expert] routed counts, halved at each adaptation
    int steps_ = 0;
    cache_stats stats_;
};

}  // namespace strata::engine::gpu
