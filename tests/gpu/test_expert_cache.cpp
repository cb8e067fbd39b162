// The VRAM expert cache's bookkeeping (engine/gpu/expert_cache.hpp), with a scripted copier: runs
// everywhere, no GPU needed.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>

#include "gpu/expert_cache.hpp"

namespace strata::engine::gpu {
namespace {

// Copies land only when the test says so (or at wait()).
class fake_copier final : public expert_copier {
public:
    ticket start(int slot, expert_key key) override {
        started.push_back({slot, key});
        landed_[next_] = false;
        return next_++;
    }
    bool landed(ticket t) override { return landed_.at(t); }
    void wait(ticket t) override { landed_.at(t) = true; }
    void land_all() {
        for (auto& [t, l] : landed_) l = true;
    }
    struct copy {
        int slot;
        expert_key key;
    };
    std::vector<copy> started;

private:
    ticket next_ = 0;
    std::map<ticket, bool> landed_;
};

constexpr uint64_t kMiB = 1 << 20;

TEST(ExpertCacheSizing, AutoFillsWhatIsLeft) {
    const vram_budget b{.free_bytes = 1000 * kMiB, .reserve_bytes = 100 * kMiB, .dense_bytes = 300 * kMiB,
                        .kv_bytes_per_session = 50 * kMiB};
    const cache_size s = size_expert_cache(b, std::nullopt, 10 * kMiB, 1000);
    EXPECT_EQ(s.available_bytes, 550 * kMiB);
    EXPECT_EQ(s.n_slots, 55);
    EXPECT_EQ(size_expert_cache(b, std::nullopt, 10 * kMiB, 20).n_slots, 20);  // capped by the model
    EXPECT_EQ(size_expert_cache(b, std::nullopt, 7 * kMiB, 1000).n_slots, 78);  // floor(550 / 7)
}

TEST(ExpertCacheSizing, KvCacheIsSizedForTheSessionsThatExist) {
    // One session unless more are asked for (--gpu-sessions): the other sessions' VRAM goes to experts.
    vram_budget b{.free_bytes = 2000 * kMiB, .reserve_bytes = 100 * kMiB, .dense_bytes = 300 * kMiB,
                  .kv_bytes_per_session = 200 * kMiB};
    EXPECT_EQ(b.kv_bytes(), 200 * kMiB);
    const cache_size one = size_expert_cache(b, std::nullopt, 10 * kMiB, 1000);
    EXPECT_EQ(one.available_bytes, 1400 * kMiB);
    EXPECT_EQ(one.n_slots, 140);
    b.n_sessions = 4;
    const cache_size four = size_expert_cache(b, std::nullopt, 10 * kMiB, 1000);
    EXPECT_EQ(four.available_bytes, 800 * kMiB);
    EXPECT_EQ(four.n_slots, 80);
    b.n_sessions = 9;  // 1800 MiB of KV caches do not fit in 1600
    try {
        size_expert_cache(b, std::nullopt, 10 * kMiB, 1000);
        FAIL() << "9 sessions' KV caches should not fit";
    } catch (const std::runtime_error& e) {
        EXPECT_NE(std::string(e.what()).find("the KV cache (1800 MiB for 9 session(s))"), std::string::npos) << e.what();
    }
    b.n_sessions = 0;
    EXPECT_THROW(size_expert_cache(b, std::nullopt, 10 * kMiB, 1000), std::invalid_argument);
}

TEST(ExpertCacheSizing, ExplicitSizeMustFit) {
    const vram_budget b{.free_bytes = 4096 * kMiB, .reserve_bytes = 512 * kMiB, .dense_bytes = 1024 * kMiB,
                        .kv_bytes_per_session = 512 * kMiB};
    EXPECT_EQ(size_expert_cache(b, 1.0, 64 * kMiB, 1000).n_slots, 16);
    EXPECT_EQ(size_expert_cache(b, 0.0, 64 * kMiB, 1000).n_slots, 0);
    try {
        size_expert_cache(b, 3.0, 64 * kMiB, 1000);
        FAIL() << "3 GiB should not fit 2 GiB";
    } catch (const std::runtime_error& e) {
        EXPECT_NE(std::string(e.what()).find("leaves 2048 MiB"), std::string::npos) << e.what();
    }
}

TEST(ExpertCacheSizing, DenseThatDoesNotFitNamesTheNumbers) {
    const vram_budget b{.free_bytes = 1000 * kMiB, .reserve_bytes = 512 * kMiB, .dense_bytes = 600 * kMiB,
                        .kv_bytes_per_session = 0};
    try {
        size_expert_cache(b, std::nullopt, kMiB, 10);
        FAIL();
    } catch (const std::runtime_error& e) {
        const std::string m = e.what();
        EXPECT_NE(m.find("1000 MiB free"), std::string::npos) << m;
        EXPECT_NE(m.find("need 1112 MiB"), std::string::npos) << m;
    }
}

TEST(ExpertCacheSizing, ParsesTheFlag) {
    EXPECT_FALSE(parse_expert_cache("auto").has_value());
    EXPECT_DOUBLE_EQ(*parse_expert_cache("12.5"), 12.5);
    EXPECT_THROW(parse_expert_cache("12G"), std::invalid_argument);
    EXPECT_THROW(parse_expert_cache("-1"), std::invalid_argument);
}

TEST(ExpertProfile, RoundTrip) {
    const auto path = std::filesystem::temp_directory_path() / "strata_test_profile.txt";
    expert_profile p{.n_layer = 3, .n_expert = 4, .counts = {}};
    for (int i = 0; i < 12; ++i) p.counts.push_back(static_cast<uint64_t>(i * 7919 % 13) + (uint64_t{1} << 40));
    save_profile(path.string(), p);
    const expert_profile q = load_profile(path.string(), 3, 4);
    EXPECT_EQ(q.counts, p.counts);
    EXPECT_THROW(load_profile(path.string(), 3, 8), std::runtime_error);
    {
        std::ofstream(path) << "strata-expert-profile 1 3 4\n1 2 3\n";
    }
    EXPECT_THROW(load_profile(path.string(), 3, 4), std::runtime_error);
    std::filesystem::remove(path);
    EXPECT_THROW(load_profile(path.string(), 3, 4), std::runtime_error);
}

TEST(ExpertProfile, FillOrder) {
    const auto def = fill_order(2, 3, nullptr);
    const std::vector<expert_key> want_def{{0, 0}, {1, 0}, {0, 1}, {1, 1}, {0, 2}, {1, 2}};
    EXPECT_EQ(def, want_def);
    const expert_profile p{.n_layer = 2, .n_expert = 3, .counts = {5, 9, 1, 9, 0, 5}};
    const std::vector<expert_key> want{{0, 1}, {1, 0}, {0, 0}, {1, 2}, {0, 2}, {1, 1}};
    EXPECT_EQ(fill_order(2, 3, &p), want);
}

// Scripted routing over 2 layers x 4 experts, 2 slots filled with (0,0) and (1,0); k = 2.
TEST(ExpertCache, HitRateIsExactOnAScriptedRouting) {
    fake_copier copier;
    expert_cache cache(2, 4, 2, {}, copier);
    cache.fill({{0, 0}, {1, 0}});
    EXPECT_EQ(cache.slot_of(0, 0), 0);
    EXPECT_EQ(cache.slot_of(1, 0), 1);
    EXPECT_EQ(cache.slot_of(0, 1), -1);

    const int32_t ids[] = {0, 1, 2, 3, 1, 0};  // 3 tokens
    const float w[] = {.5f, .5f, .6f, .4f, .7f, .3f};
    int32_t comp[6];
    std::vector<resident_job> res;
    cache.split(0, 3, 2, ids, w, comp, res);
    const int32_t want_comp[] = {-1, 1, 2, 3, 1, -1};
    EXPECT_TRUE(std::equal(comp, comp + 6, want_comp));
    ASSERT_EQ(res.size(), 2u);
    EXPECT_EQ(res[0].token, 0);
    EXPECT_EQ(res[0].slot_in_token, 0);
    EXPECT_EQ(res[0].slot, 0);
    EXPECT_FLOAT_EQ(res[0].weight, .5f);
    EXPECT_EQ(res[1].token, 2);
    EXPECT_EQ(res[1].slot_in_token, 1);
    cache.split(1, 3, 2, ids, w, comp, res);  // layer 1: expert 0 resident in slot 1
    EXPECT_EQ(res.size(), 2u);
    EXPECT_EQ(res[0].slot, 1);
    EXPECT_EQ(cache.stats().lookups, 12u);
    EXPECT_EQ(cache.stats().hits, 4u);
    EXPECT_DOUBLE_EQ(cache.stats().hit_rate(), 4.0 / 12.0);

    const int32_t bad[] = {4, 0};
    EXPECT_THROW(cache.split(0, 1, 2, bad, w, comp, res), std::out_of_range);
}

// Route one token per decode step in layer 0 to the given experts (k = 2).
void route(expert_cache& cache, int32_t a, int32_t b) {
    const int32_t ids[] = {a, b};
    const float w[] = {.5f, .5f};
    int32_t comp[2];
    std::vector<resident_job> res;
    cache.split(0, 1, 2, ids, w, comp, res);
}

TEST(ExpertCache, AdaptiveSwapsPickTheMostRoutedNonResidents) {
    fake_copier copier;
    expert_cache cache(1, 8, 3, {.every = 4, .swaps = 2, .async = false}, copier);
    cache.fill({{0, 0}, {0, 1}, {0, 2}});
    copier.started.clear();
    // counts over 4 steps: e5: 4, e6: 3, e0: 1, e1: 0 (resident, never routed), e2: 0, e7: 0
    route(cache, 5, 6);
    cache.end_decode_step();
    route(cache, 5, 6);
    cache.end_decode_step();
    route(cache, 5, 6);
    cache.end_decode_step();
    EXPECT_TRUE(copier.started.empty());
    route(cache, 5, 0);
    cache.end_decode_step();  // step 4: adapt; synchronous, so the swaps have landed on return
    ASSERT_EQ(copier.started.size(), 2u);
    // least-routed residents first: e1 and e2 both 0, the later one (e2) first
    EXPECT_EQ(copier.started[0].key, (expert_key{0, 5}));
    EXPECT_EQ(copier.started[0].slot, 2);
    EXPECT_EQ(copier.started[1].key, (expert_key{0, 6}));
    EXPECT_EQ(copier.started[1].slot, 1);
    EXPECT_EQ(cache.slot_of(0, 5), 2);
    EXPECT_EQ(cache.slot_of(0, 6), 1);
    EXPECT_EQ(cache.slot_of(0, 1), -1);
    EXPECT_EQ(cache.slot_of(0, 2), -1);
    EXPECT_EQ(cache.slot_of(0, 0), 0);
    EXPECT_EQ(cache.stats().swaps_started, 2u);
    EXPECT_EQ(cache.stats().swaps_landed, 2u);
    EXPECT_EQ(cache.stats().n_resident, 3);
}

TEST(ExpertCache, NoSwapWithoutAStrictlyMoreRoutedCandidate) {
    fake_copier copier;
    expert_cache cache(1, 4, 2, {.every = 2, .swaps = 4, .async = false}, copier);
    cache.fill({{0, 0}, {0, 1}});
    copier.started.clear();
    route(cache, 0, 1);
    cache.end_decode_step();
    route(cache, 2, 1);  // e2: 1 == e0: 1; no swap
    cache.end_decode_step();
    EXPECT_TRUE(copier.started.empty());
}

TEST(ExpertCache, TableNeverPointsAtASlotBeforeItsCopyLanded) {
    fake_copier copier;
    expert_cache cache(1, 6, 2, {.every = 1, .swaps = 1, .async = true}, copier);
    cache.fill({{0, 0}, {0, 1}});
    route(cache, 4, 4);  // e4 routed twice
    cache.end_decode_step();  // adapt: e4 replaces e1 (count 0, later) in slot 1, copy in flight
    ASSERT_EQ(cache.n_pending(), 1);
    EXPECT_EQ(cache.slot_of(0, 4), -1);  // not landed: not resident
    EXPECT_EQ(cache.slot_of(0, 1), -1);  // its victim left the table before the copy started
    EXPECT_EQ(cache.slot_content(1), (expert_key{0, 4}));
    // while in flight, lookups of both go to the CPU
    const int32_t ids[] = {4, 1};
    const float w[] = {.5f, .5f};
    int32_t comp[2];
    std::vector<resident_job> res;
    cache.split(0, 1, 2, ids, w, comp, res);
    EXPECT_TRUE(res.empty());
    EXPECT_EQ(comp[0], 4);
    EXPECT_EQ(comp[1], 1);
    // further adaptations neither reuse the busy slot nor start e4 again
    route(cache, 4, 5);
    cache.end_decode_step();
    for (const auto& c : copier.started) EXPECT_FALSE(c.slot == 1 && c.key == (expert_key{0, 5}));
    EXPECT_EQ(cache.slot_of(0, 4), -1);
    copier.land_all();
    cache.end_decode_step();
    EXPECT_EQ(cache.slot_of(0, 4), 1);
    for (int e = 0; e < 6; ++e) {
        const int s = cache.slot_of(0, e);
        if (s >= 0) {
            EXPECT_EQ(cache.slot_content(s), (expert_key{0, e}));
        }
    }
}

}  // namespace
}  // namespace strata::engine::gpu
