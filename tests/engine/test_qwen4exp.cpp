// qwen4exp: loading as llama.cpp reads its files (errors naming key and numbers), the generator's PLE
// hash constants as transformers computes them, the forward pass against the naive reference of
// reference_qwen4exp.cpp over greedy decoding with QSA choosing blocks, bitwise determinism across
// pools and batch splits, and the recurrent state (PLE window and conv included) restored exactly.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include <sys/stat.h>

#include "generate.hpp"
#include "gguf/gguf_writer.hpp"
#include "loaded_model.hpp"
#include "model/forward.hpp"
#include "model/ple.hpp"
#include "model/qsa.hpp"
#include "qwen4exp_spec.hpp"
#include "reference_qwen4exp.hpp"
#include "region_map.hpp"
#include "strata/engine.hpp"

namespace strata::engine {
namespace {

using formats::ggml_type;
using make_model::arch;

make_model::model_spec tiny() { return make_model::preset("tiny", arch::qwen4exp); }

// The tiny preset as written (Q4_K experts, Q6_K head), baked once per process: copies are cheap.
const gguf::writer& tiny_writer() {
    static const gguf::writer w = test::baked(make_model::build_model(tiny()));
    return w;
}

// The tiny shape with Q8_0 where the preset has K-quants, which take the generator seconds to fit:
// for the tests of loading, state and generation, which do not depend on the weights' types.
make_model::model_spec quick() {
    make_model::model_spec s = tiny();
    s.type_experts = s.type_out = ggml_type::Q8_0;
    return s;
}

const gguf::writer& quick_writer() {
    static const gguf::writer w = test::baked(make_model::build_model(quick()));
    return w;
}

make_model::model_spec all_f32(make_model::model_spec s) {
    for (ggml_type* t : {&s.type_experts, &s.type_shexp, &s.type_attn, &s.type_embd, &s.type_out, &s.type_router,
                         &s.type_ple})
        *t = ggml_type::F32;
    return s;
}

std::vector<int32_t> some_tokens(int n_vocab, int n) {
    std::vector<int32_t> t;
    for (int i = 0; i < n; ++i) t.push_back((i * 7919 + 13) % (n_vocab - 3));
    return t;
}

std::vector<float> run(test::loaded& m, arenas::expert_pool& pool, const std::vector<int32_t>& tokens,
                       std::vector<int> batches) {
    forward_pass fwd(pool, m.hp, m.w, *m.rows);
    kv_cache state = make_sequence_state(m.hp, std::max<int>(64, static_cast<int>(tokens.size())), kv_type::f16);
    std::vector<float> logits(tokens.size() * static_cast<size_t>(m.hp.n_vocab), NAN);
    const std::span<const int32_t> all(tokens);
    size_t done = 0;
    for (size_t i = 0; done < tokens.size(); ++i) {
        const size_t n = std::min(tokens.size() - done, static_cast<size_t>(batches[std::min(i, batches.size() - 1)]));
        fwd.eval(all.subspan(done, n), static_cast<int>(done), state, logits.data() + done * m.hp.n_vocab, true, 512);
        done += n;
    }
    return logits;
}

double rel_err(const float* a, const std::vector<float>& b) {
    double num = 0, den = 0;
    for (size_t i = 0; i < b.size(); ++i) {
        num = std::max(num, std::abs(double(a[i]) - b[i]));
        den = std::max(den, std::abs(double(b[i])));
    }
    return num / den;
}

bool is_prime(uint64_t v) {
    if (v < 2) return false;
    for (uint64_t d = 2; d * d <= v; ++d)
        if (v % d == 0) return false;
    return true;
}

TEST(Qwen4Load, ReadsTheKeysTensorsAndStateSizes) {
    auto m = test::load(quick_writer());
    const hparams& hp = m->hp;
    EXPECT_TRUE(hp.qwen4() && hp.hybrid() && hp.ssm_gate_sigmoid && hp.ssm_v_tiled);
    EXPECT_EQ(hp.hc, 4);
    EXPECT_EQ(hp.hc_rank, 32);
    EXPECT_EQ(hp.idx_n_head, 4);
    EXPECT_EQ(hp.idx_head_dim, 32);
    EXPECT_EQ(hp.idx_top_k, 16);
    EXPECT_EQ(hp.qsa_ratio, (std::vector<int>{0, 0, 0, 4}));
    EXPECT_EQ(hp.ple_layer, 1);
    EXPECT_EQ(hp.ple_n_heads(), 4);
    EXPECT_EQ(hp.ple_eos, hp.n_vocab - 1);
    // Consecutive primes from the base 1000, each head's rows after the one before.
    EXPECT_EQ(hp.ple_vocab, (std::vector<uint64_t>{1009, 1013, 1019, 1021}));
    EXPECT_EQ(hp.ple_offset, (std::vector<uint64_t>{0, 1009, 2022, 3041}));
    for (uint64_t v : hp.ple_vocab) EXPECT_TRUE(is_prime(v)) << v;
    for (uint64_t mlt : hp.ple_mult) EXPECT_EQ(mlt % 2, 1u);  // 2 (splitmix % half) + 1
    EXPECT_EQ(hp.ple_rows(), 4062);
    const model_weights& w = m->w;
    EXPECT_TRUE(w.hc_head.present() && !w.hc_head.inject.present());
    EXPECT_EQ(w.output_norm, nullptr);
    EXPECT_EQ(w.layers[0].hc_attn.inject.n_rows, 4);
    EXPECT_TRUE(w.layers[3].idx_q.present() && !w.layers[0].idx_q.present());
    EXPECT_TRUE(w.layers[1].ple.present() && !w.layers[0].ple.present());
    // The table is read where the file maps it: the same bytes, not a copy.
    const gguf::tensor_info* t = m->file.find_tensor("per_layer_token_embd.weight");
    EXPECT_EQ(w.ple.data, m->file.tensor_data(*t).data());
    EXPECT_EQ(w.ple.n_rows, 4096);  // 4062 rows padded to 64
}

// The MTP block (its own output mixer, hnorm over the wide residual) is bound and costs the trunk nothing.
TEST(Qwen4Load, MtpBlockIsBoundButNotRun) {
    make_model::model_spec s = quick();
    s.n_layer_nextn = 1;
    auto mtp = test::load(make_model::build_model(s));
    auto plain = test::load(quick_writer());
    ASSERT_EQ(mtp->hp.n_layer, 4);
    ASSERT_EQ(mtp->w.nextn.size(), 1u);
    const nextn_weights& n = mtp->w.nextn[0];
    EXPECT_TRUE(n.eh_proj.present() && n.hc_head.present() && n.layer.hc_attn.present() && n.layer.idx_q.present());
    EXPECT_EQ(n.eh_proj.m.n_cols, 2 * mtp->hp.n_embd);
    auto pool = test::make_pool("off", 2);
    const auto tokens = some_tokens(plain->hp.n_vocab, 24);
    const std::vector<float> a = run(*plain, *pool, tokens, {24}), b = run(*mtp, *pool, tokens, {24});
    EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)));
}

