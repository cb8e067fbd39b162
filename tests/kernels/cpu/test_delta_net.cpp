// Gated DeltaNet kernels (cpu/delta_net.hpp) on every ISA this CPU has: the sequential and chunked forms
// against a double-precision reference that applies the per-token formulas literally, the chunked form
// against the sequential one over long sequences, the position rule of delta_rule_run (bitwise), the
// causal conv against a double reference with its state carried across calls, and the row L2 norm.
//
// Tolerances. Outputs and states are compared as max |x - ref| / (1 + max |ref|). The recurrence is a
// contraction for unit keys and beta in (0, 1) (S <- (I - beta k k^T) e^g S + beta k v^T), so f32 rounding
// (~6e-8 per operation, sums of up to 256 terms) does not grow with the sequence: 2e-6 for the sequential
// form (measured up to 1.5e-7), 2e-5 for the chunked one (up to 1.3e-6: its UT transform solves a unit
// triangular system of up to 128 rows per chunk). A wrong decay, a missing beta or a token in the wrong
// chunk moves outputs by O(1e-2) or more, far above either.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "cpu/delta_net.hpp"
#include "cpu/delta_net/layout.hpp"
#include "cpu/detail/kernel_table.hpp"

namespace {

using namespace strata::kernels::cpu;
namespace detail = strata::kernels::cpu::detail;

constexpr double kSeqTol = 2e-6;
constexpr double kChunkTol = 2e-5;

// How strongly the state decays per token: g = log of the decay, in [lo, hi], with a share of spikes.
struct decay {
    float lo, hi;
    double spike_share = 0;  // tokens with g = spike instead
    float spike = 0;
};

// One head's inputs, stored inside [n_tok][n_head][dim] buffers (the head at index `head` of 3) so every
// stride is exercised; q and k L2-normalised, q scaled by 1/sqrt(d_k), as the kernels expect.
struct problem {
    int d_k, d_v, n_tok;
    static constexpr int n_head = 3, head = 1;
    std::vector<float> q, k, v, g, beta, s0;

    problem(int d_k_, int d_v_, int n_tok_, decay dec, uint32_t seed)
        : d_k(d_k_), d_v(d_v_), n_tok(n_tok_), q(size_t(n_tok_) * n_head * d_k_), k(q.size()),
          v(size_t(n_tok_) * n_head * d_v_), g(size_t(n_tok_) * n_head), beta(g.size()), s0(size_t(d_k_) * d_v_) {
        std::mt19937 rng(seed);
        std::normal_distribution<float> normal(0.0f, 1.0f);
        std::uniform_real_distribution<float> uni(0.0f, 1.0f);
        for (auto* buf : {&q, &k, &v}) std::generate(buf->begin(), buf->end(), [&] { return normal(rng); });
        for (int t = 0; t < n_tok; ++t) {
            for (auto [buf, scale] : {std::pair{&q, 1.0 / std::sqrt(double(d_k))}, std::pair{&k, 1.0}}) {
                float* row = buf->data() + (size_t(t) * n_head + head) * d_k;
                double ss = 0;
                for (int i = 0; i < d_k; ++i) ss += double(row[i]) * row[i];
                for (int i = 0; i < d_k; ++i) row[i] = float(row[i] / std::sqrt(ss) * scale);
            }
        }
        for (auto& x : g) x = uni(rng) < dec.spike_share ? dec.spike : dec.lo + (dec.hi - dec.lo) * uni(rng);
        for (auto& x : beta) x = 1.0f / (1.0f + std::exp(-2.0f * normal(rng)));
        for (auto& x : s0) x = 0.5f * normal(rng);
    }

    detail::delta_io io(float* o) const {
        return {d_k,
                d_v,
                q.data() + head * d_k,
                n_head * d_k,
                k.data() + head * d_k,
                n_head * d_k,
                v.data() + head * d_v,
                n_head * d_v,
                g.data() + head,
                n_head,
                beta.data() + head,
                n_head,
                o + head * d_v,
                n_head * d_v};
    }
    std::vector<float> out_buffer() const { return std::vector<float>(size_t(n_tok) * n_head * d_v, NAN); }
    // Token t's output of this head in an out_buffer.
    const float* out_row(const std::vector<float>& o, int t) const { return o.data() + (size_t(t) * n_head + head) * d_v; }

