// forward_pass::eval_step: several sequences' prompt chunks and single decode rows in one pass give
// each sequence's logits bitwise as when it runs alone, in every pool mode and worker count (the
// hybrids' recurrent states included, checkpointed at the same positions).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <span>
#include <vector>

#include "expert_pool.hpp"
#include "generate.hpp"
#include "loaded_model.hpp"
#include "model/forward.hpp"

namespace strata::engine {
namespace {

using make_model::arch;

std::vector<int32_t> tokens_of(int n_vocab, int n, int salt) {
    std::vector<int32_t> t;
    for (int i = 0; i < n; ++i) t.push_back((i * 7919 + 13 + salt * 101) % (n_vocab - 3));
    return t;
}

// The hybrids' recurrent state is checkpointed every kInterval positions, so steps cross intervals.
constexpr int kInterval = 8;

// Every position's logits of `tokens` evaluated alone in batches of 512.
std::vector<float> alone(test::loaded& m, arenas::expert_pool& pool, const std::vector<int32_t>& tokens, kv_type kv,
                         size_t* n_checkpoints = nullptr, int n_ctx = 64) {
    forward_pass fwd(pool, m.hp, m.w, *m.rows);
    fwd.set_checkpoint_interval(kInterval);
    kv_cache cache = make_sequence_state(m.hp, n_ctx, kv);
    std::vector<float> logits(tokens.size() * static_cast<size_t>(m.hp.n_vocab), NAN);
    fwd.eval(tokens, 0, cache, logits.data(), true, 512);
    if (n_checkpoints) *n_checkpoints = cache.n_checkpoints();
    return logits;
}

// Three sequences stepped together: each step takes a chunk of every sequence that has started and
// not finished, of a size that cycles through prompt-like chunks and single decode rows (so a step
// mixes both); sequence s starts at step s. Returns every position's logits per sequence.
std::vector<std::vector<float>> stepped(test::loaded& m, arenas::expert_pool& pool,
                                        const std::vector<std::vector<int32_t>>& seqs, kv_type kv, int* max_rows,
                                        std::vector<size_t>* n_checkpoints = nullptr) {
    forward_pass fwd(pool, m.hp, m.w, *m.rows);
    fwd.set_checkpoint_interval(kInterval);
    const size_t n_vocab = static_cast<size_t>(m.hp.n_vocab);
    std::vector<kv_cache> caches;
    std::vector<std::vector<float>> out;
    for (const auto& s : seqs) {
        caches.push_back(make_sequence_state(m.hp, 64, kv));
        out.emplace_back(s.size() * n_vocab, NAN);
    }
    std::vector<int> done(seqs.size(), 0);
    constexpr int sizes[] = {9, 1, 1, 4, 1, 6};
    for (int step = 0;; ++step) {
        std::vector<step_segment> segs;
        int rows = 0;
        for (size_t s = 0; s < seqs.size(); ++s) {
            const int left = static_cast<int>(seqs[s].size()) - done[s];
            if (static_cast<int>(s) > step || left == 0) continue;
            const int n = std::min(left, sizes[(static_cast<size_t>(step) + s) % std::size(sizes)]);
            segs.push_back({seqs[s].data() + done[s], n, done[s], &caches[s],
                            out[s].data() + static_cast<size_t>(done[s]) * n_vocab, true});
            done[s] += n;
            rows += n;
        }
        if (segs.empty()) break;
        *max_rows = std::max(*max_rows, rows);
        fwd.eval_step(segs);
    }
    if (n_checkpoints)
        for (const kv_cache& c : caches) n_checkpoints->push_back(c.n_checkpoints());
    return out;
}

TEST(ForwardStep, SequencesSteppedTogetherAreBitwiseAlone) {
    const auto ds = make_model::preset("tiny", arch::deepseek2);
    for (const auto& [spec, kv] : {std::pair{make_model::preset("tiny", arch::qwen2moe), kv_type::f16},
                                   std::pair{make_model::preset("tiny", arch::glm4moe), kv_type::int8},
                                   std::pair{make_model::preset("tiny"), kv_type::f16}, std::pair{ds, kv_type::f16},
                                   std::pair{make_model::preset("tiny", arch::qwen35moe), kv_type::f16},
                                   std::pair{make_model::preset("tiny", arch::qwen3next), kv_type::f16},
                                   std::pair{make_model::preset("tiny", arch::qwen4exp), kv_type::f16}}) {
        auto m = test::load(make_model::build_model(spec));
        auto base_pool = test::make_pool("off", 1);
        // Every family puts the sequences' rows in one pass.
        const bool one_pass = forward_pass(*base_pool, m->hp, m->w, *m->rows).batches_sequences();
        EXPECT_TRUE(one_pass) << make_model::arch_name(spec.architecture);
        // qwen4exp's sequences run long enough that the indexer leaves most blocks out (its budget is 4).
        const int len = m->hp.qwen4() ? 60 : 23;
        const std::vector<std::vector<int32_t>> seqs{tokens_of(m->hp.n_vocab, len, 0),
                                                     tokens_of(m->hp.n_vocab, len - 6, 1),
                                                     tokens_of(m->hp.n_vocab, len - 3, 2)};
        std::vector<std::vector<float>> base;
        std::vector<size_t> base_checkpoints;
        for (const auto& s : seqs) base.push_back(alone(*m, *base_pool, s, kv, &base_checkpoints.emplace_back()));
        int compared = 0;
        for (const std::string mode : {"off", "test:2", "test:3"})
            for (int workers : {1, 2, 3}) {
                auto pool = test::make_pool(mode, workers);
                int max_rows = 0;
                std::vector<size_t> checkpoints;
                const auto got = stepped(*m, *pool, seqs, kv, &max_rows, &checkpoints);
                EXPECT_GT(max_rows, 9) << "some step should hold several sequences' rows";
                // The hybrids' states are checkpointed at the same positions (each multiple of the interval).
                EXPECT_EQ(checkpoints, base_checkpoints);
                if (m->hp.hybrid()) {
                    EXPECT_EQ(base_checkpoints[0], static_cast<size_t>(len / kInterval));
                }
                for (size_t s = 0; s < seqs.size(); ++s) {
                    ASSERT_EQ(std::memcmp(got[s].data(), base[s].data(), base[s].size() * sizeof(float)), 0)
                        << make_model::arch_name(spec.architecture) << " " << kv_type_name(kv) << " " << mode
                        << " workers " << workers << " sequence " << s;
                    ++compared;
                }
            }
        std::printf("  %s, %s KV: %d sequences bitwise alone (%s)\n", make_model::arch_name(spec.architecture).c_str(),
                    kv_type_name(kv), compared, one_pass ? "one pass per step" : "evaluated in turn");
    }
}

// Decode rows of sequences at different depths share one attention phase per layer: one sequence
// past the cache's first chunk (its heads fold two chunks), one short, each row bitwise as alone.
TEST(ForwardStep, DecodeRowsAtDifferentDepthsAreBitwiseAlone) {
    auto m = test::load(make_model::build_model(make_model::preset("tiny")));
    constexpr int n_ctx = kv_cache::chunk_tokens + 64;
    const std::vector<std::vector<int32_t>> seqs{tokens_of(m->hp.n_vocab, kv_cache::chunk_tokens + 40, 0),
                                                 tokens_of(m->hp.n_vocab, 20, 1)};
    constexpr int n_decode = 6;
    const size_t n_vocab = static_cast<size_t>(m->hp.n_vocab);
    auto base_pool = test::make_pool("off", 1);
    std::vector<std::vector<float>> base;
    for (const auto& s : seqs) base.push_back(alone(*m, *base_pool, s, kv_type::f16, nullptr, n_ctx));
    for (const std::string mode : {"off", "test:2"})
        for (int workers : {1, 2}) {
            auto pool = test::make_pool(mode, workers);
            forward_pass fwd(*pool, m->hp, m->w, *m->rows);
            fwd.set_checkpoint_interval(kInterval);
            std::vector<kv_cache> caches;
            for (size_t s = 0; s < seqs.size(); ++s) caches.push_back(make_sequence_state(m->hp, n_ctx, kv_type::f16));
            std::vector<std::vector<float>> got(seqs.size(), std::vector<float>(n_vocab * n_decode, NAN));
            for (size_t s = 0; s < seqs.size(); ++s) {
                const step_segment prompt{seqs[s].data(), static_cast<int>(seqs[s].size()) - n_decode, 0, &caches[s],
                                          nullptr, false};
                fwd.eval_step(std::span(&prompt, 1));
            }
            for (int d = 0; d < n_decode; ++d) {
                std::vector<step_segment> segs;
                for (size_t s = 0; s < seqs.size(); ++s) {
                    const int pos = static_cast<int>(seqs[s].size()) - n_decode + d;
                    segs.push_back({seqs[s].data() + pos, 1, pos, &caches[s], got[s].data() + d * n_vocab, false});
                }
                fwd.eval_step(segs);
            }
            for (size_t s = 0; s < seqs.size(); ++s) {
                const size_t first = (seqs[s].size() - n_decode) * n_vocab;
                ASSERT_EQ(std::memcmp(got[s].data(), base[s].data() + first, n_decode * n_vocab * sizeof(float)), 0)
                    << mode << " workers " << workers << " sequence " << s;
            }
        }
}

// A segment whose positions do not fit its cache is refused before any segment is evaluated.
TEST(ForwardStep, ASegmentPastItsContextRefusesTheStep) {
    auto m = test::load(make_model::build_model(make_model::preset("tiny")));
    auto pool = test::make_pool("off", 1);
    forward_pass fwd(*pool, m->hp, m->w, *m->rows);
    kv_cache a = make_sequence_state(m->hp, 64, kv_type::f16), b = make_sequence_state(m->hp, 8, kv_type::f16);
    const auto t = tokens_of(m->hp.n_vocab, 10, 0);
    std::vector<float> logits(static_cast<size_t>(m->hp.n_vocab));
    const step_segment segs[] = {{t.data(), 4, 0, &a, logits.data(), false}, {t.data(), 10, 0, &b, nullptr, false}};
    EXPECT_THROW(fwd.eval_step(segs), kv_cache_full);
    EXPECT_EQ(a.bytes(), make_sequence_state(m->hp, 64, kv_type::f16).bytes()) << "nothing was reserved for a";
}

}  // namespace
}  // namespace strata::engine
