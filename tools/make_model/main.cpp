// strata-make-model: writes a synthetic MoE model as a real GGUF file (random weights, learned
// byte-level BPE or SentencePiece vocabulary, chat template), since no real weights can be downloaded here.
#include <chrono>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <string>

// --add-token takes text that may hold commas: one value per occurrence, never split.
#define CXXOPTS_VECTOR_DELIMITER '\0'
#include <cxxopts.hpp>
#include <spdlog/fmt/fmt.h>

#include "formats/quant.hpp"
#include "generate.hpp"
#include "model_spec.hpp"

namespace {

using strata::formats::ggml_type;

ggml_type parse_type(const std::string& flag, const std::string& name) {
    const auto t = strata::formats::type_from_name(name);
    if (!t || (*t != ggml_type::F32 && !strata::formats::can_quantize(*t)))
        throw std::invalid_argument(fmt::format("--{} {}: not a type strata can write (try F32, F16, BF16, Q8_0, "
                                                "Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS, IQ1_S, IQ1_M, "
                                                "IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, MXFP4)",
                                                flag, name));
    return *t;
}

int run(int argc, char** argv) {
    cxxopts::Options opts("strata-make-model", "Write a synthetic MoE model as a GGUF file");
    opts.add_options()
        ("o,output", "output file", cxxopts::value<std::string>()->default_value("model.gguf"))
        ("preset", "tiny | demo | bench (dimensions below override it; qwen4exp bench: Q4_0 experts, as 640 is no "
                   "multiple of the k-quants' 256)",
         cxxopts::value<std::string>()->default_value("tiny"))
        ("arch", "qwen3moe | qwen2moe | mixtral | glm4moe | deepseek2 | qwen35moe | qwen3next | qwen4exp", cxxopts::value<std::string>()->default_value("qwen3moe"))
        ("name", "general.name", cxxopts::value<std::string>())
        ("seed", "random seed", cxxopts::value<uint64_t>())
        ("layers", "transformer blocks", cxxopts::value<int>())
        ("n-embd", "embedding width", cxxopts::value<int>())
        ("heads", "attention heads", cxxopts::value<int>())
        ("kv-heads", "key/value heads", cxxopts::value<int>())
        ("head-dim", "width of one head", cxxopts::value<int>())
        ("experts", "routed experts per layer", cxxopts::value<int>())
        ("experts-used", "experts routed per token", cxxopts::value<int>())
        ("n-ff", "hidden size of a routed expert", cxxopts::value<int>())
        ("n-ff-shared", "hidden size of the shared expert (qwen2moe)", cxxopts::value<int>())
        ("rope-dims", "rope.dimension_count: dimensions of a head that RoPE turns (default: all; glm4moe half)",
         cxxopts::value<int>())
        ("dense-layers", "glm4moe, deepseek2: leading layers with a dense FFN (leading_dense_block_count)", cxxopts::value<int>())
        ("n-ff-dense", "glm4moe, deepseek2: hidden size of the leading dense layers' FFN", cxxopts::value<int>())
        ("shared-experts", "glm4moe, deepseek2: shared experts (expert_shared_count), each --n-ff wide", cxxopts::value<int>())
        ("nextn-layers", "glm4moe, deepseek2, qwen35moe, qwen4exp: next-token-prediction layers written after the others "
         "(nextn_predict_layers)", cxxopts::value<int>())
        ("ssm-state", "qwen35moe, qwen3next: ssm.state_size, a DeltaNet head's key and value width", cxxopts::value<int>())
        ("ssm-k-heads", "qwen35moe, qwen3next: ssm.group_count, DeltaNet key heads", cxxopts::value<int>())
        ("ssm-v-heads", "qwen35moe, qwen3next: ssm.time_step_rank, DeltaNet value heads", cxxopts::value<int>())
        ("full-attention-interval", "qwen35moe, qwen3next: every this many layers one is gated attention",
         cxxopts::value<int>())
        ("ssm-in", "qwen3next: the older interleaved ssm_in instead of attn_qkv + attn_gate")
        ("qsa-top-k", "qwen4exp: attention.indexer.top_k, the tokens a QSA query attends to", cxxopts::value<int>())
        ("qsa-ratio", "qwen4exp: the QSA block size (attention.compress_ratios of attention layers)",
         cxxopts::value<int>())
        ("ple-rows", "qwen4exp: rows of the PLE table (per_layer_token_embd), at least those the hash heads reach; "
         "the rows past those are zeros left as holes in the file (a large sparse table)", cxxopts::value<int64_t>())
        ("no-ple", "qwen4exp: no PLE block")
        ("no-qk-norm", "glm4moe: no attn_q_norm / attn_k_norm, as GLM-4.5-Air")
        ("q-lora-rank", "deepseek2: attention.q_lora_rank (0: a plain attn_q, as the Lite models)",
         cxxopts::value<int>())
        ("kv-lora-rank", "deepseek2: attention.kv_lora_rank, the latent the KV cache keeps", cxxopts::value<int>())
        ("head-dim-v", "deepseek2: width of a value head (--head-dim is a query/key head)", cxxopts::value<int>())
        ("kv-b-merged", "deepseek2: one attn_kv_b per layer, as older files, instead of attn_k_b + attn_v_b")
        ("gating", "deepseek2: expert_gating_func softmax | sigmoid", cxxopts::value<std::string>())
        ("no-exp-probs-b", "deepseek2: no score-correction bias (exp_probs_b), as DeepSeek-V2")
        ("expert-groups", "deepseek2: expert_group_count (0: no group-limited routing)", cxxopts::value<int>())
        ("groups-used", "deepseek2: expert_group_used_count", cxxopts::value<int>())
        ("vocab", "vocabulary size", cxxopts::value<int>())
        ("ctx", "context length", cxxopts::value<int>())
        ("rope-scaling", "write rope.scaling.type: none | linear | yarn (default: no scaling keys)",
         cxxopts::value<std::string>())
        ("rope-factor", "rope.scaling.factor (linear, yarn)", cxxopts::value<float>())
        ("yarn-orig-ctx", "yarn: rope.scaling.original_context_length (default: ctx / factor)", cxxopts::value<int>())
        ("yarn-log-mul", "deepseek2, yarn: rope.scaling.yarn_log_multiplier as converted files carry it (0.1 x "
         "mscale_all_dim, e.g. 0.0707)", cxxopts::value<float>())
        ("type-experts", "type of routed expert weights", cxxopts::value<std::string>())
        ("type-shexp", "type of shared expert weights", cxxopts::value<std::string>())
        ("type-attn", "type of attention weights", cxxopts::value<std::string>())
        ("type-embd", "type of the token embeddings", cxxopts::value<std::string>())
        ("type-out", "type of the output head", cxxopts::value<std::string>())
        ("type-router", "type of the router weights", cxxopts::value<std::string>())
        ("tie-embeddings", "no output.weight; the head reuses token_embd")
        ("echo-cycle", "a model whose greedy output repeats runs of this many token ids (id base + i is followed "
         "by base + (i + 1) % N; layer outputs scaled down); writes strata.echo_cycle for strata-bench model --spec",
         cxxopts::value<int>())
        ("split-experts", "mixtral: one tensor per expert (blk.N.ffn_gate.E.weight), as older files have")
        ("fused-gate-up", "one ffn_gate_up_exps per layer (each expert's gate rows, then its up rows) instead of "
         "ffn_gate_exps + ffn_up_exps; the same values as without it")
        ("tokenizer", "gpt2 (byte-level BPE, ChatML) | llama (SentencePiece, Mistral [INST]); default: llama "
         "for mixtral, gpt2 otherwise", cxxopts::value<std::string>())
        ("vocab-from", "take the tokenizer (vocabulary, merges, chat template: every tokenizer.* key) from this GGUF "
         "file, e.g. one of llama.cpp's vocabulary-only files; --vocab is then its token count",
         cxxopts::value<std::string>())
        ("add-token", "gpt2 tokenizer: a user-defined token with this text (repeatable; after the special tokens, "
         "in place of the last learned tokens)", cxxopts::value<std::vector<std::string>>())
        ("h,help", "show help");
    const auto a = opts.parse(argc, argv);
    if (a.count("help")) {
        std::printf("%s\n", opts.help().c_str());
        return 0;
    }

    using namespace strata::make_model;
    model_spec s = preset(a["preset"].as<std::string>(), parse_arch(a["arch"].as<std::string>()));
    auto set_int = [&](const char* flag, int& field) {
        if (!a.count(flag)) return;
        field = a[flag].as<int>();
        if (field <= 0) throw std::invalid_argument(fmt::format("--{} must be positive, got {}", flag, field));
    };
    set_int("layers", s.n_layer);
    set_int("n-embd", s.n_embd);
    set_int("heads", s.n_head);
    set_int("kv-heads", s.n_head_kv);
    set_int("head-dim", s.head_dim);
    set_int("experts", s.n_expert);
    set_int("experts-used", s.n_expert_used);
    set_int("n-ff", s.n_ff_exp);
    set_int("n-ff-shared", s.n_ff_shexp);
    set_int("vocab", s.n_vocab);
    set_int("rope-dims", s.n_rot);
    set_int("n-ff-dense", s.n_ff);
    set_int("kv-lora-rank", s.n_lora_kv);
    set_int("head-dim-v", s.head_dim_v);
    set_int("ssm-state", s.ssm_d_state);
    set_int("ssm-k-heads", s.ssm_n_group);
    set_int("ssm-v-heads", s.ssm_dt_rank);
    set_int("full-attention-interval", s.full_attention_interval);
    if (a.count("ssm-in")) s.ssm_in = true;
    set_int("qsa-top-k", s.idx_top_k);
    set_int("qsa-ratio", s.qsa_ratio);
    if (a.count("ple-rows")) {
        s.ple_rows = a["ple-rows"].as<int64_t>();
        if (s.ple_rows <= 0) throw std::invalid_argument(fmt::format("--ple-rows must be positive, got {}", s.ple_rows));
    }
    if (a.count("no-ple")) s.ple_layer = -1;
    for (auto [flag, field] : {std::pair{"dense-layers", &s.n_layer_dense_lead}, std::pair{"shared-experts", &s.n_expert_shared},
                               std::pair{"nextn-layers", &s.n_layer_nextn}, std::pair{"q-lora-rank", &s.n_lora_q},
                               std::pair{"expert-groups", &s.n_expert_groups}, std::pair{"groups-used", &s.n_group_used}}) {
        if (!a.count(flag)) continue;
        *field = a[flag].as<int>();
        if (*field < 0) throw std::invalid_argument(fmt::format("--{} must be 0 or more, got {}", flag, *field));
    }
    s.qk_norm = a.count("no-qk-norm") == 0;
    if (a.count("kv-b-merged")) s.kv_b_split = false;
    if (a.count("no-exp-probs-b")) s.exp_probs_b = false;
    if (a.count("gating")) {
        const std::string g = a["gating"].as<std::string>();
        if (g != "softmax" && g != "sigmoid")
            throw std::invalid_argument("--gating must be softmax or sigmoid, got '" + g + "'");
        s.expert_gating_func = g == "softmax" ? 1 : 2;
    }
    set_int("ctx", s.n_ctx);
    if (a.count("seed")) s.seed = a["seed"].as<uint64_t>();
    if (a.count("name")) s.name = a["name"].as<std::string>();
    const std::pair<const char*, ggml_type*> types[] = {
        {"type-experts", &s.type_experts}, {"type-shexp", &s.type_shexp}, {"type-attn", &s.type_attn},
        {"type-embd", &s.type_embd},       {"type-out", &s.type_out},     {"type-router", &s.type_router}};
    for (auto [flag, field] : types)
        if (a.count(flag)) *field = parse_type(flag, a[flag].as<std::string>());
    s.tie_embeddings = a.count("tie-embeddings") > 0;
    set_int("echo-cycle", s.echo_cycle);
    if (s.echo_cycle > 0 && s.tie_embeddings)
        throw std::invalid_argument("--echo-cycle needs an output head of its own: leave out --tie-embeddings");
    s.split_experts = a.count("split-experts") > 0;
    s.fused_gate_up = a.count("fused-gate-up") > 0;
    if (s.fused_gate_up && s.split_experts)
        throw std::invalid_argument("--fused-gate-up and --split-experts exclude each other");
    if (a.count("tokenizer")) s.tokenizer = parse_tokenizer(a["tokenizer"].as<std::string>());
    if (a.count("vocab-from")) {
        if (a.count("vocab") || a.count("tokenizer"))
            throw std::invalid_argument("--vocab-from sets the vocabulary: leave out --vocab and --tokenizer");
        s.vocab_from = a["vocab-from"].as<std::string>();
    }
    if (a.count("add-token")) {
        if (!s.vocab_from.empty() || resolve_tokenizer(s) != tokenizer_kind::gpt2)
            throw std::invalid_argument("--add-token needs the gpt2 tokenizer (and no --vocab-from)");
        s.added_tokens = a["add-token"].as<std::vector<std::string>>();
    }
    if (a.count("rope-scaling")) s.rope_scaling = parse_rope_scaling(a["rope-scaling"].as<std::string>());
    const bool scaled = s.rope_scaling == rope_scaling_type::linear || s.rope_scaling == rope_scaling_type::yarn;
    if (a.count("rope-factor") && !scaled)
        throw std::invalid_argument("--rope-factor needs --rope-scaling linear or yarn");
    if (a.count("yarn-orig-ctx") && s.rope_scaling != rope_scaling_type::yarn)
        throw std::invalid_argument("--yarn-orig-ctx needs --rope-scaling yarn");
    if (a.count("rope-factor")) {
        s.rope_factor = a["rope-factor"].as<float>();
        if (!(s.rope_factor > 0.0f))
            throw std::invalid_argument(fmt::format("--rope-factor must be positive, got {}", s.rope_factor));
    }
    set_int("yarn-orig-ctx", s.rope_orig_ctx);
    if (a.count("yarn-log-mul")) {
        if (s.architecture != arch::deepseek2 || s.rope_scaling != rope_scaling_type::yarn)
            throw std::invalid_argument("--yarn-log-mul needs --arch deepseek2 and --rope-scaling yarn");
        s.rope_yarn_log_mul = a["yarn-log-mul"].as<float>();
    }

    const std::string out = a["output"].as<std::string>();
    const auto t0 = std::chrono::steady_clock::now();
    const strata::gguf::writer w = build_model(s);
    if (const auto dir = std::filesystem::path(out).parent_path(); !dir.empty())
        std::filesystem::create_directories(dir);
    w.write_file(out);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("wrote %s: %s, %zu tensors, %.1f MiB in %.1f s\n", out.c_str(), arch_name(s.architecture).c_str(),
                w.tensor_count(), static_cast<double>(std::filesystem::file_size(out)) / (1 << 20), secs);
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    try {
        return run(argc, argv);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "strata-make-model: error: %s\n", e.what());
        return 1;
    }
}