    // The per-token formulas in double: S <- e^g S; delta = beta (v - S^T k); S <- S + k delta^T; o = S^T q.
    void reference(std::vector<double>& S, std::vector<double>& out) const {
        S.assign(s0.begin(), s0.end());
        out.assign(size_t(n_tok) * d_v, 0.0);
        std::vector<double> delta(d_v);
        for (int t = 0; t < n_tok; ++t) {
            const size_t r = size_t(t) * n_head + head;
            const float* qt = q.data() + r * d_k;
            const float* kt = k.data() + r * d_k;
            const float* vt = v.data() + r * d_v;
            const double eg = std::exp(double(g[r])), b = beta[r];
            for (auto& x : S) x *= eg;
            for (int j = 0; j < d_v; ++j) {
                double sk = 0;
                for (int i = 0; i < d_k; ++i) sk += S[size_t(i) * d_v + j] * kt[i];
                delta[j] = b * (vt[j] - sk);
            }
            for (int i = 0; i < d_k; ++i)
                for (int j = 0; j < d_v; ++j) S[size_t(i) * d_v + j] += kt[i] * delta[j];
            for (int j = 0; j < d_v; ++j) {
                double o = 0;
                for (int i = 0; i < d_k; ++i) o += S[size_t(i) * d_v + j] * qt[i];
                out[size_t(t) * d_v + j] = o;
            }
        }
    }

    // max |o - ref| / (1 + max |ref|) over every token's output.
    double out_error(const std::vector<float>& o, const std::vector<double>& ref) const {
        double worst = 0, scale = 0;
        for (int t = 0; t < n_tok; ++t)
            for (int j = 0; j < d_v; ++j) {
                worst = std::max(worst, std::fabs(out_row(o, t)[j] - ref[size_t(t) * d_v + j]));
                scale = std::max(scale, std::fabs(ref[size_t(t) * d_v + j]));
            }
        return worst / (1 + scale);
    }
};

template <class A, class B>
double rel_error(const A& x, const B& ref) {
    double worst = 0, scale = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
        worst = std::max(worst, std::fabs(double(x[i]) - double(ref[i])));
        scale = std::max(scale, std::fabs(double(ref[i])));
    }
    return worst / (1 + scale);
}

// The chunked form on one ISA's table: chunks of `chunk` tokens from the first, as delta_rule_chunked runs them.
void run_chunked(const detail::isa_table& t, const problem& pb, float* S, float* o, int chunk) {
    std::vector<float> scratch(detail::delta_chunk_layout(pb.d_k, pb.d_v, chunk).total + 16);
    float* aligned = scratch.data() + (16 - reinterpret_cast<uintptr_t>(scratch.data()) / 4 % 16) % 16;
    const detail::delta_io io = pb.io(o);
    for (int t0 = 0; t0 < pb.n_tok; t0 += chunk) t.delta_chunk(S, io.from(t0), std::min(chunk, pb.n_tok - t0), chunk, aligned);
}

class DeltaRuleIsa : public ::testing::TestWithParam<isa> {
protected:
    const detail::isa_table& table() const { return detail::table_for(GetParam()); }
};

struct shape {
    int d_k, d_v, n_tok;
    decay dec;
};

// Key/value sizes incl. the models' 128 x 128, vector-width multiples and others (scalar fallback),
// lengths 1..300, decays from mild to strong with spikes whose exp underflows a chunk's cumulative decay.
const std::vector<shape> kShapes = {
    {128, 128, 300, {-0.3f, 0.0f}},
    {128, 128, 97, {-8.0f, -0.01f, 0.05, -60.0f}},
    {64, 64, 1, {-1.0f, 0.0f}},
    {64, 64, 130, {-40.0f, 0.0f}},
    {32, 48, 77, {-2.0f, 0.0f, 0.1, -85.0f}},
    {16, 80, 200, {-0.05f, 0.0f}},
    {128, 64, 65, {-1.0f, -0.1f}},
    {24, 20, 40, {-0.5f, 0.0f}},
};

