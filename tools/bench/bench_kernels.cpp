// strata-bench kernels: single-token matvec weight bandwidth per format on 1..N threads next to a
// STREAM-like read bandwidth measured in the same run (same buffer size, same thread counts,
// alternating repeat by repeat so both see the same machine load), tokens/s of the batched matmul, and
// the tiled attention on one thread (prompt GFLOP/s, decode GB/s of KV read vs the read bandwidth), and
// gated DeltaNet's delta rule (decode GB/s of recurrent state vs the read bandwidth; prompt tokens/s of
// the chunked form vs the sequential one).
// Formats with a prompt GEMM kernel on this ISA get a second row in the rows16 layout, timed alongside.
#include <sys/mman.h>
#include <xmmintrin.h>

#include <algorithm>
#include <barrier>
#include <ctime>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <cxxopts.hpp>
#include <nlohmann/json.hpp>

#include "cpu/attention.hpp"
#include "cpu/delta_net.hpp"
#include "cpu/detail/kernel_table.hpp"
#include "cpu/kernels.hpp"
#include "formats/quant.hpp"
#include "bandwidth.hpp"
#include "fma_peak.hpp"
#include "modes.hpp"

namespace strata::bench {
namespace {

namespace cpu = kernels::cpu;
using formats::ggml_type;
using clock_type = std::chrono::steady_clock;

constexpr size_t huge_page = size_t{2} << 20;

// A 2 MiB-aligned buffer with transparent huge pages requested (as the pool's node buffers are).
struct buffer {
    std::unique_ptr<uint8_t, decltype(&std::free)> data{nullptr, &std::free};
    size_t size = 0;
    explicit buffer(size_t bytes) : size(bytes) {
        const size_t rounded = (bytes + huge_page - 1) / huge_page * huge_page;
        data.reset(static_cast<uint8_t*>(std::aligned_alloc(huge_page, rounded)));
        if (!data) throw std::bad_alloc();
        madvise(data.get(), rounded, MADV_HUGEPAGE);
    }
};

// --cpu-time: time_parallel reports the largest thread CPU time of a repeat instead of wall time, so the
// figures of a machine shared with other work leave out the time its threads sat descheduled.
bool use_cpu_time = false;

// The matvec rows' compute ceiling: rows of this many KiB per thread (within any x86 core's L2 with the
// activations), timed over this many passes after a warm-up pass.
constexpr int cached_kib_per_thread = 128;
constexpr int cached_passes = 16;

double thread_cpu_seconds() {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// Runs fn(thread, n_threads) on n_threads threads `repeats` times; returns the seconds of each repeat
// (between the start barrier and the last thread finishing, or with use_cpu_time the most CPU time a thread took). With warm_up, each thread first runs fn
// once untimed: a new thread's stack pages are not mapped yet (glibc hands them back when a thread
// exits), and the attention kernels' large stack frames would otherwise fault them in while timed.
// own_time: the longest time a thread spent in fn instead, for runs of tens of microseconds, which the
// barrier's wake-up latency would otherwise dominate.
std::vector<double> time_parallel(int n_threads, int repeats, const std::function<void(int, int)>& fn,
                                  bool warm_up = false, bool own_time = false) {
    std::barrier sync(n_threads + 1);
    std::vector<std::thread> threads;
    std::vector<double> cpu_seconds(static_cast<size_t>(n_threads) * repeats), own_seconds(cpu_seconds.size());
    for (int t = 0; t < n_threads; ++t)
        threads.emplace_back([&, t] {
            if (warm_up) {
                fn(t, n_threads);
                sync.arrive_and_wait();
            }
            for (int r = 0; r < repeats; ++r) {
                sync.arrive_and_wait();
                const double c0 = thread_cpu_seconds();
                const auto w0 = clock_type::now();
                fn(t, n_threads);
                own_seconds[static_cast<size_t>(r) * n_threads + t] = std::chrono::duration<double>(clock_type::now() - w0).count();
                cpu_seconds[static_cast<size_t>(r) * n_threads + t] = thread_cpu_seconds() - c0;
                sync.arrive_and_wait();
            }
        });
    std::vector<double> seconds;
    if (warm_up) sync.arrive_and_wait();
    for (int r = 0; r < repeats; ++r) {
        const auto start = clock_type::now();
        sync.arrive_and_wait();
        sync.arrive_and_wait();
        seconds.push_back(std::chrono::duration<double>(clock_type::now() - start).count());
    }
    for (auto& th : threads) th.join();
    const std::vector<double>* per_thread = use_cpu_time ? &cpu_seconds : own_time ? &own_seconds : nullptr;
    if (per_thread)
        for (int r = 0; r < repeats; ++r)
            seconds[r] = *std::max_element(per_thread->begin() + static_cast<ptrdiff_t>(r) * n_threads,
                                           per_thread->begin() + static_cast<ptrdiff_t>(r + 1) * n_threads);
    return seconds;
}

// [begin, end) of part `i` of `n` equal parts of `count` items.
std::pair<int64_t, int64_t> split(int64_t count, int i, int n) { return {count * i / n, count * (i + 1) / n}; }

// Fills `rows` rows of a matrix by encoding a few random rows and repeating them.
void fill_matrix(ggml_type type, int64_t n_cols, int64_t n_rows, uint8_t* dst) {
    const size_t row_bytes = formats::row_size(type, n_cols);
    constexpr int64_t distinct = 16;
    std::mt19937 rng(1);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::vector<float> x(n_cols);
    std::vector<uint8_t> seed(row_bytes * distinct);
    for (int64_t r = 0; r < distinct; ++r) {
        for (auto& v : x) v = dist(rng);
        uint8_t* row = seed.data() + r * row_bytes;
        if (type == ggml_type::F32) std::memcpy(row, x.data(), row_bytes);
        else if (type == ggml_type::F16 || type == ggml_type::BF16) {
            auto* h = reinterpret_cast<uint16_t*>(row);
            for (int64_t i = 0; i < n_cols; ++i)
                h[i] = type == ggml_type::F16 ? formats::fp32_to_fp16(x[i]) : formats::fp32_to_bf16(x[i]);
        } else formats::quantize_row(type, x.data(), row, n_cols);
    }
    for (int64_t r = 0; r < n_rows; ++r) std::memcpy(dst + r * row_bytes, seed.data() + (r % distinct) * row_bytes, row_bytes);
}

std::vector<uint8_t> make_activations(ggml_type type, int64_t n_cols, int64_t n_tok) {
    const size_t stride = cpu::activation_row_size(type, n_cols);
    std::vector<uint8_t> act(stride * n_tok);
    std::mt19937 rng(2);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::vector<float> x(n_cols);
    for (int64_t t = 0; t < n_tok; ++t) {
        for (auto& v : x) v = dist(rng);
        cpu::quantize_activation(type, x.data(), act.data() + t * stride, n_cols);
    }
    return act;
}

// The attention rows: a Qwen3-30B-like head layout over one kv head per tile, one thread (the kernel is
// single-threaded; the engine runs one (kv head, query tile) or (kv head, chunk) item per thread).
struct attn_shape {
    static constexpr int n_head = 32, n_head_kv = 4, head_dim = 128;
    static constexpr int group = n_head / n_head_kv;
    static constexpr int query_tile = 16;  // prompt tokens per engine work item
};

// Prompt: the last 16-token query tile of a `prompt_tokens` prompt after `depth` positions, every kv
// head (rows = 16 tokens x group), all its tiles folded: GFLOP/s counting 4 head_dim flops (q.k and
// p v) per (row, visible position). Decode: one token (group rows per kv head) over `depth` positions
// of every layer that fits in `buf` (so the cache is read from memory, not the L3), GB/s of KV read,
// next to a one-thread read of `reads` timed in alternation.
// fma_gbps: the KV GB/s at which decode's f32 arithmetic (4 head_dim flops per query row and position,
// over 2 rows of row_bytes; 2 for Q8_0, whose scores are int8 dot products) would keep the FMA units
// busy at fma_gflops.
nlohmann::json bench_attention(ggml_type type, int depth, int prompt_tokens, buffer& buf, buffer& reads, int repeats,
                               double fma_gflops) {
    using S = attn_shape;
    const size_t row_bytes = formats::row_size(type, S::head_dim);
    const int n_ctx = depth + prompt_tokens;
    const size_t side_bytes = static_cast<size_t>(n_ctx) * row_bytes;       // K (or V) of one kv head
    const size_t layer_bytes = 2 * side_bytes * S::n_head_kv;
    const int n_layers = static_cast<int>(buf.size / layer_bytes);
    if (n_layers < 1) throw std::runtime_error("strata-bench kernels: --mib too small for attention at depth " + std::to_string(depth));
    fill_matrix(type, S::head_dim, static_cast<int64_t>(buf.size / row_bytes), buf.data.get());
    // Keys in the blocked layout the cache keeps them in (cpu/attention.hpp), packed in place: read as
    // rows, a Q8_0 tile's scales would be arbitrary bytes, denormal halves among them, which Intel
    // cores score through slow microcode assists.
    if (n_ctx % cpu::attn_key_block != 0)
        throw std::runtime_error("strata-bench kernels: attention needs depth + prompt tokens to be a multiple of " +
                                 std::to_string(cpu::attn_key_block));
    std::vector<uint8_t> rows(static_cast<size_t>(cpu::attn_tile_max) * row_bytes);
    for (int layer = 0; layer < n_layers; ++layer)
        for (int g = 0; g < S::n_head_kv; ++g)
            for (int pos0 = 0; pos0 < n_ctx; pos0 += cpu::attn_tile_max) {
                uint8_t* k = buf.data.get() + static_cast<size_t>(layer) * layer_bytes + 2 * g * side_bytes +
                             static_cast<size_t>(pos0) * row_bytes;
                const int n = std::min(cpu::attn_tile_max, n_ctx - pos0);
                std::memcpy(rows.data(), k, static_cast<size_t>(n) * row_bytes);
                cpu::attn_pack_keys(type, S::head_dim, rows.data(), row_bytes, n, k);
            }
    auto tile = [&](int layer, int g, int c, int n_pos) {
        const uint8_t* k = buf.data.get() + static_cast<size_t>(layer) * layer_bytes + 2 * g * side_bytes;
        const int pos0 = c * cpu::attn_tile_max;
        cpu::kv_tile t{type, k + pos0 * row_bytes, k + side_bytes + pos0 * row_bytes, row_bytes, pos0,
                       std::min(cpu::attn_tile_max, n_pos - pos0)};
        // As the engine's decode work items do: the next chunk's keys, for the kernel to prefetch.
        if (pos0 + cpu::attn_tile_max < n_pos) t.next_k = k + (pos0 + cpu::attn_tile_max) * row_bytes;
        return t;
    };
    const float scale = 1.0f / std::sqrt(static_cast<float>(S::head_dim));
    constexpr int prompt_rows = S::query_tile * S::group;
    std::vector<float> q(prompt_rows * S::head_dim), st_buf(prompt_rows * (S::head_dim + 2));
    std::mt19937 rng(3);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    for (auto& x : q) x = dist(rng);
    const cpu::attn_state st{st_buf.data(), st_buf.data() + prompt_rows, st_buf.data() + 2 * prompt_rows};

    std::vector<int64_t> last(prompt_rows);
    double prompt_flops = 0;
    for (int r = 0; r < prompt_rows; ++r) {
        last[r] = n_ctx - S::query_tile + r / S::group;
        prompt_flops += 4.0 * S::head_dim * static_cast<double>(last[r] + 1) * S::n_head_kv;
    }
    std::vector<double> t_prompt;
    for (int r = 0; r < repeats; ++r) {
        t_prompt.push_back(time_parallel(1, 1, [&](int, int) {
            for (int g = 0; g < S::n_head_kv; ++g) {
                cpu::attn_clear(st, S::head_dim, prompt_rows);
                for (int c = 0; c * cpu::attn_tile_max < n_ctx; ++c)
                    cpu::attn_tile(tile(0, g, c, n_ctx), S::head_dim, q.data(), prompt_rows, last.data(), scale, st);
            }
        }, true)[0]);
        if (t_prompt.back() > 2.0) break;  // scalar: one repeat is enough
    }

    const std::vector<int64_t> decode_last(S::group, depth - 1);
    const double kv_bytes = 2.0 * static_cast<double>(depth) * row_bytes * S::n_head_kv * n_layers;
    std::vector<double> t_decode, t_read;
    std::vector<uint64_t> sink(1);
    for (int r = 0; r < repeats; ++r) {
        double best_read = 1e30;
        for (int pf = 0; pf < 2; ++pf)
            best_read = std::min(best_read, time_parallel(1, 1, [&](int, int) {
                sink[0] += read_words(reinterpret_cast<const uint64_t*>(reads.data.get()), reads.size / 8, pf);
            })[0]);
        t_read.push_back(best_read);
        t_decode.push_back(time_parallel(1, 1, [&](int, int) {
            for (int layer = 0; layer < n_layers; ++layer)
                for (int g = 0; g < S::n_head_kv; ++g) {
                    cpu::attn_clear(st, S::head_dim, S::group);
                    for (int c = 0; c * cpu::attn_tile_max < depth; ++c)
                        cpu::attn_tile(tile(layer, g, c, depth), S::head_dim, q.data(), S::group, decode_last.data(),
                                       scale, st);
                }
        }, true)[0]);
        if (t_decode.back() > 2.0) break;
    }
    const double read_gbps = static_cast<double>(reads.size) / median(t_read) / 1e9;
    const double kv_gbps = kv_bytes / median(t_decode) / 1e9;
    return {{"kv_type", std::string(formats::info(type).name)}, {"depth", depth}, {"prompt_tokens", prompt_tokens},
            {"prompt_gflops", prompt_flops / median(t_prompt) / 1e9}, {"decode_kv_gbps", kv_gbps},
            {"read_gbps", read_gbps}, {"ratio", kv_gbps / read_gbps}, {"decode_layers", n_layers},
            {"fma_gflops", fma_gflops},
            {"fma_gbps", fma_gflops / ((type == ggml_type::Q8_0 ? 2.0 : 4.0) * S::group * S::head_dim /
                                       (2.0 * static_cast<double>(row_bytes)))}};
}

// Gated DeltaNet at Qwen3.5-35B-A3B's shape: 32 V heads of a 128 x 128 f32 state per layer (2 MiB).
struct delta_shape {
    static constexpr int n_head_v = 32, n_head_k = 16, d_k = 128, d_v = 128;
    static constexpr size_t head_floats = size_t{d_k} * d_v;
    static constexpr size_t layer_bytes = n_head_v * head_floats * sizeof(float);
};

// Token inputs of n_tok tokens in the engine's layout ([n_tok][n_head][dim]; the K heads broadcast to
// V heads), q and k unit rows (q times 1/sqrt(d_k)), realistic decays.
struct delta_tokens {
    using S = delta_shape;
    int n_tok;
    std::vector<float> q, k, v, g, beta, o;
    explicit delta_tokens(int n)
        : n_tok(n), q(size_t(n) * S::n_head_k * S::d_k), k(q.size()), v(size_t(n) * S::n_head_v * S::d_v),
          g(size_t(n) * S::n_head_v), beta(g.size()), o(v.size()) {
        std::mt19937 rng(4);
        std::normal_distribution<float> dist(0.0f, 1.0f);
        std::uniform_real_distribution<float> uni(0.0f, 1.0f);
        for (auto* b : {&q, &k, &v}) std::generate(b->begin(), b->end(), [&] { return dist(rng); });
        cpu::l2_normalize_rows(q.data(), n * S::n_head_k, S::d_k, S::d_k, 1e-6f, 1.0f / std::sqrt(float(S::d_k)));
        cpu::l2_normalize_rows(k.data(), n * S::n_head_k, S::d_k, S::d_k, 1e-6f, 1.0f);
        for (auto& x : g) x = -0.5f * uni(rng);
        for (auto& x : beta) x = 1.0f / (1.0f + std::exp(-dist(rng)));
    }
    // Head h's tokens [t0, t0 + n) through the sequential or the chunked form.
    void run(float* state, int h, int t0, int n, bool chunked, float* scratch) {
        const int hk = h % S::n_head_k;
        const size_t tq = size_t(t0) * S::n_head_k * S::d_k + size_t(hk) * S::d_k;
        const size_t tv = size_t(t0) * S::n_head_v * S::d_v + size_t(h) * S::d_v;
        const size_t tg = size_t(t0) * S::n_head_v + h;
        const ptrdiff_t qs = S::n_head_k * S::d_k, vs = S::n_head_v * S::d_v, gs = S::n_head_v;
        if (chunked)
            cpu::delta_rule_chunked(state, S::d_k, S::d_v, n, q.data() + tq, qs, k.data() + tq, qs, v.data() + tv, vs,
                                    g.data() + tg, gs, beta.data() + tg, gs, o.data() + tv, vs,
                                    cpu::delta_rule_default_chunk, scratch);
        else
            cpu::delta_rule_sequential(state, S::d_k, S::d_v, n, q.data() + tq, qs, k.data() + tq, qs, v.data() + tv, vs,
                                       g.data() + tg, gs, beta.data() + tg, gs, o.data() + tv, vs);
    }
};

// Decode: one token through every head of as many layers' states as fit in `buf` (so states come from
// memory, as the engine's 30 layers x 2 MiB do between tokens), heads split over the threads; GB/s of state
// read + written against the read bandwidth of the same threads, timed in alternation.
nlohmann::json bench_delta_decode(buffer& buf, buffer& reads, int n_threads, int repeats) {
    using S = delta_shape;
    const int n_layers = static_cast<int>(buf.size / S::layer_bytes);
    auto* states = reinterpret_cast<float*>(buf.data.get());
    std::mt19937 rng(6);
    std::normal_distribution<float> dist(0.0f, 0.1f);
    for (size_t i = 0; i < n_layers * S::n_head_v * S::head_floats; ++i) states[i] = dist(rng);
    std::vector<delta_tokens> toks;
    for (int i = 0; i < n_threads; ++i) toks.emplace_back(1);  // each thread's own outputs
    std::vector<double> t_step, t_read;
    std::vector<uint64_t> sink(8 * n_threads);
    for (int r = 0; r < repeats; ++r) {
        double best_read = 1e30;
        for (int pf = 0; pf < 2; ++pf)
            best_read = std::min(best_read, time_parallel(n_threads, 1, [&](int i, int n) {
                const auto [b, e] = split(static_cast<int64_t>(reads.size / 8), i, n);
                sink[8 * i] += read_words(reinterpret_cast<const uint64_t*>(reads.data.get()) + b, e - b, pf);
            })[0]);
        t_read.push_back(best_read);
        t_step.push_back(time_parallel(n_threads, 1, [&](int i, int n) {
            const auto [h0, h1] = split(S::n_head_v, i, n);
            for (int layer = 0; layer < n_layers; ++layer)
                for (int h = static_cast<int>(h0); h < h1; ++h)
                    toks[i].run(states + (size_t(layer) * S::n_head_v + h) * S::head_floats, h, 0, 1, false, nullptr);
        }, true)[0]);
    }
    const double read_gbps = static_cast<double>(reads.size) / median(t_read) / 1e9;
    const double state_gbps = 2.0 * S::layer_bytes * n_layers / median(t_step) / 1e9;
    return {{"threads", n_threads}, {"layers", n_layers}, {"state_gbps", state_gbps}, {"read_gbps", read_gbps},
            {"ratio", state_gbps / read_gbps}, {"us_per_layer", 1e6 * median(t_step) / n_layers}};
}

// Prompt: n_tok tokens of heads 0..3 on one thread (the engine runs one head per work item), the
// sequential and the chunked form timed in alternation. Flops counted per form: sequential 7 d_k d_v per
// token (S^T k, decay, update, S^T q); chunked per chunk of c: 6 c d_k d_v (W S0, Qd S0, Kd^T D) +
// 2 c^2 d_k (k.k, q.k, lower halves) + c^2 (d_k + d_v) (the two triangular solves) + c^2 d_v (P D).
nlohmann::json bench_delta_prompt(int n_tok, int repeats) {
    using S = delta_shape;
    constexpr int n_heads = 4;
    delta_tokens toks(n_tok);
    std::vector<float> state(n_heads * S::head_floats);
    std::vector<float> scratch(cpu::delta_rule_chunked_scratch(S::d_k, S::d_v, cpu::delta_rule_default_chunk));
    std::vector<double> times[2];
    for (int r = 0; r < repeats; ++r)
        for (int chunked = 0; chunked < 2; ++chunked) {
            std::fill(state.begin(), state.end(), 0.0f);
            times[chunked].push_back(time_parallel(1, 1, [&](int, int) {
                for (int h = 0; h < n_heads; ++h) toks.run(state.data() + h * S::head_floats, h, 0, n_tok, chunked, scratch.data());
            })[0]);
        }
    const double dk = S::d_k, dv = S::d_v, c = cpu::delta_rule_default_chunk;
    const double seq_flops = 7.0 * dk * dv * n_tok * n_heads;
    const double chunk_flops = (6 * c * dk * dv + 2 * c * c * dk + c * c * (dk + dv) + c * c * dv) * (n_tok / c) * n_heads;
    const double t_seq = median(times[0]) / n_heads, t_chunk = median(times[1]) / n_heads;
    return {{"tokens", n_tok}, {"seq_tokens_per_s", n_tok / t_seq}, {"chunked_tokens_per_s", n_tok / t_chunk},
            {"seq_gflops", seq_flops / n_heads / t_seq / 1e9}, {"chunked_gflops", chunk_flops / n_heads / t_chunk / 1e9},
            {"speedup", t_seq / t_chunk}, {"fma_gflops", fma_peak_gflops()}};
}

int run(int argc, char** argv) {
    cxxopts::Options options("strata-bench kernels",
                             "Single-token matvec GB/s per format vs read bandwidth, and batched matmul tokens/s.");
    options.add_options()
        ("formats", "comma-separated weight formats",
         cxxopts::value<std::string>()->default_value(
             "Q4_K,Q6_K,Q8_0,IQ4_XS,Q5_K,Q4_0,Q4_1,Q5_0,Q5_1,IQ4_NL,Q2_K,Q3_K,F16,BF16,F32,"
             "IQ1_S,IQ1_M,IQ2_XXS,IQ2_XS,IQ2_S,IQ3_XXS,IQ3_S,MXFP4"))
        ("mib", "weight matrix (and read buffer) size in MiB", cxxopts::value<int64_t>()->default_value("256"))
        ("cols", "elements per row", cxxopts::value<int64_t>()->default_value("4096"))
        ("threads", "comma-separated thread counts", cxxopts::value<std::string>()->default_value("1,2"))
        ("repeats", "repeats per figure (the median is reported)", cxxopts::value<int>()->default_value("9"))
        ("matmul-tokens", "comma-separated token counts for the batched matmul (empty: skip)",
         cxxopts::value<std::string>()->default_value("64,512"))
        ("matmul-rows", "rows of the matmul matrix (n_cols x rows)", cxxopts::value<int64_t>()->default_value("4096"))
        ("attn-depths", "comma-separated KV depths for the attention rows (empty: skip)",
         cxxopts::value<std::string>()->default_value("4096,16384"))
        ("attn-kv", "comma-separated KV cache types for the attention rows", cxxopts::value<std::string>()->default_value("F16,Q8_0"))
        ("attn-prompt", "prompt tokens after the depth for the attention prompt row", cxxopts::value<int>()->default_value("512"))
        ("delta-prompt", "comma-separated prompt lengths for the gated DeltaNet rows (empty: skip them)",
         cxxopts::value<std::string>()->default_value("512,4096"))
        ("cpu-time", "time by the threads' CPU time instead of wall time (a machine shared with other work)")
        ("json", "print JSON instead of a table")
        ("h,help", "this help");
    const auto args = options.parse(argc, argv);
    if (args.count("help")) {
        std::printf("%s\n", options.help().c_str());
        return 0;
    }
    const int64_t mib = args["mib"].as<int64_t>(), n_cols = args["cols"].as<int64_t>();
    const int repeats = std::max(1, args["repeats"].as<int>());
    std::vector<int> thread_counts;
    for (const auto& t : split_list(args["threads"].as<std::string>())) thread_counts.push_back(std::stoi(t));
    std::vector<int64_t> matmul_tokens;
    for (const auto& t : split_list(args["matmul-tokens"].as<std::string>())) matmul_tokens.push_back(std::stoll(t));
    const int64_t matmul_rows = args["matmul-rows"].as<int64_t>();
    const bool json = args.count("json") > 0;
    use_cpu_time = args.count("cpu-time") > 0;

    std::vector<int> attn_depths;
    for (const auto& d : split_list(args["attn-depths"].as<std::string>())) attn_depths.push_back(std::stoi(d));
    std::vector<ggml_type> attn_types;
    for (const auto& name : split_list(args["attn-kv"].as<std::string>())) {
        const auto t = formats::type_from_name(name);
        if (!t || (*t != ggml_type::F16 && *t != ggml_type::Q8_0)) {
            std::fprintf(stderr, "strata-bench kernels: the KV cache is F16 or Q8_0, not '%s'\n", name.c_str());
            return 2;
        }
        attn_types.push_back(*t);
    }

    std::vector<ggml_type> types;
    for (const auto& name : split_list(args["formats"].as<std::string>())) {
        const auto t = formats::type_from_name(name);
        if (!t || !cpu::has_matvec(*t)) {
            std::fprintf(stderr, "strata-bench kernels: unknown or unsupported format '%s'\n", name.c_str());
            return 2;
        }
        types.push_back(*t);
    }

    const size_t bytes = static_cast<size_t>(mib) << 20;
    buffer weights(bytes), reads(bytes);
    std::memset(reads.data.get(), 1, bytes);
    const std::string isa(cpu::isa_name(cpu::active_isa()));
    nlohmann::json out = {{"isa", isa}, {"mib", mib}, {"n_cols", n_cols}, {"repeats", repeats}, {"cpu_time", use_cpu_time},
                          {"matvec", nlohmann::json::array()}, {"matmul", nlohmann::json::array()},
                          {"attention", nlohmann::json::array()}, {"delta_decode", nlohmann::json::array()},
                          {"delta_prompt", nlohmann::json::array()}};
    if (!json) {
        std::printf("strata-bench kernels: ISA %s, %lld MiB matrix of %lld columns, one token, median of %d%s\n",
                    isa.c_str(), static_cast<long long>(mib), static_cast<long long>(n_cols), repeats,
                    use_cpu_time ? ", timed by thread CPU time" : "");
        std::printf("read GB/s: the better of a plain and a software-prefetching read of %lld MiB, same threads\n",
                    static_cast<long long>(mib));
        std::printf("cached GB/s: the same kernel on %d KiB of rows per thread, read from cache (%d passes): the compute\n"
                    "ceiling; ceiling: cached GB/s / read GB/s, the ratio the kernel can reach (capped by 100 %%)\n",
                    cached_kib_per_thread, cached_passes);
        std::printf("%-8s %4s %12s %12s %7s %12s %7s\n", "format", "thr", "weight GB/s", "read GB/s", "ratio", "cached GB/s",
                    "ceiling");
    }

    for (const ggml_type type : types) {
        const std::string name(formats::info(type).name);
        const size_t row_bytes = formats::row_size(type, n_cols);
        const int64_t n_rows = static_cast<int64_t>(bytes / row_bytes);
        const double matrix_bytes = static_cast<double>(row_bytes) * n_rows;
        fill_matrix(type, n_cols, n_rows, weights.data.get());
        const cpu::matrix w{type, weights.data.get(), n_cols, row_bytes};
        int64_t n_act = 1;
        for (const int64_t n_tok : matmul_tokens) n_act = std::max(n_act, n_tok);
        const auto act = make_activations(type, n_cols, n_act);
        std::vector<float> y(n_rows);
        std::vector<uint64_t> sink(64);
        // The rows16 layout of the prompt GEMM kernels, where the ISA has one: timed next to the GGUF
        // layout, repeat by repeat.
        const int64_t n_packed_rows = n_rows / cpu::repack_group_rows * cpu::repack_group_rows;
        const bool packed = cpu::can_repack(type, n_packed_rows);
        std::unique_ptr<buffer> packed_weights;
        cpu::matrix wp{};
        if (packed) {
            const size_t stride = cpu::repacked_row_stride(type, n_cols);
            packed_weights = std::make_unique<buffer>(stride * static_cast<size_t>(n_packed_rows));
            cpu::repack_rows(type, weights.data.get(), row_bytes, n_packed_rows, n_cols, packed_weights->data.get());
            wp = {type, packed_weights->data.get(), n_cols, stride, cpu::weight_layout::rows16};
        }
        // [begin, end) of thread i's rows of the packed matrix, on group boundaries
        auto packed_split = [&](int i, int n) {
            const auto [b, e] = split(n_packed_rows / cpu::repack_group_rows, i, n);
            return std::pair{b * cpu::repack_group_rows, e * cpu::repack_group_rows};
        };

        for (const int n_threads : thread_counts) {
            std::vector<double> t_read[2], t_mv, t_mv_packed, t_cached, t_cached_packed;  // t_read[0]: plain, [1]: with software prefetch
            // The compute ceiling: the same kernel on cached_kib_per_thread of rows per thread, read from cache
            // (warmed up, then cached_passes passes timed).
            const int64_t cached_rows = std::clamp<int64_t>(static_cast<int64_t>(cached_kib_per_thread << 10) * n_threads / static_cast<int64_t>(row_bytes),
                                                            n_threads, n_rows);
            for (int r = 0; r < repeats; ++r) {  // alternate so all figures see the same load
                for (int pf = 0; pf < 2; ++pf)
                    t_read[pf].push_back(time_parallel(n_threads, 1, [&](int i, int n) {
                        const size_t words = bytes / 8;
                        const auto [b, e] = split(static_cast<int64_t>(words), i, n);
                        sink[8 * i] += read_words(reinterpret_cast<const uint64_t*>(reads.data.get()) + b, e - b, pf);
                    })[0]);
                t_mv.push_back(time_parallel(n_threads, 1, [&](int i, int n) {
                    const auto [b, e] = split(n_rows, i, n);
                    cpu::matvec(w, b, e, act.data(), y.data() + b);
                })[0]);
                if (packed)
                    t_mv_packed.push_back(time_parallel(n_threads, 1, [&](int i, int n) {
                        const auto [b, e] = packed_split(i, n);
                        cpu::matvec(wp, b, e, act.data(), y.data() + b);
                    })[0]);
                t_cached.push_back(time_parallel(n_threads, 1, [&](int i, int n) {
                    const auto [b, e] = split(cached_rows, i, n);
                    for (int pass = 0; pass < cached_passes; ++pass) cpu::matvec(w, b, e, act.data(), y.data() + b);
                }, true, true)[0]);
                if (packed)
                    t_cached_packed.push_back(time_parallel(n_threads, 1, [&](int i, int n) {
                        const int64_t g = cpu::repack_group_rows;
                        const auto [b, e] = split(std::max<int64_t>(cached_rows / g, n), i, n);
                        for (int pass = 0; pass < cached_passes; ++pass) cpu::matvec(wp, b * g, e * g, act.data(), y.data() + b * g);
                    }, true, true)[0]);
            }
            const double read_plain = static_cast<double>(bytes) / median(t_read[0]) / 1e9;
            const double read_prefetch = static_cast<double>(bytes) / median(t_read[1]) / 1e9;
            const double read_gbps = std::max(read_plain, read_prefetch);  // the better of the two is the baseline
            const double weight_gbps = matrix_bytes / median(t_mv) / 1e9;
            const double cached_gbps = static_cast<double>(row_bytes) * cached_rows * cached_passes / median(t_cached) / 1e9;
            out["matvec"].push_back({{"format", name}, {"threads", n_threads}, {"weight_gbps", weight_gbps},
                                     {"read_gbps", read_gbps}, {"read_plain_gbps", read_plain},
                                     {"read_prefetch_gbps", read_prefetch}, {"ratio", weight_gbps / read_gbps},
                                     {"cached_gbps", cached_gbps}, {"compute_ceiling", cached_gbps / read_gbps}});
            if (!json)
                std::printf("%-8s %4d %12.2f %12.2f %6.0f%% %12.2f %6.0f%%\n", name.c_str(), n_threads, weight_gbps, read_gbps,
                            100.0 * weight_gbps / read_gbps, cached_gbps, 100.0 * cached_gbps / read_gbps);
            if (packed) {
                // GB/s of the GGUF bytes the same rows hold, so both layouts count the same work
                const double gbps = static_cast<double>(row_bytes) * n_packed_rows / median(t_mv_packed) / 1e9;
                const int64_t g = cpu::repack_group_rows;
                const double cached_p = static_cast<double>(row_bytes) * (std::max<int64_t>(cached_rows / g, n_threads) * g) *
                                        cached_passes / median(t_cached_packed) / 1e9;
                out["matvec"].push_back({{"format", name + "/rows16"}, {"threads", n_threads}, {"weight_gbps", gbps},
                                         {"read_gbps", read_gbps}, {"ratio", gbps / read_gbps}, {"cached_gbps", cached_p},
                                         {"compute_ceiling", cached_p / read_gbps}});
                if (!json)
                    std::printf("%-8s %4d %12.2f %12.2f %6.0f%% %12.2f %6.0f%%  (rows16 layout, GB/s of the GGUF bytes)\n",
                                name.c_str(), n_threads, gbps, read_gbps, 100.0 * gbps / read_gbps, cached_p,
                                100.0 * cached_p / read_gbps);
            }
        }

        // Batched matmul on a matmul_rows x n_cols matrix (a prefix of the same buffer), all threads.
        const int n_threads = *std::max_element(thread_counts.begin(), thread_counts.end());
        const int64_t rows = std::min(matmul_rows, n_packed_rows);
        const cpu::matrix wm{type, weights.data.get(), n_cols, row_bytes};
        const size_t act_stride = cpu::activation_row_size(type, n_cols);
        // A format with a prompt GEMM on the GGUF layout (the code book formats) is also timed through its
        // dot kernel alone (groups of 4 or 8 tokens), the prompt path without that GEMM.
        const auto& active = cpu::detail::active_table();
        std::unique_ptr<cpu::detail::isa_table> dot_only;
        if (active.gemm_rows[static_cast<size_t>(type)] != nullptr) {
            dot_only = std::make_unique<cpu::detail::isa_table>(active);
            dot_only->gemm_rows[static_cast<size_t>(type)] = nullptr;
        }
        for (const int64_t n_tok : matmul_tokens) {
            std::vector<float> ym(rows * n_tok);
            std::vector<double> times, times_packed, times_dot;
            for (int r = 0; r < std::max(1, repeats / 2); ++r) {
                times.push_back(time_parallel(n_threads, 1, [&](int i, int n) {
                    const auto [b, e] = split(rows, i, n);
                    cpu::matmul(wm, b, e, act.data(), act_stride, n_tok, ym.data() + b, rows);
                })[0]);
                if (dot_only)
                    times_dot.push_back(time_parallel(n_threads, 1, [&](int i, int n) {
                        const auto [b, e] = split(rows, i, n);
                        cpu::detail::run_rows(*dot_only, wm, b, e, act.data(), act_stride, n_tok, ym.data() + b, rows);
                    })[0]);
                if (packed)
                    times_packed.push_back(time_parallel(n_threads, 1, [&](int i, int n) {
                        const auto [b, e] = split(rows / cpu::repack_group_rows, i, n);
                        cpu::matmul(wp, b * cpu::repack_group_rows, e * cpu::repack_group_rows, act.data(), act_stride, n_tok,
                                    ym.data() + b * cpu::repack_group_rows, rows);
                    })[0]);
                if (times.back() > 2.0) break;  // scalar-only formats: one repeat is enough
            }
            const double tps = static_cast<double>(n_tok) / median(times);
            out["matmul"].push_back({{"format", name}, {"tokens", n_tok}, {"threads", n_threads}, {"rows", rows},
                                     {"n_cols", n_cols}, {"tokens_per_s", tps}});
            if (dot_only)
                out["matmul"].push_back({{"format", name + "/dot"}, {"tokens", n_tok}, {"threads", n_threads},
                                         {"rows", rows}, {"n_cols", n_cols},
                                         {"tokens_per_s", static_cast<double>(n_tok) / median(times_dot)}});
            if (packed)
                out["matmul"].push_back({{"format", name + "/rows16"}, {"tokens", n_tok}, {"threads", n_threads},
                                         {"rows", rows}, {"n_cols", n_cols},
                                         {"tokens_per_s", static_cast<double>(n_tok) / median(times_packed)}});
        }
    }

    const double fma_gflops = attn_depths.empty() ? 0 : fma_peak_gflops();
    for (const int depth : attn_depths)
        for (const ggml_type type : attn_types)
            out["attention"].push_back(
                bench_attention(type, depth, args["attn-prompt"].as<int>(), weights, reads, repeats, fma_gflops));

    std::vector<int> delta_prompts;
    for (const auto& n : split_list(args["delta-prompt"].as<std::string>())) delta_prompts.push_back(std::stoi(n));
    if (!delta_prompts.empty()) {
        for (const int n_threads : thread_counts) out["delta_decode"].push_back(bench_delta_decode(weights, reads, n_threads, repeats));
        for (const int n_tok : delta_prompts) out["delta_prompt"].push_back(bench_delta_prompt(n_tok, std::max(1, repeats / 3)));
    }

    if (json) {
        std::printf("%s\n", out.dump(2).c_str());
        return 0;
    }
    if (!matmul_tokens.empty()) {
        std::printf("\nbatched matmul, %lld x %lld matrix, %d threads (activation quantization not timed)\n",
                    static_cast<long long>(matmul_rows), static_cast<long long>(n_cols),
                    *std::max_element(thread_counts.begin(), thread_counts.end()));
        std::printf("FORMAT/dot: a format with a prompt GEMM on the GGUF layout (code book, and on AVX-512 float) "
                    "through its dot kernel alone (4 or 8 tokens per weight decode), timed alongside the GEMM\n");
        std::printf("%-13s %7s %12s %14s\n", "format", "tokens", "tokens/s", "GMAC/s");
        for (const auto& m : out["matmul"])
            std::printf("%-13s %7lld %12.1f %14.2f\n", m["format"].get<std::string>().c_str(),
                        static_cast<long long>(m["tokens"].get<int64_t>()), m["tokens_per_s"].get<double>(),
                        m["tokens_per_s"].get<double>() * m["rows"].get<int64_t>() * n_cols / 1e9);
    }
    if (!attn_depths.empty()) {
        std::printf("\nattention, one thread: %d q heads, %d kv heads, head_dim %d; prompt = the last %d-token query "
                    "tile of a %d-token prompt after the depth, decode = 1 token over the depth\n",
                    attn_shape::n_head, attn_shape::n_head_kv, attn_shape::head_dim, attn_shape::query_tile,
                    args["attn-prompt"].as<int>());
        std::printf("FMA bound: one thread's peak of %.1f GFLOP/s (independent FMA chains) spent on decode's 4 head_dim "
                    "flops per query row and position\n", fma_gflops);
        std::printf("%-6s %7s %15s %15s %12s %7s %15s %7s\n", "kv", "depth", "prompt GFLOP/s", "decode KV GB/s",
                    "read GB/s", "ratio", "FMA-bound GB/s", "ratio");
        for (const auto& a : out["attention"])
            std::printf("%-6s %7d %15.2f %15.2f %12.2f %6.0f%% %15.2f %6.0f%%\n", a["kv_type"].get<std::string>().c_str(),
                        a["depth"].get<int>(), a["prompt_gflops"].get<double>(), a["decode_kv_gbps"].get<double>(),
                        a["read_gbps"].get<double>(), 100.0 * a["ratio"].get<double>(), a["fma_gbps"].get<double>(),
                        a["fma_gbps"].get<double>() > 0 ? 100.0 * a["decode_kv_gbps"].get<double>() / a["fma_gbps"].get<double>() : 0.0);
    }
    if (!delta_prompts.empty()) {
        std::printf("\ngated DeltaNet delta rule, 32 V heads of 128 x 128 f32 state (2 MiB per layer)\n");
        std::printf("decode: one token through every head of the layers that fit in %lld MiB; GB/s of state read + "
                    "written vs the read bandwidth of the same threads\n", static_cast<long long>(mib));
        std::printf("%4s %7s %14s %12s %12s %7s\n", "thr", "layers", "us per layer", "state GB/s", "read GB/s", "ratio");
        for (const auto& d : out["delta_decode"])
            std::printf("%4d %7d %14.1f %12.2f %12.2f %6.0f%%\n", d["threads"].get<int>(), d["layers"].get<int>(),
                        d["us_per_layer"].get<double>(), d["state_gbps"].get<double>(), d["read_gbps"].get<double>(),
                        100.0 * d["ratio"].get<double>());
        std::printf("prompt: one head on one thread, sequential form vs chunked form (chunk %d), timed in alternation; "
                    "FMA peak: one thread's, measured after them\n", cpu::delta_rule_default_chunk);
        std::printf("%7s %16s %12s %16s %12s %8s %10s\n", "tokens", "seq tokens/s", "seq GFLOP/s", "chunked tokens/s",
                    "chunk GFLOP/s", "speedup", "FMA peak");
        for (const auto& d : out["delta_prompt"])
            std::printf("%7d %16.0f %12.2f %16.0f %12.2f %7.2fx %10.1f\n", d["tokens"].get<int>(),
                        d["seq_tokens_per_s"].get<double>(), d["seq_gflops"].get<double>(),
                        d["chunked_tokens_per_s"].get<double>(), d["chunked_gflops"].get<double>(),
                        d["speedup"].get<double>(), d["fma_gflops"].get<double>());
    }
    return 0;
}

register_mode reg{{"kernels", "CPU kernels: matvec GB/s per format vs read bandwidth, matmul tokens/s", &run}};

}  // namespace
}  // namespace strata::bench
