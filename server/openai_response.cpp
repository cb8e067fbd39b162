#include "openai_response.hpp"

#include "text.hpp"

namespace strata::server {

std::string to_text(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string sse_event(const json& j) { return "data: " + to_text(j) + "\n\n"; }

json error_body(const api_error& e) {
    const auto or_null = [](const std::string& s) { return s.empty() ? json(nullptr) : json(s); };
    return {{"error", {{"message", e.what()}, {"type", e.type}, {"param", or_null(e.param)}, {"code", or_null(e.code)}}}};
}

json timings_json(const timings& t) {
    return {{"prompt_n", t.prompt_n},
            {"prompt_ms", t.prompt_ms},
            {"prompt_per_token_ms", t.prompt_n > 0 ? t.prompt_ms / t.prompt_n : 0.0},
            {"prompt_per_second", t.prompt_per_second()},
            {"predicted_n", t.predicted_n},
            {"predicted_ms", t.predicted_ms},
            {"predicted_per_token_ms", t.predicted_n > 0 ? t.predicted_ms / t.predicted_n : 0.0},
            {"predicted_per_second", t.predicted_per_second()},
            {"cache_n", t.cache_n},
            {"draft_n", t.spec_drafted},
            {"draft_n_accepted", t.spec_accepted},
            {"draft_acceptance", t.spec_acceptance()}};
}

json usage_json(int prompt_tokens, const timings& t) {
    return {{"prompt_tokens", prompt_tokens},
            {"completion_tokens", t.predicted_n},
            {"total_tokens", prompt_tokens + t.predicted_n},
            {"prompt_tokens_details", {{"cached_tokens", t.cache_n}}}};
}

static json byte_values(const std::string& s) {
    json a = json::array();
    for (unsigned char c : s) a.push_back(int(c));
    return a;
}

static json chat_logprobs(std::span<const generated_token> tokens, const model& m, int top_logprobs) {
    json content = json::array();
    for (const generated_token& g : tokens) {
        const std::string piece = m.token_text(g.id);
        json top = json::array();
        for (size_t k = 0; k < g.top.size() && static_cast<int>(k) < top_logprobs; ++k)
            top.push_back({{"token", to_valid_utf8(g.top[k].text)}, {"logprob", g.top[k].logprob},
                           {"bytes", byte_values(g.top[k].text)}});
        content.push_back({{"token", to_valid_utf8(piece)}, {"logprob", g.logprob}, {"bytes", byte_values(piece)},
                           {"top_logprobs", std::move(top)}});
    }
    return {{"content", std::move(content)}, {"refusal", nullptr}};
}

static json completion_logprobs(std::span<const generated_token> tokens, const model& m, int top_logprobs,
                                std::span<const size_t> text_offsets) {
    json text_tokens = json::array(), token_logprobs = json::array(), top = json::array(), offsets = json::array();
    for (size_t i = 0; i < tokens.size(); ++i) {
        const generated_token& g = tokens[i];
        const std::string piece = m.token_text(g.id);
        text_tokens.push_back(to_valid_utf8(piece));
        token_logprobs.push_back(g.logprob);
        json alternatives = json::object();
        for (size_t k = 0; k < g.top.size() && static_cast<int>(k) < top_logprobs; ++k)
            alternatives[to_valid_utf8(g.top[k].text)] = g.top[k].logprob;
        top.push_back(top_logprobs > 0 ? std::move(alternatives) : json(nullptr));
        offsets.push_back(i < text_offsets.size() ? text_offsets[i] : (text_offsets.empty() ? 0 : text_offsets.back()));
    }
    return {{"tokens", std::move(text_tokens)}, {"token_logprobs", std::move(token_logprobs)},
            {"top_logprobs", std::move(top)}, {"text_offset", std::move(offsets)}};
}

json logprobs_json(endpoint kind, std::span<const generated_token> tokens, const model& m, int top_logprobs,
                   std::span<const size_t> text_offsets) {
    return kind == endpoint::chat ? chat_logprobs(tokens, m, top_logprobs)
                                  : completion_logprobs(tokens, m, top_logprobs, text_offsets);
}

static json envelope(const response_meta& meta, const char* chat_object, const char* text_object) {
    return {{"id", meta.id},
            {"object", meta.kind == endpoint::chat ? chat_object : text_object},
            {"created", meta.created},
            {"model", meta.model},
            {"system_fingerprint", "strata-" STRATA_VERSION}};
}

json completion_response(const response_meta& meta, const parsed_reply& reply, std::string_view finish_reason,
                         const json& logprobs, int prompt_tokens, const timings& t) {
    json r = envelope(meta, "chat.completion", "text_completion");
    const bool calls = !reply.tool_calls.empty();
    json choice = {{"index", 0}, {"logprobs", logprobs}, {"finish_reason", calls ? "tool_calls" : finish_reason}};
    if (meta.kind == endpoint::chat) {
        json msg = {{"role", "assistant"}, {"content", calls && reply.content.empty() ? json(nullptr) : json(reply.content)}};
        if (!reply.reasoning.empty()) msg["reasoning_content"] = reply.reasoning;
        if (calls) msg["tool_calls"] = reply.tool_calls;
        choice["message"] = std::move(msg);
    } else {
        choice["text"] = reply.content;
    }
    r["choices"] = json::array({std::move(choice)});
    r["usage"] = usage_json(prompt_tokens, t);
    r["timings"] = timings_json(t);
    return r;
}

json stream_chunk(const response_meta& meta, const chunk_fields& f) {
    json r = envelope(meta, "chat.completion.chunk", "text_completion");
    json choice = {{"index", 0}, {"logprobs", f.logprobs},
                   {"finish_reason", f.finish_reason ? json(*f.finish_reason) : json(nullptr)}};
    if (meta.kind == endpoint::chat) {
        json delta = json::object();
        if (f.first) delta["role"] = "assistant";
        if (!f.piece.empty() || f.first) delta["content"] = f.piece;
        if (!f.reasoning.empty()) delta["reasoning_content"] = f.reasoning;
        if (f.tool_calls) {
            json calls = *f.tool_calls;
            for (size_t i = 0; i < calls.size(); ++i)
                if (!calls[i].contains("index")) calls[i]["index"] = i;
            delta["tool_calls"] = std::move(calls);
        }
        choice["delta"] = std::move(delta);
    } else {
        choice["text"] = f.piece;
    }
    r["choices"] = json::array({std::move(choice)});
    if (f.usage_null) r["usage"] = nullptr;
    if (f.final_timings) r["timings"] = timings_json(*f.final_timings);
    return r;
}

json usage_chunk(const response_meta& meta, int prompt_tokens, const timings& t) {
    json r = envelope(meta, "chat.completion.chunk", "text_completion");
    r["choices"] = json::array();
    r["usage"] = usage_json(prompt_tokens, t);
    r["timings"] = timings_json(t);
    return r;
}

}  // namespace strata::server