TEST_P(DeltaRuleIsa, SequentialMatchesDoubleReference) {
    if (!cpu_supports(GetParam())) GTEST_SKIP() << isa_name(GetParam()) << ": this CPU lacks it";
    uint32_t seed = 1;
    for (const shape& s : kShapes) {
        SCOPED_TRACE(std::to_string(s.d_k) + "x" + std::to_string(s.d_v) + ", " + std::to_string(s.n_tok) + " tokens");
        const problem pb(s.d_k, s.d_v, s.n_tok, s.dec, seed++);
        std::vector<double> S_ref, o_ref;
        pb.reference(S_ref, o_ref);
        std::vector<float> S = pb.s0, o = pb.out_buffer();
        table().delta_seq(S.data(), pb.io(o.data()), pb.n_tok);
        EXPECT_LE(pb.out_error(o, o_ref), kSeqTol);
        EXPECT_LE(rel_error(S, S_ref), kSeqTol) << "final state";
    }
}

TEST_P(DeltaRuleIsa, SequentialIsBitwiseTheSameHoweverTheTokensAreSplit) {
    if (!cpu_supports(GetParam())) GTEST_SKIP() << isa_name(GetParam()) << ": this CPU lacks it";
    // The models' 128 x 128, and value widths that leave whole vectors past the one-token form's blocks.
    for (const problem& pb : {problem(128, 128, 90, {-1.0f, 0.0f}, 7), problem(32, 80, 20, {-0.5f, 0.0f}, 8),
                              problem(64, 208, 12, {-2.0f, 0.0f}, 9)}) {
        SCOPED_TRACE(std::to_string(pb.d_k) + "x" + std::to_string(pb.d_v));
        std::vector<float> S_all = pb.s0, o_all = pb.out_buffer();
        table().delta_seq(S_all.data(), pb.io(o_all.data()), pb.n_tok);
        for (int piece : {1, 3, 64}) {
            std::vector<float> S = pb.s0, o = pb.out_buffer();
            const detail::delta_io io = pb.io(o.data());
            for (int t0 = 0; t0 < pb.n_tok; t0 += piece)
                table().delta_seq(S.data(), io.from(t0), std::min(piece, pb.n_tok - t0));
            EXPECT_EQ(0, std::memcmp(S.data(), S_all.data(), S.size() * sizeof(float))) << piece << " tokens per call";
            for (int t = 0; t < pb.n_tok; ++t)
                ASSERT_EQ(0, std::memcmp(pb.out_row(o, t), pb.out_row(o_all, t), pb.d_v * sizeof(float)))
                    << "token " << t << ", " << piece << " tokens per call";
        }
    }
}

TEST_P(DeltaRuleIsa, ChunkedMatchesDoubleReference) {
    if (!cpu_supports(GetParam())) GTEST_SKIP() << isa_name(GetParam()) << ": this CPU lacks it";
    uint32_t seed = 100;
    for (const shape& s : kShapes)
        for (int chunk : {64, 16}) {
            SCOPED_TRACE(std::to_string(s.d_k) + "x" + std::to_string(s.d_v) + ", " + std::to_string(s.n_tok) +
                         " tokens, chunk " + std::to_string(chunk));
            const problem pb(s.d_k, s.d_v, s.n_tok, s.dec, seed++);
            std::vector<double> S_ref, o_ref;
            pb.reference(S_ref, o_ref);
            std::vector<float> S = pb.s0, o = pb.out_buffer();
            run_chunked(table(), pb, S.data(), o.data(), chunk);
            EXPECT_LE(pb.out_error(o, o_ref), kChunkTol);
            EXPECT_LE(rel_error(S, S_ref), kChunkTol) << "final state";
        }
}

