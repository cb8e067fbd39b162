// Embedding strata as a library: load a model, chat, stream tokens, cancel from a callback.
// Build: linked against strata_engine (see docs/examples/CMakeLists.txt); run: embed MODEL.gguf
#include <cstdio>
#include <exception>

#include "strata/engine.hpp"

int main(int argc, char** argv) {
    if (argc < 2) {
        std::fprintf(stderr, "usage: %s MODEL.gguf\n", argv[0]);
        return 2;
    }
    try {
        strata::model_options options;
        options.path = argv[1];
        options.n_ctx = 512;
        const auto model = strata::model::load(options);
        std::printf("%s: %s, %d layers, %d experts (%d used)\n", options.path.c_str(),
                    model->info().architecture.c_str(), model->info().n_layer, model->info().n_expert,
                    model->info().n_expert_used);

        const std::vector<strata::chat_message> chat = {{"user", "Hello! How are you today?"}};
        const auto prompt = model->tokenize(model->apply_chat_template(chat), true, true);

        strata::session session(model);
        strata::generation_options gen;
        gen.max_tokens = 24;
        gen.sampling.seed = 42;
        int n = 0;
        const auto result = session.generate(prompt, gen, [&](const strata::token_event& e) {
            std::fwrite(e.text.data(), 1, e.text.size(), stdout);
            return ++n < 20;  // returning false stops the generation
        });
        std::printf("\n%d prompt tokens, %d generated (%.1f tokens/s), stopped: %s\n", result.time.prompt_n,
                    result.time.predicted_n, result.time.predicted_per_second(),
                    std::string(strata::stop_reason_name(result.reason)).c_str());
        return result.tokens.empty() ? 1 : 0;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
}
