#include "conversation_bench.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <thread>
#include <vector>

#include <httplib.h>
#include <nlohmann/json.hpp>
#include <spdlog/fmt/fmt.h>

#include "generate.hpp"
#include "strata/engine.hpp"
#include "strata/server.hpp"

namespace strata::bench {
namespace {

using clock_type = std::chrono::steady_clock;
using json = nlohmann::json;

double median(std::vector<double> v) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

// A conversation's opening text of at least `tokens` tokens; different for each conversation.
std::string opening(const model& m, int conversation, int tokens) {
    static const char* words[] = {"river", "bridge", "market", "lantern", "harbour", "orchard", "tower", "meadow"};
    std::string text = fmt::format("Story {} begins here.", conversation);
    for (int i = 0; m.tokenize(text).size() < static_cast<size_t>(tokens); ++i)
        text += fmt::format(" In part {} the traveller of story {} passed the {} and the {}.", i, conversation,
                            words[(i + conversation) % 8], words[(3 * i + 1) % 8]);
    return text;
}

struct arm_result {
    std::vector<double> first_ms, returning_ms, edited_ms;  // time to first token
    double returning_cache_n = 0, returning_prompt_n = 0, edited_cache_n = 0, edited_prompt_n = 0;
    std::vector<std::string> answers;            // every turn's text, in order
    json cache;                                  // /v1/status conversation_cache at the end
    int errors = 0;
};

// One arm: a server on `m`, the conversations taking turns round robin.
arm_result run_arm(const std::shared_ptr<model>& m, const conversation_bench_options& o) {
    server::server_options so;
    so.host = "127.0.0.1";
    so.port = 0;
    server::http_server srv(so);
    const int port = srv.bind();
    srv.set_model(m);
    std::thread serving([&] { srv.run(); });
    httplib::Client cli("127.0.0.1", port);
    cli.set_read_timeout(3600, 0);

    arm_result r;
    std::vector<std::string> prompts, before_last(size_t(o.conversations));
    for (int c = 0; c < o.conversations; ++c) prompts.push_back(opening(*m, c, o.history));
    // The turns, then (edit) each conversation once more with its last question reworded: the text
    // before that question is reused, the rest evaluated again.
    for (int turn = 0; turn < o.turns + (o.edit ? 1 : 0); ++turn)
        for (int c = 0; c < o.conversations; ++c) {
            std::string& prompt = prompts[size_t(c)];
            const bool edited = turn == o.turns;
            if (edited) {
                prompt = before_last[size_t(c)] + fmt::format("\nQuestion {}: and what came after that in story {}?\nAnswer:",
                                                              turn - 1, c);
            } else if (turn > 0) {
                before_last[size_t(c)] = prompt;
                prompt += fmt::format("\nQuestion {}: what happened next in story {}?\nAnswer:", turn, c);
            }
            const json body = {{"prompt", prompt}, {"max_tokens", o.max_tokens}, {"temperature", 0}, {"ignore_eos", true}};
            const auto t0 = clock_type::now();
            const auto res = cli.Post("/v1/completions", body.dump(), "application/json");
            const double ms = std::chrono::duration<double, std::milli>(clock_type::now() - t0).count();
            if (!res || res->status != 200) {
                ++r.errors;
                continue;
            }
            const json j = json::parse(res->body);
            const json& t = j["timings"];
            // Time to first token: the request without the decode of the tokens after the first.
            const double ttft = ms - t["predicted_ms"].get<double>();
            (turn == 0 ? r.first_ms : edited ? r.edited_ms : r.returning_ms).push_back(ttft);
            if (edited) {
                r.edited_cache_n += t["cache_n"].get<double>();
                r.edited_prompt_n += t["prompt_n"].get<double>();
            } else if (turn > 0) {
                r.returning_cache_n += t["cache_n"].get<double>();
                r.returning_prompt_n += t["prompt_n"].get<double>();
            }
            const std::string answer = j["choices"][0]["text"].get<std::string>();
            r.answers.push_back(answer);
            prompt += answer;
        }
    if (const auto st = cli.Get("/v1/status"); st && st->status == 200)
        r.cache = json::parse(st->body)["conversation_cache"];
    srv.begin_shutdown();
    srv.wait_idle(std::chrono::seconds(10));
    srv.stop();
    serving.join();
    const double n = std::max<double>(1, static_cast<double>(r.returning_ms.size()));
    r.returning_cache_n /= n;
    r.returning_prompt_n /= n;
    const double n_edited = std::max<double>(1, static_cast<double>(r.edited_ms.size()));
    r.edited_cache_n /= n_edited;
    r.edited_prompt_n /= n_edited;
    return r;
}

}  // namespace

int run_conversation_bench(const conversation_bench_options& o) {
    std::filesystem::path temp_dir;
    std::string path = o.model;
    if (path.empty()) {
        temp_dir = std::filesystem::temp_directory_path() / fmt::format("strata-bench-conversations-{}", getpid());
        std::filesystem::create_directories(temp_dir);
        path = (temp_dir / "demo.gguf").string();
        make_model::model_spec s = make_model::preset("demo");
        s.n_ctx = 8192;
        make_model::build_model(s).write_file(path);
    }
    model_options mo;
    mo.path = path;
    mo.cache_ram_mib = o.cache_ram_mib;
    const auto on_model = model::load(mo);
    const int n_ctx = on_model->info().n_ctx;
    const arm_result on = run_arm(on_model, o);
    const uint64_t budget = on.cache.value("budget_bytes", uint64_t{0});
    mo.cache_ram_mib = 0;
    const arm_result off = run_arm(model::load(mo), o);

    fmt::print("strata-bench server --conversations {} --history {}: {} (context {}), {} turns each, {} tokens per "
               "answer, conversations in turn on one server\n",
               o.conversations, o.history, path, n_ctx, o.turns, o.max_tokens);
    fmt::print("  {:<28} {:>20} {:>24} {:>14} {:>14}\n", "arm", "first turn TTFT", "returning turn TTFT",
               "reused tokens", "evaluated");
    const auto row = [](const char* name, const arm_result& r) {
        fmt::print("  {:<28} {:>17.1f} ms {:>21.1f} ms {:>14.0f} {:>14.0f}\n", name, median(r.first_ms),
                   median(r.returning_ms), r.returning_cache_n, r.returning_prompt_n);
    };
    row(fmt::format("cache on ({:.0f} MiB budget)", double(budget) / (1 << 20)).c_str(), on);
    row("cache off (--cache-ram 0)", off);
    const double speedup = median(on.returning_ms) > 0 ? median(off.returning_ms) / median(on.returning_ms) : 0;
    fmt::print("  returning turns: {:.1f}x lower time to first token with the cache (medians of {} turns; reused "
               "and evaluated: mean prompt tokens per returning turn)\n",
               speedup, on.returning_ms.size());
    fmt::print("  snapshots: {} entries, {:.1f} MiB in {} segments ({}), {} hits, {} misses, {} tokens restored, {} "
               "evictions\n",
               on.cache.value("entries", json::array()).size(), double(on.cache.value("bytes", uint64_t{0})) / (1 << 20),
               on.cache.value("segments", 0), on.cache.value("placement", std::string("?")), on.cache.value("hits", 0),
               on.cache.value("misses", 0), on.cache.value("tokens_restored", 0), on.cache.value("evictions", 0));
    if (o.edit)
        fmt::print("  edited last question: TTFT {:.1f} ms with the cache ({:.0f} tokens reused, {:.0f} evaluated), {:.1f} ms "
                   "without ({:.0f} reused, {:.0f} evaluated): {:.1f}x lower; against a first turn's TTFT: {:.1f}x lower\n",
                   median(on.edited_ms), on.edited_cache_n, on.edited_prompt_n, median(off.edited_ms), off.edited_cache_n,
                   off.edited_prompt_n, median(on.edited_ms) > 0 ? median(off.edited_ms) / median(on.edited_ms) : 0,
                   median(on.edited_ms) > 0 ? median(off.first_ms) / median(on.edited_ms) : 0);
    const bool same = on.answers == off.answers;
    fmt::print("  answers with and without the cache: {}\n", same ? "identical" : "DIFFERENT");
    if (!temp_dir.empty()) std::filesystem::remove_all(temp_dir);
    return on.errors + off.errors == 0 && same ? 0 : 1;
}

}  // namespace strata::bench