// Long sequences, the models' head shape: the chunked form stays within f32 rounding of the sequential
// one (no drift from chunk to chunk), for the default chunk, the largest and an odd one with a short tail.
TEST_P(DeltaRuleIsa, ChunkedMatchesSequentialOnLongSequences) {
    if (!cpu_supports(GetParam())) GTEST_SKIP() << isa_name(GetParam()) << ": this CPU lacks it";
    for (int chunk : {delta_rule_default_chunk, delta_rule_max_chunk, 48}) {
        SCOPED_TRACE("chunk " + std::to_string(chunk));
        const problem pb(128, 128, 1100, {-0.6f, 0.0f, 0.02, -20.0f}, uint32_t(chunk));
        std::vector<float> S_seq = pb.s0, o_seq = pb.out_buffer();
        table().delta_seq(S_seq.data(), pb.io(o_seq.data()), pb.n_tok);
        std::vector<float> S = pb.s0, o = pb.out_buffer();
        run_chunked(table(), pb, S.data(), o.data(), chunk);
        double worst = 0, scale = 0;
        for (int t = 0; t < pb.n_tok; ++t)
            for (int j = 0; j < pb.d_v; ++j) {
                worst = std::max(worst, double(std::fabs(pb.out_row(o, t)[j] - pb.out_row(o_seq, t)[j])));
                scale = std::max(scale, double(std::fabs(pb.out_row(o_seq, t)[j])));
            }
        EXPECT_LE(worst / (1 + scale), kChunkTol) << "outputs";
        EXPECT_LE(rel_error(S, S_seq), kChunkTol) << "final state";
    }
}

INSTANTIATE_TEST_SUITE_P(AllIsas, DeltaRuleIsa, ::testing::Values(isa::scalar, isa::avx2, isa::avx512),
                         [](const auto& info) { return std::string(isa_name(info.param)); });

// Public entries (the active ISA) -----------------------------------------------------------------------

struct public_run {
    const problem& pb;
    std::vector<float> S, o, scratch;
    explicit public_run(const problem& p)
        : pb(p), S(p.s0), o(p.out_buffer()), scratch(delta_rule_chunked_scratch(p.d_k, p.d_v, delta_rule_max_chunk)) {}
    // delta_rule_run over tokens [t0, t0 + n) of the problem, at absolute positions pos0 + t0...
    void run(int64_t pos0, int t0, int n, int chunk) {
        const detail::delta_io io = pb.io(o.data()).from(t0);
        delta_rule_run(S.data(), pos0 + t0, pb.d_k, pb.d_v, n, io.q, io.q_stride, io.k, io.k_stride, io.v, io.v_stride,
                       io.g, io.g_stride, io.beta, io.beta_stride, io.o, io.o_stride, chunk, scratch.data());
    }
    void sequential(int t0, int n) {
        const detail::delta_io io = pb.io(o.data()).from(t0);
        delta_rule_sequential(S.data(), pb.d_k, pb.d_v, n, io.q, io.q_stride, io.k, io.k_stride, io.v, io.v_stride, io.g,
                              io.g_stride, io.beta, io.beta_stride, io.o, io.o_stride);
    }
    void chunked(int t0, int n, int chunk) {
        const detail::delta_io io = pb.io(o.data()).from(t0);
        delta_rule_chunked(S.data(), pb.d_k, pb.d_v, n, io.q, io.q_stride, io.k, io.k_stride, io.v, io.v_stride, io.g,
                           io.g_stride, io.beta, io.beta_stride, io.o, io.o_stride, chunk, scratch.data());
    }
    bool same_as(const public_run& other) const {
        return std::memcmp(S.data(), other.S.data(), S.size() * sizeof(float)) == 0 &&
               std::memcmp(o.data(), other.o.data(), o.size() * sizeof(float)) == 0;
    }
};

