// strata-gpu-bench: prompt and decode tokens/s of a model CPU-only and hybrid at given residencies,
// as one markdown table (tools/gpu-check.sh runs it on the bench preset). Until strata-bench model
// has --gpu/--expert-cache arms, this is the hybrid benchmark.
//
// Usage: strata-gpu-bench MODEL N_PROMPT N_GEN ARM...   (ARM: cpu | a residency in percent, e.g. 50)
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include <spdlog/fmt/fmt.h>

#include "gguf/gguf_reader.hpp"
#include "strata/engine.hpp"

namespace {

// Bytes of every routed expert tensor (blk.N.ffn_{gate,up,down}_exps or per-expert tensors).
double expert_bytes(const std::string& path) {
    const auto f = strata::gguf::reader::open(path);
    double bytes = 0;
    for (const auto& t : f.tensors())
        if (t.name.find("_exps.") != std::string::npos ||
            (t.name.find(".ffn_") != std::string::npos && t.name.find("shexp") == std::string::npos &&
             t.name.find("ffn_gate_inp") == std::string::npos && t.name.find("ffn_norm") == std::string::npos))
            bytes += double(t.n_bytes);
    return bytes;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 5) {
        std::fprintf(stderr, "usage: %s MODEL N_PROMPT N_GEN ARM... (ARM: cpu | residency percent)\n", argv[0]);
        return 2;
    }
    try {
        const std::string path = argv[1];
        const int n_prompt = std::atoi(argv[2]), n_gen = std::atoi(argv[3]);
        const double experts = expert_bytes(path);
        std::printf("| arm | expert cache GiB | prompt tok/s | decode tok/s | VRAM hit rate |\n|---|---|---|---|---|\n");
        for (int i = 4; i < argc; ++i) {
            const std::string arm = argv[i];
            strata::model_options o;
            o.path = path;
            o.n_ctx = n_prompt + n_gen + 8;
            std::string cache = "-";
            if (arm != "cpu") {
                const double pct = std::atof(arm.c_str());
                o.gpu = 0;
                // 100 %: everything (auto caps at the model's experts); else that share of the expert bytes.
                o.expert_cache = pct >= 100 ? "auto" : fmt::format("{:.4f}", experts * pct / 100.0 / double(1 << 30));
                cache = o.expert_cache;
            }
            auto m = strata::model::load(o);
            std::vector<int32_t> prompt;
            for (int t = 0; t < n_prompt; ++t) prompt.push_back((t * 7919 + 13) % (m->info().n_vocab - 3));
            strata::generation_options g;
            g.max_tokens = n_gen;
            g.ignore_eos = true;
            g.sampling.temperature = 0;
            strata::session(m).generate(prompt, g);  // warm-up
            const strata::generation_result r = strata::session(m).generate(prompt, g);
            const strata::expert_stats st = m->statistics();
            std::printf("| %s | %s | %.1f | %.2f | %s |\n", arm == "cpu" ? "CPU only" : (arm + " % resident").c_str(),
                        cache.c_str(), r.time.prompt_per_second(), r.time.predicted_per_second(),
                        st.expert_lookups ? fmt::format("{:.1f} %", 100.0 * st.hit_rate()).c_str() : "-");
            std::fflush(stdout);
        }
    } catch (const std::exception& e) {
        std::fprintf(stderr, "strata-gpu-bench: %s\n", e.what());
        return 1;
    }
    return 0;
}
