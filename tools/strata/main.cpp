// strata SUBCOMMAND ...: the command-line front end of the engine.
#include <cstdio>
#include <exception>
#include <string_view>

#include "commands.hpp"

namespace {

struct subcommand {
    std::string_view name;
    std::string_view summary;
    int (*run)(int argc, char** argv);
};

constexpr subcommand kSubcommands[] = {
    {"info", "describe a GGUF model file (architecture, hyper-parameters, tensors, tokenizer)",
     &strata::cli::run_info},
    {"run", "generate text: strata run -m FILE -p PROMPT [-n N] [--chat] (see --help)", &strata::cli::run_generate},
};

int usage() {
    std::fprintf(stderr, "usage: strata SUBCOMMAND [options]   (SUBCOMMAND --help for its options)\n");
    for (const auto& s : kSubcommands)
        std::fprintf(stderr, "  %-6.*s %.*s\n", int(s.name.size()), s.name.data(), int(s.summary.size()),
                     s.summary.data());
    return 2;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 2) return usage();
    for (const auto& s : kSubcommands) {
        if (s.name != argv[1]) continue;
        try {
            return s.run(argc - 1, argv + 1);
        } catch (const std::exception& e) {
            std::fprintf(stderr, "strata %s: error: %s\n", argv[1], e.what());
            return 1;
        }
    }
    std::fprintf(stderr, "strata: unknown subcommand '%s'\n", argv[1]);
    return usage();
}
