// Request parsing and validation for the OpenAI-compatible endpoints. Every failure is an api_error
// whose message names the field and the value's problem; nothing here touches the engine thread.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "strata/engine.hpp"

namespace strata::server {

using json = nlohmann::json;

enum class endpoint { chat, completions };

struct completion_request {
    endpoint kind = endpoint::chat;
    std::vector<int32_t> prompt;
    generation_options generation;
    bool stream = false;
    bool include_usage = false;        // stream_options.include_usage
    bool logprobs = false;             // chat: "logprobs": true; completions: "logprobs": N (N >= 0)
    int top_logprobs = 0;
    bool thinking_opened = false;      // chat: the rendered prompt ends inside <think>
    bool tools_offered = false;        // chat: the template was given tools
    // The conversation's identity (prompt_cache_key, else user; the X-Conversation-Id header, checked
    // by the caller, comes first): generation.cache_scope is derived from it. Empty: none given.
    std::string conversation;
};

// The longest conversation key accepted (prompt_cache_key, user, X-Conversation-Id), in bytes.
inline constexpr size_t max_conversation_key_bytes = 256;

// A conversation key given in field (or header) `name`: 400 naming it when it is longer than
// max_conversation_key_bytes or holds control characters.
void check_conversation_key(std::string_view name, std::string_view key);

// The cache scope of a conversation key ("" stays ""): what generation_options::cache_scope is set to.
std::string cache_scope_of(std::string_view conversation);

// Whether a rendered chat prompt ends with an open reasoning marker such as "<think>" (the generation
// starts as reasoning).
bool opens_thinking(std::string_view prompt);

// The body as a JSON object: 400 for invalid UTF-8 (with the byte offset), malformed JSON (with the
// parser's position) or a body that is not an object.
json parse_body(std::string_view body);

// Validates the fields (sampling values within the ranges the sampler accepts), renders chat messages
// through the model's template, tokenizes (message content as text unless special_in_content), and
// checks the prompt and max_tokens against the context (code "context_length_exceeded", both numbers).
// raw_body (the text body was parsed from) gives the chat template the client's key order.
completion_request parse_completion_request(const json& body, endpoint kind, const model& m,
                                            const sampling_options& defaults, bool special_in_content = false,
                                            std::string_view raw_body = {});

struct tokenize_request {
    std::string content;
    bool add_special = false;
    bool parse_special = true;
    bool with_pieces = false;
};
tokenize_request parse_tokenize_request(const json& body);
std::vector<int32_t> parse_detokenize_request(const json& body);

}  // namespace strata::server
