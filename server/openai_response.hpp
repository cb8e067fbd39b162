// Response bodies of the OpenAI-compatible endpoints: whole responses, SSE chunks, usage with
// llama.cpp's timings, logprobs in the chat and in the legacy completions shape, error objects.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include <nlohmann/json.hpp>

#include "api_error.hpp"
#include "chat_output.hpp"
#include "openai_schema.hpp"
#include "strata/engine.hpp"

namespace strata::server {

// JSON text with any ill-formed UTF-8 (a token piece cut inside a character) replaced by U+FFFD.
std::string to_text(const json& j);
// One server-sent event: "data: <json>\n\n".
std::string sse_event(const json& j);
inline constexpr std::string_view sse_done = "data: [DONE]\n\n";

json error_body(const api_error& e);

json timings_json(const timings& t);
json usage_json(int prompt_tokens, const timings& t);

struct response_meta {
    endpoint kind = endpoint::chat;
    std::string id;        // "chatcmpl-N" | "cmpl-N"
    int64_t created = 0;   // Unix seconds
    std::string model;
};

// Logprobs of `tokens` in the endpoint's shape: chat {"content": [{token, logprob, bytes,
// top_logprobs}]}; completions {tokens, token_logprobs, top_logprobs, text_offset}, where
// text_offset[i] (completions only, one per token) is the byte offset in the returned text at which
// token i's text was emitted.
json logprobs_json(endpoint kind, std::span<const generated_token> tokens, const model& m, int top_logprobs,
                   std::span<const size_t> text_offsets = {});

// A complete (non-streamed) response; a chat reply carries reasoning_content and tool_calls when it
// has them (content is null beside tool calls when empty), and finish_reason "tool_calls" with them.
json completion_response(const response_meta& meta, const parsed_reply& reply, std::string_view finish_reason,
                         const json& logprobs, int prompt_tokens, const timings& t);

// A streamed chunk: text `piece` (the chat role on the first chunk), optional logprobs, and on the
// last chunk the finish reason with the timings.
struct chunk_fields {
    std::string_view piece;
    std::string_view reasoning;                       // chat: delta.reasoning_content
    const json* tool_calls = nullptr;                 // chat: delta.tool_calls (an entry without "index" gets its position)
    bool first = false;
    json logprobs;                                    // null when not asked for
    std::optional<std::string_view> finish_reason;
    const timings* final_timings = nullptr;
    bool usage_null = false;                          // include_usage: every chunk but the last has "usage": null
};
json stream_chunk(const response_meta& meta, const chunk_fields& f);
// The extra last chunk of include_usage: no choices, the usage.
json usage_chunk(const response_meta& meta, int prompt_tokens, const timings& t);

}  // namespace strata::server
