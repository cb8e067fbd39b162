#include "engine_flags.hpp"

#include <cmath>

#include <spdlog/fmt/fmt.h>

namespace strata::cli {

void add_model_flags(cxxopts::Options& o) {
    o.add_options("model")
        ("m,model", "GGUF model file", cxxopts::value<std::string>())
        ("c,ctx", "context length in tokens (0: the model's training context; the KV cache grows as it fills)", cxxopts::value<int>()->default_value("0"))
        ("b,batch", "prompt tokens per forward batch", cxxopts::value<int>()->default_value("512"))
        ("prefill-pace", "while other generations decode, a step with prompt tokens takes at most F times a "
                         "decode-only step (the prompt chunk follows from measured step times; <= 1: whole --batch)",
         cxxopts::value<double>()->default_value("2"))
        ("kv", "KV cache type: f16 | int8", cxxopts::value<std::string>()->default_value("f16"))
        ("numa-pool", "CPU expert pool split across NUMA nodes: auto | off | on | test | test:N "
                      "(default: STRATA_NUMA_POOL, else auto)", cxxopts::value<std::string>())
        ("pool-workers", "worker threads of the CPU expert pool (default: TBB_NUM_THREADS, else the plan's)",
         cxxopts::value<int>())
        ("chat-template", "chat template override: a Jinja template file, or chatml | mistral | llama3", cxxopts::value<std::string>())
        ("numa-hot-node", "split-off pool: claim the resident experts on NUMA node N (N | auto: the GPU's | off)",
         cxxopts::value<std::string>()->default_value("off"))
        ("mmap-experts", "split-off pool: read routed experts from the mapped file instead of a RAM copy")
        ("no-repack", "keep the weights in the GGUF layout (default: Q2_K-Q6_K, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, "
                      "IQ4_XS, MXFP4 experts, and dense matrices without a GPU, repacked for the prompt GEMM kernels)")
        ("cache-ram", "MiB for parked conversation snapshots (default: the smaller of 25 % of MemAvailable and "
                      "8 GiB; 0: off)", cxxopts::value<int>())
        ("mem-budget", "MiB that all sessions' KV caches, recurrent-state checkpoints and conversation snapshots "
                       "share; past it snapshots are evicted, then growth is refused (default: 90 % of what the "
                       "system and the cgroup can still give after loading; 0: none)", cxxopts::value<int>())
        ("state-checkpoint-interval", "hybrid models (qwen35moe, qwen3next): checkpoint the recurrent state every N "
                                      "tokens (default 1024; 0: only where prompts' new tokens start and end)",
         cxxopts::value<int>());
    o.add_options("model")("override-pre", "pre-tokenizer to use instead of the file's tokenizer.ggml.pre (llama.cpp's "
                                           "names: llama-bpe, qwen2, deepseek-v3, ...)",
                           cxxopts::value<std::string>());
    o.add_options("rope")
        ("rope-scaling", "RoPE scaling: none | linear | yarn (default: the model's)", cxxopts::value<std::string>())
        ("rope-scale", "RoPE context scaling factor N: angles divided by N (default: the model's)",
         cxxopts::value<float>())
        ("rope-freq-base", "RoPE base frequency (default: the model's)", cxxopts::value<float>())
        ("yarn-orig-ctx", "YaRN: the model's original context (default: the model's, else its context)",
         cxxopts::value<int>())
        ("yarn-ext-factor", "YaRN extrapolation mix, 0..1 (default: 1 under yarn, else 0)", cxxopts::value<float>())
        ("yarn-attn-factor", "YaRN scale on cos and sin (default: 1)", cxxopts::value<float>())
        ("yarn-beta-fast", "YaRN low correction dim (default: 32)", cxxopts::value<float>())
        ("yarn-beta-slow", "YaRN high correction dim (default: 1)", cxxopts::value<float>());
    o.add_options("gpu")
        ("gpu", "CUDA device for the hybrid mode (-1: CPU only)", cxxopts::value<int>()->default_value("-1"))
        ("expert-cache", "VRAM for routed experts: auto | GiB", cxxopts::value<std::string>()->default_value("auto"))
        ("vram-reserve-mib", "VRAM left free by --expert-cache auto", cxxopts::value<int>()->default_value("512"))
        ("gpu-sessions", "sessions whose KV caches VRAM holds at once (the rest goes to experts)",
         cxxopts::value<int>()->default_value("1"))
        ("expert-profile", "fill the VRAM expert cache from this profile", cxxopts::value<std::string>())
        ("profile-save", "write the routed counts per layer and expert here when the model unloads",
         cxxopts::value<std::string>())
        ("adapt-every", "decode steps between adaptive expert swaps (0: off)", cxxopts::value<int>()->default_value("0"))
        ("adapt-swaps", "experts swapped in per adaptation at most", cxxopts::value<int>()->default_value("4"))
        ("adapt-async", "1: expert copies land in the background, off the decode path",
         cxxopts::value<int>()->default_value("0"));
}

void add_sampling_flags(cxxopts::Options& o) {
    o.add_options("sampling")
        ("temp", "temperature (0: greedy)", cxxopts::value<float>()->default_value("0.8"))
        ("top-k", "top-k (0: off)", cxxopts::value<int>()->default_value("40"))
        ("top-p", "top-p (1: off)", cxxopts::value<float>()->default_value("0.95"))
        ("min-p", "min-p (0: off)", cxxopts::value<float>()->default_value("0.05"))
        ("repeat-penalty", "repetition penalty (1: off)", cxxopts::value<float>()->default_value("1.0"))
        ("repeat-last-n", "tokens the repetition penalty looks back at", cxxopts::value<int>()->default_value("64"))
        ("presence-penalty", "presence penalty", cxxopts::value<float>()->default_value("0"))
        ("frequency-penalty", "frequency penalty", cxxopts::value<float>()->default_value("0"))
        ("s,seed", "random seed (default: random)", cxxopts::value<uint64_t>());
}

void add_spec_flags(cxxopts::Options& o) {
    o.add_options("speculative decoding")
        ("spec-type", "drafts verified in one batch: auto (drafts when they pay), ngram, mtp, off; llama.cpp's "
                      "names ngram-simple, ngram-map-k, ngram-map-k4v, draft-mtp, none too",
         cxxopts::value<std::string>()->default_value("auto"))
        ("spec", "drafted tokens per step at most (1..16)", cxxopts::value<int>()->default_value("4"))
        ("draft-max", "llama.cpp's name for --spec", cxxopts::value<int>())
        ("spec-min-p", "MTP: stop drafting when a draft's probability is below this",
         cxxopts::value<float>()->default_value("0.5"))
        ("draft-p-min", "llama.cpp's name for --spec-min-p", cxxopts::value<float>());
}

namespace {

// The RoPE flags, each checked when given (the engine reads 0 or negative as "the model's").
void read_rope_flags(const cxxopts::ParseResult& a, model_options& m) {
    if (a.count("rope-scaling")) {
        m.rope_scaling = a["rope-scaling"].as<std::string>();
        if (m.rope_scaling != "none" && m.rope_scaling != "linear" && m.rope_scaling != "yarn")
            throw std::invalid_argument(
                fmt::format("--rope-scaling {}: not a RoPE scaling type (valid: none, linear, yarn)", m.rope_scaling));
    }
    const auto positive = [&](const char* flag, float& field, bool zero_ok) {
        if (!a.count(flag)) return;
        field = a[flag].as<float>();
        if (!std::isfinite(field) || field < 0.0f || (field == 0.0f && !zero_ok))
            throw std::invalid_argument(fmt::format("--{} must be {}, got {}", flag, zero_ok ? "0 or more" : "positive", field));
    };
    positive("rope-scale", m.rope_scale, false);
    positive("rope-freq-base", m.rope_freq_base, false);
    positive("yarn-ext-factor", m.yarn_ext_factor, true);
    positive("yarn-attn-factor", m.yarn_attn_factor, false);
    positive("yarn-beta-fast", m.yarn_beta_fast, false);
    positive("yarn-beta-slow", m.yarn_beta_slow, false);
    if (a.count("yarn-orig-ctx")) {
        m.yarn_orig_ctx = a["yarn-orig-ctx"].as<int>();
        if (m.yarn_orig_ctx <= 0)
            throw std::invalid_argument(fmt::format("--yarn-orig-ctx must be positive, got {}", m.yarn_orig_ctx));
    }
}

}  // namespace

model_options model_options_from(const cxxopts::ParseResult& a) {
    model_options m;
    if (!a.count("model")) throw std::invalid_argument("-m/--model FILE is required");
    m.path = a["model"].as<std::string>();
    m.n_ctx = a["ctx"].as<int>();
    m.n_batch = a["batch"].as<int>();
    m.prefill_pace = a["prefill-pace"].as<double>();
    if (m.n_ctx < 0) throw std::invalid_argument(fmt::format("--ctx must be 0 or positive, got {}", m.n_ctx));
    if (m.n_batch < 1) throw std::invalid_argument(fmt::format("--batch must be positive, got {}", m.n_batch));
    m.kv_type = a["kv"].as<std::string>();
    if (a.count("numa-pool")) m.numa_pool = a["numa-pool"].as<std::string>();
    if (a.count("pool-workers")) {
        m.pool_workers = a["pool-workers"].as<int>();
        if (*m.pool_workers < 0)
            throw std::invalid_argument(fmt::format("--pool-workers must be 0 or positive, got {}", *m.pool_workers));
    }
    if (a.count("chat-template")) m.chat_template = a["chat-template"].as<std::string>();
    if (a.count("override-pre")) m.override_pre = a["override-pre"].as<std::string>();
    m.numa_hot_node = a["numa-hot-node"].as<std::string>();
    m.mmap_experts = a.count("mmap-experts") > 0;
    m.repack = a.count("no-repack") == 0;
    if (a.count("cache-ram")) {
        m.cache_ram_mib = a["cache-ram"].as<int>();
        if (m.cache_ram_mib < 0)
            throw std::invalid_argument(fmt::format("--cache-ram must be 0 (off) or a number of MiB, got {}",
                                                    m.cache_ram_mib));
    }
    if (a.count("mem-budget")) {
        m.mem_budget_mib = a["mem-budget"].as<int>();
        if (m.mem_budget_mib < 0)
            throw std::invalid_argument(fmt::format("--mem-budget must be 0 (none) or a number of MiB, got {}",
                                                    m.mem_budget_mib));
    }
    if (a.count("state-checkpoint-interval")) m.state_checkpoint_interval = a["state-checkpoint-interval"].as<int>();
    m.gpu = a["gpu"].as<int>();
    m.expert_cache = a["expert-cache"].as<std::string>();
    m.vram_reserve_mib = a["vram-reserve-mib"].as<int>();
    m.gpu_sessions = a["gpu-sessions"].as<int>();
    if (m.gpu_sessions < 1) throw std::invalid_argument(fmt::format("--gpu-sessions must be at least 1, got {}", m.gpu_sessions));
    if (a.count("expert-profile")) m.expert_profile = a["expert-profile"].as<std::string>();
    if (a.count("profile-save")) m.profile_save = a["profile-save"].as<std::string>();
    m.adapt_every = a["adapt-every"].as<int>();
    m.adapt_swaps = a["adapt-swaps"].as<int>();
    m.adapt_async = a["adapt-async"].as<int>() != 0;
    if (m.vram_reserve_mib < 0 || m.adapt_every < 0 || m.adapt_swaps < 0)
        throw std::invalid_argument(fmt::format("--vram-reserve-mib, --adapt-every and --adapt-swaps must not be "
                                                "negative (got {}, {}, {})",
                                                m.vram_reserve_mib, m.adapt_every, m.adapt_swaps));
    read_rope_flags(a, m);
    return m;
}

sampling_options sampling_options_from(const cxxopts::ParseResult& a) {
    sampling_options s;
    s.temperature = a["temp"].as<float>();
    s.top_k = a["top-k"].as<int>();
    s.top_p = a["top-p"].as<float>();
    s.min_p = a["min-p"].as<float>();
    s.repeat_penalty = a["repeat-penalty"].as<float>();
    s.repeat_last_n = a["repeat-last-n"].as<int>();
    s.presence_penalty = a["presence-penalty"].as<float>();
    s.frequency_penalty = a["frequency-penalty"].as<float>();
    if (a.count("seed")) s.seed = a["seed"].as<uint64_t>();
    return s;
}

speculation_options speculation_options_from(const cxxopts::ParseResult& a) {
    speculation_options s;
    const std::string type = a["spec-type"].as<std::string>();
    if (type == "ngram" || type == "ngram-simple" || type == "ngram-map-k" || type == "ngram-map-k4v")
        s.type = "ngram";
    else if (type == "mtp" || type == "draft-mtp")
        s.type = "mtp";
    else if (type == "off" || type == "none")
        s.type = "off";
    else if (type == "auto")
        s.type = "auto";
    else
        throw std::invalid_argument(fmt::format("--spec-type {}: not a speculation type (valid: auto, ngram, mtp, off, "
                                                "and llama.cpp's ngram-simple, ngram-map-k, ngram-map-k4v, draft-mtp, "
                                                "none)",
                                                type));
    s.n_max = a.count("draft-max") ? a["draft-max"].as<int>() : a["spec"].as<int>();
    s.min_p = a.count("draft-p-min") ? a["draft-p-min"].as<float>() : a["spec-min-p"].as<float>();
    if (s.n_max < 1 || s.n_max > 16)
        throw std::invalid_argument(fmt::format("--spec {}: the draft length must be 1..16", s.n_max));
    if (!(s.min_p >= 0.0f && s.min_p <= 1.0f))
        throw std::invalid_argument(fmt::format("--spec-min-p {}: must be 0..1", s.min_p));
    return s;
}

}  // namespace strata::cli
