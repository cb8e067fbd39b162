// strata-bench model -m FILE: prompt and decode tokens/s over repeats (median and range) for arms of
// --numa-pool, --pool-workers, --kv and --repack, at each --depth (tokens of context evaluated first, untimed, as
// llama-bench's -d), with the weight and KV cache bytes a decode token reads and the bandwidth that
// implies, next to the read bandwidth probed just before each decode. With --gpu N, every such arm also runs
// hybrid at each --residency (percent of the routed experts resident in VRAM), against the CPU-only run
// of the same arm, with the VRAM hit rate.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <random>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include <cxxopts.hpp>
#include <nlohmann/json.hpp>
#include <spdlog/fmt/fmt.h>

#include "bandwidth.hpp"
#include "fma_peak.hpp"
#include "gguf/gguf_reader.hpp"
#include "model_info.hpp"
#include "modes.hpp"
#include "spec_bench.hpp"
#include "strata/engine.hpp"

namespace strata::bench {
namespace {

// Rows a token gathers from qwen4exp's PLE table: one per n-gram head (the file's head vocab sizes).
size_t ple_heads(const gguf::reader& f) {
    const gguf::value* v = f.find(f.get_string("general.architecture", "") + ".ple.head_vocab_sizes");
    return v ? v->as_array("ple.head_vocab_sizes").size() : 0;
}

// Bytes one decode token reads: every dense tensor, n_used / n_expert of each routed expert tensor (each
// token reads its experts' whole matrices), one embedding row, qwen4exp's PLE rows; for hybrid models
// also the recurrent state, read and written once per token.

double bytes_per_token(const gguf::reader& f, const model_info& info) {
    double bytes = 0;
    for (const auto& t : f.tensors()) {
        const std::string_view cls = tensor_class(t.name);
        if (cls == "embeddings")
            bytes += double(t.n_bytes) / double(t.ne[1]);
        else if (t.name == "per_layer_token_embd.weight")  // qwen4exp's cold PLE table: a row per head
            bytes += double(t.n_bytes) / double(t.ne[1]) * double(ple_heads(f));
        else if (cls == "experts")
            bytes += double(t.n_bytes) * info.n_expert_used / info.n_expert;
        else
            bytes += double(t.n_bytes);
    }
    if (!f.find_tensor("output.weight"))  // tied head reads the whole embedding matrix
        bytes += double(f.find_tensor("token_embd.weight")->n_bytes);
    return bytes + 2.0 * double(info.state_bytes_per_session);
}

// What the attention of one decode token reads at a context of ctx positions: dense layers every
// position; a QSA layer whose complete blocks pass its budget only the chosen blocks' rows and its
// incomplete tail block's, plus the indexer's f32 key of every complete block (scored by its heads).
struct attention_reads {
    double bytes = 0;          // KV rows and indexer block keys
    double positions = 0;      // attended positions summed over the layers
    double indexer_flops = 0;  // the block scores' dots
};
attention_reads decode_attention_reads(const model_info& mi, double ctx) {
    attention_reads a;
    const int n_kv = std::max(mi.n_kv_layers, 1);
    const double row = double(mi.kv_bytes_per_token) / n_kv;  // one position of one layer
    const int n_sparse = std::min(static_cast<int>(mi.qsa_ratios.size()), n_kv);
    a.positions = ctx * (n_kv - n_sparse);
    for (int i = 0; i < n_sparse; ++i) {
        const int r = mi.qsa_ratios[static_cast<size_t>(i)];
        const double n_blocks = std::floor(ctx / r), budget = std::floor(double(mi.qsa_top_k) / r);
        if (n_blocks <= budget) {
            a.positions += ctx;
            continue;
        }
        a.positions += budget * r + (ctx - n_blocks * r);
        a.bytes += n_blocks * mi.qsa_key_length * sizeof(float);
        a.indexer_flops += 2.0 * n_blocks * mi.qsa_heads * mi.qsa_key_length;
    }
    a.bytes += row * a.positions;
    return a;
}

// Bytes of every routed expert tensor: what 100 % residency puts in VRAM.
double routed_expert_bytes(const gguf::reader& f) {
    double bytes = 0;
    for (const auto& t : f.tensors())
        if (tensor_class(t.name) == "experts") bytes += double(t.n_bytes);
    return bytes;
}

struct figure {
    double median = 0, lo = 0, hi = 0;
};

figure summarize(const std::vector<double>& v) {
    return {median(v), *std::min_element(v.begin(), v.end()), *std::max_element(v.begin(), v.end())};
}

struct arm {
    std::string numa_pool;
    std::optional<int> workers;
    std::string kv;
    bool repack = true;
    std::optional<int> residency;  // percent of routed experts in VRAM; nullopt: CPU only
    std::string label() const {    // the CPU arm and its hybrid arms share it
        return fmt::format("pool {} workers {} kv {}{}", numa_pool.empty() ? "default" : numa_pool,
                           workers ? std::to_string(*workers) : "default", kv, repack ? "" : " no-repack");
    }
    std::string residency_label() const { return residency ? fmt::format("{} %", *residency) : "CPU only"; }
};

// "cpu,100,50,20" -> {nullopt, 100, 50, 20}; the CPU-only arm always comes first (the baseline).
std::vector<std::optional<int>> parse_residency(const std::string& list, int gpu) {
    std::vector<std::optional<int>> out{std::nullopt};
    for (const auto& item : split_list(list)) {
        if (item == "cpu") continue;
        std::size_t used = 0;
        int pct = -1;
        try {
            pct = std::stoi(item, &used);
        } catch (const std::exception&) {
        }
        if (used != item.size() || pct < 0 || pct > 100)
            throw std::invalid_argument("--residency '" + item + "' must be cpu or a percentage from 0 to 100");
        if (gpu < 0) throw std::invalid_argument("--residency " + item + " needs --gpu N");
        out.push_back(pct);
    }
    return out;
}

// --expert-cache for a residency: 100 % is "auto" (the engine caps it at the model's experts), less
// is that share of the routed expert bytes in GiB.
std::string expert_cache_for(int residency, double expert_bytes) {
    if (residency >= 100) return "auto";
    return fmt::format("{:.4f}", expert_bytes * residency / 100.0 / double(1 << 30));
}

int pool_threads(const model_info& info) {
    int threads = 0;
    for (const auto& s : info.pool_slices) threads += s.threads;
    return threads;
}

struct measured {
    int depth = 0;
    int threads = 0;
    figure prompt, decode;
    std::optional<double> hit_rate;  // hybrid only
    std::vector<phase_time> phases;  // --breakdown: the decode passes of every repeat, by part
    int passes = 0;
    std::vector<double> decode_each;  // decode tok/s of each repeat, in order
    std::vector<double> read_each;    // CPU arms: the read bandwidth probed just before each repeat's decode
    std::vector<double> fma_each;     // CPU arms at depth: one thread's FMA peak, probed likewise
    // qwen4exp: the cold PLE table during the timed decodes (deltas), and its residency after them.
    uint64_t cold_tokens = 0, cold_rows = 0, cold_faults = 0, cold_resident = 0, cold_mapped = 0;
    std::vector<phase_time> prompt_phases;  // --breakdown: the timed prompts of every repeat, by part
    int prompt_tokens = 0;
};

// sum += more, part by part.
void add_phases(std::vector<phase_time>& sum, const std::vector<phase_time>& more) {
    if (sum.empty()) {
        sum = more;
        return;
    }
    for (size_t i = 0; i < sum.size() && i < more.size(); ++i) {
        sum[i].ms += more[i].ms;
        sum[i].bytes += more[i].bytes;
    }
}

// Figures at each depth (ascending) on one session: the context at depth D is the first D tokens of
// one random sequence, evaluated untimed (only the tokens past the previous depth, thanks to prefix
// reuse). Each repeat then times -p new tokens after those D (prompt tok/s) and -n tokens decoded after
// them (decode tok/s; the first comes from the prompt's logits, the other n - 1 each take a forward
// pass at depth D + 1 .. D + n - 1). probe, when given, is called just before each timed decode: the
// machine's read bandwidth at that moment, the base of that repeat's ratio; so is fma_probe at depths
// above 0 (one thread's FMA peak, the base of the FMA-aware bound). synthetic: each depth's
// context is not evaluated but filled with pseudo-random state (session::fill_synthetic).
std::vector<measured> measure(const std::shared_ptr<model>& m, int n_prompt, int n_gen, int reps,
                              const std::vector<int>& depths, const std::string& what,
                              const std::function<double()>& probe, const std::function<double()>& fma_probe,
                              bool synthetic) {
    const int threads = pool_threads(m->info());
    std::mt19937 rng(7);
    std::uniform_int_distribution<int32_t> tok(0, m->info().n_vocab - 1);
    generation_options go;
    go.sampling.temperature = 0;
    go.ignore_eos = true;
    go.max_tokens = 2;
    session(m).generate(std::vector<int32_t>(8, tok(rng)), go);  // warm-up: first-use costs stay out of the figures
    std::vector<int32_t> context(static_cast<size_t>(depths.back()));
    for (auto& t : context) t = tok(rng);
    session s(m);
    std::vector<measured> out;
    for (const int depth : depths) {
        std::vector<phase_time> phases, prompt_phases;
        int passes = 0, prompt_tokens = 0;
        uint64_t cold_tokens = 0, cold_rows = 0, cold_faults = 0, cold_resident = 0, cold_mapped = 0;
        const std::span<const int32_t> before(context.data(), static_cast<size_t>(depth));
        go.max_tokens = 1;
        if (depth > 0 && synthetic) {
            std::fprintf(stderr, "\r%s: filling %d tokens of context synthetically ", what.c_str(), depth);
            s.fill_synthetic(before);
        } else if (depth > 0) {
            std::fprintf(stderr, "\r%s: evaluating %d tokens of context ", what.c_str(), depth);
            s.generate(before, go);
        }
        const expert_stats stats0 = m->info().gpu_hybrid ? m->statistics() : expert_stats{};
        std::vector<double> pp, tg, rd, fm;
        for (int r = 0; r < reps; ++r) {
            std::fprintf(stderr, "\r%s: depth %d, repeat %d/%d ", what.c_str(), depth, r + 1, reps);
            std::vector<int32_t> prompt(before.begin(), before.end());
            for (int i = 0; i < n_prompt; ++i) prompt.push_back(tok(rng));
            go.max_tokens = 1;
            const generation_result pr = s.generate(prompt, go);
            if (pr.time.cache_n < depth)
                throw std::logic_error(fmt::format("depth {}: the session reused {} tokens of context", depth,
                                                   pr.time.cache_n));
            pp.push_back(pr.time.prompt_per_second());
            add_phases(prompt_phases, pr.time.prompt_phases);
            prompt_tokens += pr.time.prompt_n;
            prompt.resize(before.size());
            prompt.push_back(tok(rng));
            go.max_tokens = n_gen;
            if (probe) rd.push_back(probe());
            // A peak of 0 (the scalar kernels) leaves fm short, so no FMA-aware bound is printed.
            if (fma_probe && depth > 0)
                if (const double gflops = fma_probe(); gflops > 0) fm.push_back(gflops);
            const std::vector<cold_region_stats> cold0 = m->cold_regions();
            const generation_result dr = s.generate(prompt, go);
            for (const cold_region_stats& c1 : m->cold_regions()) {
                cold_tokens += c1.tokens - cold0[0].tokens;
                cold_rows += c1.rows_read - cold0[0].rows_read;
                cold_faults += c1.page_faults - cold0[0].page_faults;
                cold_resident = c1.bytes_resident;
                cold_mapped = c1.bytes_mapped;
            }
            tg.push_back((dr.time.predicted_n - 1) * 1000.0 / dr.time.predicted_ms);
            add_phases(phases, dr.time.decode_phases);
            passes += dr.time.decode_passes;
        }
        measured d{depth, threads, summarize(pp), summarize(tg), std::nullopt, std::move(phases), passes, tg, rd, fm,
                   cold_tokens, cold_rows, cold_faults, cold_resident, cold_mapped};
        if (m->info().gpu_hybrid) {
            const expert_stats stats1 = m->statistics();
            const uint64_t lookups = stats1.expert_lookups - stats0.expert_lookups;
            d.hit_rate = lookups ? double(stats1.vram_hits - stats0.vram_hits) / double(lookups) : 0.0;
        }
        d.prompt_phases = std::move(prompt_phases);
        d.prompt_tokens = prompt_tokens;
        out.push_back(d);
    }
    return out;
}

// "0,4096,16384" -> {0, 4096, 16384}, ascending without repeats.
std::vector<int> parse_depths(const std::string& list) {
    std::vector<int> out;
    for (const auto& item : split_list(list)) {
        std::size_t used = 0;
        int d = -1;
        try {
            d = std::stoi(item, &used);
        } catch (const std::exception&) {
        }
        if (used != item.size() || d < 0) throw std::invalid_argument("--depth '" + item + "' must be a token count >= 0");
        out.push_back(d);
    }
    if (out.empty()) out.push_back(0);
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
    return out;
}

int run(int argc, char** argv) {
    cxxopts::Options opts("strata-bench model", "Prompt and decode tokens/s of a GGUF model");
    opts.add_options()
        ("m,model", "GGUF model file", cxxopts::value<std::string>())
        ("p,n-prompt", "prompt tokens", cxxopts::value<int>()->default_value("512"))
        ("n,n-gen", "decode tokens", cxxopts::value<int>()->default_value("64"))
        ("r,repetitions", "repeats per arm and depth", cxxopts::value<int>()->default_value("3"))
        ("d,depth", "comma list of context depths: tokens evaluated (untimed) before the timed prompt and decode",
         cxxopts::value<std::string>()->default_value("0"))
        ("fill", "real | synthetic: how the depth's context is made: evaluated, or its KV, indexer keys and recurrent "
                 "state written with pseudo-random values without computing them (CPU arms; times deep decode fast)",
         cxxopts::value<std::string>()->default_value("real"))
        ("numa-pool", "comma list of --numa-pool values (auto, off, on, test, test:N)",
         cxxopts::value<std::string>()->default_value(""))
        ("pool-workers", "comma list of worker counts", cxxopts::value<std::string>()->default_value(""))
        ("kv", "comma list of KV cache types", cxxopts::value<std::string>()->default_value("f16"))
        ("repack", "comma list of on | off: experts repacked for the prompt GEMM kernels (off: --no-repack)",
         cxxopts::value<std::string>()->default_value("on"))
        ("b,batch", "prompt batch size", cxxopts::value<int>()->default_value("512"))
        ("gpu", "CUDA device for the hybrid arms (-1: CPU only)", cxxopts::value<int>()->default_value("-1"))
        ("residency", "comma list of hybrid arms: percent of routed experts resident in VRAM (100 = "
                      "--expert-cache auto), cpu for the CPU-only baseline, which always runs; default with "
                      "--gpu: cpu,100,50,20",
         cxxopts::value<std::string>()->default_value(""))
        ("breakdown", "time each part of the decode forward passes (CPU arms): ms, MiB and GB/s per token by part")
        ("spec", "speculative decoding instead: plain, n-gram, auto, MTP (files with an MTP block) and forced-draft arms, verification cost "
                 "k = 1..8, break-even acceptance, speed vs forced acceptance (-n tokens, -r repeats, -p prompt)")
        ("json", "print JSON instead of a markdown table")
        ("h,help", "show help");
    const auto a = opts.parse(argc, argv);
    if (a.count("help") || !a.count("model")) {
        std::fprintf(stderr, "%s\n", opts.help().c_str());
        return a.count("help") ? 0 : 2;
    }
    const std::string path = a["model"].as<std::string>();
    const int n_prompt = a["n-prompt"].as<int>(), n_gen = a["n-gen"].as<int>(), reps = a["repetitions"].as<int>();
    if (n_prompt < 1 || n_gen < 2 || reps < 1)
        throw std::invalid_argument("-p must be >= 1, -n >= 2 and -r >= 1");
    if (a.count("spec")) return run_spec_bench({path, n_gen, reps, std::min(n_prompt, 256), 8});
    const int gpu = a["gpu"].as<int>();
    std::string residency_list = a["residency"].as<std::string>();
    if (residency_list.empty() && gpu >= 0) residency_list = "cpu,100,50,20";
    const bool hybrid = gpu >= 0;
    const std::vector<int> depths = parse_depths(a["depth"].as<std::string>());
    const std::string fill = a["fill"].as<std::string>();
    if (fill != "real" && fill != "synthetic")
        throw std::invalid_argument("--fill takes real or synthetic, got '" + fill + "'");
    const bool synthetic = fill == "synthetic";
    if (synthetic && hybrid) throw std::invalid_argument("--fill synthetic runs CPU arms only (not with --gpu)");

    std::vector<arm> arms;
    std::vector<std::string> pools = split_list(a["numa-pool"].as<std::string>());
    if (pools.empty()) pools.push_back("");
    std::vector<std::optional<int>> workers;
    for (const auto& w : split_list(a["pool-workers"].as<std::string>())) workers.push_back(std::stoi(w));
    if (workers.empty()) workers.push_back(std::nullopt);
    const auto residencies = parse_residency(residency_list, gpu);
    for (const auto& p : pools)
        for (const auto& w : workers)
            for (const auto& kv : split_list(a["kv"].as<std::string>()))
                for (const auto& rp : split_list(a["repack"].as<std::string>())) {
                    if (rp != "on" && rp != "off")
                        throw std::invalid_argument("--repack takes on or off, got '" + rp + "'");
                    for (const auto& res : residencies) arms.push_back({p, w, kv, rp == "on", res});
                }

    const gguf::reader file = gguf::reader::open(path);
    const double expert_bytes = routed_expert_bytes(file);
    nlohmann::ordered_json out = nlohmann::ordered_json::array();
    std::string table = hybrid ? "| arm | depth | residency | expert cache GiB | threads | prompt tok/s | decode tok/s "
                                 "| decode vs CPU | VRAM hit rate | MiB read per decode token (weights + KV) "
                                 "| GB/s read by decode | read bandwidth GB/s | ratio |\n"
                                 "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n"
                               : "| arm | depth | threads | prompt tok/s | decode tok/s | MiB read per decode token "
                                 "(weights + KV) | GB/s read by decode | read bandwidth GB/s | ratio |\n"
                                 "|---|---|---|---|---|---|---|---|---|\n";
    std::map<std::pair<std::string, int>, double> cpu_decode;  // (arm label, depth) -> CPU-only decode tok/s
    std::optional<std::string> cpu_only_reason;
    std::vector<std::string> skipped;          // arms not run because the engine ran CPU-only
    std::vector<std::string> notes;            // lines after the table (JSON: {"note": ...} entries)
    double cpu_bytes_per_token = 0;
    std::string kv_per_position;               // the header's KV cache bytes per token of context, per --kv
    std::string breakdowns;                    // --breakdown tables, after the main one
    for (size_t ai = 0; ai < arms.size(); ++ai) {
        const arm& arm = arms[ai];
        const std::string what = fmt::format("arm {}/{} ({}, {})", ai + 1, arms.size(), arm.label(), arm.residency_label());
        if (arm.residency && cpu_only_reason) {
            skipped.push_back(arm.residency_label());
            continue;
        }
        model_options mo;
        mo.path = path;
        mo.numa_pool = arm.numa_pool;
        mo.pool_workers = arm.workers;
        mo.kv_type = arm.kv;
        mo.repack = arm.repack;
        mo.n_batch = a["batch"].as<int>();
        mo.n_ctx = depths.back() + std::max(n_prompt, n_gen) + 8;  // set, not the file's: the depth needs it
        mo.cache_ram_mib = 0;  // no conversation snapshots: each timed prompt pays only its own evaluation
        mo.phase_timing = a.count("breakdown") > 0;
        if (arm.residency) {
            mo.gpu = gpu;
            mo.expert_cache = expert_cache_for(*arm.residency, expert_bytes);
        }
        std::shared_ptr<model> m;
        try {
            m = model::load(mo);
        } catch (const std::exception& e) {
            if (!arm.residency) throw;
            notes.push_back(fmt::format("{} did not load with --expert-cache {}: {}", what, mo.expert_cache, e.what()));
            continue;
        }
        if (arm.residency && !m->info().gpu_hybrid) {  // no usable device: the same for every hybrid arm
            cpu_only_reason = m->info().gpu_cpu_only_reason;
            skipped.push_back(arm.residency_label());
            continue;
        }
        if (depths.back() + std::max(n_prompt, n_gen) > m->info().n_ctx_train && m->info().n_ctx_train > 0)
            notes.push_back(fmt::format("{}: depth {} and {} tokens pass the file's training context of {} tokens.",
                                        what, depths.back(), std::max(n_prompt, n_gen), m->info().n_ctx_train));
        // Read bandwidth on the arm's threads, once per arm: bytes from RAM per token mean something only
        // when every weight is read there (CPU-only arms).
        const std::string kv_line = fmt::format("{:.2f} KiB ({})", double(m->info().kv_bytes_per_token) / 1024, arm.kv);
        if (kv_per_position.find(kv_line) == std::string::npos)
            kv_per_position += (kv_per_position.empty() ? "" : ", ") + kv_line;
        // Probed on the arm's threads just before each repeat's decode (the machine's bandwidth and speed
        // drift over minutes): each repeat's decode is compared with its own probes, and the ratio is
        // their median.
        const int probe_threads = std::max(pool_threads(m->info()), 1);
        std::function<double()> probe, fma_probe;
        if (!arm.residency) {
            probe = [probe_threads] { return read_bandwidth_gbs(probe_threads); };
            fma_probe = fma_peak_gflops;
        }
        const std::vector<measured> runs =
            measure(m, n_prompt, n_gen, reps, depths, what, probe, fma_probe, synthetic);
        for (const measured& r : runs) {
            const figure &p = r.prompt, &g = r.decode;
            nlohmann::ordered_json row = {{"arm", arm.label()}, {"depth", r.depth}, {"fill", fill}, {"threads", r.threads},
                                          {"prompt_tokens", n_prompt}, {"decode_tokens", n_gen},
                                          {"prompt_tps", {{"median", p.median}, {"min", p.lo}, {"max", p.hi}}},
                                          {"decode_tps", {{"median", g.median}, {"min", g.lo}, {"max", g.hi}}}};
            const std::string tps = fmt::format("{:.1f} [{:.1f}-{:.1f}] | {:.2f} [{:.2f}-{:.2f}]", p.median, p.lo,
                                                p.hi, g.median, g.lo, g.hi);
            if (!arm.residency) cpu_decode[{arm.label(), r.depth}] = g.median;
            // KV read by the timed decode passes, at positions depth + 1 .. depth + n - 1: their mean context.
            const attention_reads reads = decode_attention_reads(m->info(), r.depth + 1 + n_gen / 2.0);
            const double kv_bpt = reads.bytes;
            std::string bandwidth = "- | - | - | -";
            if (!arm.residency) {
                const double bpt = bytes_per_token(file, m->info());
                cpu_bytes_per_token = bpt;
                const double implied = (bpt + kv_bpt) * g.median / 1e9;
                std::vector<double> ratios;
                for (size_t i = 0; i < r.decode_each.size(); ++i)
                    ratios.push_back((bpt + kv_bpt) * r.decode_each[i] / 1e9 / r.read_each[i]);
                const figure rf = summarize(ratios), bf = summarize(r.read_each);
                const double bw = bf.median;
                bandwidth = fmt::format("{:.1f} + {:.1f} | {:.2f} | {:.2f} | {:.0f} %", bpt / (1 << 20),
                                        kv_bpt / (1 << 20), implied, bw, 100.0 * rf.median);
                if (ratios.size() > 1) bandwidth += fmt::format(" [{:.0f}-{:.0f}]", 100.0 * rf.lo, 100.0 * rf.hi);
                if (bf.hi - bf.lo > 0.1 * bw)
                    notes.push_back(fmt::format("{} at depth {}: the read bandwidth ranged {:.1f}-{:.1f} GB/s over the "
                                                "repeats; each repeat's decode is compared with the probe just before it.",
                                                arm.label(), r.depth, bf.lo, bf.hi));
                row.update({{"bytes_per_token", bpt}, {"kv_bytes_per_token", kv_bpt}, {"decode_gbs", implied},
                            {"read_bandwidth_gbs", bw}, {"read_bandwidth_each_gbs", r.read_each},
                            {"decode_tps_each", r.decode_each}, {"bandwidth_ratio", rf.median},
                            {"bandwidth_ratio_each", ratios}});
                // Attention's f32 arithmetic per query head and position of context, on every layer:
                // 4 head_dim flops (2 with an int8 cache, whose scores are int8 dot products); latent
                // attention scores the latent and the RoPE key and sums latents, 2 (2 lora + n_rot). At
                // small GQA groups it takes longer on the FMA units than its KV takes to read.
                const model_info& mi = m->info();
                const double per_head = mi.kv_lora_rank > 0 ? 2.0 * (2 * mi.kv_lora_rank + mi.n_rot)
                                                            : (arm.kv == "int8" ? 2.0 : 4.0) * mi.head_dim;
                const double attn_flops = per_head * mi.n_head * reads.positions + reads.indexer_flops;
                if (r.depth > 0 && r.fma_each.size() == r.decode_each.size()) {
                    const int threads = std::max(r.threads, 1);
                    // Seconds of attention FMA work per token at a one-thread peak, on every thread.
                    const auto fma_seconds = [&](double gflops) { return attn_flops / (gflops * 1e9 * threads); };
                    // Seconds per token at a read bandwidth and FMA peak: the weights, then the longer of
                    // KV read and FMA work.
                    const auto bound_at = [&](double gbs, double gflops) {
                        return (bpt + std::max(kv_bpt, fma_seconds(gflops) * gbs * 1e9)) / (gbs * 1e9);
                    };
                    const double fma_gflops = summarize(r.fma_each).median;
                    const double fma_s = fma_seconds(fma_gflops);
                    const double bound_s = bound_at(bw, fma_gflops);
                    // Each repeat against the bound at its own probes, as the table's ratio is.
                    std::vector<double> reached;
                    for (size_t i = 0; i < r.decode_each.size(); ++i)
                        reached.push_back(r.decode_each[i] * bound_at(r.read_each[i], r.fma_each[i]));
                    const figure fr = summarize(reached);
                    notes.push_back(fmt::format(
                        "{} at depth {}: attention's {:.2f} GFLOP of f32 FMA per token take at least {:.2f} ms at {} x {:.1f} "
                        "GFLOP/s (one thread's FMA peak, the median of the probes before each repeat's decode), "
                        "against {:.2f} ms to read its KV: decode is bounded by {:.1f} tok/s (weights read + the "
                        "longer of the two, at the median probes); each repeat against the bound at its own "
                        "probes: {:.0f} % reached (median).",
                        arm.label(), r.depth, attn_flops / 1e9, 1e3 * fma_s, threads, fma_gflops,
                        1e3 * kv_bpt / (bw * 1e9), 1 / bound_s, 100.0 * fr.median));
                    row.update({{"attention_gflop_per_token", attn_flops / 1e9}, {"fma_peak_gflops", fma_gflops},
                                {"fma_peak_each_gflops", r.fma_each}, {"fma_bound_tps", 1 / bound_s},
                                {"fma_bound_ratio", fr.median}, {"fma_bound_ratio_each", reached}});
                }
            }
            if (r.passes > 0) {
                double total_ms = 0;
                for (const auto& ph : r.phases) total_ms += ph.ms;
                std::string t = fmt::format("\ndecode by part: {}, depth {}, {} passes ({:.2f} ms per token)\n\n"
                                            "| part | ms per token | share | MiB per token | GB/s |\n|---|---|---|---|---|\n",
                                            arm.label(), r.depth, r.passes, total_ms / r.passes);
                nlohmann::ordered_json parts = nlohmann::ordered_json::array();
                for (const auto& ph : r.phases) {
                    const double ms = ph.ms / r.passes, mib = double(ph.bytes) / r.passes / (1 << 20);
                    const double gbs = ph.ms > 0 ? double(ph.bytes) / (ph.ms * 1e-3) / 1e9 : 0;
                    t += fmt::format("| {} | {:.3f} | {:.1f} % | {:.1f} | {} |\n", ph.name, ms,
                                     total_ms > 0 ? 100.0 * ph.ms / total_ms : 0.0, mib,
                                     ph.bytes ? fmt::format("{:.1f}", gbs) : std::string("-"));
                    parts.push_back({{"part", ph.name}, {"ms_per_token", ms}, {"mib_per_token", mib}, {"gbs", gbs}});
                }
                if (r.cold_mapped > 0 && r.cold_tokens > 0) {
                    const double per = 1.0 / double(r.cold_tokens);
                    t += fmt::format("\nPLE table (cold, file-backed): {:.1f} rows gathered per token, {:.3f} page-cache "
                                     "misses (major faults) per token; {:.1f} of {:.1f} MiB in the page cache after.\n",
                                     double(r.cold_rows) * per, double(r.cold_faults) * per,
                                     double(r.cold_resident) / (1 << 20), double(r.cold_mapped) / (1 << 20));
                    row["ple_table"] = {{"rows_per_token", double(r.cold_rows) * per},
                                        {"page_faults_per_token", double(r.cold_faults) * per},
                                        {"bytes_resident", r.cold_resident}, {"bytes_mapped", r.cold_mapped}};
                }
                if (r.prompt_tokens > 0 && !r.prompt_phases.empty()) {
                    double prompt_ms = 0;
                    for (const auto& ph : r.prompt_phases) prompt_ms += ph.ms;
                    t += fmt::format("\nprompt by part: {}, depth {}, {} tokens ({:.2f} ms per token)\n\n"
                                     "| part | ms per token | share |\n|---|---|---|\n",
                                     arm.label(), r.depth, r.prompt_tokens, prompt_ms / r.prompt_tokens);
                    nlohmann::ordered_json prompt_parts = nlohmann::ordered_json::array();
                    for (const auto& ph : r.prompt_phases) {
                        t += fmt::format("| {} | {:.3f} | {:.1f} % |\n", ph.name, ph.ms / r.prompt_tokens,
                                         prompt_ms > 0 ? 100.0 * ph.ms / prompt_ms : 0.0);
                        prompt_parts.push_back({{"part", ph.name}, {"ms_per_token", ph.ms / r.prompt_tokens}});
                    }
                    row["prompt_breakdown"] = prompt_parts;
                }
                breakdowns += t;
                row["breakdown"] = parts;
            }
            if (!hybrid) {
                table += fmt::format("| {} | {} | {} | {} | {} |\n", arm.label(), r.depth, r.threads, tps, bandwidth);
                out.push_back(row);
                continue;
            }
            const auto base = cpu_decode.find({arm.label(), r.depth});
            const double baseline = base != cpu_decode.end() ? base->second : 0;
            const std::string cache = arm.residency ? mo.expert_cache : "-";
            table += fmt::format("| {} | {} | {} | {} | {} | {} | {} | {} | {} |\n", arm.label(), r.depth,
                                 arm.residency_label(), cache, r.threads, tps,
                                 !arm.residency ? "baseline"
                                 : baseline > 0 ? fmt::format("{:.2f}x", g.median / baseline)
                                                : "-",
                                 r.hit_rate ? fmt::format("{:.1f} %", 100.0 * *r.hit_rate) : "-", bandwidth);
            row.update({{"residency", arm.residency ? nlohmann::ordered_json(*arm.residency) : nlohmann::ordered_json("cpu")},
                        {"expert_cache", cache},
                        {"decode_vs_cpu", baseline > 0 ? g.median / baseline : 0.0},
                        {"vram_hit_rate", r.hit_rate ? nlohmann::ordered_json(*r.hit_rate) : nlohmann::ordered_json()}});
            out.push_back(row);
        }
    }
    std::fprintf(stderr, "\n");
    if (!skipped.empty()) {
        std::string list;
        for (const auto& s : skipped) list += (list.empty() ? "" : ", ") + s;
        notes.push_back(fmt::format("GPU arms skipped ({}): the engine runs CPU-only with --gpu {}: {}.", list, gpu,
                                    cpu_only_reason.value_or("")));
    }
    if (a.count("json")) {
        for (const auto& n : notes) out.push_back({{"note", n}});
        std::printf("%s\n", out.dump(2).c_str());
        return 0;
    }
    std::printf("model %s: %.1f MiB of weights read per decode token; KV cache read per token of context: %s",
                path.c_str(), cpu_bytes_per_token / (1 << 20), kv_per_position.c_str());
    if (hybrid) std::printf("; routed experts %.1f MiB (residency = that share in VRAM)", expert_bytes / (1 << 20));
    if (synthetic && depths.back() > 0)
        std::printf("\ncontext at each depth: SYNTHETIC FILL (keys, values, indexer keys and recurrent state "
                    "pseudo-random, not evaluated): the timed prompt and decode do their depth's real work, "
                    "on logits that are not the model's");
    std::printf("\n\n%s%s", table.c_str(), breakdowns.c_str());
    for (const auto& n : notes) std::printf("%s\n", n.c_str());
    return 0;
}

register_mode reg{{"model", "prompt and decode tokens/s of a GGUF model (CPU, or hybrid with --gpu), bytes per "
                            "token vs read bandwidth",
                   &run}};

}  // namespace
}  // namespace strata::bench
