// The conversation cache through the engine API on generated models: parked and restored KV states
// give bitwise the same tokens and logprobs as a cold evaluation (f16 and int8, every architecture),
// the longest prefix wins, LRU eviction under the budget, a conversation extended after its snapshot,
// and a prompt cancelled after a restore.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <future>
#include <random>

#include "conversation_cache.hpp"
#include "generate.hpp"
#include "hot_node.hpp"
#include "strata/engine.hpp"
#include "topology.hpp"

namespace strata {
namespace {

std::string model_path(make_model::arch a) {
    const auto path = std::filesystem::temp_directory_path() / ("strata_convo_" + make_model::arch_name(a) + ".gguf");
    if (!std::filesystem::exists(path)) {
        make_model::model_spec s = make_model::preset("tiny", a);
        make_model::build_model(s).write_file(path.string());
    }
    return path.string();
}

std::shared_ptr<model> load(make_model::arch a, const std::string& kv, int cache_ram_mib, int n_batch = 512,
                            int checkpoint_interval = 1024) {
    model_options o;
    o.state_checkpoint_interval = checkpoint_interval;
    o.path = model_path(a);
    o.numa_pool = "off";
    o.n_ctx = 1024;
    o.n_batch = n_batch;
    o.kv_type = kv;
    o.cache_ram_mib = cache_ram_mib;
    return model::load(o);
}

// n token ids in [3, n_vocab), the same for the same seed.
std::vector<int32_t> tokens(size_t n, uint32_t seed, int n_vocab) {
    std::mt19937 rng(seed);
    std::uniform_int_distribution<int32_t> id(3, n_vocab - 1);
    std::vector<int32_t> out(n);
    for (auto& t : out) t = id(rng);
    return out;
}

std::vector<int32_t> concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
}

generation_options greedy(int n) {
    generation_options g;
    g.max_tokens = n;
    g.sampling.temperature = 0;
    g.ignore_eos = true;
    g.logprobs = true;
    g.top_logprobs = 5;
    return g;
}

// Token ids, logprobs and alternatives, bitwise.
void expect_same(const generation_result& a, const generation_result& b, const std::string& what) {
    ASSERT_EQ(a.tokens.size(), b.tokens.size()) << what;
    for (size_t i = 0; i < a.tokens.size(); ++i) {
        EXPECT_EQ(a.tokens[i].id, b.tokens[i].id) << what << " token " << i;
        EXPECT_EQ(0, std::memcmp(&a.tokens[i].logprob, &b.tokens[i].logprob, sizeof(float))) << what << " token " << i;
        ASSERT_EQ(a.tokens[i].top.size(), b.tokens[i].top.size()) << what;
        for (size_t k = 0; k < a.tokens[i].top.size(); ++k) {
            EXPECT_EQ(a.tokens[i].top[k].id, b.tokens[i].top[k].id) << what;
            EXPECT_EQ(0, std::memcmp(&a.tokens[i].top[k].logprob, &b.tokens[i].top[k].logprob, sizeof(float))) << what;
        }
    }
    EXPECT_EQ(a.text, b.text) << what;
}

std::vector<int32_t> ids_of(const generation_result& r) {
    std::vector<int32_t> out;
    for (const auto& t : r.tokens) out.push_back(t.id);
    return out;
}

struct variant {
    make_model::arch arch;
    std::string kv;
};

class ConversationCacheIdentity : public testing::TestWithParam<variant> {};

// Conversation A (300 tokens: a chunk boundary inside), interrupted by an unrelated prompt B (which
// parks A), comes back with its answer and 60 more tokens: restored from the snapshot, then from the
// live state, each bitwise the same as a cold model with the cache off. qwen4exp's snapshot carries
// its recurrent state (PLE window and conv, wide residual) and QSA indexer keys.
TEST_P(ConversationCacheIdentity, RestoredLiveAndColdAreBitwiseTheSame) {
    const variant v = GetParam();
    const auto m = load(v.arch, v.kv, 64);
    const auto cold_model = load(v.arch, v.kv, 0);
    const int n_vocab = m->info().n_vocab;
    const auto a = tokens(300, 1, n_vocab), b = tokens(120, 2, n_vocab);

    session s(m);
    const auto first = s.generate(a, greedy(8));
    const auto other = s.generate(b, greedy(4));
    EXPECT_EQ(other.time.cache_source, prefix_source::none);
    auto stats = m->conversation_statistics();
    ASSERT_EQ(stats.entries.size(), 1u);
    EXPECT_EQ(stats.entries[0].tokens, 300 + 7);  // the prompt and the generated tokens evaluated

    const auto a2 = concat(concat(a, ids_of(first)), tokens(60, 3, n_vocab));
    const auto restored = s.generate(a2, greedy(8));
    EXPECT_EQ(restored.time.cache_source, prefix_source::snapshot);
    EXPECT_EQ(restored.time.cache_snapshot, stats.entries[0].id);
    EXPECT_EQ(restored.time.cache_n, 307);
    EXPECT_EQ(restored.time.prompt_n, static_cast<int>(a2.size()) - 307);

    const auto live = s.generate(a2, greedy(8));
    EXPECT_EQ(live.time.cache_source, prefix_source::live);
    if (m->info().n_recurrent_layers == 0)
        EXPECT_EQ(live.time.cache_n, static_cast<int>(a2.size()) - 1);
    else  // a recurrent state goes back only to a checkpoint: at the latest, where a2's new tokens started
        EXPECT_EQ(live.time.cache_n, 307);

    session cold(cold_model);
    const auto reference = cold.generate(a2, greedy(8));
    EXPECT_EQ(reference.time.cache_n, 0);
    expect_same(reference, restored, "restored");
    expect_same(reference, live, "live");
    stats = m->conversation_statistics();
    EXPECT_EQ(stats.hits, 1u);
    EXPECT_EQ(stats.tokens_restored, 307u);
    EXPECT_GT(stats.bytes, 0u);
    EXPECT_EQ(cold_model->conversation_statistics().entries.size(), 0u);
    EXPECT_FALSE(cold_model->conversation_statistics().enabled);
}

INSTANTIATE_TEST_SUITE_P(Models, ConversationCacheIdentity,
                         testing::Values(variant{make_model::arch::qwen3moe, "f16"},
                                         variant{make_model::arch::qwen3moe, "int8"},
                                         variant{make_model::arch::qwen2moe, "f16"},
                                         variant{make_model::arch::qwen2moe, "int8"},
                                         variant{make_model::arch::mixtral, "f16"},
                                         variant{make_model::arch::mixtral, "int8"},
                                         variant{make_model::arch::qwen4exp, "f16"}),
                         [](const testing::TestParamInfo<variant>& i) {
                             return make_model::arch_name(i.param.arch) + "_" + i.param.kv;
                         });

// Parks `prompt` from a session of its own and returns the snapshot's id.
uint64_t park(const std::shared_ptr<model>& m, const std::vector<int32_t>& prompt) {
    session s(m);
    s.generate(prompt, greedy(1));
    return s.park();
}

// A snapshot parked with a session's MTP cache (one layer) keeps its rows of the filled positions and
// restores them past the caller's own (latent caches alike), counting them in the snapshot's bytes.
TEST(ConversationCache, MtpRowsAreParkedAndRestoredBitwise) {
    const arenas::hot_node hot(std::nullopt, arenas::load_machine_topology());
    for (const bool latent : {false, true}) {
        const int heads = latent ? 1 : 2, dim = latent ? 48 : 32, n = 300;  // two chunks
        engine::kv_cache kv(2, 512, heads, dim, engine::kv_type::f16, latent),
            mtp(1, 512, heads, dim, engine::kv_type::f16, latent);
        kv.reserve(n);
        mtp.reserve(n);
        std::mt19937 rng(5);
        std::normal_distribution<float> d;
        std::vector<float> k(static_cast<size_t>(heads * dim)), v(k.size());
        for (int p = 0; p < n; ++p) {
            for (float& x : k) x = d(rng);
            for (float& x : v) x = d(rng);
            for (int l = 0; l < 2; ++l) latent ? kv.store_latent(l, p, k.data()) : kv.store(l, p, k.data(), v.data());
            latent ? mtp.store_latent(0, p, k.data()) : mtp.store(0, p, k.data(), v.data());
        }
        engine::conversation_cache plain_cc(64 << 20, hot), cc(64 << 20, hot);
        const std::vector<int32_t> toks = tokens(n, 1, 1000);
        plain_cc.park(toks, kv);
        const uint64_t id = cc.park(toks, kv, {}, &mtp, 290);  // the MTP entries of the first 290 positions
        ASSERT_NE(id, 0u);
        const uint64_t row_bytes = static_cast<uint64_t>(mtp.n_tiles()) * mtp.head_row_bytes();
        EXPECT_EQ(cc.stats().bytes - plain_cc.stats().bytes, 290 * row_bytes);
        engine::kv_cache kv2(2, 512, heads, dim, engine::kv_type::f16, latent),
            mtp2(1, 512, heads, dim, engine::kv_type::f16, latent);
        kv2.reserve(n);
        mtp2.reserve(n);
        // The caller holds MTP entries [0, 10) of its own; the snapshot gives [10, 290).
        EXPECT_EQ(cc.restore(id, 0, 280, kv2, &mtp2, 10), 280u);
        EXPECT_EQ(cc.restore(id, 0, n, kv2, &mtp2, 280), 290u);
        EXPECT_EQ(cc.restore(id, 0, n, kv2, &mtp2, 295), 295u);  // nothing past what the caller has
        std::vector<uint8_t> a(engine::kv_cache::chunk_tokens * mtp.head_row_bytes()), b(a.size());
        for (int c = 0; c < 2; ++c)
            for (int t = 0; t < mtp.n_tiles(); ++t) {
                const int r1 = c == 0 ? engine::kv_cache::chunk_tokens : 290 - engine::kv_cache::chunk_tokens;
                mtp.read_rows(0, c, t, c == 0 ? 10 : 0, r1, a.data());
                mtp2.read_rows(0, c, t, c == 0 ? 10 : 0, r1, b.data());
                EXPECT_EQ(0, std::memcmp(a.data(), b.data(), static_cast<size_t>(r1 - (c == 0 ? 10 : 0)) * mtp.head_row_bytes()))
                    << "latent " << latent << " chunk " << c << " tile " << t;
            }
        // Without a cache to take them, the rows stay in the snapshot.
        EXPECT_EQ(cc.restore(id, 0, n, kv2), 0u);
    }
}

TEST(ConversationCache, TheLongestSharedPrefixWins) {
    const auto m = load(make_model::arch::qwen3moe, "f16", 64);
    const int n_vocab = m->info().n_vocab;
    const auto x = tokens(100, 10, n_vocab), y1 = tokens(50, 11, n_vocab), y2 = tokens(100, 12, n_vocab);
    const uint64_t id1 = park(m, concat(x, y1));
    const uint64_t id2 = park(m, concat(x, y2));
    const uint64_t id3 = park(m, concat(concat(x, std::vector(y2.begin(), y2.begin() + 50)), tokens(80, 13, n_vocab)));
    ASSERT_TRUE(id1 && id2 && id3);
    EXPECT_EQ(m->conversation_statistics().entries.size(), 3u);

    const uint64_t hits = m->conversation_statistics().hits;  // parking id2 and id3 restored x from id1, id2
    session s(m);
    const auto r = s.generate(concat(concat(x, y2), tokens(20, 14, n_vocab)), greedy(2));
    EXPECT_EQ(r.time.cache_source, prefix_source::snapshot);
    EXPECT_EQ(r.time.cache_snapshot, id2);
    EXPECT_EQ(r.time.cache_n, 200);
    // Most recently used first.
    EXPECT_EQ(m->conversation_statistics().entries.front().id, id2);

    session t(m);
    const auto none = t.generate(tokens(40, 15, n_vocab), greedy(2));
    EXPECT_EQ(none.time.cache_source, prefix_source::none);
    EXPECT_EQ(none.time.cache_n, 0);
    const auto stats = m->conversation_statistics();
    EXPECT_EQ(stats.hits, hits + 1);
    EXPECT_GE(stats.misses, 1u);
}

// generation_options::cache_scope: a prompt reuses neither the live state nor a snapshot another scope
// left, and gets its own scope's back; park() keeps the session's scope.
TEST(ConversationCache, ScopesNeverShareAPrefix) {
    const auto m = load(make_model::arch::qwen3moe, "f16", 64);
    const auto p = tokens(120, 30, m->info().n_vocab);
    const auto scoped = [](std::string scope) {
        generation_options g = greedy(2);
        g.cache_scope = std::move(scope);
        return g;
    };
    session s(m);
    const auto a = s.generate(p, scoped("a"));
    EXPECT_EQ(a.time.cache_n, 0);
    const auto b = s.generate(p, scoped("b"));
    EXPECT_EQ(b.time.cache_n, 0) << "scope a's live state";
    EXPECT_EQ(b.time.cache_source, prefix_source::none);
    const auto unscoped = s.generate(p, greedy(2));
    EXPECT_EQ(unscoped.time.cache_n, 0) << "scope a's or b's snapshot";
    const auto again = s.generate(p, scoped("a"));
    EXPECT_EQ(again.time.cache_source, prefix_source::snapshot);
    EXPECT_EQ(again.time.cache_n, 119);
    EXPECT_EQ(again.tokens[0].id, a.tokens[0].id);
    const auto live = s.generate(p, scoped("a"));
    EXPECT_EQ(live.time.cache_source, prefix_source::live);
    EXPECT_EQ(live.time.cache_n, 119);

    session t(m);
    EXPECT_EQ(t.generate(p, scoped("c")).time.cache_n, 0);
    ASSERT_GT(t.park(), 0u);
    session u(m);
    EXPECT_EQ(u.generate(p, scoped("b")).time.cache_n, 119) << "b's own snapshot";
    EXPECT_EQ(u.generate(p, scoped("c")).time.cache_n, 119) << "the snapshot t parked under c";
}

TEST(ConversationCache, EvictsTheLeastRecentlyUsedWithinTheBudget) {
    // Each snapshot of the tiny model maps one 2 MiB segment: a 5 MiB budget holds two.
    const auto m = load(make_model::arch::qwen3moe, "f16", 5);
    const int n_vocab = m->info().n_vocab;
    const auto a = tokens(60, 20, n_vocab), b = tokens(60, 21, n_vocab), c = tokens(60, 22, n_vocab);
    const uint64_t ida = park(m, a), idb = park(m, b);
    session s(m);
    EXPECT_EQ(s.generate(concat(a, tokens(5, 23, n_vocab)), greedy(1)).time.cache_snapshot, ida);  // a is used again
    const uint64_t idc = park(m, c);
    const auto stats = m->conversation_statistics();
    ASSERT_EQ(stats.entries.size(), 2u);
    EXPECT_EQ(stats.entries[0].id, idc);
    EXPECT_EQ(stats.entries[1].id, ida);
    EXPECT_EQ(stats.evictions, 1u);
    EXPECT_LE(stats.bytes, stats.budget_bytes);
    EXPECT_EQ(stats.budget_bytes, uint64_t{5} << 20);
    EXPECT_EQ(stats.segments, 2u);
    EXPECT_NE(idb, 0u);

    const auto small = load(make_model::arch::qwen3moe, "f16", 1);
    EXPECT_EQ(park(small, a), 0u) << "a snapshot larger than the whole budget is not parked";
    const auto off = load(make_model::arch::qwen3moe, "f16", 0);
    EXPECT_EQ(park(off, a), 0u);
    EXPECT_FALSE(off->conversation_statistics().enabled);
}

TEST(ConversationCache, AConversationExtendedAfterItsSnapshotReplacesIt) {
    const auto m = load(make_model::arch::qwen2moe, "f16", 64);
    const auto cold_model = load(make_model::arch::qwen2moe, "f16", 0);
    const int n_vocab = m->info().n_vocab;
    const auto t1 = tokens(280, 30, n_vocab);
    const uint64_t id1 = park(m, t1);
    session s(m);
    const auto t2 = concat(t1, tokens(90, 31, n_vocab));
    const auto second = s.generate(t2, greedy(4));
    EXPECT_EQ(second.time.cache_snapshot, id1);
    const uint64_t id2 = s.park();
    const auto stats = m->conversation_statistics();
    ASSERT_EQ(stats.entries.size(), 1u) << "the earlier turn's snapshot is superseded";
    EXPECT_EQ(stats.entries[0].id, id2);
    EXPECT_EQ(stats.entries[0].tokens, static_cast<int>(t2.size()) + 3);
    EXPECT_EQ(stats.evictions, 0u);

    // A third turn from another session restores the extended snapshot.
    const auto t3 = concat(concat(t2, ids_of(second)), tokens(30, 32, n_vocab));
    session other(m);
    const auto third = other.generate(t3, greedy(6));
    EXPECT_EQ(third.time.cache_snapshot, id2);
    EXPECT_EQ(third.time.cache_n, static_cast<int>(t2.size()) + 3);
    session cold(cold_model);
    expect_same(cold.generate(t3, greedy(6)), third, "extended");
}

TEST(ConversationCache, APromptCancelledAfterARestoreLeavesCacheAndSessionUsable) {
    const auto m = load(make_model::arch::mixtral, "int8", 64, 8);
    const auto cold_model = load(make_model::arch::mixtral, "int8", 0, 8);
    const int n_vocab = m->info().n_vocab;
    const auto a = tokens(300, 40, n_vocab);
    const uint64_t id = park(m, a);
    // 600 new tokens in batches of 8. The cancel comes from another session's token callback, which runs
    // on the engine thread after each step the two share: it sees the prompt at 340 positions or a few
    // more, whatever the machine's load.
    const auto prompt = concat(a, tokens(600, 41, n_vocab));

    session s(m), clock(m);
    std::promise<void> ticking;
    bool started = false, cancelled = false;
    auto ticks = clock.start(tokens(4, 42, n_vocab), greedy(500), [&](const token_event&) {
        if (!started) ticking.set_value();
        started = true;
        if (!cancelled && s.cached_tokens() >= 340) {
            s.cancel();
            cancelled = true;
            return true;
        }
        return !cancelled;
    });
    ticking.get_future().wait();
    const auto cut = s.generate(prompt, greedy(4));
    ticks.get();
    EXPECT_TRUE(cancelled);
    EXPECT_EQ(cut.reason, stop_reason::cancelled);
    EXPECT_EQ(cut.time.cache_snapshot, id);
    EXPECT_LT(cut.time.prompt_n, 600);
    EXPECT_EQ(m->conversation_statistics().entries.size(), 1u);

    session cold(cold_model);
    const auto reference = cold.generate(prompt, greedy(4));
    const auto again = s.generate(prompt, greedy(4));  // the session goes on from what it had evaluated
    EXPECT_EQ(again.time.cache_source, prefix_source::live);
    EXPECT_GE(again.time.cache_n, 340);
    expect_same(reference, again, "after the cancel, same session");
    session fresh(m);
    const auto restored = fresh.generate(prompt, greedy(4));
    EXPECT_EQ(restored.time.cache_source, prefix_source::snapshot);
    expect_same(reference, restored, "after the cancel, restored");
}

}  // namespace
}  // namespace strata