// The MTP block's draft logits against the naive reference (llama.cpp's graph): the trunk's wide
// residual rows captured by the pass, each position's entry from its token and the residual before it,
// the block's own KV cache filled by a batch and then one position at a time.
TEST(Qwen4Mtp, DraftLogitsMatchNaiveReference) {
    make_model::model_spec spec = all_f32(tiny());
    spec.n_layer_nextn = 1;
    auto m = test::load(make_model::build_model(spec));
    auto pool = test::make_pool("off", 2);
    forward_pass fwd(*pool, m->hp, m->w, *m->rows);
    ASSERT_TRUE(fwd.has_mtp());
    const int n = 24;
    const size_t width = static_cast<size_t>(m->hp.residual_width()), n_vocab = static_cast<size_t>(m->hp.n_vocab);
    ASSERT_EQ(width, static_cast<size_t>(m->hp.hc_dim()));
    const auto tokens = some_tokens(m->hp.n_vocab, n);
    kv_cache state = make_sequence_state(m->hp, 64, kv_type::f16);
    std::vector<float> logits(n_vocab), hidden(static_cast<size_t>(n) * width);
    fwd.eval(tokens, 0, state, logits.data(), false, 512, hidden.data());
    // Row p's hidden input: the residual at p - 1 (zeros at 0).
    std::vector<float> h(static_cast<size_t>(n) * width, 0.0f);
    std::copy(hidden.begin(), hidden.end() - static_cast<std::ptrdiff_t>(width), h.begin() + static_cast<std::ptrdiff_t>(width));
    kv_cache mkv(1, 64, m->hp.kv_heads(), m->hp.kv_head_dim(), kv_type::f16);
    std::vector<float> got(static_cast<size_t>(n) * n_vocab, NAN), h_out(width, NAN);
    const int first = n - 4;
    fwd.mtp(tokens.data(), h.data(), first, 0, mkv, nullptr, got.data(), true);
    for (int p = first; p < n; ++p)
        fwd.mtp(tokens.data() + p, h.data() + static_cast<size_t>(p) * width, 1, p, mkv, h_out.data(),
                got.data() + static_cast<size_t>(p) * n_vocab);
    testing::qwen4exp_reference ref(m->file);
    const auto want = ref.mtp_logits(tokens);
    double worst = 0;
    for (int p = 0; p < n; ++p) worst = std::max(worst, rel_err(got.data() + static_cast<size_t>(p) * n_vocab, want[size_t(p)]));
    std::printf("  qwen4exp MTP all-F32: worst relative draft logit error %.2e (least routing margin %.2e)\n", worst,
                ref.min_route_margin());
    EXPECT_LT(worst, 1e-3);
    const float* last = got.data() + static_cast<size_t>(n - 1) * n_vocab;
    EXPECT_EQ(std::max_element(last, last + n_vocab) - last,
              std::max_element(want.back().begin(), want.back().end()) - want.back().begin());
    EXPECT_TRUE(std::all_of(h_out.begin(), h_out.end(), [](float v) { return std::isfinite(v); }));  // wide, all written
}

