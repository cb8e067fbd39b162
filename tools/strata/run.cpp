// `strata run -m FILE -p PROMPT [-n N] [--chat] [sampling options]`: streams a generation to stdout,
// then one line with prompt and decode speed.
#include <cstdio>
#include <string>

#include <cxxopts.hpp>
#include <spdlog/fmt/fmt.h>

#include "commands.hpp"
#include "engine_flags.hpp"
#include "strata/engine.hpp"

namespace strata::cli {

int run_generate(int argc, char** argv) {
    cxxopts::Options options("strata run", "Generate text with a GGUF MoE model");
    add_model_flags(options);
    add_sampling_flags(options);
    add_spec_flags(options);
    options.add_options("generation")
        ("p,prompt", "prompt text", cxxopts::value<std::string>())
        ("n,n-predict", "tokens to generate at most", cxxopts::value<int>()->default_value("128"))
        ("chat", "wrap the prompt as a user message in the model's chat template")
        ("system", "system message (with --chat)", cxxopts::value<std::string>())
        ("stop", "stop string (repeatable)", cxxopts::value<std::vector<std::string>>())
        ("ignore-eos", "keep generating past end-of-generation tokens")
        ("h,help", "show help");
    const auto args = options.parse(argc, argv);
    if (args.count("help")) {
        fmt::print("{}\n", options.help());
        return 0;
    }
    if (!args.count("prompt")) throw std::invalid_argument("-p/--prompt TEXT is required");
    const model_options mo = model_options_from(args);
    generation_options go;
    go.sampling = sampling_options_from(args);
    go.speculation = speculation_options_from(args);
    go.max_tokens = args["n-predict"].as<int>();
    if (args.count("stop")) go.stop = args["stop"].as<std::vector<std::string>>();
    go.ignore_eos = args.count("ignore-eos") > 0;

    const auto m = model::load(mo);
    const std::string text = args["prompt"].as<std::string>();
    std::vector<int32_t> prompt;
    if (args.count("chat")) {
        std::vector<chat_message> messages;
        if (args.count("system")) messages.push_back({"system", args["system"].as<std::string>()});
        messages.push_back({"user", text});
        prompt = m->tokenize(m->apply_chat_template(messages), true, true);
    } else {
        prompt = m->tokenize(text, true, false);
        fmt::print("{}", text);
    }
    session s(m);
    const generation_result r = s.generate(prompt, go, [](const token_event& e) {
        fmt::print("{}", e.text);
        std::fflush(stdout);
        return true;
    });
    fmt::print("\n");
    std::fflush(stdout);
    fmt::print(stderr, "prompt: {} tokens in {:.1f} ms ({:.1f} tokens/s); decode: {} tokens in {:.1f} ms ({:.1f} tokens/s); "
                       "{}stopped by {}\n",
               r.time.prompt_n, r.time.prompt_ms, r.time.prompt_per_second(), r.time.predicted_n, r.time.predicted_ms,
               r.time.predicted_per_second(),
               r.time.spec_drafted > 0 ? fmt::format("speculation: {} drafted, {} accepted ({:.0f} %); ", r.time.spec_drafted,
                                                    r.time.spec_accepted, 100 * r.time.spec_acceptance())
                                       : std::string(),
               r.reason == stop_reason::eos ? "end of generation"
                                              : r.reason == stop_reason::stop_string ? "stop string"
                                              : r.reason == stop_reason::length ? "length" : "cancellation");
    return 0;
}

}  // namespace strata::cli
