// strata-bench batch -m MODEL.gguf: concurrent generations through the engine's step batcher. For 1,
// 2, 4 and 8 streams: aggregate and per-stream decode tokens/s, time to first token, the weight and KV
// bytes each step read and the decode bound they give at this run's read bandwidth, and the streams'
// p50/p99 inter-token gap while a long prompt (4,096 tokens) is admitted, next to their gap without it.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <utility>
#include <thread>
#include <vector>

#include <cxxopts.hpp>
#include <spdlog/fmt/fmt.h>

#include "bandwidth.hpp"
#include "modes.hpp"
#include "strata/engine.hpp"

namespace strata::bench {
namespace {

using clock_type = std::chrono::steady_clock;

double ms_between(clock_type::time_point a, clock_type::time_point b) {
    return std::chrono::duration<double, std::milli>(b - a).count();
}

double percentile(std::vector<double> v, double p) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    return v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size() - 1) + 0.5))];
}

std::vector<int32_t> prompt_tokens(int n_vocab, int n, int salt) {
    std::vector<int32_t> t;
    for (int i = 0; i < n; ++i) t.push_back(static_cast<int32_t>((i * 7919 + salt * 104729 + 17) % (n_vocab - 8)));
    return t;
}

generation_options greedy(int n) {
    generation_options g;
    g.max_tokens = n;
    g.sampling.temperature = 0;
    g.ignore_eos = true;
    return g;
}

// One stream's token times, written on the engine thread and read after its future is ready.
struct stream {
    std::unique_ptr<session> s;
    std::vector<int32_t> prompt;
    clock_type::time_point submitted;
    std::vector<clock_type::time_point> tokens;
    std::atomic<int> n_tokens{0};  // tokens.size(), readable while it runs
    std::future<generation_result> f;
    // on_token: false ends the generation.
    void start(int n, const std::function<bool()>& on_token = {}) {
        tokens.clear();
        n_tokens = 0;
        submitted = clock_type::now();
        f = s->start(prompt, greedy(n), [this, on_token](const token_event& e) {
            if (!e.flush) {
                tokens.push_back(clock_type::now());
                ++n_tokens;
            }
            return !on_token || on_token();
        });
    }
};

struct row {
    int streams = 0;
    double aggregate = 0, per_stream = 0, ttft_ms = 0;
    double bytes_per_step = 0, rows_per_step = 0, bound = 0, bw_gbs = 0;
    double bw_before = 0, bw_after = 0;  // the read probe just before and just after the decode
    double gap_p50 = 0, gap_p99 = 0, long_p50 = 0, long_p99 = 0;
    double long_s = 0;  // the long prompt's time to its first token
    int n_during = 0;   // gaps that ended while it was admitted
    std::vector<phase_time> parts;  // --breakdown: ms and bytes per decode step by part
};

// Per step: the phases summed over `steps` passes.
std::vector<phase_time> per_step(const std::vector<phase_time>& after, const std::vector<phase_time>& before, double steps) {
    std::vector<phase_time> out;
    for (size_t i = 0; i < after.size(); ++i) {
        const bool had = i < before.size();
        out.push_back({after[i].name, (after[i].ms - (had ? before[i].ms : 0)) / steps,
                       static_cast<uint64_t>(static_cast<double>(after[i].bytes - (had ? before[i].bytes : 0)) / steps)});
    }
    return out;
}