TEST(Qwen4Load, MultipliersAreTransformersSplitmix) {
    // transformers' _build_layer_multipliers for seed 42, vocab 512, layer index 0, recomputed here.
    const auto mix = [](uint64_t v) {
        v += 0x9E3779B97F4A7C15ull;
        v = (v ^ (v >> 30)) * 0xBF58476D1CE4E5B9ull;
        v = (v ^ (v >> 27)) * 0x94D049BB133111EBull;
        return v ^ (v >> 31);
    };
    const make_model::ple_hash h = make_model::make_ple_hash(tiny());
    const uint64_t half = ((uint64_t{1} << 63) - 1) / 512 / 2;
    ASSERT_EQ(h.mult.size(), 3u);
    for (uint64_t i = 0; i < 3; ++i) EXPECT_EQ(h.mult[i], 2 * (mix(42 + 0x9E3779B97F4A7C15ull * (i + 1)) % half) + 1);
}

TEST(Qwen4Load, ErrorsNameTheKeyAndNumbers) {
    const auto expect_error = [](const char* key, gguf::value v, const char* needle) {
        gguf::writer w = quick_writer();
        w.set(std::string("qwen4exp.") + key, std::move(v));
        try {
            test::load(w);
            ADD_FAILURE() << key << ": no error";
        } catch (const std::runtime_error& e) {
            EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
        }
    };
    expect_error("hyper_connection.count", gguf::value::u32(1), "hyper_connection.count must be greater than one, got 1");
    expect_error("hyper_connection.low_rank", gguf::value::u32(0), "hyper_connection.low_rank is 0");
    expect_error("attention.indexer.top_k", gguf::value::u32(0), "attention.indexer.top_k is 0");
    expect_error("attention.indexer.top_k", gguf::value::u32(2), "blocks of 4 tokens, more than the indexer's budget");
    expect_error("attention.indexer.key_length", gguf::value::u32(8), "indexer.key_length is 8");
    expect_error("ple.ngram_size", gguf::value::u32(1), "ple.ngram_size is 1, must be 2..8");
    expect_error("ple.layers", gguf::value::i32_array({3}), "PLE layer 3 (qwen4exp.ple.layers) is not a linear attention");
    expect_error("ple.layers", gguf::value::i32_array({1, 2}), "lists 2 layers, but only one PLE layer is supported");
    expect_error("ple.layers", gguf::value::i32_array({9}), "names layer 9, but the trunk has 4 layers");
    expect_error("ple.head_vocab_sizes", gguf::value::i32_array({1009, 1013}), "has 2 entries, but at least 4");
    expect_error("ple.head_vocab_sizes", gguf::value::i32_array({1009, 0, 1019, 1021}), "PLE head 1 covers rows");
    expect_error("ple.eos_token_id", gguf::value::u32(100000), "ple.eos_token_id is 100000, beyond the vocabulary");
    expect_error("attention.compress_ratios", gguf::value::i32_array({0, 4}), "has 2 entries, expected one per block (4)");
    gguf::writer w = quick_writer();
    w.erase("qwen4exp.hyper_connection.count");
    try {
        test::load(w);
        ADD_FAILURE() << "no error without hyper_connection.count";
    } catch (const std::runtime_error& e) {
        EXPECT_NE(std::string(e.what()).find("'qwen4exp.hyper_connection.count' is missing"), std::string::npos)
            << e.what();
    }
}

