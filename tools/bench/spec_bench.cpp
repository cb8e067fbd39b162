#include "spec_bench.hpp"

#include <algorithm>
#include <cstdio>
#include <map>
#include <random>
#include <stdexcept>
#include <vector>

#include <spdlog/fmt/fmt.h>

#include "gguf/gguf_reader.hpp"
#include "strata/engine.hpp"

namespace strata::bench {
namespace {

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0 : v[v.size() / 2];
}

// 1 + a + ... + a^k: tokens per verification of k drafts each accepted with probability a.
double expected(double a, int k) {
    double s = 0, t = 1;
    for (int i = 0; i <= k; ++i, t *= a) s += t;
    return s;
}

// The acceptance rate at which k drafts costing `cost` decode steps break even with plain decoding.
double break_even(double cost, int k) {
    if (cost <= 1) return 0;
    if (expected(1.0, k) <= cost) return 1;
    double lo = 0, hi = 1;
    for (int i = 0; i < 50; ++i) {
        const double mid = (lo + hi) / 2;
        (expected(mid, k) < cost ? lo : hi) = mid;
    }
    return hi;
}

struct run_result {
    double tok_s = 0;          // decode tokens per second, the first token (from the prompt) left out
    double ms = 0;
    int tokens = 0;
    int drafted = 0, accepted = 0, verifications = 0;
};

run_result run_once(session& s, const std::vector<int32_t>& prompt, const generation_options& go) {
    const generation_result r = s.generate(prompt, go);
    return {(r.time.predicted_n - 1) * 1000.0 / r.time.predicted_ms, r.time.predicted_ms, r.time.predicted_n,
            r.time.spec_drafted, r.time.spec_accepted, r.time.spec_verifications};
}

}  // namespace

