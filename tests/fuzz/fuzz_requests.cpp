// libFuzzer target for the request parser: a body goes through what the handlers run before the engine
// thread (parse_body, then each endpoint's validation, chat template and tokenizer, /tokenize and
// /detokenize). Every outcome must be an answer or an api_error with a 4xx status; anything else
// (another exception, a 5xx, a sanitizer report) is a finding. The model is the tests' tiny one,
// generated at start into a temporary folder.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <string>
#include <string_view>

#include "api_error.hpp"
#include "generate.hpp"
#include "openai_schema.hpp"

namespace {

using namespace strata;

std::shared_ptr<model> g_model;
std::filesystem::path g_dir;

void remove_model_dir() {
    std::error_code ec;
    std::filesystem::remove_all(g_dir, ec);
}

[[noreturn]] void finding(const char* what, const std::string& detail) {
    std::fprintf(stderr, "fuzz_requests: %s: %s\n", what, detail.c_str());
    std::abort();
}

void check_status(const server::api_error& e) {
    if (e.status < 400 || e.status >= 500) finding("an error that is not a 4xx", std::to_string(e.status) + " " + e.what());
}

template <typename F>
void expect_answer_or_4xx(const char* step, F&& f) {
    try {
        f();
    } catch (const server::api_error& e) {
        check_status(e);
    } catch (const request_error&) {
        // The handlers turn these into 400s (an id outside the vocabulary in /detokenize).
    } catch (const std::exception& e) {
        finding(step, e.what());
    }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
    std::string pattern = (std::filesystem::temp_directory_path() / "strata-fuzz-XXXXXX").string();
    if (!mkdtemp(pattern.data())) finding("setup", "mkdtemp failed for " + pattern);
    g_dir = pattern;
    std::atexit(remove_model_dir);
    const std::string file = (g_dir / "tiny.gguf").string();
    make_model::model_spec spec = make_model::preset("tiny");
    spec.n_ctx = 512;
    make_model::build_model(spec).write_file(file);
    model_options o;
    o.path = file;
    o.n_ctx = 512;
    o.numa_pool = "off";
    o.cache_ram_mib = 0;
    g_model = model::load(o);
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string_view body(reinterpret_cast<const char*>(data), size);
    server::json j;
    try {
        j = server::parse_body(body);
    } catch (const server::api_error& e) {
        check_status(e);
        return 0;
    } catch (const std::exception& e) {
        finding("parse_body", e.what());
    }
    const sampling_options defaults;
    for (bool special : {false, true}) {
        expect_answer_or_4xx("chat", [&] {
            const auto r = server::parse_completion_request(j, server::endpoint::chat, *g_model, defaults, special);
            if (r.prompt.empty() || r.generation.max_tokens < 1) finding("chat", "a request with nothing to do passed");
        });
    }
    expect_answer_or_4xx("completions", [&] {
        const auto r = server::parse_completion_request(j, server::endpoint::completions, *g_model, defaults);
        if (r.prompt.empty() || r.generation.max_tokens < 1) finding("completions", "a request with nothing to do passed");
    });
    expect_answer_or_4xx("tokenize", [&] {
        const server::tokenize_request r = server::parse_tokenize_request(j);
        for (int32_t id : g_model->tokenize(r.content, r.add_special, r.parse_special)) g_model->token_text(id);
    });
    expect_answer_or_4xx("detokenize", [&] { g_model->detokenize(server::parse_detokenize_request(j), true); });
    return 0;
}