TEST(Qwen4Load, PleTableTooShortIsAnError) {
    gguf::writer w = quick_writer();
    w.set("qwen4exp.ple.head_offsets", gguf::value::i32_array({0, 1009, 2022, 4000}));
    try {
        test::load(w);
        ADD_FAILURE() << "no error";
    } catch (const std::runtime_error& e) {
        EXPECT_NE(std::string(e.what()).find("expected [32, at least 5021]"), std::string::npos) << e.what();
    }
}

TEST(Qwen4Ple, RowsCutTheWindowAtEos) {
    auto m = test::load(quick_writer());
    const hparams& hp = m->hp;
    const int eos = static_cast<int>(hp.ple_eos);
    std::vector<float> window(2, 0.0f);
    const std::vector<int32_t> a = {5, 6, 7}, b = {5, eos, 7}, c = {9, eos, 7};
    std::vector<int64_t> ra(4), rb(4), rc(4), r0(4);
    ple_rows_of(hp, window.data(), a.data(), 2, ra.data());
    ple_rows_of(hp, window.data(), b.data(), 2, rb.data());
    ple_rows_of(hp, window.data(), c.data(), 2, rc.data());
    EXPECT_NE(ra, rb);
    EXPECT_EQ(rb, rc);  // what lies before an EOS is not seen
    // The window carries the tokens of earlier batches.
    ple_push_window(hp, window.data(), a.data(), 2);
    ple_rows_of(hp, window.data(), a.data() + 2, 0, r0.data());
    EXPECT_EQ(r0, ra);
    for (size_t h = 0; h < 4; ++h) {
        EXPECT_GE(ra[h], static_cast<int64_t>(hp.ple_offset[h]));
        EXPECT_LT(ra[h], static_cast<int64_t>(hp.ple_offset[h] + hp.ple_vocab[h]));
    }
}

TEST(Qwen4Qsa, PicksTheBestBlocksEarlierFirstOnTies) {
    const float s[] = {0.5f, 0.0f, 0.9f, 0.0f, 0.5f, 0.0f};
    EXPECT_EQ(qsa_pick_blocks(s, 6, 2), (std::vector<int>{0, 2}));
    EXPECT_EQ(qsa_pick_blocks(s, 6, 4), (std::vector<int>{0, 1, 2, 4}));
    EXPECT_EQ(qsa_pick_blocks(s, 3, 4), (std::vector<int>{0, 1, 2}));
}

