// The hybrid forward pass: everything on the GPU except the routed experts that are not resident in
// VRAM (the complement), which the CPU expert pool computes at the same time (stream_manager.hpp).
// Same contract as engine::forward_pass::eval; the CPU kv_cache passed in identifies the session,
// whose keys and values live in VRAM.
//
// No CUDA type appears here: engine code includes it in every build; create() says why there is no
// hybrid pass in a build without CUDA or on a machine without a usable device.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "expert_pool.hpp"
#include "hot_node.hpp"
#include "gpu/device.hpp"
#include "gpu/expert_cache.hpp"
#include "model/forward.hpp"
#include "model/hparams.hpp"
#include "model/kv_cache.hpp"
#include "model/weights.hpp"

namespace strata::engine::gpu {

struct hybrid_options {
    int gpu = 0;                       // CUDA device index
    std::optional<device_info> device; // `gpu` as select_device() returned it on this thread; nullopt: create() selects
    std::optional<double> expert_cache_gib;  // nullopt: auto
    int vram_reserve_mib = 512;
    std::string expert_profile;        // profile to fill the cache from ("": the default order)
    adapt_options adapt;
    int n_ctx = 0;                     // per session: the most positions its VRAM KV cache grows to
    // Positions per session whose VRAM KV cache the budget sets aside before sizing the expert cache
    // (0: n_ctx). The cache grows as a session fills; past these positions only into VRAM still free.
    int kv_reserved_ctx = 0;
    int kv_grow_tokens = 4096;         // the VRAM KV cache grows by whole steps of this many positions
    int n_batch = 512;                 // prompt tokens per forward batch (sizes the scratch)
    kv_type kv = kv_type::f16;         // the VRAM KV cache's type, as the CPU's (--kv f16 | int8)
    int gpu_sessions = 1;              // --gpu-sessions: sessions whose KV caches VRAM holds at once (sized for)
    bool decode_timing = false;        // STRATA_DECODE_TIMING=1: one log line per decode token
    // Where the pinned host pools go (hot_node::allocate_hot, region map included); must outlive the
    // pass. nullptr: anonymous memory, listed nowhere.
    const arenas::hot_node* hot = nullptr;
};

class hybrid_forward {
public:
    virtual ~hybrid_forward() = default;

    // nullptr with *why set (one sentence with the numbers) when the hybrid pass cannot run: no CUDA in
    // this build, no usable device, a weight type without a CUDA kernel, or dense weights that do not
    // fit. Throws std::runtime_error for a bad profile file or an --expert-cache size that does not fit.
    static std::unique_ptr<hybrid_forward> create(arenas::expert_pool& pool, const hparams& hp,
                                                  const model_weights& w, const std::vector<arenas::moe_layer>& layers,
                                                  const arenas::expert_rows& rows, const hybrid_options& options,
                                                  std::string* why);

    // As forward_pass::eval. kv identifies the session (its VRAM cache is created at position 0);
    // throws std::runtime_error if a session continues after its VRAM cache was given to another, and
    // kv_cache_full (naming the numbers, the session's cache intact) when VRAM has no room to grow it.
    virtual void eval(std::span<const int32_t> tokens, int pos0, kv_cache& kv, float* logits, bool all_logits,
                      int n_batch) = 0;
    // VRAM the session of kv has allocated for its keys and values (0: none), and what one session's
    // cache takes at the full context.
    virtual uint64_t kv_bytes(const kv_cache& kv) const = 0;
    virtual uint64_t kv_bytes_max() const = 0;

    virtual const routing_counts& routing() const = 0;
    virtual cache_stats expert_cache_stats() const = 0;
    virtual int device_numa_node() const = 0;  // -1: unknown
};

}  // namespace strata::engine::gpu