// The bound takes the mean of read probes run just before and just after the decode, so a shift of the
// memory's speed during the row shows (both are printed) instead of skewing the ratio unseen.
row measure(const std::shared_ptr<model>& m, int n_streams, int n_prompt, int n_gen, int n_long, int n_more,
            int probe_threads) {
    const int n_vocab = m->info().n_vocab;
    std::vector<stream> ss(static_cast<size_t>(n_streams));
    for (int i = 0; i < n_streams; ++i) {
        ss[i].s = std::make_unique<session>(m);
        ss[i].prompt = prompt_tokens(n_vocab, n_prompt, i);
    }
    row r;
    r.streams = n_streams;
    // 1. Prompts arrive together: time to first token (the prompts share steps too).
    for (auto& s : ss) s.start(1);
    for (auto& s : ss) {
        s.f.get();
        r.ttft_ms += ms_between(s.submitted, s.tokens.front()) / n_streams;
    }
    // 2. Decode: each stream continues its prompt (the cache holds it); steps hold one row per stream.
    for (auto& s : ss) s.prompt.push_back(0);
    r.bw_before = read_bandwidth_gbs(probe_threads);
    const batch_stats before = m->batching();
    for (auto& s : ss) s.start(n_gen);
    for (auto& s : ss) {
        const generation_result g = s.f.get();
        if (n_streams == 1 && g.time.decode_passes > 0)
            r.parts = per_step(g.time.decode_phases, {}, g.time.decode_passes);
        const double ms = ms_between(s.tokens.front(), s.tokens.back());
        const double rate = (static_cast<double>(s.tokens.size()) - 1) * 1000 / ms;
        r.aggregate += rate;
        r.per_stream += rate / n_streams;
    }
    const batch_stats after = m->batching();
    r.bw_after = read_bandwidth_gbs(probe_threads);
    r.bw_gbs = (r.bw_before + r.bw_after) / 2;
    const double steps = static_cast<double>(after.steps - before.steps);
    r.bytes_per_step = static_cast<double>(after.bytes - before.bytes) / steps;
    r.rows_per_step = static_cast<double>(after.rows - before.rows) / steps;
    r.bound = r.bw_gbs * 1e9 / r.bytes_per_step * r.rows_per_step;
    if (after.timed_steps > before.timed_steps)
        r.parts = per_step(after.step_phases, before.step_phases, static_cast<double>(after.timed_steps - before.timed_steps));
    // 3. The streams decode again; once each has a few tokens, a long prompt arrives on its own session.
    // They go on decoding until the prompt has its first token and each has had a few more tokens, so the
    // whole admission runs beside them. Their solo gaps: the decode of 2. and the tokens before and after.
    if (n_long > 0) {
        stream longp;
        longp.s = std::make_unique<session>(m);
        longp.prompt = prompt_tokens(n_vocab, n_long, 1000 + n_streams);
        std::vector<double> solo, during;
        for (auto& s : ss)
            for (size_t t = 1; t < s.tokens.size(); ++t) solo.push_back(ms_between(s.tokens[t - 1], s.tokens[t]));
        std::atomic<bool> stop{false};
        for (auto& s : ss) s.prompt.push_back(1);
        for (auto& s : ss) s.start(n_more, [&stop] { return !stop.load(); });
        const auto wait_tokens = [&](int n) {
            for (auto& s : ss)
                while (s.n_tokens.load() < n && s.f.wait_for(std::chrono::milliseconds(1)) != std::future_status::ready) {
                }
        };
        wait_tokens(8);
        const auto long_at = clock_type::now();
        longp.start(1);
        longp.f.get();
        const auto long_done = longp.tokens.front();
        r.long_s = ms_between(long_at, long_done) / 1000;
        std::vector<int> at_done;
        for (auto& s : ss) at_done.push_back(s.n_tokens.load());
        for (size_t i = 0; i < ss.size(); ++i)
            while (ss[i].n_tokens.load() < at_done[i] + 8 &&
                   ss[i].f.wait_for(std::chrono::milliseconds(1)) != std::future_status::ready) {
            }
        stop = true;
        for (auto& s : ss) {
            const generation_result g = s.f.get();
            if (!s.tokens.empty() && s.tokens.back() < long_done)
                std::fprintf(stderr, "a stream ended (%d tokens) before the long prompt was in: raise -n\n",
                             static_cast<int>(g.tokens.size()));
            for (size_t t = 1; t < s.tokens.size(); ++t) {
                const double gap = ms_between(s.tokens[t - 1], s.tokens[t]);
                if (s.tokens[t] <= long_at || s.tokens[t - 1] >= long_done) solo.push_back(gap);
                else during.push_back(gap);
            }
        }
        r.gap_p50 = percentile(solo, 0.5);
        r.gap_p99 = percentile(solo, 0.99);
        r.long_p50 = percentile(during, 0.5);
        r.long_p99 = percentile(during, 0.99);
        r.n_during = static_cast<int>(during.size());
    }
    return r;
}