// All-F32: a prompt then 64 greedy steps, the engine decoding token by token; the reference fed the
// same tokens. QSA leaves blocks out from position 19 on (budget 16 tokens in blocks of 4).
TEST(Qwen4Forward, AllF32GreedyMatchesNaiveReference) {
    auto m = test::load(make_model::build_model(all_f32(tiny())));
    auto pool = test::make_pool("off", 2);
    forward_pass fwd(*pool, m->hp, m->w, *m->rows);
    kv_cache state = make_sequence_state(m->hp, 128, kv_type::f16);
    std::vector<int32_t> tokens = some_tokens(m->hp.n_vocab, 8);
    const size_t nv = static_cast<size_t>(m->hp.n_vocab);
    std::vector<std::vector<float>> got;
    std::vector<float> logits(8 * nv);
    fwd.eval(tokens, 0, state, logits.data(), true, 512);
    for (int p = 0; p < 8; ++p) got.emplace_back(logits.begin() + p * static_cast<std::ptrdiff_t>(nv), logits.begin() + (p + 1) * static_cast<std::ptrdiff_t>(nv));
    for (int step = 0; step < 64; ++step) {
        const auto& last = got.back();
        tokens.push_back(static_cast<int32_t>(std::max_element(last.begin(), last.end()) - last.begin()));
        std::vector<float> one(nv);
        fwd.eval(std::span<const int32_t>(tokens).last(1), static_cast<int>(tokens.size()) - 1, state, one.data());
        got.push_back(one);
    }
    tokens.pop_back();
    got.pop_back();
    testing::qwen4exp_reference ref(m->file);
    const auto want = ref.logits(tokens);
    double worst = 0;
    for (size_t p = 0; p < tokens.size(); ++p) worst = std::max(worst, rel_err(got[p].data(), want[p]));
    std::printf("  qwen4exp all-F32, %zu positions: worst relative logit error %.2e (least routing margin %.2e, "
                "%d sparse queries)\n",
                tokens.size(), worst, ref.min_route_margin(), ref.sparse_queries());
    EXPECT_GT(ref.sparse_queries(), 40);
    EXPECT_LT(worst, 2e-3);
}

TEST(Qwen4Forward, QuantizedIsCloseToReference) {
    make_model::model_spec s = all_f32(tiny());
    s.n_expert = s.n_expert_used = 4;
    for (ggml_type* t : {&s.type_experts, &s.type_shexp, &s.type_attn, &s.type_embd, &s.type_ple}) *t = ggml_type::Q8_0;
    auto m = test::load(make_model::build_model(s));
    const auto tokens = some_tokens(m->hp.n_vocab, 24);
    auto pool = test::make_pool("off", 2);
    const std::vector<float> got = run(*m, *pool, tokens, {512});
    testing::qwen4exp_reference ref(m->file);
    const auto want = ref.logits(tokens);
    double worst = 0;
    for (size_t p = 0; p < tokens.size(); ++p)
        worst = std::max(worst, rel_err(got.data() + p * static_cast<size_t>(m->hp.n_vocab), want[p]));
    std::printf("  qwen4exp quantized: worst relative logit error %.2e\n", worst);
    EXPECT_LT(worst, 0.08);
}

TEST(Qwen4Forward, BitwiseAcrossPoolsWorkersAndBatches) {
    auto m = test::load(tiny_writer());
    const auto tokens = some_tokens(m->hp.n_vocab, 80);
    auto base_pool = test::make_pool("off", 1);
    const std::vector<float> base = run(*m, *base_pool, tokens, {512});
    for (const auto& [mode, workers] : {std::pair{"off", 2}, std::pair{"test:2", 2}, std::pair{"test:3", 3}}) {
        auto pool = test::make_pool(mode, workers);
        for (const std::vector<int>& batches : {std::vector<int>{512}, {48, 1}, {17, 5, 1}}) {
            const std::vector<float> got = run(*m, *pool, tokens, batches);
            EXPECT_EQ(0, std::memcmp(got.data(), base.data(), got.size() * sizeof(float)))
                << "pool " << mode << " x" << workers << " first batch " << batches[0];
        }
    }
}