// The position rule: whole chunk-aligned windows chunked, the rest sequential, so splits at multiples
// of the chunk give the same bits as one call, and one-token calls the same bits as the sequential form.
TEST(DeltaRuleRun, SplitsAtAbsoluteChunkBoundaries) {
    const problem pb(128, 128, 400, {-0.5f, 0.0f}, 11);
    const int chunk = 64;
    for (int64_t pos0 : {0, 10, 64, 1000}) {
        SCOPED_TRACE("pos0 " + std::to_string(pos0));
        public_run whole(pb), pieces(pb), by_form(pb), one_by_one(pb), seq(pb);
        whole.run(pos0, 0, pb.n_tok, chunk);
        // Calls that end on absolute multiples of the chunk (then the rest).
        int t0 = 0;
        for (int piece : {int(chunk - pos0 % chunk), 128, 64}) {
            pieces.run(pos0, t0, piece, chunk);
            t0 += piece;
        }
        pieces.run(pos0, t0, pb.n_tok - t0, chunk);
        EXPECT_TRUE(whole.same_as(pieces)) << "calls split at multiples of the chunk";
        // The same thing spelled out: sequential up to the first boundary and past the last whole window.
        const int head = int((chunk - pos0 % chunk) % chunk), whole_chunks = (pb.n_tok - head) / chunk * chunk;
        by_form.sequential(0, head);
        by_form.chunked(head, whole_chunks, chunk);
        by_form.sequential(head + whole_chunks, pb.n_tok - head - whole_chunks);
        EXPECT_TRUE(whole.same_as(by_form)) << "sequential head, chunked windows, sequential tail";
        for (int t = 0; t < pb.n_tok; ++t) one_by_one.run(pos0, t, 1, chunk);
        seq.sequential(0, pb.n_tok);
        EXPECT_TRUE(one_by_one.same_as(seq)) << "one token per call is the sequential form";
        EXPECT_FALSE(whole.same_as(seq)) << "the prompt took the chunked form";
        EXPECT_LE(rel_error(whole.o, seq.o), kChunkTol) << "and is within rounding of the sequential one";
    }
}

TEST(DeltaRuleRun, ChunkZeroIsTheSequentialFormForAnySplit) {
    const problem pb(128, 128, 150, {-0.5f, 0.0f}, 12);
    public_run whole(pb), pieces(pb), seq(pb);
    whole.run(5, 0, pb.n_tok, 0);
    for (int t0 = 0; t0 < pb.n_tok; t0 += 37) pieces.run(5, t0, std::min(37, pb.n_tok - t0), 0);
    seq.sequential(0, pb.n_tok);
    EXPECT_TRUE(whole.same_as(seq));
    EXPECT_TRUE(pieces.same_as(seq));
}

TEST(DeltaRuleRun, RejectsBadSizes) {
    float S[4] = {}, x[4] = {}, scratch[4] = {};
    EXPECT_THROW(delta_rule_sequential(S, 0, 2, 1, x, 0, x, 0, x, 0, x, 0, x, 0, x, 0), std::invalid_argument);
    EXPECT_THROW(delta_rule_sequential(S, 2, delta_rule_max_dim + 1, 1, x, 0, x, 0, x, 0, x, 0, x, 0, x, 0),
                 std::invalid_argument);
    EXPECT_THROW(delta_rule_chunked(S, 2, 2, 1, x, 0, x, 0, x, 0, x, 0, x, 0, x, 0, 0, scratch), std::invalid_argument);
    EXPECT_THROW(delta_rule_chunked_scratch(128, 128, delta_rule_max_chunk + 1), std::invalid_argument);
    EXPECT_THROW(delta_rule_run(S, -1, 2, 2, 1, x, 0, x, 0, x, 0, x, 0, x, 0, x, 0, 64, scratch), std::invalid_argument);
    EXPECT_THROW(delta_rule_run(S, 0, 2, 2, 1, x, 0, x, 0, x, 0, x, 0, x, 0, x, 0, -64, scratch), std::invalid_argument);
    EXPECT_THROW(causal_conv1d_silu(S, x, 0, x, 1, 1, 0, x, 0), std::invalid_argument);
}

