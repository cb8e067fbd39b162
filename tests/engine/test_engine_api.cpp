// The public engine API end to end on a generated model: generation, prefix reuse, cancellation,
// stop strings, context limits, determinism with a seed, and identical output across pool modes.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <thread>

#include "generate.hpp"
#include "gguf/gguf_writer.hpp"
#include "strata/engine.hpp"

namespace strata {
namespace {

std::string model_path(make_model::arch a = make_model::arch::qwen3moe) {
    const auto path = std::filesystem::temp_directory_path() / ("strata_api_" + make_model::arch_name(a) + ".gguf");
    if (!std::filesystem::exists(path)) {
        make_model::build_model(make_model::preset("tiny", a)).write_file(path.string());
    }
    return path.string();
}

std::shared_ptr<model> load(const std::string& pool = "off", int n_ctx = 128) {
    model_options o;
    o.path = model_path();
    o.numa_pool = pool;
    o.n_ctx = n_ctx;
    return model::load(o);
}

generation_options greedy(int n) {
    generation_options g;
    g.max_tokens = n;
    g.sampling.temperature = 0;
    g.ignore_eos = true;
    return g;
}

TEST(EngineApi, InfoDescribesTheModelAndPool) {
    const auto m = load();
    const model_info& i = m->info();
    EXPECT_EQ(i.architecture, "qwen3moe");
    EXPECT_EQ(i.n_layer, 2);
    EXPECT_EQ(i.n_expert, 8);
    EXPECT_EQ(i.n_vocab, 512);
    EXPECT_EQ(i.n_ctx, 128);
    EXPECT_EQ(i.chat_format, "jinja");  // the file's own template, rendered by the Jinja engine
    EXPECT_FALSE(i.pool_split);
    ASSERT_FALSE(i.pool_slices.empty());
    EXPECT_GT(i.kv_bytes_per_session, 0u);
}

TEST(EngineApi, GreedyGenerationIsDeterministicAndStreamsItsText) {
    const auto m = load();
    const auto prompt = m->tokenize("Hello! How are you today?");
    session a(m), b(m);
    std::string streamed;
    int callbacks = 0;
    const auto ra = a.generate(prompt, greedy(16), [&](const token_event& e) {
        streamed += e.text;
        ++callbacks;
        return true;
    });
    const auto rb = b.generate(prompt, greedy(16));
    EXPECT_EQ(ra.tokens.size(), 16u);
    EXPECT_EQ(ra.reason, stop_reason::length);
    EXPECT_GE(callbacks, 16);
    EXPECT_EQ(streamed, ra.text);
    ASSERT_EQ(ra.tokens.size(), rb.tokens.size());
    for (size_t i = 0; i < ra.tokens.size(); ++i) EXPECT_EQ(ra.tokens[i].id, rb.tokens[i].id);
    EXPECT_EQ(ra.time.prompt_n, static_cast<int>(prompt.size()));
    EXPECT_EQ(ra.time.predicted_n, 16);
}

TEST(EngineApi, SameSeedSameSampledText) {
    const auto m = load();
    const auto prompt = m->tokenize("The river ran quietly");
    generation_options g;
    g.max_tokens = 12;
    g.ignore_eos = true;
    g.sampling.temperature = 1.0f;
    g.sampling.seed = 1234;
    session s(m);
    const auto r1 = s.generate(prompt, g);
    const auto r2 = s.generate(prompt, g);
    EXPECT_EQ(r1.text, r2.text);
    g.sampling.seed = 99;
    bool differs = false;
    for (uint64_t seed = 99; seed < 104 && !differs; ++seed) {
        g.sampling.seed = seed;
        differs = s.generate(prompt, g).text != r1.text;
    }
    EXPECT_TRUE(differs);
}

TEST(EngineApi, ReusesThePromptPrefixAndGivesTheSameTokens) {
    const auto m = load();
    const auto prompt = m->tokenize("Question: What is the capital of France? Answer:");
    session s(m);
    const auto first = s.generate(prompt, greedy(8));
    EXPECT_EQ(first.time.cache_n, 0);
    const auto second = s.generate(prompt, greedy(8));
    EXPECT_EQ(second.time.cache_n, static_cast<int>(prompt.size()) - 1);
    EXPECT_EQ(second.time.prompt_n, 1);
    for (size_t i = 0; i < first.tokens.size(); ++i) EXPECT_EQ(first.tokens[i].id, second.tokens[i].id);
    auto longer = prompt;
    longer.push_back(first.tokens[0].id);
    const auto third = s.generate(longer, greedy(4));
    EXPECT_GE(third.time.cache_n, static_cast<int>(prompt.size()));
    EXPECT_EQ(third.tokens[0].id, first.tokens[1].id);
}

TEST(EngineApi, BitwiseSameLogitsAcrossPoolModes) {
    std::vector<float> base;
    for (const std::string mode : {"off", "test:2", "test:3"}) {
        const auto m = load(mode);
        session s(m);
        const auto logits = s.evaluate(m->tokenize("Good morning. The weather today is sunny."), true);
        if (base.empty())
            base = logits;
        else
            EXPECT_EQ(0, std::memcmp(base.data(), logits.data(), base.size() * sizeof(float))) << mode;
    }
}

TEST(EngineApi, CancelFromAnotherThreadStopsAtTheNextToken) {
    const auto m = load("off", 512);
    session s(m);
    std::atomic<int> seen{0};
    std::atomic<bool> cancelled{false};
    std::thread canceller;
    // At the 5th token another thread cancels; the callback waits until it has, so the generation must
    // stop before a 6th token however the threads are scheduled.
    const auto r = s.generate(m->tokenize("Once upon a time"), greedy(400), [&](const token_event&) {
        if (++seen == 5) {
            canceller = std::thread([&] {
                s.cancel();
                cancelled = true;
            });
            while (!cancelled) std::this_thread::yield();
        }
        return true;
    });
    canceller.join();
    EXPECT_EQ(r.reason, stop_reason::cancelled);
    EXPECT_EQ(r.tokens.size(), 5u);
    // A callback returning false stops too.
    const auto r2 = s.generate(m->tokenize("Once upon a time"), greedy(400),
                               [n = 0](const token_event&) mutable { return ++n < 3; });
    EXPECT_EQ(r2.reason, stop_reason::cancelled);
    EXPECT_EQ(r2.tokens.size(), 3u);
}

TEST(EngineApi, StopStringEndsTheTextBeforeIt) {
    const auto m = load();
    const auto prompt = m->tokenize("Hello");
    session s(m);
    const auto free_run = s.generate(prompt, greedy(20));
    ASSERT_GT(free_run.text.size(), 4u);
    const std::string stop = free_run.text.substr(free_run.text.size() / 2, 2);
    auto g = greedy(20);
    g.stop = {stop};
    const auto r = s.generate(prompt, g);
    EXPECT_EQ(r.reason, stop_reason::stop_string);
    EXPECT_EQ(r.text, free_run.text.substr(0, free_run.text.find(stop)));
}

TEST(EngineApi, PromptLongerThanTheContextNamesBothNumbers) {
    const auto m = load("off", 32);
    session s(m);
    std::vector<int32_t> prompt(40, 5);
    try {
        s.generate(prompt, greedy(4));
        FAIL();
    } catch (const request_error& e) {
        const std::string msg = e.what();
        EXPECT_NE(msg.find("40 tokens"), std::string::npos) << msg;
        EXPECT_NE(msg.find("32"), std::string::npos) << msg;
    }
    // Generation stops at the context's end with reason `length`.
    std::vector<int32_t> fits(30, 5);
    const auto r = s.generate(fits, greedy(100));
    EXPECT_EQ(r.reason, stop_reason::length);
    EXPECT_LE(r.tokens.size() + fits.size(), 33u);
    EXPECT_THROW(s.generate(std::vector<int32_t>{}, greedy(4)), request_error);
    EXPECT_THROW(s.generate(std::vector<int32_t>{1, 100000}, greedy(4)), request_error);
    EXPECT_THROW(s.generate(fits, greedy(0)), request_error);
}

TEST(EngineApi, ChatTemplateAndTokenizerRoundTrip) {
    const auto m = load();
    const std::vector<chat_message> msgs = {{"system", "Be brief."}, {"user", "Hello!"}};
    const std::string text = m->apply_chat_template(msgs);
    EXPECT_EQ(text, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n");
    const auto ids = m->tokenize(text, true, true);
    int ends = 0;  // the two <|im_end|> markers, each one token when special tokens are parsed
    for (int32_t id : ids) ends += m->is_end_of_generation(id);
    EXPECT_EQ(ends, 2);
    int plain_ends = 0;
    for (int32_t id : m->tokenize(text, true, false)) plain_ends += m->is_end_of_generation(id);
    EXPECT_EQ(plain_ends, 0) << "without parse_special the markers are ordinary text";
    // The model's own template decides which roles it renders (this one takes any, as in transformers);
    // a failing template is a request_error naming its line.
    EXPECT_EQ(m->apply_chat_template(std::vector<chat_message>{{"robot", "x"}}, false), "<|im_start|>robot\nx<|im_end|>\n");
    EXPECT_THROW(m->tokenize_chat_context("{\"messages\": 3}"), request_error);
    EXPECT_EQ(m->detokenize(m->tokenize("The river ran quietly.", false)), "The river ran quietly.");
}

TEST(EngineApi, LoadErrorsNameTheProblem) {
    model_options o;
    o.path = "/nonexistent.gguf";
    EXPECT_THROW(model::load(o), std::runtime_error);
    o.path = model_path();
    o.kv_type = "q4";
    try {
        model::load(o);
        FAIL();
    } catch (const std::exception& e) {
        EXPECT_NE(std::string(e.what()).find("q4"), std::string::npos) << e.what();
    }
    o.kv_type = "f16";
    EXPECT_EQ(o.gpu_sessions, 1) << "VRAM is sized for one session unless more are asked for";
    o.gpu_sessions = 0;
    try {
        model::load(o);
        FAIL();
    } catch (const std::exception& e) {
        EXPECT_NE(std::string(e.what()).find("--gpu-sessions must be at least 1, got 0"), std::string::npos) << e.what();
    }
}

// The decode passes by part: one pass per token after the first, the attention part reads exactly the
// KV bytes of the positions it attends to, and the parts' times fit in the decode time.
TEST(EngineApi, PhaseTimingCoversTheDecodePassesByPart) {
    model_options o;
    o.path = model_path();
    o.numa_pool = "off";
    o.n_ctx = 128;
    o.phase_timing = true;
    const auto m = model::load(o);
    const auto prompt = m->tokenize("Hello there");
    const generation_result r = session(m).generate(prompt, greedy(5));
    EXPECT_EQ(r.time.decode_passes, 4);
    ASSERT_EQ(r.time.decode_phases.size(), 12u);
    double ms = 0;
    uint64_t attention = 0, gate_up = 0, down = 0;
    for (const auto& p : r.time.decode_phases) {
        EXPECT_GE(p.ms, 0.0) << p.name;
        ms += p.ms;
        if (p.name == "attention") attention = p.bytes;
        if (p.name == "experts: gate+up") gate_up = p.bytes;
        if (p.name == "experts: down") down = p.bytes;
    }
    EXPECT_GT(ms, 0.0);
    EXPECT_LE(ms, r.time.predicted_ms);
    const uint64_t p0 = prompt.size();  // passes attend to p0 + 1 .. p0 + 4 positions
    EXPECT_EQ(attention, m->info().kv_bytes_per_token * (4 * p0 + 1 + 2 + 3 + 4));
    EXPECT_EQ(gate_up, 2 * down);  // gate and up have down's shape transposed, per routed expert
    EXPECT_GT(down, 0u);
    // The prompt's pass, by the same parts: its attention read the prompt's positions' KV rows.
    ASSERT_EQ(r.time.prompt_phases.size(), 12u);
    double prompt_ms = 0;
    for (const auto& p : r.time.prompt_phases) {
        prompt_ms += p.ms;
        if (p.name == "attention") {
            EXPECT_EQ(p.bytes, m->info().kv_bytes_per_token * p0) << "prompt";
        }
    }
    EXPECT_GT(prompt_ms, 0.0);
    EXPECT_LE(prompt_ms, r.time.prompt_ms);

    const generation_result plain = session(load()).generate(prompt, greedy(3));  // off by default
    EXPECT_TRUE(plain.time.decode_phases.empty());
    EXPECT_TRUE(plain.time.prompt_phases.empty());
}

// glm4moe on the CPU: decode timing has a dense FFN part for its leading dense layer.
TEST(EngineApi, Glm4moeTimesItsDenseLayer) {
    model_options o;
    o.path = model_path(make_model::arch::glm4moe);
    o.numa_pool = "off";
    o.n_ctx = 128;
    o.phase_timing = true;
    const auto m = model::load(o);
    const generation_result r = session(m).generate(m->tokenize("Hello there"), greedy(4));
    EXPECT_EQ(r.tokens.size(), 4u);
    uint64_t dense = 0;
    for (const auto& p : r.time.decode_phases)
        if (p.name == "dense FFN") dense = p.bytes;
    EXPECT_EQ(dense, 3u * 256 * 512 * 34 / 32 * 3);  // 3 passes x gate, up, down of 256 x 512 in Q8_0
}

// The GPU hybrid runs glm4moe's dense layers, sigmoid routing with the correction bias and ungated
// shared expert (tests/gpu check it against the CPU): under --gpu it runs, or it runs CPU-only only
// for want of a device (a build without CUDA, no GPU), never for the architecture.
TEST(EngineApi, Glm4moeIsNotRefusedByTheGpuHybrid) {
    model_options o;
    o.path = model_path(make_model::arch::glm4moe);
    o.numa_pool = "off";
    o.n_ctx = 128;
    o.gpu = 0;
    const auto m = model::load(o);
    const std::string& why = m->info().gpu_cpu_only_reason;
    EXPECT_TRUE(m->info().gpu_hybrid || !why.empty());
    EXPECT_EQ(why.find("glm4moe"), std::string::npos) << why;
    EXPECT_EQ(why.find("does not run"), std::string::npos) << why;
    EXPECT_EQ(session(m).generate(m->tokenize("Hello there"), greedy(2)).tokens.size(), 2u);
}

// deepseek2 runs on the CPU (the hybrid refuses latent attention, before asking for a device), its KV
// cache holds one latent row per position, and a parked conversation restores into it exactly.
TEST(EngineApi, Deepseek2RunsCpuOnlyOverALatentCache) {
    model_options o;
    o.path = model_path(make_model::arch::deepseek2);
    o.numa_pool = "off";
    o.n_ctx = 128;
    o.gpu = 0;
    o.phase_timing = true;
    const auto m = model::load(o);
    EXPECT_FALSE(m->info().gpu_hybrid);
    EXPECT_NE(m->info().gpu_cpu_only_reason.find("multi-head latent attention"), std::string::npos)
        << m->info().gpu_cpu_only_reason;
    // 3 layers x (kv_lora_rank 64 + 32 RoPE dims) halves: the latent, not 4 heads of keys and values.
    EXPECT_EQ(m->info().kv_bytes_per_token, 3u * (64 + 32) * 2);
    const std::vector<int32_t> prompt = m->tokenize("Hello there, how are you today?");
    session a(m);
    const generation_result first = a.generate(prompt, greedy(6));
    ASSERT_EQ(first.tokens.size(), 6u);
    uint64_t attention = 0;
    for (const auto& p : first.time.decode_phases)
        if (p.name == "attention") attention = p.bytes;
    // The 5 decode passes attend to p0 + 1 .. p0 + 5 positions and apply attn_k_b and attn_v_b (4 heads
    // of 64 x 32 and 32 x 64 in Q8_0) in each of the 3 layers.
    const uint64_t p0 = prompt.size();
    EXPECT_EQ(attention, m->info().kv_bytes_per_token * (5 * p0 + 1 + 2 + 3 + 4 + 5) + 5u * 3 * 2 * (4 * 64 * 34));
    ASSERT_GT(a.park(), 0u);
    // A new session restores the parked latent rows and continues as a session that evaluated them.
    std::vector<int32_t> longer = prompt;
    for (const auto& t : first.tokens) longer.push_back(t.id);
    const generation_result restored = session(m).generate(longer, greedy(4));
    EXPECT_EQ(restored.time.cache_source, prefix_source::snapshot);
    o.cache_ram_mib = 0;
    const auto fresh_model = model::load(o);
    const generation_result fresh = session(fresh_model).generate(longer, greedy(4));
    EXPECT_EQ(fresh.time.cache_n, 0);
    ASSERT_EQ(restored.tokens.size(), fresh.tokens.size());
    for (size_t i = 0; i < fresh.tokens.size(); ++i) EXPECT_EQ(restored.tokens[i].id, fresh.tokens[i].id);
}

// Group-limited routing is read for every architecture, as llama.cpp does, and the GPU hybrid runs it:
// under --gpu it runs CPU-only only for want of a device, never for the routing.
TEST(EngineApi, GroupLimitedRoutingIsNotRefusedByTheGpuHybrid) {
    const auto path = std::filesystem::temp_directory_path() / "strata_api_qwen3moe_groups.gguf";
    gguf::writer w = make_model::build_model(make_model::preset("tiny"));
    w.set("qwen3moe.expert_group_count", gguf::value::u32(4));
    w.set("qwen3moe.expert_group_used_count", gguf::value::u32(2));
    w.write_file(path.string());
    model_options o;
    o.path = path.string();
    o.numa_pool = "off";
    o.n_ctx = 64;
    o.gpu = 0;
    const auto m = model::load(o);
    const std::string& why = m->info().gpu_cpu_only_reason;
    EXPECT_TRUE(m->info().gpu_hybrid || !why.empty());
    EXPECT_EQ(why.find("group"), std::string::npos) << why;
    EXPECT_EQ(why.find("does not run"), std::string::npos) << why;
    EXPECT_EQ(session(m).generate(m->tokenize("Hello"), greedy(2)).tokens.size(), 2u);
    std::filesystem::remove(path);
}

TEST(EngineApi, StatisticsCountRoutedExperts) {
    const auto m = load();
    session s(m);
    const auto before = m->statistics();
    s.generate(m->tokenize("Hello"), greedy(4));
    const auto after = m->statistics();
    EXPECT_GT(after.tokens, before.tokens);
    uint64_t routed = 0;
    for (size_t i = 0; i < after.counts.size(); ++i) routed += after.counts[i] - before.counts[i];
    EXPECT_EQ(routed, (after.tokens - before.tokens) * 2u * 2u);  // 2 layers x 2 experts per token
}

}  // namespace
}  // namespace strata

namespace strata {
namespace {

TEST(EngineApi, CancelStopsALongPromptBetweenBatches) {
    model_options o;
    o.path = model_path();
    o.numa_pool = "off";
    o.n_ctx = 4096;
    o.n_batch = 8;
    const auto m = model::load(o);
    session s(m);
    // 500 batches: the canceller thread gets its turn long before the last even when the pool's
    // threads hold both cores of a small machine.
    std::vector<int32_t> prompt(4000, 7);
    std::thread canceller([&] {
        while (s.cached_tokens() < 16) std::this_thread::yield();
        s.cancel();
    });
    const auto r = s.generate(prompt, greedy(4));
    canceller.join();
    EXPECT_EQ(r.reason, stop_reason::cancelled);
    EXPECT_TRUE(r.tokens.empty());
    EXPECT_LT(r.time.prompt_n, 4000);
    EXPECT_EQ(r.time.prompt_n % 8, 0);
}

}  // namespace
}  // namespace strata