// A state cut back to a checkpoint (the PLE window and conv inputs with it) gives the same logits.
TEST(Qwen4Forward, CheckpointsRestoreTheStateExactly) {
    auto m = test::load(quick_writer());
    auto pool = test::make_pool("off", 2);
    const auto tokens = some_tokens(m->hp.n_vocab, 100);
    const std::span<const int32_t> all(tokens);
    const size_t nv = static_cast<size_t>(m->hp.n_vocab);
    forward_pass fwd(*pool, m->hp, m->w, *m->rows);
    fwd.set_checkpoint_interval(32);
    kv_cache state = make_sequence_state(m->hp, 128, kv_type::f16);
    std::vector<float> first(tokens.size() * nv), again(tokens.size() * nv);
    // The DeltaNet layers' recurrent state, then the QSA layers' indexer keys.
    ASSERT_EQ(state.states().size(), 2u);
    EXPECT_STREQ(state.states()[0]->kind(), "gated DeltaNet recurrent state");
    EXPECT_STREQ(state.states()[1]->kind(), "QSA indexer keys");
    ASSERT_FALSE(fwd.has_mtp());  // no MTP block in this file: the hc residual's reason comes first
    EXPECT_EQ(fwd.mtp_refusal(), "it has no nextn.hc_head_* output mixer");
    fwd.eval(all, 0, state, first.data(), true, 512);
    EXPECT_EQ(state.state<recurrent_state>().bytes(), recurrent_state_bytes(m->hp));
    ASSERT_EQ(state.state<recurrent_state>().cut_back(70), 64);
    fwd.eval(all.subspan(64), 64, state, again.data() + 64 * nv, true, 512);
    EXPECT_EQ(0, std::memcmp(first.data() + 64 * nv, again.data() + 64 * nv, (100 - 64) * nv * sizeof(float)));
}

// A synthetic fill (strata-bench model --fill synthetic) leaves the state a real evaluation of the tokens
// would in all but the values: positions, indexer stores and the PLE window; the same values for the
// same seed; and a decode step over it takes the sparse path to finite logits.
TEST(Qwen4Forward, SyntheticFillIsAStateDecodeContinues) {
    auto m = test::load(quick_writer());
    auto pool = test::make_pool("off", 2);
    forward_pass fwd(*pool, m->hp, m->w, *m->rows);
    const auto tokens = some_tokens(m->hp.n_vocab, 100);
    std::vector<float> logits(static_cast<size_t>(m->hp.n_vocab));
    kv_cache real = make_sequence_state(m->hp, 128, kv_type::f16);
    fwd.eval(tokens, 0, real, logits.data());
    kv_cache a = make_sequence_state(m->hp, 128, kv_type::f16), b = make_sequence_state(m->hp, 128, kv_type::f16),
             c = make_sequence_state(m->hp, 128, kv_type::f16);
    fwd.fill_synthetic(tokens, a, 7);
    fwd.fill_synthetic(tokens, b, 7);
    fwd.fill_synthetic(tokens, c, 8);
    EXPECT_EQ(a.state<recurrent_state>().pos(), 100);
    EXPECT_GE(a.capacity(), 100);
    const auto& real_keys = real.state<indexer_keys>().stores;
    const auto& a_keys = a.state<indexer_keys>().stores;
    ASSERT_FALSE(real_keys.empty());
    ASSERT_EQ(a_keys.size(), real_keys.size());
    for (size_t i = 0; i < a_keys.size(); ++i) EXPECT_EQ(a_keys[i].size(), real_keys[i].size()) << i;
    const size_t window = static_cast<size_t>(m->hp.ple_ngram - 1) * sizeof(float);
    EXPECT_EQ(0, std::memcmp(a.state<recurrent_state>().ple_window(), real.state<recurrent_state>().ple_window(), window));
    EXPECT_TRUE(std::ranges::equal(a.state<recurrent_state>().data(), b.state<recurrent_state>().data()));
    EXPECT_EQ(a.state<indexer_keys>().stores, b.state<indexer_keys>().stores);
    EXPECT_NE(a.state<indexer_keys>().stores, c.state<indexer_keys>().stores);
    // The last position's values are written, seeded.
    std::vector<uint8_t> row_a(a.head_row_bytes()), row_b(a.head_row_bytes()), row_c(a.head_row_bytes()), zero(a.head_row_bytes());
    a.read_rows(0, 0, a.n_head_kv(), 99, 100, row_a.data());
    b.read_rows(0, 0, b.n_head_kv(), 99, 100, row_b.data());
    c.read_rows(0, 0, c.n_head_kv(), 99, 100, row_c.data());
    EXPECT_EQ(row_a, row_b);
    EXPECT_NE(row_a, row_c);
    EXPECT_NE(row_a, zero);

    // More complete blocks than the budget holds: the decode step is sparse.
    const int ratio = m->hp.qsa_ratio[static_cast<size_t>(m->hp.n_layer - 1)];
    ASSERT_GT(ratio, 0);
    ASSERT_GT(100 / ratio, m->hp.idx_top_k / ratio);
    const int32_t next = tokens[0];
    fwd.eval(std::span(&next, 1), 100, a, logits.data());
    EXPECT_TRUE(std::ranges::all_of(logits, [](float x) { return std::isfinite(x); }));
    EXPECT_EQ(a.state<recurrent_state>().pos(), 101);
    EXPECT_EQ(a.state<indexer_keys>().stores[0].size(), 101u * static_cast<size_t>(m->hp.idx_head_dim));
}