// Conv: y_t[c] = silu(sum_j w[c][j] x_{t-K+1+j}[c]) in double over the history and the tokens.
void check_conv(int channels) {
    SCOPED_TRACE(std::to_string(channels) + " channels");
    const int kernel = 4, n_tok = 23, hist = kernel - 1;
    std::mt19937 rng(5);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> x(size_t(n_tok) * channels * 2), w(size_t(channels) * kernel), state0(size_t(hist) * channels);
    for (auto* buf : {&x, &w, &state0}) std::generate(buf->begin(), buf->end(), [&] { return normal(rng); });
    const ptrdiff_t x_stride = 2 * channels;  // every other row: strided input
    // The full input sequence: the history, then the tokens.
    std::vector<double> seq;
    for (float e : state0) seq.push_back(e);
    for (int t = 0; t < n_tok; ++t)
        for (int c = 0; c < channels; ++c) seq.push_back(x[t * x_stride + c]);
    std::vector<double> ref(size_t(n_tok) * channels);
    for (int t = 0; t < n_tok; ++t)
        for (int c = 0; c < channels; ++c) {
            double sum = 0;
            for (int j = 0; j < kernel; ++j) sum += w[c * kernel + j] * seq[size_t(t + j) * channels + c];
            ref[size_t(t) * channels + c] = sum / (1 + std::exp(-sum));
        }
    std::vector<float> y_all(size_t(n_tok) * channels), state_all = state0;
    causal_conv1d_silu(state_all.data(), x.data(), x_stride, w.data(), n_tok, channels, kernel, y_all.data(), channels);
    EXPECT_LE(rel_error(y_all, ref), 1e-6);
    for (int r = 0; r < hist; ++r)
        for (int c = 0; c < channels; ++c)
            ASSERT_EQ(state_all[r * channels + c], x[(n_tok - hist + r) * x_stride + c]) << "state row " << r;
    // Calls of 1, 2 (fewer than the history) and 5 tokens carry the state: the same bits as one call.
    for (int piece : {1, 2, 5}) {
        std::vector<float> y(y_all.size(), NAN), state = state0;
        for (int t0 = 0; t0 < n_tok; t0 += piece) {
            const int n = std::min(piece, n_tok - t0);
            causal_conv1d_silu(state.data(), x.data() + t0 * x_stride, x_stride, w.data(), n, channels, kernel,
                               y.data() + t0 * channels, channels);
        }
        EXPECT_EQ(0, std::memcmp(y.data(), y_all.data(), y.size() * sizeof(float))) << piece << " tokens per call";
        EXPECT_EQ(0, std::memcmp(state.data(), state_all.data(), state.size() * sizeof(float))) << piece;
    }
    // Channels split into ranges, each a call on its part of the wider state (state_stride), as the engine
    // splits them between workers: the same bits, and a range's call touches no other channel.
    for (int first_part : {1, channels / 3}) {
        std::vector<float> y(y_all.size(), NAN), state = state0;
        for (const auto& [c0, c1] : {std::pair{0, first_part}, std::pair{first_part, channels}})
            causal_conv1d_silu(state.data() + c0, x.data() + c0, x_stride, w.data() + c0 * kernel, n_tok, c1 - c0, kernel,
                               y.data() + c0, channels, channels);
        EXPECT_EQ(0, std::memcmp(y.data(), y_all.data(), y.size() * sizeof(float))) << "split at " << first_part;
        EXPECT_EQ(0, std::memcmp(state.data(), state_all.data(), state.size() * sizeof(float))) << first_part;
    }
}

// Channels: fewer than one block of the kernel's channel loop, and several blocks with a ragged last one.
TEST(CausalConv1dSilu, MatchesReferenceAndCarriesStateAcrossCalls) {
    for (const int channels : {37, 600}) check_conv(channels);
}

TEST(L2NormalizeRows, ScalesRowsToUnitNormTimesScaleAndKeepsZeroRows) {
    std::vector<float> x = {3, 4, 99, 0, 0, 99, 1, -1, 99};
    l2_normalize_rows(x.data(), 3, 2, 3, 1e-6f, 2.0f);
    EXPECT_FLOAT_EQ(x[0], 1.2f);
    EXPECT_FLOAT_EQ(x[1], 1.6f);
    EXPECT_EQ(x[2], 99.0f) << "past dim: untouched";
    EXPECT_EQ(x[3], 0.0f) << "a zero row stays zero (eps)";
    EXPECT_FLOAT_EQ(x[6], float(2 / std::sqrt(2.0)));
    EXPECT_FLOAT_EQ(x[7], float(-2 / std::sqrt(2.0)));
}

}  // namespace
