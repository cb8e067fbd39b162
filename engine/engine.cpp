#include "engine_impl.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include <nlohmann/json.hpp>
#include <spdlog/fmt/fmt.h>

#include "batcher.hpp"
#include "gpu/device.hpp"
#include "gpu/expert_cache.hpp"
#include "log.hpp"
#include "model_info.hpp"
#include "process_memory.hpp"
#include "topology.hpp"

namespace strata {

engine_thread::engine_thread() : thread_([this] { loop(); }) {}

engine_thread::~engine_thread() {
    {
        std::lock_guard lock(mutex_);
        stop_ = true;
    }
    wake_.notify_one();
    thread_.join();
}

void engine_thread::run(const std::function<void()>& fn) {
    std::packaged_task<void()> task(fn);
    std::future<void> done = task.get_future();
    {
        std::lock_guard lock(mutex_);
        tasks_.push_back(std::move(task));
    }
    wake_.notify_one();
    done.get();
}

void engine_thread::post(std::function<void()> fn) {
    {
        std::lock_guard lock(mutex_);
        tasks_.emplace_back(std::move(fn));
    }
    wake_.notify_one();
}

void engine_thread::loop() {
    for (;;) {
        std::packaged_task<void()> task;
        {
            std::unique_lock lock(mutex_);
            wake_.wait(lock, [&] { return stop_ || !tasks_.empty(); });
            if (tasks_.empty()) return;
            task = std::move(tasks_.front());
            tasks_.pop_front();
        }
        task();
    }
}

std::string_view prefix_source_name(prefix_source s) {
    switch (s) {
        case prefix_source::live: return "live";
        case prefix_source::snapshot: return "snapshot";
        case prefix_source::none: break;
    }
    return "none";
}

std::string_view stop_reason_name(stop_reason r) {
    switch (r) {
        case stop_reason::eos:
        case stop_reason::stop_string: return "stop";
        case stop_reason::length: return "length";
        case stop_reason::cancelled: return "cancelled";
    }
    return "stop";
}

namespace {

arenas::pool_requests pool_requests_for(const model_options& o) {
    arenas::pool_flags flags;
    if (!o.numa_pool.empty()) flags.numa_pool = o.numa_pool;
    flags.pool_workers = o.pool_workers;
    return arenas::read_pool_requests(arenas::process_environment(), flags);
}

model_info describe(const model::impl& m, const arenas::pool_plan& plan) {
    model_info i;
    const auto& hp = m.hp;
    i.path = m.options.path;
    i.architecture = hp.arch.name;
    i.name = m.file.get_string("general.name", "");
    i.n_layer = hp.n_layer;
    i.n_embd = hp.n_embd;
    i.n_head = hp.n_head;
    i.n_head_kv = hp.n_head_kv;
    i.head_dim = hp.head_dim;
    i.n_rot = hp.n_rot;
    i.kv_lora_rank = hp.n_lora_kv;
    i.n_expert = hp.n_expert;
    i.n_expert_used = hp.n_expert_used;
    i.n_ff_exp = hp.n_ff_exp;
    i.n_vocab = hp.n_vocab;
    i.n_ctx_train = hp.n_ctx_train;
    i.n_ctx = m.options.n_ctx;
    i.n_batch = m.options.n_batch;
    i.kv_type = engine::kv_type_name(m.kv);
    i.chat_format = m.chat ? std::string(m.chat->name()) : "";
    i.file_bytes = m.file.file_size();
    const engine::kv_rows rows = engine::sequence_rows(hp);
    i.kv_bytes_per_session = engine::kv_cache::bytes_needed(hp.n_kv_layer(), m.options.n_ctx, rows.n_head_kv,
                                                               rows.head_dim, m.kv, rows.latent);
    i.kv_chunk_tokens = engine::kv_cache::chunk_tokens;
    if (m.hybrid) {  // the keys and values live in VRAM
        i.kv_bytes_per_session = m.hybrid->kv_bytes_max();
        i.kv_chunk_tokens = engine::gpu::hybrid_options{}.kv_grow_tokens;
    }
    i.kv_bytes_per_token = engine::kv_cache::bytes_per_token(hp.n_kv_layer(), rows.n_head_kv, rows.head_dim, m.kv,
                                                             rows.latent);
    i.n_kv_layers = hp.n_kv_layer();
    for (size_t il = 0; il < hp.qsa_ratio.size() && il < static_cast<size_t>(hp.n_layer); ++il)
        if (hp.qsa_ratio[il] > 0) i.qsa_ratios.push_back(hp.qsa_ratio[il]);
    if (!i.qsa_ratios.empty()) {
        i.qsa_top_k = hp.idx_top_k;
        i.qsa_heads = hp.idx_n_head;
        i.qsa_key_length = hp.idx_head_dim;
    }
    i.n_recurrent_layers = engine::n_recurrent_layers(hp);
    i.state_bytes_per_session = engine::sequence_state_bytes(hp);
    i.state_checkpoint_interval = i.n_recurrent_layers > 0 ? m.options.state_checkpoint_interval : 0;
    i.pool_split = plan.split;
    i.pool_test_mode = plan.test_mode;
    i.pool_reason = plan.reason;
    for (const auto& s : plan.slices) i.pool_slices.push_back({s.node, s.threads(), s.cores});
    const arenas::store_placement& p = m.store->placement();
    static constexpr const char* kModes[] = {"split", "test", "copy", "mapped"};
    i.placement_mode = kModes[static_cast<int>(p.mode)];
    i.placement = p.describe();
    i.expert_bytes = p.bytes;
    for (const auto& n : p.nodes) i.placement_nodes.push_back({n.slice, n.node, n.bytes, n.share, n.ok});
    i.region_map_path = m.regions.path();
    i.gpu_hybrid = m.hybrid != nullptr;
    i.gpu_cpu_only_reason = m.cpu_only_reason;
    return i;
}

// The device behind --gpu, resolved once at load: its NUMA node steers the host thread and
// --numa-hot-node auto. `why` says why there is none (no --gpu, no usable device, no CUDA).
struct gpu_choice {
    int index = -1;  // --gpu
    std::optional<engine::gpu::device_info> device;
    std::string why = "no --gpu was given";