// quick_writer()'s file at `path`, loaded through the engine: no NUMA split, 256 positions, no
// conversation cache.
model_options quick_model(const std::string& path) {
    quick_writer().write_file(path);
    model_options o;
    o.path = path;
    o.numa_pool = "off";
    o.n_ctx = 256;
    o.cache_ram_mib = 0;
    return o;
}

// session::fill_synthetic keeps the tokens for prefix reuse: a prompt that extends them evaluates the rest.
TEST(Qwen4Generate, SyntheticFillIsReusedAsAPrefix) {
    const std::string path = ::testing::TempDir() + "qwen4exp_synthetic.gguf";
    model_options o = quick_model(path);
    const auto m = model::load(o);
    session s(m);
    std::vector<int32_t> tokens = some_tokens(m->info().n_vocab, 120);
    s.fill_synthetic(std::span(tokens).first(100));
    EXPECT_EQ(s.cached_tokens(), 100u);
    generation_options g;
    g.max_tokens = 3;
    g.sampling.temperature = 0;
    g.ignore_eos = true;
    const generation_result r = s.generate(tokens, g);
    EXPECT_EQ(r.time.cache_n, 100);
    EXPECT_EQ(r.tokens.size(), 3u);
    EXPECT_EQ(s.cached_tokens(), 122u);
    EXPECT_THROW(s.fill_synthetic(std::vector<int32_t>(256, 1)), request_error);
    std::remove(path.c_str());
}

TEST(Qwen4Generate, PresetsWriteLoadableFiles) {
    for (const char* preset : {"tiny", "demo"}) {
        make_model::model_spec s = make_model::preset(preset, arch::qwen4exp);
        s.n_expert = 4;
        s.n_expert_used = 2;
        s.type_experts = s.type_out = ggml_type::Q8_0;  // the shapes are what is checked
        auto m = test::load(make_model::build_model(s));
        EXPECT_TRUE(m->hp.qwen4()) << preset;
    }
    // bench as written (too large to build here): every tensor fits its type's blocks, the 640-wide
    // experts included.
    const make_model::model_spec bench = make_model::preset("bench", arch::qwen4exp);
    EXPECT_EQ(bench.n_ff_exp, 640);
    EXPECT_NO_THROW(make_model::tensor_specs(bench));
    make_model::model_spec s = tiny();
    s.ple_rows = 100;
    EXPECT_THROW(make_model::build_model(s), std::invalid_argument);
    s.ple_layer = 3;  // an attention layer
    s.ple_rows = 0;
    EXPECT_THROW(make_model::build_model(s), std::invalid_argument);
}