int run(int argc, char** argv) {
    cxxopts::Options o("strata-bench batch", "concurrent generations through the engine's step batcher");
    o.add_options()("m,model", "GGUF file", cxxopts::value<std::string>())(
        "streams", "concurrent generations to measure", cxxopts::value<std::string>()->default_value("1,2,4,8"))(
        "p,prompt", "prompt tokens per stream", cxxopts::value<int>()->default_value("32"))(
        "n,gen", "tokens each stream decodes", cxxopts::value<int>()->default_value("48"))(
        "long", "tokens of the prompt that arrives while the streams decode (0: skip)",
        cxxopts::value<int>()->default_value("4096"))(
        "batch", "tokens per step (the server's --batch)", cxxopts::value<int>()->default_value("512"))(
        "prefill-pace", "the server's --prefill-pace", cxxopts::value<double>()->default_value("2"))(
        "breakdown", "time the decode steps by part of the pass (ms per step, after the table)")(
        "no-repack", "keep the weights in the GGUF layout (as strata's --no-repack)")(
        "threads", "pool workers", cxxopts::value<int>())("numa-pool", "as strata's --numa-pool",
                                                          cxxopts::value<std::string>()->default_value("auto"))(
        "h,help", "show help");
    const auto a = o.parse(argc, argv);
    if (a.count("help") || !a.count("model")) {
        std::printf("%s\n", o.help().c_str());
        return a.count("help") ? 0 : 2;
    }
    std::vector<int> counts;
    for (const auto& s : split_list(a["streams"].as<std::string>())) counts.push_back(std::stoi(s));
    const int n_prompt = a["prompt"].as<int>(), n_gen = a["gen"].as<int>(), n_long = a["long"].as<int>();
    model_options mo;
    mo.path = a["model"].as<std::string>();
    mo.numa_pool = a["numa-pool"].as<std::string>();
    if (a.count("threads")) mo.pool_workers = a["threads"].as<int>();
    mo.n_batch = a["batch"].as<int>();
    mo.prefill_pace = a["prefill-pace"].as<double>();
    mo.phase_timing = a.count("breakdown") > 0;
    mo.repack = a.count("no-repack") == 0;
    // The streams decode on while the long prompt is admitted (thousands of tokens at one stream).
    mo.n_ctx = n_prompt + n_gen + 64 + (n_long > 0 ? n_long + 4096 : 0);
    const int n_more = mo.n_ctx - n_prompt - n_gen - 8;
    mo.cache_ram_mib = 0;
    const auto m = model::load(mo);
    int threads = 0;
    for (const auto& s : m->info().pool_slices) threads += s.threads;
    std::printf("model %s, %d threads, --batch %d, --prefill-pace %g; each stream: %d-token prompt, %d decoded tokens; long prompt %d "
                "tokens\n\n", mo.path.c_str(), threads, mo.n_batch, mo.prefill_pace, n_prompt, n_gen, n_long);
    std::printf("| streams | aggregate decode tok/s | per stream tok/s | vs 1 stream | TTFT ms | MiB read per step | "
                "rows per step | bound tok/s (read GB/s before / after) | aggregate / bound | gap p50/p99 ms | with long prompt "
                "p50/p99 ms (gaps) | p99 / solo p99 | long prompt s |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    double one = 0;
    std::vector<row> rows;
    for (int n : counts) {
        const row r = measure(m, n, n_prompt, n_gen, n_long, n_more, std::max(threads, 1));
        if (n == 1 || one == 0) one = r.aggregate / n;
        std::printf("| %d | %.1f | %.1f | %.2fx | %.1f | %.1f | %.2f | %.1f (%.1f / %.1f) | %.0f %% | %.1f / %.1f | %.1f / %.1f (%d) | "
                    "%.2fx | %.1f |\n",
                    n, r.aggregate, r.per_stream, r.aggregate / one, r.ttft_ms, r.bytes_per_step / (1 << 20),
                    r.rows_per_step, r.bound, r.bw_before, r.bw_after, 100 * r.aggregate / r.bound, r.gap_p50, r.gap_p99, r.long_p50,
                    r.long_p99, r.n_during, r.gap_p99 > 0 ? r.long_p99 / r.gap_p99 : 0.0, r.long_s);
        std::fflush(stdout);
        rows.push_back(r);
    }
    if (!mo.phase_timing) return 0;
    // Each part's time next to the time its bytes take at the row's read bandwidth: where the aggregate
    // falls short of the bound, the parts whose time exceeds their bytes' time say where.
    std::printf("\nms per decode step by part, and in brackets the ms its bytes take at the row's read bandwidth:\n\n| part |");
    for (const row& r : rows) std::printf(" %d streams |", r.streams);
    std::printf("\n|---|");
    for (size_t i = 0; i < rows.size(); ++i) std::printf("---|");
    std::printf("\n");
    const auto byte_ms = [](const row& r, uint64_t bytes) { return r.bw_gbs > 0 ? 1e3 * double(bytes) / (r.bw_gbs * 1e9) : 0.0; };
    for (size_t p = 0; !rows.empty() && p < rows.back().parts.size(); ++p) {
        std::printf("| %s |", rows.back().parts[p].name.c_str());
        for (const row& r : rows) {
            if (p >= r.parts.size()) std::printf(" - |");
            else if (r.parts[p].bytes == 0) std::printf(" %.2f |", r.parts[p].ms);
            else std::printf(" %.2f (%.2f) |", r.parts[p].ms, byte_ms(r, r.parts[p].bytes));
        }
        std::printf("\n");
    }
    std::printf("| all parts |");
    for (const row& r : rows) {
        double ms = 0;
        uint64_t bytes = 0;
        for (const phase_time& t : r.parts) ms += t.ms, bytes += t.bytes;
        std::printf(" %.2f (%.2f) |", ms, byte_ms(r, bytes));
    }
    std::printf("\n");
    return 0;
}

register_mode reg{{"batch", "concurrent generations in the step batcher: aggregate tok/s, TTFT, bytes per step vs "
                            "bandwidth, inter-token gaps while a long prompt arrives",
                   &run}};

}  // namespace
}  // namespace strata::bench