namespace strata {
namespace {

// Same tokens, logprobs within f32 rounding: a hybrid model's recurrent state restarted from a checkpoint
// evaluates the rest in other batches than a cold run, which the prompt kernel may round differently.
void expect_close(const generation_result& a, const generation_result& b, const std::string& what) {
    ASSERT_EQ(ids_of(a), ids_of(b)) << what;
    for (size_t i = 0; i < a.tokens.size(); ++i) EXPECT_NEAR(a.tokens[i].logprob, b.tokens[i].logprob, 1e-3) << what;
}

// A hybrid conversation whose last user turn is edited restarts from the checkpoint where that turn
// started, from the live session and from a parked snapshot; a state never goes back past a checkpoint.
TEST(HybridConversation, AnEditedTurnRestartsFromItsCheckpoint) {
    for (make_model::arch a : {make_model::arch::qwen35moe, make_model::arch::qwen3next}) {
        const auto m = load(a, "f16", 256, 512, 64);
        const auto cold_model = load(a, "f16", 0);
        ASSERT_GT(m->info().state_bytes_per_session, 0u);
        EXPECT_EQ(m->info().n_recurrent_layers, 3);
        const int n_vocab = m->info().n_vocab;
        const auto turn1 = tokens(300, 1, n_vocab);
        session s(m);
        const auto r1 = s.generate(turn1, greedy(8));
        // Every 64 positions (4) and the prompt's end (300).
        EXPECT_EQ(s.state_checkpoints(), 5u);
        EXPECT_EQ(s.state_checkpoint_bytes(), 5 * m->info().state_bytes_per_session);
        const auto history = concat(turn1, ids_of(r1));  // 308 tokens, 307 evaluated
        const auto r2 = s.generate(concat(history, tokens(60, 2, n_vocab)), greedy(4));
        EXPECT_EQ(r2.time.cache_n, 307);
        const auto edited = concat(history, tokens(50, 3, n_vocab));
        const auto r3 = s.generate(edited, greedy(6));
        EXPECT_EQ(r3.time.cache_source, prefix_source::live);
        EXPECT_EQ(r3.time.cache_n, 307);  // the checkpoint where turn 2's new tokens started
        session cold(cold_model);
        expect_close(cold.generate(edited, greedy(6)), r3, "live " + make_model::arch_name(a));

        // A prompt sharing only the first 200 tokens restarts from the checkpoint at 192.
        const auto r4 = s.generate(concat(std::vector<int32_t>(turn1.begin(), turn1.begin() + 200), tokens(20, 4, n_vocab)),
                                   greedy(2));
        EXPECT_EQ(r4.time.cache_n, 192);

        // Parked by that prompt, the edited conversation comes back from the snapshot's checkpoint at 307.
        const auto stats = m->conversation_statistics();
        ASSERT_GE(stats.entries.size(), 1u);
        EXPECT_GT(stats.state_checkpoints, 0u);
        EXPECT_GT(stats.state_bytes, 0u);
        const auto edited2 = concat(history, tokens(40, 5, n_vocab));
        const auto r5 = s.generate(edited2, greedy(4));
        EXPECT_EQ(r5.time.cache_source, prefix_source::snapshot);
        EXPECT_EQ(r5.time.cache_n, 307);
        session cold2(cold_model);
        expect_close(cold2.generate(edited2, greedy(4)), r5, "snapshot " + make_model::arch_name(a));
    }
}

}  // namespace
}  // namespace strata