int run_spec_bench(const spec_bench_options& o) {
    model_options mo;
    mo.path = o.path;
    mo.n_ctx = o.n_prompt + o.n_gen + 32;
    mo.cache_ram_mib = 0;
    const auto m = model::load(mo);
    const int n_vocab = m->info().n_vocab;
    // The prompt: a block of random tokens said twice, so the n-gram drafter has text to quote. An echo
    // file (strata-make-model --echo-cycle L) continues each run of L ids, so there the block is one
    // run (ids L .. 2L-1, clear of the special tokens at the end) and the model goes on repeating it,
    // as a model asked to repeat a code block does.
    const gguf::reader file = gguf::reader::open(o.path);
    const gguf::value* echo_key = file.find("strata.echo_cycle");
    const int echo = echo_key ? static_cast<int>(echo_key->as_u64()) : 0;
    std::vector<int32_t> prompt;
    if (echo > 0) {
        if (2 * echo > n_vocab)
            throw std::invalid_argument(fmt::format("strata.echo_cycle {} needs at least {} tokens, the file has {}",
                                                    echo, 2 * echo, n_vocab));
        while (static_cast<int>(prompt.size()) < std::max(o.n_prompt, 2 * echo))
            prompt.push_back(echo + static_cast<int32_t>(prompt.size()) % echo);
    } else {
        std::mt19937 rng(11);
        std::uniform_int_distribution<int32_t> tok(0, n_vocab - 1);
        prompt.resize(static_cast<size_t>(o.n_prompt / 2));
        for (auto& t : prompt) t = tok(rng);
        prompt.insert(prompt.end(), prompt.begin(), prompt.end());
    }

    generation_options base;
    base.max_tokens = o.n_gen;
    base.ignore_eos = true;
    base.sampling.temperature = 0;
    session s(m);
    const generation_result teacher = s.generate(prompt, base);  // also the warm-up
    std::vector<int32_t> known;
    for (const auto& t : teacher.tokens) known.push_back(t.id);

    // Arms, run in turn each repeat so that load from elsewhere falls on all of them alike.
    struct arm {
        std::string name;
        generation_options go;
        int k = 0;
        double rate = -1;  // forced acceptance rate (forced arms)
        std::vector<run_result> runs;
    };
    std::vector<arm> arms;
    const auto add = [&](std::string name, const std::string& type, int k, double rate = -1) {
        generation_options go = base;
        go.speculation.type = type;
        go.speculation.n_max = std::max(1, k);
        if (type == "forced") {
            // Each draft the known token with probability `rate`, else another token.
            std::mt19937 pick(static_cast<uint32_t>(1000 * rate) + static_cast<uint32_t>(k));
            std::uniform_real_distribution<double> u(0, 1);
            go.speculation.forced = known;
            for (auto& t : go.speculation.forced)
                if (u(pick) >= rate) t = (t + 1) % n_vocab;
        }
        arms.push_back({std::move(name), go, k, rate, {}});
    };
    // MTP arms where the file has an MTP block (a request for it is refused otherwise).
    bool has_mtp = true;
    try {
        generation_options probe = base;
        probe.max_tokens = 1;
        probe.speculation.type = "mtp";
        s.generate(prompt, probe);
    } catch (const request_error&) {
        has_mtp = false;
    }
    add("plain", "off", 0);
    add("ngram k=4", "ngram", 4);
    add(has_mtp ? "auto (mtp)" : "auto (ngram)", "auto", 4);
    if (has_mtp) {
        add("mtp k=1 min-p 0", "mtp", 1);
        add("mtp k=4 min-p 0", "mtp", 4);
        add("mtp k=4 min-p 0.5", "mtp", 4);
        arms[arms.size() - 3].go.speculation.min_p = 0;
        arms[arms.size() - 2].go.speculation.min_p = 0;
    }
    for (int k = 1; k <= o.max_k; ++k) add(fmt::format("forced k={}", k), "forced", k, 1.0);
    for (const double rate : {0.0, 0.25, 0.5, 0.75, 0.9}) add(fmt::format("forced {:.0f} % k=4", 100 * rate), "forced", 4, rate);
    for (int r = 0; r < o.reps; ++r)
        for (size_t i = 0; i < arms.size(); ++i) {
            std::fprintf(stderr, "\rrepeat %d/%d, arm %zu/%zu   ", r + 1, o.reps, i + 1, arms.size());
            arms[i].runs.push_back(run_once(s, prompt, arms[i].go));
        }
    std::fprintf(stderr, "\n");

    const auto tok_s = [](const arm& a) {
        std::vector<double> v;
        for (const auto& r : a.runs) v.push_back(r.tok_s);
        return median(v);
    };
    const double plain = tok_s(arms[0]);
    const double step_ms = 1000.0 / plain;
    std::printf("model %s: plain decode %.2f tok/s (%.2f ms a step), %d tokens, %d repeats (medians)\n", o.path.c_str(),
                plain, step_ms, o.n_gen, o.reps);
    if (echo > 0) {
        // How much of the greedy continuation repeats the prompt's run (what the n-gram drafter can quote).
        int follows = 0;
        for (size_t i = 0; i < known.size(); ++i)
            follows += known[i] == echo + static_cast<int32_t>((prompt.size() + i) % static_cast<size_t>(echo));
        std::printf("echo file (runs of %d ids): %d of %zu generated tokens repeat the prompt's block\n", echo, follows,
                    known.size());
    }
    std::printf("\n");
    std::printf("| arm | decode tok/s | vs plain | drafted | accepted | acceptance |\n|---|---|---|---|---|---|\n");
    for (const arm& a : arms) {
        const run_result& r = a.runs.back();
        std::printf("| %s | %.2f | %.2fx | %d | %d | %.0f %% |\n", a.name.c_str(), tok_s(a), tok_s(a) / plain, r.drafted,
                    r.accepted, r.drafted ? 100.0 * r.accepted / r.drafted : 0.0);
    }
    // Verification cost from the forced arms at 100 %: the steps that were not verifications each
    // took one plain step; the rest of the time is the verifications'.
    std::printf("\n| k | verification cost (decode steps) | ceiling (k+1)/cost | forced tok/s vs plain | vs ceiling | "
                "break-even acceptance |\n|---|---|---|---|---|---|\n");
    double best_ceiling = 0, best_forced = 0;
    for (const arm& a : arms) {
        if (a.rate != 1.0) continue;
        std::vector<double> costs;
        for (const auto& r : a.runs) {
            const int singles = std::max(0, r.tokens - 1 - r.verifications * (a.k + 1));
            if (r.verifications > 0) costs.push_back((r.ms - (singles + 1) * step_ms) / r.verifications / step_ms);
        }
        const double cost = median(costs);
        const double ceiling = cost > 0 ? (a.k + 1) / cost : 0;
        const double forced = tok_s(a) / plain;
        best_ceiling = std::max(best_ceiling, ceiling);
        best_forced = std::max(best_forced, forced);
        std::printf("| %d | %.2f | %.2fx | %.2fx | %.0f %% | %.0f %% |\n", a.k, cost, ceiling, forced,
                    ceiling > 0 ? 100 * forced / ceiling : 0.0, 100 * break_even(cost, a.k));
    }
    std::printf("\nteacher-forced best %.2fx plain; ceiling from the measured costs %.2fx (%.0f %% of it)\n",
                best_forced, best_ceiling, best_ceiling > 0 ? 100 * best_forced / best_ceiling : 0.0);
    return 0;
}

}  // namespace strata::bench