// --ple-rows: a table of a million rows, the rows past the hash heads' a hole in the file; it loads,
// runs as the compact one bit for bit, and the file takes a fraction of its size on disk.
TEST(Qwen4Generate, LargeSparsePleTable) {
    make_model::model_spec s = quick();
    s.ple_rows = int64_t{1} << 20;
    const std::string path = ::testing::TempDir() + "qwen4exp_sparse_ple.gguf";
    make_model::build_model(s).write_file(path);
    struct stat st {};
    ASSERT_EQ(0, ::stat(path.c_str(), &st));
    const int64_t table = int64_t{34} * (int64_t{1} << 20);  // Q8_0 rows of 32
    EXPECT_GT(st.st_size, table);
    std::printf("  sparse PLE table: file %.1f MiB, %.1f MiB on disk\n", double(st.st_size) / (1 << 20),
                double(st.st_blocks) * 512 / (1 << 20));
    EXPECT_LT(int64_t{st.st_blocks} * 512, st.st_size - table / 2);
    auto big = test::load(gguf::reader::open(path));
    auto small = test::load(quick_writer());
    EXPECT_EQ(big->w.ple.n_rows, int64_t{1} << 20);
    auto pool = test::make_pool("off", 2);
    const auto tokens = some_tokens(small->hp.n_vocab, 24);
    const std::vector<float> a = run(*big, *pool, tokens, {7, 1}), b = run(*small, *pool, tokens, {7, 1});
    EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)));
    std::remove(path.c_str());
}

// Through the engine: the PLE table is its own cold region (the file's bytes, listed with no NUMA intent
// in the region map), and what the passes gather from it is counted, in the counters and --breakdown.
TEST(Qwen4Cold, PleTableIsAColdRegionWithItsReads) {
    const std::string path = ::testing::TempDir() + "qwen4exp_cold.gguf";
    model_options o = quick_model(path);
    o.phase_timing = true;
    const auto m = model::load(o);
    const uint64_t table = 4096 * 34;  // 4096 Q8_0 rows of 32
    std::vector<cold_region_stats> cold = m->cold_regions();
    ASSERT_EQ(cold.size(), 1u);
    EXPECT_EQ(cold[0].bytes_mapped, table);
    EXPECT_NE(cold[0].where.find(path), std::string::npos) << cold[0].where;
    EXPECT_EQ(cold[0].rows_read, 0u);
    bool listed = false;
    for (const arenas::region& r : arenas::region_map::read(m->info().region_map_path))
        listed |= r.name == "ple table (cold, file-backed)" && r.bytes == table && r.node == -1;
    EXPECT_TRUE(listed);

    generation_options g;
    g.max_tokens = 5;
    g.sampling.temperature = 0;
    g.ignore_eos = true;
    session s(m);
    const generation_result r = s.generate(some_tokens(m->info().n_vocab, 20), g);
    cold = m->cold_regions();
    EXPECT_EQ(cold[0].tokens, 24u);  // the prompt, then 4 decode passes
    EXPECT_EQ(cold[0].rows_read, 24u * 4);
    EXPECT_GT(cold[0].bytes_resident, 0u);
    EXPECT_LE(cold[0].bytes_resident, table);
    EXPECT_LE(cold[0].page_faults, cold[0].rows_read);
    const auto part = std::find_if(r.time.decode_phases.begin(), r.time.decode_phases.end(),
                                   [](const phase_time& p) { return p.name == "PLE rows (cold table)"; });
    ASSERT_NE(part, r.time.decode_phases.end());
    EXPECT_EQ(part->bytes, static_cast<uint64_t>(r.time.decode_passes) * 4 * 34);
    std::remove(path.c_str());
}

}  // namespace
}  // namespace strata::engine
