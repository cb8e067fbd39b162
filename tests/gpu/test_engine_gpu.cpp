// The GPU hybrid through the public engine API on a generated model: per-generation routed lookups and
// VRAM hits that add up to the engine statistics, the CPU-only fallback for a device that is not
// there, --profile-save / --expert-profile round trip, the adaptive tier's determinism, and the
// pinned host pools' home (the hot node, or anonymous memory without one NUMA system call), glm4moe on
// the hybrid, and deepseek2 CPU-only with its reason.
// Label gpu: skips without a device (and runs on the CPU emulator under STRATA_CUDA=EMU).
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <numeric>

#include <spdlog/fmt/fmt.h>

#include "formats/types.hpp"
#include "generate.hpp"
#include "gpu_available.hpp"
#include "numa_policy.hpp"
#include "region_map.hpp"
#include "strata/engine.hpp"

namespace strata {
namespace {

constexpr int kCtx = 128;
constexpr int kGenerate = 12;

std::filesystem::path temp_file(const std::string& name) { return std::filesystem::temp_directory_path() / name; }

// Written once per process and renamed into place, so that tests ctest runs in parallel never see a
// half-written file (a process that has it mapped keeps the old one).
std::string write_tiny(make_model::arch a) {
    const std::string name = "strata_engine_gpu_tiny_" + make_model::arch_name(a);
    const auto p = temp_file(name + ".gguf");
    const auto tmp = temp_file(fmt::format("{}.{}.tmp", name, ::getpid()));
    make_model::build_model(make_model::preset("tiny", a)).write_file(tmp.string());
    std::filesystem::rename(tmp, p);
    return p.string();
}

const std::string& model_path() {
    static const std::string path = write_tiny(make_model::arch::qwen3moe);
    return path;
}

const std::string& glm_model_path() {
    static const std::string path = write_tiny(make_model::arch::glm4moe);
    return path;
}

// --expert-cache for about half the routed experts: the slot size as the backend computes it (gate,
// up and down of one expert, 256-byte aligned), times half the experts plus half a slot, so that
// rounding the GiB figure never loses a slot. glm4moe's leading dense layer has no experts.
std::string half_cache_gib(make_model::arch a = make_model::arch::qwen3moe) {
    const make_model::model_spec s = make_model::preset("tiny", a);
    const int n_moe_layer = s.n_layer - (a == make_model::arch::glm4moe ? s.n_layer_dense_lead : 0);
    const uint64_t ff = static_cast<uint64_t>(s.n_ff_exp), embd = static_cast<uint64_t>(s.n_embd);
    const uint64_t bytes = 2 * ff * formats::row_size(s.type_experts, s.n_embd) +
                           embd * formats::row_size(s.type_experts, s.n_ff_exp);
    const uint64_t slot = (bytes + 255) / 256 * 256;
    const double half_slots = n_moe_layer * s.n_expert / 2 + 0.5;
    return fmt::format("{:.12f}", half_slots * double(slot) / double(1 << 30));
}

model_options gpu_options(int gpu = 0) {
    model_options o;
    o.path = model_path();
    o.numa_pool = "off";
    o.pool_workers = 2;
    o.n_ctx = kCtx;
    o.gpu = gpu;
    o.expert_cache = half_cache_gib();
    return o;
}

generation_options greedy(int n) {
    generation_options g;
    g.max_tokens = n;
    g.sampling.temperature = 0;
    g.ignore_eos = true;
    return g;
}

std::vector<int32_t> ids(const generation_result& r) {
    std::vector<int32_t> out;
    for (const generated_token& t : r.tokens) out.push_back(t.id);
    return out;
}

// Tokens the forward pass evaluated for a generation that ran to max_tokens: the prompt tokens not
// reused, and every generated token but the last (whose logits nobody needs).
uint64_t tokens_evaluated(const generation_result& r) {
    return static_cast<uint64_t>(r.time.prompt_n) + static_cast<uint64_t>(r.time.predicted_n) - 1;
}

uint64_t lookups_for(const model_info& i, uint64_t tokens) {
    return tokens * static_cast<uint64_t>(i.n_layer) * static_cast<uint64_t>(i.n_expert_used);
}

TEST(EngineGpu, GenerationReportsItsLookupsAndVramHits) {
    STRATA_REQUIRE_GPU();
    const auto m = model::load(gpu_options());
    const model_info& info = m->info();
    ASSERT_TRUE(info.gpu_hybrid) << info.gpu_cpu_only_reason;
    EXPECT_TRUE(info.gpu_cpu_only_reason.empty());

    session s(m);
    const auto prompt = m->tokenize("The river ran quietly past the old mill");
    const generation_result a = s.generate(prompt, greedy(kGenerate));
    ASSERT_EQ(a.tokens.size(), size_t{kGenerate});
    EXPECT_EQ(a.time.prompt_n, static_cast<int>(prompt.size()));
    EXPECT_EQ(a.time.expert_lookups, lookups_for(info, tokens_evaluated(a)));
    EXPECT_GT(a.time.vram_hits, 0u) << "half the experts are resident, yet none served a lookup";
    EXPECT_LT(a.time.vram_hits, a.time.expert_lookups) << "half the experts are resident, yet all lookups hit";

    // A follow-up that reuses the first prompt: only the new tokens count.
    auto follow = prompt;
    for (int32_t id : m->tokenize(" and the wheel turned", false)) follow.push_back(id);
    const generation_result b = s.generate(follow, greedy(kGenerate));
    EXPECT_GT(b.time.cache_n, 0);
    EXPECT_EQ(b.time.prompt_n + b.time.cache_n, static_cast<int>(follow.size()));
    EXPECT_EQ(b.time.expert_lookups, lookups_for(info, tokens_evaluated(b)));

    const expert_stats st = m->statistics();
    EXPECT_EQ(st.tokens, tokens_evaluated(a) + tokens_evaluated(b));
    EXPECT_EQ(st.expert_lookups, a.time.expert_lookups + b.time.expert_lookups);
    EXPECT_EQ(st.vram_hits, a.time.vram_hits + b.time.vram_hits);
    EXPECT_EQ(std::accumulate(st.counts.begin(), st.counts.end(), uint64_t{0}), st.expert_lookups);
    EXPECT_GT(st.hit_rate(), 0.0);
    EXPECT_LT(st.hit_rate(), 1.0);
}

// --ctx 0 with --gpu is the file's whole context (65,536 here): VRAM is set aside for the first 32,768
// positions, and a session's VRAM KV cache is allocated as it fills, a step of 4,096 positions first;
// the session and /v1/status report those bytes.
TEST(EngineGpu, TheFileContextIsTheDefaultAndTheVramKvCacheGrowsWithTheSession) {
    STRATA_REQUIRE_GPU();
    make_model::model_spec spec = make_model::preset("tiny", make_model::arch::qwen3moe);
    spec.n_ctx = 65536;
    const auto path = temp_file(fmt::format("strata_engine_gpu_ctx64k.{}.gguf", ::getpid()));
    make_model::build_model(spec).write_file(path.string());
    model_options o = gpu_options();
    o.path = path.string();
    o.n_ctx = 0;
    {
        const auto m = model::load(o);
        const model_info& info = m->info();
        ASSERT_TRUE(info.gpu_hybrid) << info.gpu_cpu_only_reason;
        EXPECT_EQ(info.n_ctx, 65536);
        EXPECT_EQ(info.kv_chunk_tokens, 4096);
        session s(m);
        EXPECT_EQ(s.kv_bytes(), 0u);
        const generation_result r = s.generate(m->tokenize("The river ran quietly past the old mill"), greedy(4));
        EXPECT_EQ(r.tokens.size(), 4u);
        EXPECT_EQ(s.kv_bytes(), info.kv_bytes_per_session / 16) << "one step of 4,096 of the 65,536 positions";
    }
    std::filesystem::remove(path);
}

// The region map's pinned host pools of the GPU path (named "... (pinned)").
std::vector<arenas::region> pinned_regions(const model_info& info) {
    std::vector<arenas::region> out;
    for (const arenas::region& r : arenas::region_map::read(info.region_map_path))
        if (r.name.ends_with("(pinned)")) out.push_back(r);
    return out;
}

TEST(EngineGpu, PinnedHostPoolsGoToTheHotNodeAndNowhereWithoutIt) {
    STRATA_REQUIRE_GPU();
    model_options o = gpu_options();
    o.numa_hot_node = "off";
    const auto before = arenas::numa_calls().total();
    {
        const auto m = model::load(o);
        ASSERT_TRUE(m->info().gpu_hybrid) << m->info().gpu_cpu_only_reason;
        const auto pools = pinned_regions(m->info());
        EXPECT_EQ(pools.size(), 3u) << "MoE staging, host copies, expert staging";
        for (const auto& r : pools) EXPECT_EQ(r.node, -1) << r.name;
        session s(m);
        EXPECT_EQ(s.generate(m->tokenize("The river ran"), greedy(4)).tokens.size(), 4u);
    }
    EXPECT_EQ(arenas::numa_calls().total(), before) << "--numa-hot-node off: a NUMA system call was issued";

    if (!arenas::numa_policy_available()) return;
    o.numa_hot_node = "0";
    const auto m = model::load(o);
    ASSERT_TRUE(m->info().gpu_hybrid) << m->info().gpu_cpu_only_reason;
    const auto pools = pinned_regions(m->info());
    EXPECT_EQ(pools.size(), 3u);
    for (const auto& r : pools) {
        EXPECT_EQ(r.node, 0) << r.name;
        EXPECT_GE(arenas::sample_page_placement(reinterpret_cast<const void*>(r.address), r.bytes, 64).share_on(0), 0.99)
            << r.name;
    }
}

TEST(EngineGpu, DeviceOutOfRangeRunsCpuOnlyAndSaysWhy) {
    STRATA_REQUIRE_GPU();
    int count = 0;
    ASSERT_EQ(cudaGetDeviceCount(&count), cudaSuccess);
    const int gpu = std::max(7, count);
    const auto m = model::load(gpu_options(gpu));
    const model_info& info = m->info();
    EXPECT_FALSE(info.gpu_hybrid);
    EXPECT_NE(info.gpu_cpu_only_reason.find(fmt::format("--gpu {} is out of range", gpu)), std::string::npos)
        << info.gpu_cpu_only_reason;
    EXPECT_NE(info.gpu_cpu_only_reason.find(fmt::format("{} CUDA device", count)), std::string::npos)
        << info.gpu_cpu_only_reason;

    session s(m);
    const generation_result r = s.generate(m->tokenize("Hello there"), greedy(kGenerate));
    EXPECT_EQ(r.tokens.size(), size_t{kGenerate});
    EXPECT_EQ(r.time.expert_lookups, 0u);
    EXPECT_EQ(r.time.vram_hits, 0u);
    const expert_stats st = m->statistics();
    EXPECT_EQ(st.expert_lookups, 0u);
    EXPECT_GT(st.tokens, 0u);
}

// The profile written at unload holds the routed counts since load; filling the cache from it puts the
// most-routed experts in VRAM, so the same request hits at least as often as with the default order.
TEST(EngineGpu, SavedProfileFillsTheCacheOnTheNextLoad) {
    STRATA_REQUIRE_GPU();
    const auto profile = temp_file("strata_engine_gpu_profile.txt");
    std::filesystem::remove(profile);
    const std::string text = "Once upon a time in a quiet village";
    generation_result first;
    expert_stats routed;
    {
        model_options o = gpu_options();
        o.profile_save = profile.string();
        const auto m = model::load(o);
        ASSERT_TRUE(m->info().gpu_hybrid) << m->info().gpu_cpu_only_reason;
        session s(m);
        first = s.generate(m->tokenize(text), greedy(kGenerate));
        routed = m->statistics();
        EXPECT_FALSE(std::filesystem::exists(profile)) << "the profile is written at unload, not before";
    }
    ASSERT_TRUE(std::filesystem::exists(profile));
    std::ifstream in(profile);
    std::string magic;
    int version = 0, n_layer = 0, n_expert = 0;
    in >> magic >> version >> n_layer >> n_expert;
    EXPECT_EQ(magic, "strata-expert-profile");
    EXPECT_EQ(version, 1);
    ASSERT_EQ(static_cast<size_t>(n_layer) * static_cast<size_t>(n_expert), routed.counts.size());
    std::vector<uint64_t> counts(routed.counts.size());
    for (uint64_t& c : counts) in >> c;
    EXPECT_EQ(counts, routed.counts);

    model_options o = gpu_options();
    o.expert_profile = profile.string();
    const auto m = model::load(o);
    ASSERT_TRUE(m->info().gpu_hybrid) << m->info().gpu_cpu_only_reason;
    session s(m);
    const generation_result again = s.generate(m->tokenize(text), greedy(kGenerate));
    EXPECT_EQ(again.time.expert_lookups, first.time.expert_lookups);
    EXPECT_GE(again.time.vram_hits, first.time.vram_hits)
        << "the cache filled from this very request's counts served fewer lookups than the default order";
    std::filesystem::remove(profile);
}

// glm4moe, which the hybrid once refused (leading dense layer, sigmoid routing with the correction
// bias, ungated shared expert): it runs on the GPU with about half its routed experts in VRAM, only
// its MoE layers look experts up, and the profile saved at unload (every layer's counts, the dense
// layer's zeros included) fills the cache on the next load, which then serves at least as many hits.
TEST(EngineGpu, Glm4moeRunsOnTheHybridAndItsProfileFillsTheCache) {
    STRATA_REQUIRE_GPU();
    const auto profile = temp_file("strata_engine_gpu_glm4moe_profile.txt");
    std::filesystem::remove(profile);
    model_options o = gpu_options();
    o.path = glm_model_path();
    o.expert_cache = half_cache_gib(make_model::arch::glm4moe);
    const std::string text = "The river ran quietly past the old mill";
    generation_result first;
    {
        o.profile_save = profile.string();
        const auto m = model::load(o);
        const model_info& info = m->info();
        ASSERT_TRUE(info.gpu_hybrid) << info.gpu_cpu_only_reason;
        ASSERT_EQ(info.architecture, "glm4moe");
        session s(m);
        first = s.generate(m->tokenize(text), greedy(kGenerate));
        ASSERT_EQ(first.tokens.size(), size_t{kGenerate});
        const uint64_t n_moe_layer = static_cast<uint64_t>(info.n_layer) - 1;  // the tiny preset's one dense layer
        EXPECT_EQ(first.time.expert_lookups,
                  tokens_evaluated(first) * n_moe_layer * static_cast<uint64_t>(info.n_expert_used));
        EXPECT_GT(first.time.vram_hits, 0u) << "half the experts are resident, yet none served a lookup";
        EXPECT_LT(first.time.vram_hits, first.time.expert_lookups) << "half the experts are resident, yet all hit";
        const expert_stats st = m->statistics();
        for (int e = 0; e < info.n_expert; ++e) EXPECT_EQ(st.counts[static_cast<size_t>(e)], 0u) << "dense layer 0";
    }
    ASSERT_TRUE(std::filesystem::exists(profile));
    o.profile_save.clear();
    o.expert_profile = profile.string();
    const auto m = model::load(o);
    ASSERT_TRUE(m->info().gpu_hybrid) << m->info().gpu_cpu_only_reason;
    session s(m);
    const generation_result again = s.generate(m->tokenize(text), greedy(kGenerate));
    EXPECT_EQ(again.time.expert_lookups, first.time.expert_lookups);
    EXPECT_GE(again.time.vram_hits, first.time.vram_hits);
    std::filesystem::remove(profile);
}

// deepseek2 stays CPU-only with a device present: the hybrid does not run latent attention, and says so.
TEST(EngineGpu, Deepseek2RunsCpuOnlyWithItsReason) {
    STRATA_REQUIRE_GPU();
    model_options o = gpu_options();
    o.path = write_tiny(make_model::arch::deepseek2);
    const auto m = model::load(o);
    EXPECT_FALSE(m->info().gpu_hybrid);
    EXPECT_NE(m->info().gpu_cpu_only_reason.find("does not run deepseek2's multi-head latent attention"),
              std::string::npos)
        << m->info().gpu_cpu_only_reason;
    session s(m);
    const generation_result r = s.generate(m->tokenize("Hello there"), greedy(3));
    EXPECT_EQ(r.tokens.size(), 3u);
    EXPECT_EQ(r.time.expert_lookups, 0u);
}

struct adaptive_run {
    std::vector<int32_t> tokens;
    uint64_t lookups = 0, hits = 0;
};

adaptive_run run_adaptive(bool async) {
    model_options o = gpu_options();
    o.adapt_every = 1;
    o.adapt_swaps = 2;
    o.adapt_async = async;
    const auto m = model::load(o);
    EXPECT_TRUE(m->info().gpu_hybrid) << m->info().gpu_cpu_only_reason;
    session s(m);
    const generation_result r = s.generate(m->tokenize("The quick brown fox jumps over the lazy dog"), greedy(kGenerate));
    return {ids(r), r.time.expert_lookups, r.time.vram_hits};
}

// Adaptive swaps every decode step choose the same experts at the same steps on every run (sync). Async
// commits a swapped-in expert at the first step end after its copy landed, which depends on timing, so
// which experts serve a step from VRAM can differ from sync (and between async runs); expert results
// differ slightly between GPU (f32 activations) and CPU (8-bit), so later greedy tokens could too, and
// only what cannot depend on timing is compared: the first token (from the prompt, before any swap),
// the number of lookups, and that swaps happen and serve hits.
TEST(EngineGpu, AdaptiveSwapsAreDeterministic) {
    STRATA_REQUIRE_GPU();
    const adaptive_run sync1 = run_adaptive(false), sync2 = run_adaptive(false);
    ASSERT_EQ(sync1.tokens.size(), size_t{kGenerate});
    EXPECT_EQ(sync1.tokens, sync2.tokens);
    EXPECT_EQ(sync1.hits, sync2.hits);
    EXPECT_EQ(sync1.lookups, sync2.lookups);

    const adaptive_run async = run_adaptive(true);
    ASSERT_EQ(async.tokens.size(), size_t{kGenerate});
    EXPECT_EQ(async.tokens[0], sync1.tokens[0]);
    EXPECT_EQ(async.lookups, sync1.lookups);
    EXPECT_GT(async.hits, 0u);
}

}  // namespace
}  // namespace strata
