// Speculative decoding: the n-gram drafter, the draft-length controller, and generation with drafts
// verified in one batch giving the same tokens and log-probabilities, bit for bit, as without them, on
// every family the generator makes (greedy and seeded sampling).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <array>
#include <atomic>
#include <filesystem>
#include <functional>
#include <future>
#include <memory>
#include <map>

#include "generate.hpp"
#include "gguf/gguf_reader.hpp"
#include "gguf/gguf_writer.hpp"
#include "spec/controller.hpp"
#include "spec/ngram.hpp"
#include "strata/engine.hpp"

namespace strata {
namespace {

using engine::spec::cost_table;
using engine::spec::ngram_draft;
using make_model::arch;

TEST(NgramDraft, ContinuesTheLatestLongestMatch) {
    // ... 1 2 3 [9 9] ... 2 3 [7 7] ... 1 2 3: the 3-gram "1 2 3" matched at the start, so 9 9 follows.
    const std::vector<int32_t> ctx = {1, 2, 3, 9, 9, 5, 2, 3, 7, 7, 6, 1, 2, 3};
    EXPECT_EQ(ngram_draft(ctx, 2), (std::vector<int32_t>{9, 9}));
    EXPECT_EQ(ngram_draft(ctx, 4), (std::vector<int32_t>{9, 9, 5, 2}));
    // Only "2 3" matches (twice): the latest occurrence wins.
    const std::vector<int32_t> ctx2 = {2, 3, 9, 4, 2, 3, 7, 8, 2, 3};
    EXPECT_EQ(ngram_draft(ctx2, 3), (std::vector<int32_t>{7, 8, 2}));
}

TEST(NgramDraft, RepeatingRunGoesOnAndNoMatchGivesNothing) {
    const std::vector<int32_t> run = {4, 5, 6, 4, 5, 6, 4, 5};
    EXPECT_EQ(ngram_draft(run, 5), (std::vector<int32_t>{6, 4, 5, 6, 4}));
    const std::vector<int32_t> none = {1, 2, 3, 4, 5, 6};
    EXPECT_TRUE(ngram_draft(none, 4).empty());
    EXPECT_TRUE(ngram_draft(run, 0).empty());
    // A unigram match is ignored unless asked for.
    const std::vector<int32_t> one = {7, 1, 2, 7};
    EXPECT_TRUE(ngram_draft(one, 2).empty());
    EXPECT_EQ(ngram_draft(one, 2, {1, 4}), (std::vector<int32_t>{1, 2}));
}

TEST(SpecController, ExpectedTokensIsTheGeometricSum) {
    EXPECT_DOUBLE_EQ(engine::spec::expected_tokens(0.0, 4), 1.0);
    EXPECT_DOUBLE_EQ(engine::spec::expected_tokens(1.0, 4), 5.0);
    EXPECT_DOUBLE_EQ(engine::spec::expected_tokens(0.5, 2), 1.75);
}

TEST(SpecController, CostTableExtrapolatesFromWhatItMeasured) {
    cost_table c;
    EXPECT_DOUBLE_EQ(c.relative(3), 1.0 + 2 * cost_table::prior_slope);
    c.record(1, 10.0);
    c.record(3, 20.0);
    EXPECT_DOUBLE_EQ(c.relative(3), 2.0);
    EXPECT_DOUBLE_EQ(c.relative(5), 3.0);  // slope 0.5 per token from the largest measured size
    EXPECT_DOUBLE_EQ(c.relative(2), 1.0 + cost_table::prior_slope);  // nothing measured below it but 1
}

TEST(SpecController, AutoDraftsWhenItPaysAndTurnsOffWhenItDoesNot) {
    cost_table cheap;
    cheap.record(1, 10.0);
    for (int n = 2; n <= 5; ++n) cheap.record(n, 10.0 + n);  // batches cost little more than one token
    engine::spec::controller on(true, 4, cheap);
    for (int i = 0; i < 10; ++i) on.record(4, 4);
    EXPECT_EQ(on.draft_length(), 4);

    cost_table dear;
    dear.record(1, 10.0);
    for (int n = 2; n <= 5; ++n) dear.record(n, 10.0 * n);  // every token costs a whole step
    engine::spec::controller off(true, 4, dear);
    EXPECT_EQ(off.draft_length(), 0);
    EXPECT_FALSE(off.turned_off().empty());
    // Off, it probes with one draft now and then.
    int probes = 0;
    for (int i = 0; i < 4 * engine::spec::controller::probe_every; ++i) probes += off.draft_length();
    EXPECT_EQ(probes, 4);
    // A fixed draft length ignores costs.
    EXPECT_EQ(engine::spec::controller(false, 3, dear).draft_length(), 3);
    // Drafts that cost a pass each (MTP): at 75 % acceptance cheap verifications pay with free drafts,
    // not with drafts costing a decode step each.
    engine::spec::controller mtp(true, 4, cheap);
    for (int i = 0; i < 30; ++i) mtp.record(5, 3);
    EXPECT_GT(mtp.draft_length(), 0);
    mtp.set_draft_cost(1.0);
    EXPECT_EQ(mtp.draft_length(), 0);
    EXPECT_NE(mtp.turned_off().find("a draft costing 1.00"), std::string::npos) << mtp.turned_off();
}

std::string model_path(arch a) {
    const auto path = std::filesystem::temp_directory_path() / ("strata_spec_" + make_model::arch_name(a) + ".gguf");
    if (!std::filesystem::exists(path)) make_model::build_model(make_model::preset("tiny", a)).write_file(path.string());
    return path.string();
}

std::shared_ptr<model> load(arch a, int n_batch = 512) {
    model_options o;
    o.path = model_path(a);
    o.numa_pool = "off";
    o.pool_workers = 2;
    o.n_ctx = 256;
    o.n_batch = n_batch;
    return model::load(o);
}

generation_options options(const std::string& spec, float temperature, uint64_t seed) {
    generation_options g;
    g.max_tokens = 80;
    g.ignore_eos = true;
    g.top_logprobs = 5;
    g.sampling.temperature = temperature;
    g.sampling.seed = seed;
    g.speculation.type = spec;
    g.speculation.n_max = 4;
    g.speculation.ngram_min = 1;  // drafts at nearly every step, so rejections and acceptances both occur
    return g;
}

// Tokens, log-probabilities and alternatives: all equal, floats compared bit for bit.
void expect_same(const generation_result& want, const generation_result& got, const std::string& what) {
    ASSERT_EQ(want.tokens.size(), got.tokens.size()) << what;
    for (size_t i = 0; i < want.tokens.size(); ++i) {
        const generated_token &a = want.tokens[i], &b = got.tokens[i];
        ASSERT_EQ(a.id, b.id) << what << " token " << i;
        ASSERT_EQ(std::memcmp(&a.logprob, &b.logprob, sizeof(float)), 0) << what << " token " << i;
        ASSERT_EQ(a.top.size(), b.top.size()) << what << " token " << i;
        for (size_t j = 0; j < a.top.size(); ++j) {
            ASSERT_EQ(a.top[j].id, b.top[j].id) << what << " token " << i;
            ASSERT_EQ(std::memcmp(&a.top[j].logprob, &b.top[j].logprob, sizeof(float)), 0) << what << " token " << i;
        }
    }
    EXPECT_EQ(want.text, got.text) << what;
}

class SpecFamilies : public testing::TestWithParam<arch> {};

// A prompt that repeats itself gives the n-gram drafter matches; random weights reject most of them.
// Forced drafts (the output, altered in places) are accepted in part at known places.
TEST_P(SpecFamilies, GreedyAndSampledOutputIsBitwiseTheSameWithDrafts) {
    const auto m = load(GetParam());
    const auto prompt = m->tokenize("one two three four five six one two three four five six one two three");
    int drafted = 0, accepted = 0;
    // qwen4exp's tiny model is the slowest: one sampled seed, fewer tokens.
    const bool heavy = GetParam() == arch::qwen4exp;
    for (const float temperature : {0.0f, 1.0f})
        for (uint64_t seed = 1; seed <= (temperature > 0 ? (heavy ? 1u : 3u) : 1u); ++seed) {
            session plain(m), fast(m);
            generation_options base = options("off", temperature, seed);
            if (heavy) base.max_tokens = 40;
            const auto want = plain.generate(prompt, base);
            EXPECT_EQ(want.time.spec_drafted, 0);
            // Forced drafts: the output itself, every fifth token altered, so batches are accepted in part.
            std::vector<int32_t> forced;
            for (const generated_token& t : want.tokens)
                forced.push_back(forced.size() % 5 == 3 ? (t.id + 1) % m->info().n_vocab : t.id);
            for (const std::string type : {"ngram", "auto", "forced"}) {
                generation_options o = options(type, temperature, seed);
                o.max_tokens = base.max_tokens;
                o.speculation.forced = forced;
                const uint64_t evaluated = m->statistics().tokens;
                const auto got = fast.generate(prompt, o);
                // Nothing is evaluated twice: the prompt's new tokens, then per step the sampled token and its
                // drafts (every token but accepted drafts and the last one starts a step); a rejection goes
                // back in the KV cache, and in a recurrent state to its copy after the last kept position.
                const int steps = static_cast<int>(got.tokens.size()) - got.time.spec_accepted - 1;
                EXPECT_EQ(m->statistics().tokens - evaluated,
                          static_cast<uint64_t>(got.time.prompt_n + steps + got.time.spec_drafted));
                expect_same(want, got, type + " T " + std::to_string(temperature) + " seed " + std::to_string(seed));
                EXPECT_LE(got.time.spec_accepted, got.time.spec_drafted);
                drafted += got.time.spec_drafted;
                accepted += got.time.spec_accepted;
                // The session continues from where the drafts left it: the next turn reuses the cache.
                EXPECT_EQ(fast.cached_tokens(), prompt.size() + got.tokens.size() - 1);
            }
        }
    std::printf("  %s: %d drafted, %d accepted\n", make_model::arch_name(GetParam()).c_str(), drafted, accepted);
    EXPECT_GT(drafted, accepted) << "no draft was rejected: the rollback went untested";
    EXPECT_GT(accepted, 0) << "no draft was accepted: the kept positions went untested";
    const speculation_stats st = m->speculation_statistics();
    EXPECT_EQ(st.drafted, static_cast<uint64_t>(drafted));
    EXPECT_EQ(st.accepted, static_cast<uint64_t>(accepted));
    ASSERT_FALSE(st.costs.empty());
    EXPECT_EQ(st.costs.front().tokens, 1);
}

INSTANTIATE_TEST_SUITE_P(Generator, SpecFamilies,
                         testing::Values(arch::qwen3moe, arch::qwen2moe, arch::mixtral, arch::glm4moe, arch::deepseek2,
                                         arch::qwen35moe, arch::qwen3next, arch::qwen4exp),
                         [](const auto& info) { return make_model::arch_name(info.param); });

// Sampled decoding with drafts draws from the model's distribution: over many seeds, the tokens after a
// fixed draft (accepted when the sampler picks it, else another token drawn from the rest) have the same
// histogram as without drafts, within a chi-square bound (two samples, p = 0.001).
TEST(Speculation, SampledTokensFollowTheModelsDistribution) {
    const auto m = load(arch::qwen3moe);
    const auto prompt = m->tokenize("The river ran quietly under the old bridge");
    session s(m);
    generation_options o = options("off", 1.0f, 0);
    o.max_tokens = 3;
    o.top_logprobs = 0;
    o.sampling.top_k = 3;
    const auto first = s.generate(prompt, o);
    std::vector<int32_t> draft;
    for (const auto& t : first.tokens) draft.push_back(t.id);
    constexpr int n_draws = 600;
    std::map<std::pair<int, int32_t>, std::array<int, 2>> counts;  // (position, token) -> [plain, drafted]
    int accepted = 0;
    for (int arm = 0; arm < 2; ++arm)
        for (uint64_t seed = 100; seed < 100 + n_draws; ++seed) {
            generation_options g = options(arm ? "forced" : "off", 1.0f, seed);
            g.max_tokens = 3;
            g.top_logprobs = 0;
            g.sampling.top_k = 3;
            g.speculation.forced = draft;
            const auto r = s.generate(prompt, g);
            accepted += r.time.spec_accepted;
            for (size_t i = 1; i < r.tokens.size(); ++i) ++counts[{static_cast<int>(i), r.tokens[i].id}][arm];
        }
    EXPECT_GT(accepted, 0);
    EXPECT_LT(accepted, 2 * n_draws);
    // Categories with fewer than 10 draws in all are pooled per position.
    std::map<std::pair<int, int32_t>, std::array<int, 2>> cells;
    for (const auto& [key, c] : counts) {
        const bool small = c[0] + c[1] < 10;
        auto& cell = cells[{key.first, small ? -1 : key.second}];
        cell[0] += c[0];
        cell[1] += c[1];
    }
    double chi2 = 0;
    for (const auto& [key, c] : cells) {
        const double total = c[0] + c[1];
        for (int arm = 0; arm < 2; ++arm) {
            const double expected_count = total / 2;  // equal sample sizes
            chi2 += (c[arm] - expected_count) * (c[arm] - expected_count) / expected_count;
        }
    }
    const int df = static_cast<int>(cells.size()) - 2;  // one constraint per position
    // Wilson-Hilferty: the chi-square quantile at p = 0.001 (z = 3.09).
    const double bound = df * std::pow(1 - 2.0 / (9 * df) + 3.09 * std::sqrt(2.0 / (9 * df)), 3);
    std::printf("  chi-square %.2f over %d degrees of freedom (bound %.2f), %d drafts accepted\n", chi2, df, bound,
                accepted);
    EXPECT_LT(chi2, bound);
}

// Several generations speculate in the same steps (each verification batch a segment of the step,
// beside other slots' decode rows and prompt chunks): each one's tokens and log-probabilities are bit
// for bit those of its solo run without drafts.
TEST(Speculation, ConcurrentSpeculatingGenerationsEqualTheirSoloRuns) {
    for (const arch a : {arch::qwen3moe, arch::qwen35moe}) {
        // A budget of 8 rows: decode rows come first, so only two verifications (5 rows each) go past it.
        const auto m = load(a, 8);
        std::vector<std::vector<int32_t>> prompts;
        for (int i = 0; i < 4; ++i) {
            std::string text = "slot " + std::to_string(i) + ":";
            for (int r = 0; r < 3; ++r) text += " red green blue " + std::to_string((r + i) % 3);
            prompts.push_back(m->tokenize(text));
        }
        const std::array<std::string, 4> types = {"forced", "ngram", "off", "forced"};
        std::vector<generation_result> solo;
        std::vector<generation_options> opts;
        for (size_t i = 0; i < prompts.size(); ++i) {
            session s(m);
            const float temperature = i % 2 ? 1.0f : 0.0f;
            solo.push_back(s.generate(prompts[i], options("off", temperature, 5 + i)));
            generation_options o = options(types[i], temperature, 5 + i);
            o.max_tokens = 40;
            solo.back().tokens.resize(std::min<size_t>(solo.back().tokens.size(), 40));
            for (size_t t = 0; t < solo.back().tokens.size(); ++t)
                o.speculation.forced.push_back(t % 4 == 2 ? (solo.back().tokens[t].id + 1) % m->info().n_vocab
                                                          : solo.back().tokens[t].id);
            opts.push_back(o);
        }
        const batch_stats before = m->batching();
        std::vector<std::unique_ptr<session>> sessions;
        std::vector<std::future<generation_result>> futures;
        // No generation takes a decode step before all four have their first token, so from then on
        // they decode in the same steps whatever the timing of start() and of prompt chunks.
        std::atomic<int> started{0};
        std::array<bool, 4> first_seen{};
        for (size_t i = 0; i < prompts.size(); ++i) {
            sessions.push_back(std::make_unique<session>(m));
            const auto on_token = [&started, &first_seen, i](const token_event&) {
                if (!first_seen[i]) {  // the engine thread runs every callback
                    first_seen[i] = true;
                    ++started;
                }
                return true;
            };
            futures.push_back(sessions.back()->start(prompts[i], opts[i], on_token, [&started] { return started == 4; }));
        }
        int drafted = 0, accepted = 0;
        for (size_t i = 0; i < prompts.size(); ++i) {
            const generation_result r = futures[i].get();
            ASSERT_EQ(r.tokens.size(), solo[i].tokens.size());
            for (size_t t = 0; t < r.tokens.size(); ++t) {
                ASSERT_EQ(r.tokens[t].id, solo[i].tokens[t].id) << make_model::arch_name(a) << " slot " << i << " token " << t;
                ASSERT_EQ(std::memcmp(&r.tokens[t].logprob, &solo[i].tokens[t].logprob, sizeof(float)), 0)
                    << make_model::arch_name(a) << " slot " << i << " token " << t;
            }
            drafted += r.time.spec_drafted;
            accepted += r.time.spec_accepted;
            EXPECT_EQ(sessions[i]->cached_tokens(), prompts[i].size() + r.tokens.size() - 1);
        }
        const batch_stats after = m->batching();
        std::printf("  %s: %d drafted, %d accepted; largest step %d rows\n", make_model::arch_name(a).c_str(), drafted,
                    accepted, after.max_step_rows);
        EXPECT_GT(accepted, 0);
        EXPECT_GT(drafted, accepted);
        EXPECT_GT(after.max_step_rows, 8) << "the speculating generations never shared a step";
        EXPECT_LT(after.steps - before.steps, after.rows - before.rows);
    }
}

// A tiny model with an MTP block (nextn_predict_layers = 1): qwen35moe's, qwen4exp's, glm4moe's or deepseek2's.
std::shared_ptr<model> load_mtp(int n_batch = 512, arch a = arch::qwen35moe) {
    const auto path = std::filesystem::temp_directory_path() / ("strata_spec_" + make_model::arch_name(a) + "_mtp.gguf");
    if (!std::filesystem::exists(path)) {
        make_model::model_spec spec = make_model::preset("tiny", a);
        spec.n_layer_nextn = 1;
        make_model::build_model(spec).write_file(path.string());
    }
    model_options o;
    o.path = path.string();
    o.numa_pool = "off";
    o.pool_workers = 2;
    o.n_ctx = 256;
    o.n_batch = n_batch;
    return model::load(o);
}

// MTP drafts (chained up to n_max, min_p 0 so that every step drafts): greedy and sampled output bit for
// bit that of plain decoding; nothing evaluated twice; a draft stops where its probability is below min_p.
// Returns the drafts made and accepted. max_tokens: per generation.
std::pair<int, int> expect_mtp_bitwise(const std::shared_ptr<model>& m, int max_tokens) {
    const auto prompt = m->tokenize("one two three four five six one two three four five six one two three");
    int drafted = 0, accepted = 0;
    for (const float temperature : {0.0f, 1.0f}) {
        session plain(m), fast(m);
        generation_options base = options("off", temperature, 7);
        base.max_tokens = max_tokens;
        const auto want = plain.generate(prompt, base);
        for (const std::string type : {"mtp", "auto"}) {
            generation_options o = options(type, temperature, 7);
            o.max_tokens = max_tokens;
            o.speculation.min_p = 0.0f;
            const uint64_t evaluated = m->statistics().tokens;
            const auto got = fast.generate(prompt, o);
            expect_same(want, got, type + " T " + std::to_string(temperature));
            const int steps = static_cast<int>(got.tokens.size()) - got.time.spec_accepted - 1;
            EXPECT_EQ(m->statistics().tokens - evaluated,
                      static_cast<uint64_t>(got.time.prompt_n + steps + got.time.spec_drafted));
            EXPECT_LE(got.time.spec_accepted, got.time.spec_drafted);
            if (type == "mtp") {
                // A fixed draft length with min_p 0: n_max drafts per verification but where the end is near.
                EXPECT_GE(got.time.spec_drafted, 4 * (got.time.spec_verifications - 2));
                EXPECT_LE(got.time.spec_drafted, 4 * got.time.spec_verifications);
                EXPECT_GT(got.time.spec_verifications, 0);
            }
            drafted += got.time.spec_drafted;
            accepted += got.time.spec_accepted;
            EXPECT_EQ(fast.cached_tokens(), prompt.size() + got.tokens.size() - 1);
        }
    }
    EXPECT_GT(drafted, accepted) << "no draft was rejected: the rollback went untested";
    return {drafted, accepted};
}

TEST(Speculation, MtpDraftsGiveBitwiseTheSameOutput) {
    const auto m = load_mtp(16);  // prompt chunks of 16: the MTP entries are filled chunk by chunk
    const auto prompt = m->tokenize("one two three four five six one two three four five six one two three");
    const auto [drafted, accepted] = expect_mtp_bitwise(m, 80);
    std::printf("  qwen35moe MTP: %d drafted, %d accepted\n", drafted, accepted);
    // min_p 1: no draft is that sure of itself, so none is made.
    session s(m);
    generation_options o = options("mtp", 0.0f, 7);
    o.speculation.min_p = 1.0f;
    o.max_tokens = 12;
    const auto r = s.generate(prompt, o);
    EXPECT_EQ(r.time.spec_drafted, 0);
    EXPECT_EQ(r.tokens.size(), 12u);
}

// glm4moe (plain attention, sigmoid routing with a correction bias) and deepseek2 (latent attention over
// the block's own one-layer latent cache): MTP drafts bitwise harmless to the output.
TEST(Speculation, Glm4moeAndDeepseek2MtpDraftsGiveBitwiseTheSameOutput) {
    for (arch a : {arch::glm4moe, arch::deepseek2}) {
        const auto m = load_mtp(16, a);
        const auto [drafted, accepted] = expect_mtp_bitwise(m, 40);
        std::printf("  %s MTP: %d drafted, %d accepted\n", make_model::arch_name(a).c_str(), drafted, accepted);
    }
}

// The MTP block's own cache is counted in the memory budget as the session's KV: one layer beside the
// trunk's (tiny glm4moe: 3), the same chunks, given back with the session.
TEST(Speculation, MtpCacheIsCountedInTheMemoryBudget) {
    const auto m = load_mtp(16, arch::glm4moe);
    const auto prompt = m->tokenize("one two three four five six one two three");
    const auto kv_after = [&](const std::string& type) {
        session s(m);
        generation_options o = options(type, 0.0f, 7);
        o.max_tokens = 16;
        o.speculation.min_p = 0.0f;
        s.generate(prompt, o);
        return m->memory_statistics().kv_bytes;
    };
    const uint64_t plain = kv_after("off"), mtp = kv_after("mtp");
    EXPECT_GT(plain, 0u);
    EXPECT_EQ(mtp - plain, plain / 3);
    EXPECT_EQ(m->memory_statistics().kv_bytes, 0u);
}

// A conversation parked with its MTP entries and restored by another session drafts on: the output is
// bitwise that of plain decoding, and the restored prefix is the snapshot's.
TEST(Speculation, MtpGenerationFromARestoredSnapshotIsBitwisePlain) {
    const auto m = load_mtp(16, arch::deepseek2);
    const auto prompt = m->tokenize("one two three four five six seven eight nine ten one two three four five six "
                                    "seven eight nine ten one two three four five six seven eight nine ten");
    generation_options o = options("mtp", 0.0f, 7);
    o.max_tokens = 12;
    o.speculation.min_p = 0.0f;
    session a(m);
    const auto first = a.generate(prompt, o);
    ASSERT_NE(a.park(), 0u);
    std::vector<int32_t> next = prompt;
    for (const auto& t : first.tokens) next.push_back(t.id);
    const auto more = m->tokenize(" eleven twelve");
    next.insert(next.end(), more.begin(), more.end());
    session b(m), plain(m);
    const auto got = b.generate(next, o);
    EXPECT_EQ(got.time.cache_source, prefix_source::snapshot);
    EXPECT_GT(got.time.spec_drafted, 0);
    o.speculation.type = "off";
    expect_same(plain.generate(next, o), got, "restored mtp");
}

// qwen4exp: the MTP block over the wide residual (hc streams in, hc streams chained), drafts bitwise
// harmless to the output; the slowest tiny model, so fewer tokens.
TEST(Speculation, Qwen4MtpDraftsGiveBitwiseTheSameOutput) {
    const auto m = load_mtp(16, arch::qwen4exp);
    const auto [drafted, accepted] = expect_mtp_bitwise(m, 32);
    std::printf("  qwen4exp MTP: %d drafted, %d accepted\n", drafted, accepted);
}

// The tiny MTP file with an MTP block that echoes its token: the embedding half of eh_proj the identity
// and the hidden half zero, unit norms, zero attention output and expert and shared-expert down
// projections, the head tied to the embedding table. Its draft is the token it is fed (that row scores
// |e|^2 against the others' random dot products), chained: the same token again.
// qwen4exp's alike, its output mixer's gate zero (each stream weighed by sigmoid(0)), unit norms;
// glm4moe's and deepseek2's as qwen35moe's (deepseek2's attn_output is the latent attention's output).
std::shared_ptr<model> load_echo_mtp(arch a = arch::qwen35moe) {
    const auto path = std::filesystem::temp_directory_path() / ("strata_spec_" + make_model::arch_name(a) + "_echo_mtp.gguf");
    if (!std::filesystem::exists(path)) {
        make_model::model_spec spec = make_model::preset("tiny", a);
        spec.n_layer_nextn = 1;
        spec.tie_embeddings = true;
        for (formats::ggml_type* t : {&spec.type_experts, &spec.type_shexp, &spec.type_attn, &spec.type_embd,
                                      &spec.type_out, &spec.type_router})
            *t = formats::ggml_type::F32;
        gguf::writer w = make_model::build_model(spec);
        const gguf::reader file = gguf::reader::from_bytes(w.write_to_memory());
        const std::string b = "blk." + std::to_string(spec.n_layer) + ".";
        const auto replace = [&](const std::string& name, const std::function<void(std::vector<float>&, int64_t)>& fill) {
            const std::vector<int64_t> ne = file.find_tensor(name)->ne;
            int64_t n = 1;
            for (int64_t d : ne) n *= d;
            std::vector<float> v(static_cast<size_t>(n), 0.0f);
            fill(v, ne[0]);
            std::vector<uint8_t> bytes(v.size() * sizeof(float));
            std::memcpy(bytes.data(), v.data(), bytes.size());
            w.erase_tensor(name);
            w.add_tensor(name, formats::ggml_type::F32, ne, std::move(bytes));
        };
        const auto zero = [](std::vector<float>&, int64_t) {};
        const auto ones = [](std::vector<float>& v, int64_t) { std::fill(v.begin(), v.end(), 1.0f); };
        replace(b + "nextn.eh_proj.weight", [](std::vector<float>& v, int64_t cols) {
            for (int64_t r = 0; r < cols / 2; ++r) v[static_cast<size_t>(r * cols + r)] = 1.0f;
        });
        for (const char* n : {"attn_output.weight", "ffn_down_exps.weight", "ffn_down_shexp.weight"}) replace(b + n, zero);
        if (a == arch::qwen4exp) {
            replace(b + "nextn.hc_head_up.weight", zero);
            for (const char* n : {"nextn.enorm.weight", "nextn.hc_head_norm.weight"}) replace(b + n, ones);
        } else {
            for (const char* n : {"nextn.enorm.weight", "nextn.shared_head_norm.weight"}) replace(b + n, ones);
        }
        w.write_file(path.string());
    }
    model_options o;
    o.path = path.string();
    o.numa_pool = "off";
    o.pool_workers = 2;
    o.n_ctx = 256;
    return model::load(o);
}

// Drafts accepted in full and in part: with the echo block, a logit bias that makes the model repeat one
// token accepts every draft; two tokens biased alike and sampled hot accept some. Output bitwise as plain.
// hot: the temperature at which the two biased tokens are both drawn.
void expect_echo_accepted(const std::shared_ptr<model>& m, float hot = 8.0f) {
    const auto prompt = m->tokenize("red green blue red green");
    for (const bool two : {false, true}) {
        generation_options o = options("off", two ? hot : 0.0f, 9);
        o.max_tokens = 40;
        o.sampling.logit_bias = {{7, 100.0f}};
        if (two) {
            o.sampling.logit_bias.push_back({8, 100.0f});
            o.sampling.top_p = 1.0f;  // both survive the truncations, which read the logits at temperature 1
            o.sampling.min_p = 0.0f;
        }
        session plain(m), fast(m);
        const auto want = plain.generate(prompt, o);
        o.speculation.type = "mtp";
        o.speculation.min_p = 0.0f;
        const auto got = fast.generate(prompt, o);
        expect_same(want, got, two ? "two tokens" : "one token");
        std::printf("  echo MTP, %s: %d drafted, %d accepted in %d verifications\n", two ? "two tokens" : "one token",
                    got.time.spec_drafted, got.time.spec_accepted, got.time.spec_verifications);
        if (!two) {
            EXPECT_GT(got.time.spec_accepted, 20);
            // The first draft (after the prompt's last token) may miss; the rest repeat the biased token.
            EXPECT_GE(got.time.spec_accepted, got.time.spec_drafted - 4);
        } else {
            EXPECT_GT(got.time.spec_accepted, 0);
            EXPECT_LT(got.time.spec_accepted, got.time.spec_drafted);
        }
        EXPECT_EQ(fast.cached_tokens(), prompt.size() + got.tokens.size() - 1);
    }
}

TEST(Speculation, MtpDraftsAcceptedInFullAndInPart) { expect_echo_accepted(load_echo_mtp()); }

// glm4moe's and deepseek2's echo blocks (plain and latent attention). The tiny glm4moe trunk's logits of the
// two biased tokens lie far apart: at 8 it samples only the first, so it is sampled at 64.
TEST(Speculation, Glm4moeAndDeepseek2MtpDraftsAcceptedInFullAndInPart) {
    for (const auto& [a, hot] : {std::pair{arch::glm4moe, 64.0f}, std::pair{arch::deepseek2, 8.0f}}) {
        std::printf("  %s:\n", make_model::arch_name(a).c_str());
        expect_echo_accepted(load_echo_mtp(a), hot);
    }
}

// qwen4exp's echo block: its drafts are fed the wide residual (each stream projected, then collapsed by
// the block's own output mixer), accepted in full and in part. Its tiny trunk's logits of the two biased
// tokens lie far apart: only as hot as 64 does the sampler leave the first (for other tokens too).
TEST(Speculation, Qwen4MtpDraftsAcceptedInFullAndInPart) { expect_echo_accepted(load_echo_mtp(arch::qwen4exp), 64.0f); }

// Two MTP-speculating generations and a plain one in the same steps: each equals its solo run.
TEST(Speculation, ConcurrentMtpGenerationsEqualTheirSoloRuns) {
    const auto m = load_mtp(64);
    std::vector<std::vector<int32_t>> prompts;
    for (int i = 0; i < 3; ++i) prompts.push_back(m->tokenize("slot " + std::to_string(i) + ": red green blue red green"));
    const std::array<std::string, 3> types = {"mtp", "off", "mtp"};
    std::vector<generation_result> solo;
    for (size_t i = 0; i < prompts.size(); ++i) {
        session s(m);
        generation_options o = options("off", i == 2 ? 1.0f : 0.0f, 3 + i);
        o.max_tokens = 30;
        solo.push_back(s.generate(prompts[i], o));
    }
    std::atomic<int> started{0};
    std::array<bool, 3> first_seen{};
    std::vector<std::unique_ptr<session>> sessions;
    std::vector<std::future<generation_result>> futures;
    for (size_t i = 0; i < prompts.size(); ++i) {
        generation_options o = options(types[i], i == 2 ? 1.0f : 0.0f, 3 + i);
        o.max_tokens = 30;
        o.speculation.min_p = 0.0f;
        sessions.push_back(std::make_unique<session>(m));
        const auto on_token = [&started, &first_seen, i](const token_event&) {
            if (!first_seen[i]) {
                first_seen[i] = true;
                ++started;
            }
            return true;
        };
        futures.push_back(sessions.back()->start(prompts[i], o, on_token, [&started] { return started == 3; }));
    }
    int drafted = 0;
    for (size_t i = 0; i < prompts.size(); ++i) {
        const generation_result r = futures[i].get();
        expect_same(solo[i], r, "slot " + std::to_string(i));
        drafted += r.time.spec_drafted;
    }
    EXPECT_GT(drafted, 0);
}

TEST(Speculation, BadOptionsAreRequestErrors) {
    const auto m = load(arch::qwen3moe);
    session s(m);
    const auto prompt = m->tokenize("hello");
    auto o = options("beam", 0, 1);
    EXPECT_THROW(s.generate(prompt, o), request_error);
    o = options("mtp", 0, 1);  // qwen3moe's tiny file has no MTP block
    EXPECT_THROW(s.generate(prompt, o), request_error);
    o = options("ngram", 0, 1);
    o.speculation.n_max = 0;
    EXPECT_THROW(s.generate(prompt, o), request_error);
    o.speculation.n_max = 17;
    EXPECT_THROW(s.generate(prompt, o), request_error);
}

}  // namespace
}  // namespace strata
