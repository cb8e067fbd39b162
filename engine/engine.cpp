#include "engine_impl.hpp"

#include <algorithm>

#include <spdlog/fmt/fmt.h>

#include "log.hpp"
#include "model_info.hpp"
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
    i.kv_bytes_per_session = engine::kv_cache::bytes_needed(hp.n_layer, m.options.n_ctx, hp.n_head_kv, hp.head_dim, m.kv);
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
    return i;
}

// Builds the pool, claims the hot node, places the resident experts and builds the forward pass; runs
// on the engine thread, which the pool pins to the host core under the split.
void build_on_engine_thread(model::impl& r) {
    const arenas::topology topo = arenas::load_machine_topology();
    r.pool = arenas::expert_pool::create(topo, pool_requests_for(r.options));
    const arenas::moe_shape shape{r.hp.n_embd, r.hp.n_ff_exp, r.hp.n_expert, r.hp.n_expert_used};
    r.hot = std::make_unique<arenas::hot_node>(arenas::parse_hot_node(r.options.numa_hot_node), topo, &r.regions);
    arenas::store_options so;
    so.mmap_experts = r.options.mmap_experts;
    so.regions = &r.regions;
    if (r.hot->active() && !r.pool->plan().split && !so.mmap_experts)
        so.claimed = r.hot->claim_complement(arenas::expert_store::bytes_per_slice(r.pool->plan(), shape, r.moe_layers)[0]);
    // Drop each layer's experts from the page cache once copied, so the cache never crowds a node.
    so.on_layer_copied = [&r](int layer) {
        const std::string prefix = fmt::format("blk.{}.", layer);
        for (const auto& t : r.file.tensors())
            if (t.name.starts_with(prefix) && tensor_class(t.name) == "experts") r.file.release_pages(t);
    };
    r.store = std::make_unique<arenas::expert_store>(*r.pool, shape, r.moe_layers, std::move(so));
    r.forward = std::make_unique<engine::forward_pass>(*r.pool, r.hp, r.weights, *r.store);
}

model_options checked(model_options o, int n_ctx_train) {
    if (o.n_ctx < 0) throw std::runtime_error(fmt::format("the context length must be positive, got {}", o.n_ctx));
    if (o.n_ctx == 0) o.n_ctx = std::min(n_ctx_train > 0 ? n_ctx_train : 4096, 4096);
    if (o.n_batch < 1) throw std::runtime_error(fmt::format("the batch size must be positive, got {}", o.n_batch));
    return o;
}

}  // namespace

model::impl::impl(const model_options& o)
    : options(o),
      file(gguf::reader::open(o.path)),
      hp(engine::read_hparams(file)),
      weights(engine::bind_weights(file, hp)),
      moe_layers(engine::moe_layers(weights)),
      tokenizer(tok::tokenizer::from_gguf(file)),
      kv(engine::parse_kv_type(o.kv_type)) {
    options = checked(o, hp.n_ctx_train);
    if (hp.n_vocab == 0) hp.n_vocab = tokenizer.n_vocab();
    if (tokenizer.n_vocab() != hp.n_vocab)
        throw std::runtime_error(fmt::format("{}: the vocabulary has {} tokens but token_embd.weight has {} rows",
                                             o.path, tokenizer.n_vocab(), hp.n_vocab));
    try {
        chat = tok::chat_template::from_model(file.get_string("tokenizer.chat_template", ""), o.chat_template);
    } catch (const std::invalid_argument&) {
        throw;  // a bad override name is the user's error: say so at load
    } catch (const std::exception& e) {
        chat_error = e.what();
    }
}

model::model(std::unique_ptr<impl> p) : impl_(std::move(p)) {}

model::~model() {
    // The pool and the forward pass belong to the engine thread: tear them down there.
    impl_->thread.run([this] {
        impl_->forward.reset();
        impl_->store.reset();
        impl_->hot.reset();
        impl_->pool.reset();
    });
}

std::shared_ptr<model> model::load(const model_options& options) {
    auto m = std::make_unique<impl>(options);
    impl& r = *m;
    r.thread.run([&r] { build_on_engine_thread(r); });
    r.info = describe(r, r.pool->plan());
    logger("engine")->info("Loaded {} ({}, {} layers, {} experts of which {} used, {:.1f} MiB); context {} tokens, "
                           "KV cache {} ({:.1f} MiB per session); routed experts: {}.",
                           options.path, r.info.architecture, r.hp.n_layer, r.hp.n_expert, r.hp.n_expert_used,
                           double(r.info.file_bytes) / (1 << 20), r.info.n_ctx, r.info.kv_type,
                           double(r.info.kv_bytes_per_session) / (1 << 20), r.info.placement);
    return std::shared_ptr<model>(new model(std::move(m)));
}

const model_info& model::info() const { return impl_->info; }

expert_stats model::statistics() const {
    expert_stats s;
    impl_->thread.run([&] {
        s.tokens = impl_->tokens_evaluated;
        s.counts = impl_->forward->routing().counts;
    });
    return s;
}

std::vector<int32_t> model::tokenize(std::string_view text, bool add_special, bool parse_special) const {
    return impl_->tokenizer.encode(text, {.add_special = add_special, .parse_special = parse_special});
}

std::string model::detokenize(std::span<const int32_t> ids) const {
    for (int32_t id : ids)
        if (id < 0 || id >= impl_->tokenizer.n_vocab())
            throw request_error(fmt::format("token id {} is outside the vocabulary (0..{})", id,
                                            impl_->tokenizer.n_vocab() - 1));
    return impl_->tokenizer.decode(ids);
}

std::string model::token_text(int32_t id) const { return std::string(impl_->tokenizer.token_to_piece(id, true)); }

bool model::is_end_of_generation(int32_t id) const { return impl_->tokenizer.is_eog(id); }

std::string model::apply_chat_template(std::span<const chat_message> messages, bool add_generation_prompt) const {
    if (!impl_->chat)
        throw request_error("this model has no chat template strata can apply (" + impl_->chat_error +
                            "); pass a template name or use plain completions");
    std::vector<tok::chat_message> converted;
    for (const auto& m : messages) converted.push_back({m.role, m.content});
    try {
        return impl_->chat->apply(converted, add_generation_prompt);
    } catch (const std::invalid_argument& e) {
        throw request_error(e.what());
    }
}

}  // namespace strata