    int numa_node() const { return device ? device->numa_node : -1; }
};

gpu_choice choose_gpu(const model_options& o) {
    gpu_choice g;
    g.index = o.gpu;
    if (o.gpu >= 0) g.device = engine::gpu::select_device(o.gpu, &g.why);
    return g;
}

// --numa-hot-node auto: the NUMA node of the GPU (--gpu), else off; other values pass through.
std::string hot_node_option(const model_options& o, const gpu_choice& gpu) {
    if (o.numa_hot_node != "auto") return o.numa_hot_node;
    if (gpu.numa_node() >= 0) {
        logger("gpu")->info("--numa-hot-node auto: node {}, the NUMA node of GPU {} ({}).", gpu.numa_node(),
                            gpu.device->index, gpu.device->pci_bus_id);
        return std::to_string(gpu.numa_node());
    }
    logger("gpu")->info("--numa-hot-node auto: off ({}).", gpu.device ? "the GPU's NUMA node is unknown" : gpu.why);
    return "off";
}

// The one line under --gpu that says where the host thread went: the engine thread, which drives the
// GPU's streams and takes part in the pool's slice on its own node.
void log_host_thread(const arenas::topology& topo, const arenas::pool_plan& plan, const gpu_choice& gpu) {
    const arenas::numa_node* node = topo.node_of_cpu(plan.host_cpu);
    const int host_node = node ? node->os_index : -1;
    const std::string where =
        plan.split ? fmt::format("pinned to CPU {} on node {} (slice {})", plan.host_cpu, host_node, plan.host_slice)
                   : fmt::format("on node {}, not pinned because the NUMA split is off ({})", host_node, plan.reason);
    std::string because;
    if (!gpu.device) because = fmt::format("GPU {} is not usable, so the default host core stands", gpu.index);
    else if (gpu.numa_node() < 0)
        because = fmt::format("the NUMA node of GPU {} ({}) is unknown, so the default host core stands", gpu.device->index,
                              gpu.device->pci_bus_id);
    else if (gpu.numa_node() == host_node)
        because = fmt::format("node {} is the NUMA node of GPU {} ({})", host_node, gpu.device->index, gpu.device->pci_bus_id);
    else
        because = fmt::format("GPU {} ({}) is on node {}, which cannot take the host thread (see the pool's line above)",
                              gpu.device->index, gpu.device->pci_bus_id, gpu.numa_node());
    logger("gpu")->info("The host thread runs {}: {}.", where, because);
}

// Builds the pool, claims the hot node, places the resident experts and builds the forward pass; runs
// on the engine thread, which the pool pins to the host core under the split (a core of the GPU's
// node under --gpu). Returns the device chosen for --gpu.
gpu_choice build_on_engine_thread(model::impl& r) {
    const arenas::topology topo = arenas::load_machine_topology();
    const gpu_choice gpu = choose_gpu(r.options);
    arenas::pool_requests requests = pool_requests_for(r.options);
    if (gpu.numa_node() >= 0) requests.host_node = gpu.numa_node();
    r.pool = arenas::expert_pool::create(topo, requests, arenas::read_pool_options(arenas::process_environment()));
    if (r.options.gpu >= 0) log_host_thread(topo, r.pool->plan(), gpu);
    const arenas::moe_shape shape{r.hp.n_embd, r.hp.n_ff_exp, r.hp.n_expert, r.hp.n_expert_used};
    r.hot = std::make_unique<arenas::hot_node>(arenas::parse_hot_node(hot_node_option(r.options, gpu)), topo, &r.regions);
    arenas::store_options so;
    so.mmap_experts = r.options.mmap_experts;
    so.repack = r.options.repack;
    so.regions = &r.regions;
    if (r.hot->active() && !r.pool->plan().split && !so.mmap_experts)
        so.claimed = r.hot->claim_complement(arenas::expert_store::bytes_per_slice(r.pool->plan(), shape, r.moe_layers, so.repack)[0]);
    // Drop each layer's experts from the page cache once copied, so the cache never crowds a node.
    so.on_layer_copied = [&r](int layer) {
        const std::string prefix = fmt::format("blk.{}.", layer);
        for (const auto& t : r.file.tensors())
            if (t.name.starts_with(prefix) && tensor_class(t.name) == "experts") r.file.release_pages(t);
    };
    r.store = std::make_unique<arenas::expert_store>(*r.pool, shape, r.moe_layers, std::move(so));
    // The dense matrices run on the CPU only without a GPU: then they get the GEMM layout too, in RAM,
    // and the mapped file's pages they came from are dropped.
    if (r.options.repack && !gpu.device) {
        const engine::repack_summary packed = engine::repack_dense(r.weights);
        r.dense_copy_bytes = packed.bytes + packed.copied_bytes;
        const auto listed = [](const std::vector<std::string>& v, const std::string& name) {
            return std::find(v.begin(), v.end(), name) != v.end();
        };
        for (const auto& t : r.file.tensors()) {
            const bool moved = listed(packed.names, t.name) || listed(packed.copied, t.name);
            if (moved && t.name != r.weights.tok_embd.name) r.file.release_pages(t);  // tied: still the embeddings
        }
        if (!packed.names.empty())
            logger("engine")->info("Dense weights: {} matrices repacked for the prompt GEMM kernels into {:.1f} MiB of RAM "
                                   "({:+.2f} % over their GGUF bytes, which are no longer read; --no-repack turns it off).",
                                   packed.names.size(), double(packed.bytes) / double(1 << 20),
                                   100.0 * (double(packed.bytes) / double(packed.gguf_bytes) - 1.0));
        if (!packed.copied.empty())
            logger("engine")->info("Dense weights: {} matrices without a GEMM layout copied as they are into {:.1f} MiB of "
                                   "RAM on huge pages (their GGUF bytes are no longer read).",
                                   packed.copied.size(), double(packed.copied_bytes) / double(1 << 20));
    }
    r.forward = std::make_unique<engine::forward_pass>(*r.pool, r.hp, r.weights, *r.store);
    r.forward->set_checkpoint_interval(r.options.state_checkpoint_interval);
    return gpu;
}

// With --gpu and the file's context (--ctx 0), VRAM is set aside for at most this many positions of a
// session's KV cache before the expert cache is sized; past them the cache grows into VRAM still free.
constexpr int kGpuReservedCtx = 32768;

model_options checked(model_options o, int n_ctx_train) {
    if (o.n_ctx < 0) throw std::runtime_error(fmt::format("the context length must be positive, got {}", o.n_ctx));
    if (o.n_ctx == 0) o.n_ctx = n_ctx_train > 0 ? n_ctx_train : 4096;
    if (o.n_batch < 1) throw std::runtime_error(fmt::format("the batch size must be positive, got {}", o.n_batch));
    if (!std::isfinite(o.prefill_pace))
        throw std::runtime_error(fmt::format("--prefill-pace must be a number, got {}", o.prefill_pace));
    if (o.gpu_sessions < 1)
        throw std::runtime_error(fmt::format("--gpu-sessions must be at least 1, got {}", o.gpu_sessions));
    if (o.state_checkpoint_interval < 0)
        throw std::runtime_error(fmt::format("--state-checkpoint-interval must be 0 (off) or a number of tokens, got {}",
                                             o.state_checkpoint_interval));
    if (o.mem_budget_mib < -1)
        throw std::runtime_error(fmt::format("--mem-budget must be 0 (none) or a number of MiB, got {}", o.mem_budget_mib));
    if (o.cache_ram_mib < -1)
        throw std::runtime_error(fmt::format("--cache-ram must be 0 (off) or a number of MiB, got {}", o.cache_ram_mib));
    return o;
}

// What the GPU hybrid does not run yet (a layer kind's reason), or empty.
std::string hybrid_unsupported(const engine::hparams& hp) { return engine::gpu_unsupported(hp); }

// The file's next-token-prediction layers are not evaluated by the trunk: one log line saying so, and
// whether the first drafts for speculation.
void log_nextn_layers(const gguf::reader& f, const engine::hparams& hp, const engine::model_weights& w) {
    if (hp.n_layer_nextn == 0) return;
    if (hp.hybrid() || !w.nextn.empty()) {
        logger("engine")->info("The file's {} next-token-prediction (MTP) block{} after layer {} {} bound for "
                               "speculation (--spec-type mtp, or auto) and not evaluated by the trunk.",
                               hp.n_layer_nextn, hp.n_layer_nextn == 1 ? "" : "s", hp.n_layer - 1,
                               hp.n_layer_nextn == 1 ? "is" : "are");
        return;
    }
    size_t n_tensors = 0;
    for (const auto& t : f.tensors())
        for (int il = hp.n_layer; il < hp.n_layer + hp.n_layer_nextn; ++il)
            if (t.name.starts_with(fmt::format("blk.{}.", il))) ++n_tensors;
    const int last = hp.n_layer + hp.n_layer_nextn - 1;
    const std::string blocks = hp.n_layer_nextn == 1 ? fmt::format("blk.{}", last) : fmt::format("blk.{}..{}", hp.n_layer, last);
    logger("engine")->info("The file's next-token-prediction layers ({}, {} tensors) are not loaded{}: strata "
                           "evaluates the {} layers before them, as llama.cpp does.",
                           blocks, n_tensors, w.nextn_error.empty() ? "" : " (MTP drafting off: " + w.nextn_error + ")",
                           hp.n_layer);
}

// The GPU hybrid pass for options.gpu, or nullptr (CPU only) with the reason in one log line, kept
// for model_info.
std::unique_ptr<engine::gpu::hybrid_forward> create_hybrid(model::impl& r, const gpu_choice& gpu) {
    const model_options& o = r.options;
    if (std::string why = hybrid_unsupported(r.hp); !why.empty()) {
        logger("gpu")->warn("Running CPU-only: {}.", why);
        r.cpu_only_reason = why;
        return nullptr;
    }
    engine::gpu::hybrid_options h;
    h.gpu = o.gpu;
    h.device = gpu.device;  // when absent, create() asks again and says why
    h.expert_cache_gib = engine::gpu::parse_expert_cache(o.expert_cache);
    h.vram_reserve_mib = o.vram_reserve_mib;
    h.gpu_sessions = o.gpu_sessions;
    h.expert_profile = o.expert_profile;
    h.adapt = {o.adapt_every, o.adapt_swaps, o.adapt_async};
    h.n_ctx = o.n_ctx;
    h.kv_reserved_ctx = r.ctx_from_file ? std::min(o.n_ctx, kGpuReservedCtx) : o.n_ctx;
    if (h.kv_reserved_ctx < o.n_ctx)
        logger("gpu")->info("The VRAM KV cache has room set aside for {} of the context's {} positions per session; "
                            "past them it grows into VRAM the expert cache left free (--ctx N sets aside N).",
                            h.kv_reserved_ctx, o.n_ctx);
    h.n_batch = o.n_batch;
    h.kv = r.kv;
    h.hot = r.hot.get();
    const char* timing = std::getenv("STRATA_DECODE_TIMING");
    h.decode_timing = timing && std::string_view(timing) == "1";
    std::string why;
    auto hybrid = engine::gpu::hybrid_forward::create(*r.pool, r.hp, r.weights, r.moe_layers, *r.store, h, &why);
    if (!hybrid) {
        logger("gpu")->warn("Running CPU-only: {}.", why);
        r.cpu_only_reason = why;
    }
    return hybrid;
}

// --profile-save: the routed counts since load, for --expert-profile next time.
void save_profile(const model::impl& r) {
    if (r.options.profile_save.empty() || !r.forward) return;
    const auto& counts = r.hybrid ? r.hybrid->routing().counts : r.forward->routing().counts;
    try {
        engine::gpu::save_profile(r.options.profile_save, {r.hp.n_layer, r.hp.n_expert, counts});
        logger("gpu")->info("Wrote the expert profile {} ({} layers x {} experts).", r.options.profile_save,
                            r.hp.n_layer, r.hp.n_expert);
    } catch (const std::exception& e) {
        logger("gpu")->error("The expert profile was not saved: {}.", e.what());
    }
}

}  // namespace

model::impl::impl(const model_options& o)
    : options(o),
      file(gguf::reader::open(o.path)),
      hp(engine::read_hparams(file, engine::rope_overrides_from(o))),
      weights(engine::bind_weights(file, hp)),
      moe_layers(engine::moe_layers(weights)),
      tokenizer(tok::tokenizer::from_gguf(file, {.override_pre = o.override_pre})),
      kv(engine::parse_kv_type(o.kv_type)) {
    ctx_from_file = o.n_ctx == 0;
    options = checked(o, hp.n_ctx_train);
    log_nextn_layers(file, hp, weights);
    if (hp.rope.freq_scale != 1.0f || hp.rope.ext_factor != 0.0f)
        logger("engine")->info("RoPE scaling: {} (base frequency {:g}).", engine::describe_rope(hp.rope),
                               hp.rope.freq_base);
    if (hp.n_vocab == 0) hp.n_vocab = tokenizer.n_vocab();
    if (tokenizer.n_vocab() != hp.n_vocab)
        throw std::runtime_error(fmt::format("{}: the vocabulary has {} tokens but token_embd.weight has {} rows",
                                             o.path, tokenizer.n_vocab(), hp.n_vocab));
    try {
        chat = tok::chat_template::from_model(file.get_string("tokenizer.chat_template", ""), o.chat_template);
        const auto text_of = [&](int32_t id) { return id < 0 ? std::string() : std::string(tokenizer.token_to_piece(id, true)); };
        chat->set_special_tokens(text_of(tokenizer.bos()), text_of(tokenizer.eos()));
    } catch (const std::invalid_argument&) {
        throw;  // a bad override name is the user's error: say so at load
    } catch (const std::exception& e) {
        chat_error = e.what();
    }
    if (weights.ple.data) register_ple_table();
}

// What the process holds resident once loaded, by kind, so a user can match it against the file's weights;
// sessions add their KV caches and recurrent states from here on.
static void log_resident_memory(const model::impl& r) {
    const std::optional<engine::process_memory> m = engine::read_process_memory(r.options.path);
    if (!m) return;
    const uint64_t experts = r.store->placement().mode == arenas::store_mode::mapped ? 0 : r.store->placement().bytes;
    const uint64_t weights = std::min<uint64_t>(experts + r.dense_copy_bytes, m->anonymous);
    const auto mib = [](uint64_t b) { return double(b) / (1 << 20); };
    logger("engine")->info("Resident memory after load: {:.1f} MiB = weights copied into RAM {:.1f} MiB (experts {:.1f}, "
                           "dense {:.1f}) + working memory {:.1f} MiB (buffers, heap, thread stacks) + the model "
                           "file's mapped pages {:.1f} MiB{} + the program and its libraries {:.1f} MiB; each session "
                           "adds its KV cache and recurrent state.",
                           mib(m->rss), mib(weights), mib(experts), mib(r.dense_copy_bytes), mib(m->anonymous - weights),
                           mib(m->file),
                           r.weights.ple.data ? fmt::format(" (of which the cold PLE table {:.1f} MiB)",
                                                            mib(engine::resident_bytes(r.weights.ple.data, r.weights.ple.bytes())))
                                              : std::string(),
                           mib(m->program));
}

void model::impl::register_ple_table() {
    // The table stays where the file maps it: listed with no NUMA intent (placement-report shows its
    // page-cache residency), counted apart from the resident weights.
    const engine::ple_table& t = weights.ple;
    weights.ple.reads = &ple_reads;
    const gguf::tensor_info* info = file.find_tensor("per_layer_token_embd.weight");
    const uint64_t at = file.data_offset() + (info ? info->offset : 0);
    ple_where = fmt::format("file-backed: {} bytes {}..{}, page cache, no NUMA placement", file.path(), at, at + t.bytes());
    regions.add({"ple table (cold, file-backed)", reinterpret_cast<std::uintptr_t>(t.data), t.bytes(), -1});
    logger("engine")->info("The PLE table ({:.1f} MiB, {} rows) is read in place from the file, a few rows a token: it "
                           "is not copied, placed or pinned, and not counted in the resident weights.",
                           double(t.bytes()) / (1 << 20), t.n_rows);
}

model::model(std::unique_ptr<impl> p) : impl_(std::move(p)) { impl_->batcher = std::make_unique<step_batcher>(*impl_); }

model::~model() {
    // The pool and the forward pass belong to the engine thread: tear them down there.
    impl_->thread.run([this] {
        save_profile(*impl_);
        impl_->conversations.reset();
        impl_->hybrid.reset();
        impl_->forward.reset();
        impl_->store.reset();
        impl_->hot.reset();
        impl_->pool.reset();
    });
}

std::shared_ptr<model> model::load(const model_options& options) {
    auto m = std::make_unique<impl>(options);
    impl& r = *m;
    r.thread.run([&r] {
        try {
            const gpu_choice gpu = build_on_engine_thread(r);
            if (r.options.gpu >= 0) r.hybrid = create_hybrid(r, gpu);
            // Only now is it known what went to the hot node (the complement only when the split is off,
            // the pinned pools only with a GPU pass).
            if (r.hot->active()) logger("arenas")->info("{}", r.hot->describe_placed());
        } catch (...) {
            // What was built belongs to this thread (the pool restores its pinning here).
            r.hybrid.reset();
            r.forward.reset();
            r.store.reset();
            r.hot.reset();
            r.pool.reset();
            throw;
        }
    });
    // The GPU hybrid keeps each session's keys and values in VRAM, which snapshots do not cover yet.
    uint64_t cache_budget = engine::conversation_cache_budget(r.options.cache_ram_mib);
    if (r.hybrid && cache_budget > 0) {
        logger("engine")->info("The conversation cache is off: the GPU hybrid keeps the KV cache in VRAM, which "
                               "snapshots do not cover.");
        cache_budget = 0;
    }
    r.budget = std::make_unique<engine::memory_budget>(engine::memory_budget_bytes(r.options.mem_budget_mib));
    r.conversations = std::make_unique<engine::conversation_cache>(cache_budget, *r.hot, r.budget.get());
    r.info = describe(r, r.pool->plan());
    if (r.info.n_recurrent_layers > 0)
        logger("engine")->info("{} of the {} layers are gated DeltaNet layers: each session keeps their recurrent "
                               "state, {:.2f} MiB, beside a KV cache of the {} attention layers ({:.2f} KiB per "
                               "token); a checkpoint of the state (as large) every {} tokens and where prompts' new "
                               "tokens start and end, at most {} per session.",
                               r.info.n_recurrent_layers, r.hp.n_layer, double(r.info.state_bytes_per_session) / (1 << 20),
                               r.hp.n_kv_layer(), double(r.info.kv_bytes_per_token) / 1024,
                               r.options.state_checkpoint_interval, engine::recurrent_state::default_max_checkpoints);
    logger("engine")->info("Loaded {} ({}, {} layers, {} experts of which {} used, {:.1f} MiB); context {} tokens, "
                           "KV cache {} grown in chunks of {} tokens up to {:.1f} MiB per session; conversation cache {}; "
                           "memory budget for KV caches, checkpoints and snapshots {}; routed experts: {}.",
                           options.path, r.info.architecture, r.hp.n_layer, r.hp.n_expert, r.hp.n_expert_used,
                           double(r.info.file_bytes) / (1 << 20), r.info.n_ctx, r.info.kv_type,
                           r.info.kv_chunk_tokens, double(r.info.kv_bytes_per_session) / (1 << 20),
                           r.conversations->enabled()
                               ? fmt::format("up to {:.1f} MiB", double(r.conversations->stats().budget_bytes) / (1 << 20))
                               : std::string("off (--cache-ram 0)"),
                           r.budget->limit() ? fmt::format("{:.1f} MiB", double(r.budget->limit()) / (1 << 20))
                                             : std::string("none (--mem-budget 0)"),
                           r.info.placement);
    log_resident_memory(r);
    return std::shared_ptr<model>(new model(std::move(m)));
}

const model_info& model::info() const { return impl_->info; }

expert_stats model::statistics() const {
    expert_stats s;
    impl_->thread.run([&] {
        s.tokens = impl_->tokens_evaluated;
        s.counts = impl_->hybrid ? impl_->hybrid->routing().counts : impl_->forward->routing().counts;
        if (impl_->hybrid) {
            const engine::gpu::cache_stats c = impl_->hybrid->expert_cache_stats();
            s.expert_lookups = c.lookups;
            s.vram_hits = c.hits;
        }
    });
    return s;
}

conversation_cache_stats model::conversation_statistics() const { return impl_->conversations->stats(); }

std::vector<cold_region_stats> model::cold_regions() const {
    const engine::ple_table& t = impl_->weights.ple;
    if (!t.data) return {};
    cold_region_stats c;
    c.name = "ple table";
    c.where = impl_->ple_where;
    c.bytes_mapped = t.bytes();
    c.bytes_resident = engine::resident_bytes(t.data, t.bytes());
    c.tokens = impl_->ple_reads.tokens.load();
    c.rows_read = impl_->ple_reads.rows.load();
    c.page_faults = impl_->ple_reads.faults.load();
    return {c};
}

speculation_stats model::speculation_statistics() const {
    const std::lock_guard lock(impl_->spec_mutex);
    speculation_stats s = impl_->spec_totals;
    for (int n = 1; n <= engine::spec::cost_table::max_tokens; ++n)
        if (impl_->spec_costs.measured(n)) s.costs.push_back({n, impl_->spec_costs.ms(n), impl_->spec_costs.passes(n)});
    return s;
}
batch_stats model::batching() const { return impl_->batcher->stats(); }

memory_budget_stats model::memory_statistics() const { return impl_->budget->stats(); }

std::vector<int32_t> model::tokenize(std::string_view text, bool add_special, bool parse_special) const {
    return impl_->tokenizer.encode(text, {.add_special = add_special, .parse_special = parse_special});
}

std::string model::detokenize(std::span<const int32_t> ids, bool render_special) const {
    for (int32_t id : ids)
        if (id < 0 || id >= impl_->tokenizer.n_vocab())
            throw request_error(fmt::format("token id {} is outside the vocabulary (0..{})", id,
                                            impl_->tokenizer.n_vocab() - 1));
    return impl_->tokenizer.decode(ids, {.render_special = render_special});
}

std::string model::token_text(int32_t id) const { return std::string(impl_->tokenizer.token_to_piece(id, true)); }

bool model::is_end_of_generation(int32_t id) const { return impl_->tokenizer.is_eog(id); }

static tok::rendered_chat render_chat(const model::impl& m, std::span<const chat_message> messages,
                                       bool add_generation_prompt) {
    if (!m.chat)
        throw request_error("this model has no chat template strata can apply (" + m.chat_error +
                            "); pass a template name or use plain completions");
    std::vector<tok::chat_message> converted;
    for (const auto& msg : messages) converted.push_back({msg.role, msg.content});
    try {
        return m.chat->render(converted, add_generation_prompt);
    } catch (const std::invalid_argument& e) {
        throw request_error(e.what());
    }
}

std::string model::apply_chat_template(std::span<const chat_message> messages, bool add_generation_prompt) const {
    return render_chat(*impl_, messages, add_generation_prompt).text;
}

model::chat_prompt model::tokenize_chat_context(std::string_view context_json, bool special_in_content) const {
    if (!impl_->chat)
        throw request_error("this model has no chat template strata can apply (" + impl_->chat_error +
                            "); pass a template name or file, or use plain completions");
    const nlohmann::ordered_json ctx = nlohmann::ordered_json::parse(context_json, nullptr, false);
    if (!ctx.is_object() || !ctx.contains("messages") || !ctx["messages"].is_array())
        throw request_error("the chat context must be a JSON object with a 'messages' array");
    tok::rendered_chat r;
    try {
        r = impl_->chat->render_context(ctx);
    } catch (const std::invalid_argument& e) {
        throw request_error(e.what());
    }
    const std::span<const tok::text_span> plain =
        special_in_content ? std::span<const tok::text_span>{} : std::span<const tok::text_span>(r.content);
    chat_prompt out;
    out.tokens = impl_->tokenizer.encode(r.text, {.add_special = true, .parse_special = true, .plain = plain});
    out.text = std::move(r.text);
    return out;
}

std::vector<int32_t> model::tokenize_chat(std::span<const chat_message> messages, bool special_in_content) const {
    const tok::rendered_chat r = render_chat(*impl_, messages, true);
    const std::span<const tok::text_span> plain =
        special_in_content ? std::span<const tok::text_span>{} : std::span<const tok::text_span>(r.content);
    return impl_->tokenizer.encode(r.text, {.add_special = true, .parse_special = true, .plain = plain});
}

}  // namespace strata
