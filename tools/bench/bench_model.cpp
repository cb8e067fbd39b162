// strata-bench model -m FILE: prompt and decode tokens/s over repeats (median and range) for arms of
// --numa-pool, --pool-workers and --kv, with the weight bytes a decode token reads and the bandwidth
// that implies, next to the read bandwidth measured in the same run.
#include <cstdio>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <cxxopts.hpp>
#include <nlohmann/json.hpp>
#include <spdlog/fmt/fmt.h>

#include "bandwidth.hpp"
#include "gguf/gguf_reader.hpp"
#include "model_info.hpp"
#include "modes.hpp"
#include "strata/engine.hpp"

namespace strata::bench {
namespace {

// Bytes of weights one decode token reads: every dense tensor, n_used / n_expert of each routed
// expert tensor (each token reads its experts' whole matrices), one embedding row.
double bytes_per_token(const gguf::reader& f, const model_info& info) {
    double bytes = 0;
    for (const auto& t : f.tensors()) {
        const std::string_view cls = tensor_class(t.name);
        if (cls == "embeddings")
            bytes += double(t.n_bytes) / double(t.ne[1]);
        else if (cls == "experts")
            bytes += double(t.n_bytes) * info.n_expert_used / info.n_expert;
        else
            bytes += double(t.n_bytes);
    }
    if (!f.find_tensor("output.weight"))  // tied head reads the whole embedding matrix
        bytes += double(f.find_tensor("token_embd.weight")->n_bytes);
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
    std::string label() const {
        return fmt::format("pool {} workers {} kv {}", numa_pool.empty() ? "default" : numa_pool,
                           workers ? std::to_string(*workers) : "default", kv);
    }
};

int run(int argc, char** argv) {
    cxxopts::Options opts("strata-bench model", "Prompt and decode tokens/s of a GGUF model");
    opts.add_options()
        ("m,model", "GGUF model file", cxxopts::value<std::string>())
        ("p,n-prompt", "prompt tokens", cxxopts::value<int>()->default_value("512"))
        ("n,n-gen", "decode tokens", cxxopts::value<int>()->default_value("64"))
        ("r,repetitions", "repeats per arm", cxxopts::value<int>()->default_value("3"))
        ("numa-pool", "comma list of --numa-pool values (auto, off, on, test, test:N)",
         cxxopts::value<std::string>()->default_value(""))
        ("pool-workers", "comma list of worker counts", cxxopts::value<std::string>()->default_value(""))
        ("kv", "comma list of KV cache types", cxxopts::value<std::string>()->default_value("f16"))
        ("b,batch", "prompt batch size", cxxopts::value<int>()->default_value("512"))
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

    std::vector<arm> arms;
    std::vector<std::string> pools = split_list(a["numa-pool"].as<std::string>());
    if (pools.empty()) pools.push_back("");
    std::vector<std::optional<int>> workers;
    for (const auto& w : split_list(a["pool-workers"].as<std::string>())) workers.push_back(std::stoi(w));
    if (workers.empty()) workers.push_back(std::nullopt);
    for (const auto& p : pools)
        for (const auto& w : workers)
            for (const auto& kv : split_list(a["kv"].as<std::string>())) arms.push_back({p, w, kv});

    const gguf::reader file = gguf::reader::open(path);
    nlohmann::ordered_json out = nlohmann::ordered_json::array();
    std::string table = "| arm | threads | prompt tok/s | decode tok/s | GB/s read by decode | read bandwidth GB/s | ratio |\n"
                        "|---|---|---|---|---|---|---|\n";
    for (size_t ai = 0; ai < arms.size(); ++ai) {
        const arm& arm = arms[ai];
        model_options mo;
        mo.path = path;
        mo.numa_pool = arm.numa_pool;
        mo.pool_workers = arm.workers;
        mo.kv_type = arm.kv;
        mo.n_batch = a["batch"].as<int>();
        mo.n_ctx = std::max(n_prompt + 8, n_gen + 8);
        const auto m = model::load(mo);
        int threads = 0;
        for (const auto& s : m->info().pool_slices) threads += s.threads;
        std::mt19937 rng(7);
        std::uniform_int_distribution<int32_t> tok(0, m->info().n_vocab - 1);
        std::vector<double> pp, tg;
        for (int r = 0; r < reps; ++r) {
            std::fprintf(stderr, "\rarm %zu/%zu (%s): repeat %d/%d ", ai + 1, arms.size(), arm.label().c_str(), r + 1,
                         reps);
            std::vector<int32_t> prompt(static_cast<size_t>(n_prompt));
            for (auto& t : prompt) t = tok(rng);
            session s(m);
            generation_options go;
            go.max_tokens = 1;
            go.sampling.temperature = 0;
            const auto pr = s.generate(prompt, go);
            pp.push_back(pr.time.prompt_per_second());
            session d(m);
            go.max_tokens = n_gen;
            go.ignore_eos = true;
            const auto dr = d.generate(std::vector<int32_t>{tok(rng)}, go);
            // The first token comes from the prompt's logits; the other n_gen - 1 each took one forward pass.
            tg.push_back((dr.time.predicted_n - 1) * 1000.0 / dr.time.predicted_ms);
        }
        const double bw = read_bandwidth_gbs(std::max(threads, 1));
        const double bpt = bytes_per_token(file, m->info());
        const figure p = summarize(pp), g = summarize(tg);
        const double implied = bpt * g.median / 1e9;
        table += fmt::format("| {} | {} | {:.1f} [{:.1f}-{:.1f}] | {:.2f} [{:.2f}-{:.2f}] | {:.2f} | {:.2f} | {:.0f} % |\n",
                             arm.label(), threads, p.median, p.lo, p.hi, g.median, g.lo, g.hi, implied, bw,
                             100.0 * implied / bw);
        out.push_back({{"arm", arm.label()}, {"threads", threads}, {"prompt_tokens", n_prompt},
                       {"decode_tokens", n_gen}, {"prompt_tps", {{"median", p.median}, {"min", p.lo}, {"max", p.hi}}},
                       {"decode_tps", {{"median", g.median}, {"min", g.lo}, {"max", g.hi}}},
                       {"bytes_per_token", bpt}, {"decode_gbs", implied}, {"read_bandwidth_gbs", bw},
                       {"bandwidth_ratio", implied / bw}});
    }
    std::fprintf(stderr, "\n");
    if (a.count("json"))
        std::printf("%s\n", out.dump(2).c_str());
    else
        std::printf("model %s: %.1f MiB of weights read per decode token\n\n%s", path.c_str(),
                    out.empty() ? 0.0 : out[0]["bytes_per_token"].get<double>() / (1 << 20), table.c_str());
    return 0;
}

register_mode reg{{"model", "prompt and decode tokens/s of a GGUF model, bytes per token vs read bandwidth", &run}};

}  // namespace
}  // namespace strata::bench
