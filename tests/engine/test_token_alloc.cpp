// The decode loop allocates nothing: once a session's buffers have grown, evaluating a token (every
// architecture's forward pass, on every pool mode) makes no heap allocation. This binary replaces the
// global operator new to count them, so it holds only these tests.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <new>

#include "generate.hpp"
#include "loaded_model.hpp"

namespace {
std::atomic<long> g_news{0};
}  // namespace

// The replacements pair malloc with free, which GCC cannot see through the replaced operators.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

void* operator new(std::size_t n) {
    g_news.fetch_add(1, std::memory_order_relaxed);
    if (void* p = std::malloc(n ? n : 1)) return p;
    throw std::bad_alloc();
}
void* operator new[](std::size_t n) { return operator new(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }

namespace strata::engine {
namespace {

using make_model::arch;

using test::make_pool;

std::unique_ptr<test::loaded> load(const make_model::model_spec& spec) { return test::load(make_model::build_model(spec)); }

struct alloc_case {
    arch a;
    const char* pool;
    int workers;
    kv_type kv;
};

void PrintTo(const alloc_case& c, std::ostream* os) {
    *os << make_model::arch_name(c.a) << ", pool " << c.pool << ", " << c.workers << " workers, " << kv_type_name(c.kv);
}

class TokenLoop : public ::testing::TestWithParam<alloc_case> {};

// A prompt, one warm-up token, then 24 more tokens inside the same KV chunk (growing the cache by a
// chunk may allocate; it happens once per 256 positions, not per token).
TEST_P(TokenLoop, DecodeAllocatesNothingOnceWarm) {
    const alloc_case c = GetParam();
    auto m = load(make_model::preset("tiny", c.a));
    auto pool = make_pool(c.pool, c.workers);
    forward_pass fwd(*pool, m->hp, m->w, *m->rows);
    kv_cache cache(m->hp.n_layer, 256, m->hp.kv_heads(), m->hp.kv_head_dim(), c.kv, m->hp.mla());
    std::vector<int32_t> tokens;
    for (int i = 0; i < 40; ++i) tokens.push_back((i * 7919 + 13) % (m->hp.n_vocab - 3));
    std::vector<float> logits(static_cast<size_t>(m->hp.n_vocab));
    const std::span<const int32_t> all(tokens);
    fwd.eval(all.first(12), 0, cache, logits.data());
    fwd.eval(all.subspan(12, 1), 12, cache, logits.data());
    const long before = g_news.load();
    for (int p = 13; p < 37; ++p) fwd.eval(all.subspan(static_cast<size_t>(p), 1), p, cache, logits.data());
    const long n = g_news.load() - before;
    std::printf("  %ld heap allocations in 24 decode tokens\n", n);
    // Anything the forward pass allocates, it allocates on every token (24 or more); fewer can only
    // come from TBB's own bookkeeping when a worker sleeps and wakes.
    EXPECT_LT(n, 24) << n << " heap allocations in 24 decode tokens (" << make_model::arch_name(c.a) << ", pool "
                    << c.pool << ", " << c.workers << " workers, " << kv_type_name(c.kv) << " KV)";
}

INSTANTIATE_TEST_SUITE_P(
    Archs, TokenLoop,
    ::testing::Values(alloc_case{arch::qwen3moe, "off", 2, kv_type::f16}, alloc_case{arch::qwen3moe, "test:2", 2, kv_type::int8},
                      alloc_case{arch::qwen2moe, "off", 1, kv_type::f16}, alloc_case{arch::mixtral, "off", 2, kv_type::f16},
                      alloc_case{arch::glm4moe, "off", 2, kv_type::f16}, alloc_case{arch::deepseek2, "off", 2, kv_type::f16},
                      alloc_case{arch::deepseek2, "test:2", 2, kv_type::int8}),
    [](const auto& info) {
        return make_model::arch_name(info.param.a) + "_" + (std::string(info.param.pool) == "off" ? "off" : "test2") +
               "_" + std::to_string(info.param.workers) + "w_" + kv_type_name(info.param.kv);
    });

}  // namespace
}  // namespace strata::engine
