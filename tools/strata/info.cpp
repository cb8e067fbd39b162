// `strata info FILE [--json]`: what a GGUF model file holds.
#include <cstdio>
#include <optional>
#include <string>

#include <cxxopts.hpp>
#include <nlohmann/json.hpp>
#include <spdlog/fmt/fmt.h>

#include "commands.hpp"
#include "model_info.hpp"
#include "tokenizer/template_facts.hpp"
#include "tokenizer/tokenizer.hpp"

namespace strata::cli {

namespace {

std::string human_bytes(uint64_t b) {
    if (b >= (1ull << 30)) return fmt::format("{:.2f} GiB", double(b) / double(1ull << 30));
    if (b >= (1ull << 20)) return fmt::format("{:.2f} MiB", double(b) / double(1ull << 20));
    if (b >= (1ull << 10)) return fmt::format("{:.1f} KiB", double(b) / double(1ull << 10));
    return fmt::format("{} B", b);
}

// The tokenizer as the engine would load it: its pre-tokenizer, or why it does not load.
struct tokenizer_facts {
    bool loads = false;
    std::string error;
    std::string pre_name;    // tokenizer.ggml.pre in effect; empty for SentencePiece
    std::string pre_family;  // the split patterns that name selects
};

tokenizer_facts read_tokenizer(const gguf::reader& file) {
    tokenizer_facts f;
    if (!file.find("tokenizer.ggml.model")) return f;
    try {
        const tok::tokenizer t = tok::tokenizer::from_gguf(file);
        f.loads = true;
        f.pre_name = t.pre_name();
        f.pre_family = t.pre_family();
    } catch (const std::exception& e) {
        f.error = e.what();
    }
    return f;
}

// The chat template's facts; nullopt when the file has none.
std::optional<tok::template_facts> read_template(const gguf::reader& file) {
    const auto* v = file.find("tokenizer.chat_template");
    if (!v) return std::nullopt;
    return tok::describe_template(v->as_string("tokenizer.chat_template"));
}

std::string describe_tools(const tok::template_facts& t) {
    if (!t.tools) return "no";
    return fmt::format("yes, {} syntax{}", t.tool_syntax,
                       t.tool_syntax_parsed ? " (parsed into tool_calls)" : " (not parsed: returned as content)");
}

std::string describe_reasoning(const tok::template_facts& t) {
    if (t.reasoning_marker.empty() && t.reasoning_switches.empty()) return "no";
    std::string out = t.reasoning_marker.empty() ? "no marker" : fmt::format("marker {}", t.reasoning_marker);
    if (!t.reasoning_switches.empty()) out += fmt::format(", switched by {}", fmt::join(t.reasoning_switches, ", "));
    return out;
}

std::string describe_pre(const model_summary& s, const tokenizer_facts& t) {
    if (!t.error.empty())
        return fmt::format("{} (does not load: {})", s.tokenizer_pre.empty() ? "-" : s.tokenizer_pre, t.error);
    if (s.tokenizer_model == "llama") return "none (SentencePiece)";
    return t.pre_name == t.pre_family ? t.pre_name : fmt::format("{} (patterns of {})", t.pre_name, t.pre_family);
}

void print_table(const gguf::reader& file, const model_summary& s, const tokenizer_facts& tf) {
    fmt::print("file:           {} (GGUF v{}, {}, alignment {})\n", file.path(), file.version(),
               human_bytes(file.file_size()), file.alignment());
    fmt::print("architecture:   {}{}\n", s.architecture.empty() ? "(none)" : s.architecture,
               s.name.empty() ? "" : fmt::format(" (\"{}\")", s.name));
    fmt::print("hyper-parameters:\n");
    for (const auto& [k, v] : s.hparams) fmt::print("  {:<36} {}\n", k, v);
    if (!s.rope_scaling.empty()) fmt::print("rope scaling:   {}\n", s.rope_scaling);
    std::string types;
    for (const auto& [t, n] : s.tensors_by_type) types += fmt::format("{}{} x {}", types.empty() ? "" : ", ", t, n);
    fmt::print("tensors:        {} ({}), {:.3f} B parameters, {}\n", s.n_tensors, types, double(s.n_params) / 1e9,
               human_bytes(s.tensor_bytes));
    fmt::print("bytes by class:\n");
    for (const auto& [cls, c] : s.bytes_by_class)
        fmt::print("  {:<14} {:>12}  {:5.1f} %  ({} tensors)\n", cls, human_bytes(c.n_bytes),
                   s.tensor_bytes ? 100.0 * double(c.n_bytes) / double(s.tensor_bytes) : 0.0, c.n_tensors);
    if (s.vocab_size > 0) {
        fmt::print("vocabulary:     {} tokens (tokenizer {})\n", s.vocab_size, s.tokenizer_model);
        fmt::print("pre-tokenizer:  {}\n", describe_pre(s, tf));
    } else {
        fmt::print("vocabulary:     none\n");
    }
    const auto tpl = read_template(file);
    if (!tpl) {
        fmt::print("chat template:  absent\n");
        return;
    }
    fmt::print("chat template:  present ({} markup)\n", tpl->family);
    fmt::print("  tool calls:   {}\n", describe_tools(*tpl));
    fmt::print("  reasoning:    {}\n", describe_reasoning(*tpl));
}

void print_json(const gguf::reader& file, const model_summary& s, const tokenizer_facts& tf) {
    nlohmann::ordered_json j;
    j["file"] = file.path();
    j["gguf_version"] = file.version();
    j["file_bytes"] = file.file_size();
    j["architecture"] = s.architecture;
    j["name"] = s.name;
    for (const auto& [k, v] : s.hparams) j["hparams"][k] = v;
    j["rope_scaling"] = s.rope_scaling;
    j["n_tensors"] = s.n_tensors;
    j["n_params"] = s.n_params;
    j["tensor_bytes"] = s.tensor_bytes;
    j["tensors_by_type"] = s.tensors_by_type;
    for (const auto& [cls, c] : s.bytes_by_class) j["bytes_by_class"][cls] = {{"bytes", c.n_bytes}, {"tensors", c.n_tensors}};
    j["vocab_size"] = s.vocab_size;
    j["tokenizer_model"] = s.tokenizer_model;
    j["tokenizer_pre"] = s.tokenizer_pre;
    j["pre_tokenizer_family"] = tf.pre_family;
    if (!tf.error.empty()) j["tokenizer_error"] = tf.error;
    j["chat_template"] = s.has_chat_template;
    if (const auto tpl = read_template(file))
        j["chat_template_facts"] = {{"family", tpl->family},
                                    {"tools", tpl->tools},
                                    {"tool_syntax", tpl->tool_syntax},
                                    {"tool_syntax_parsed", tpl->tool_syntax_parsed},
                                    {"reasoning_marker", tpl->reasoning_marker},
                                    {"reasoning_switches", tpl->reasoning_switches}};
    fmt::print("{}\n", j.dump(2));
}

}  // namespace

int run_info(int argc, char** argv) {
    cxxopts::Options options("strata info", "Describe a GGUF model file");
    options.add_options()("json", "print JSON")("h,help", "show help")("file", "GGUF file",
                                                                        cxxopts::value<std::string>());
    options.parse_positional({"file"});
    options.positional_help("FILE");
    const auto args = options.parse(argc, argv);
    if (args.count("help") || !args.count("file")) {
        fmt::print(stderr, "{}\n", options.help());
        return args.count("help") ? 0 : 2;
    }
    const gguf::reader file = gguf::reader::open(args["file"].as<std::string>());
    const model_summary s = summarize(file);
    const tokenizer_facts tf = read_tokenizer(file);
    if (args.count("json"))
        print_json(file, s, tf);
    else
        print_table(file, s, tf);
    return 0;
}

}  // namespace strata::cli
