#include "model_info.hpp"

#include "model/rope.hpp"

namespace strata {

std::string_view tensor_class(std::string_view n) {
    auto has = [&](std::string_view s) { return n.find(s) != std::string_view::npos; };
    if (n.starts_with("token_embd") || n.starts_with("position_embd")) return "embeddings";
    if (n.starts_with("output.") || n == "output") return "head";
    if (has(".nextn.")) return "nextn";  // next-token-prediction layers (glm4moe), not evaluated
    if (has("_norm")) return "norms";
    if (has("ffn_gate_inp_shexp") || has("_shexp")) return "shared_expert";
    if (has("ffn_gate_inp") || has("exp_probs_b")) return "router";
    if (has("_exps")) return "experts";
    // Older Mixtral files name experts one by one: blk.N.ffn_{gate,up,down}.E.weight
    if (n.starts_with("blk.") && has(".ffn_")) {
        const size_t ffn = n.find(".ffn_");
        const size_t dot = n.find('.', ffn + 5);
        if (dot != std::string_view::npos && dot + 1 < n.size() && n[dot + 1] >= '0' && n[dot + 1] <= '9')
            return "experts";
        return "ffn";
    }
    // Gated DeltaNet layers' mixer (qwen35moe, qwen3next): projections, conv, decay and norm.
    if (has(".ssm_") || has(".attn_qkv.") || has(".attn_gate.")) return "delta_net";
    if (has("attn_")) return "attention";
    return "other";
}

model_summary summarize(const gguf::reader& file) {
    model_summary s;
    s.architecture = file.get_string("general.architecture", "");
    s.name = file.get_string("general.name", "");
    const std::string prefix = s.architecture + ".";
    for (const auto& [key, v] : file.metadata())
        if (!s.architecture.empty() && key.starts_with(prefix))
            s.hparams.emplace_back(key.substr(prefix.size()), v.to_string());
    if (!s.architecture.empty()) {
        try {
            const auto n_ctx_train = static_cast<int>(file.get_u64(prefix + "context_length", 0));
            s.rope_scaling = engine::describe_rope(engine::read_rope(file, s.architecture, n_ctx_train));
        } catch (const std::exception& e) {
            s.rope_scaling = e.what();
        }
    }
    s.n_tensors = file.tensors().size();
    for (const auto& t : file.tensors()) {
        s.n_params += t.n_elements;
        s.tensor_bytes += t.n_bytes;
        s.tensors_by_type[std::string(formats::info(t.type).name)]++;
        auto& c = s.bytes_by_class[std::string(tensor_class(t.name))];
        c.n_tensors++;
        c.n_bytes += t.n_bytes;
    }
    if (const gguf::value* tokens = file.find("tokenizer.ggml.tokens"))
        s.vocab_size = static_cast<int64_t>(tokens->as_array("tokenizer.ggml.tokens").size());
    s.tokenizer_model = file.get_string("tokenizer.ggml.model", "");
    s.tokenizer_pre = file.get_string("tokenizer.ggml.pre", "");
    s.has_chat_template = file.find("tokenizer.chat_template") != nullptr;
    return s;
}

}  // namespace strata
