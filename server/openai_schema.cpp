#include "openai_schema.hpp"

#include <cmath>
#include <limits>
#include <optional>
#include <string>

#include <spdlog/fmt/fmt.h>

#include "api_error.hpp"
#include "chat_output.hpp"
#include "json_body.hpp"
#include "text.hpp"

namespace strata::server {
namespace {

// "a string", "an array", ... for messages that say what arrived instead.
std::string describe(const json& v) {
    const std::string t = v.type_name();
    return (t == "object" || t == "array") ? "an " + t : (t == "null" ? "null" : "a " + t);
}

api_error wrong_type(const std::string& field, const char* expected, const json& v) {
    return bad_field(field, fmt::format("'{}' must be {}, got {}", field, expected, describe(v)), "invalid_type");
}

// Absent and null are the same thing: OpenAI clients send null for every optional field left unset.
const json* field(const json& body, const char* key) {
    const auto it = body.find(key);
    return it == body.end() || it->is_null() ? nullptr : &*it;
}

std::optional<bool> get_bool(const json& body, const char* key) {
    const json* v = field(body, key);
    if (!v) return std::nullopt;
    if (!v->is_boolean()) throw wrong_type(key, "a boolean", *v);
    return v->get<bool>();
}

// Integers as JSON numbers: 9223372036854775808 (unsigned) and 1e20 (a float with no fraction) are
// integers too large to use, named as sent rather than wrapped or called the wrong type.
std::optional<int64_t> get_int(const json& body, const char* key) {
    const json* v = field(body, key);
    if (!v) return std::nullopt;
    const auto too_large = [&] {
        return bad_field(key, fmt::format("'{}' is {}, beyond the integers strata accepts (magnitude below 9e15)", key,
                                          v->dump()));
    };
    if (v->is_number_unsigned() && v->get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max())) throw too_large();
    if (v->is_number_integer()) return v->get<int64_t>();
    if (v->is_number_float()) {
        const double d = v->get<double>();
        if (std::isfinite(d) && d == std::floor(d)) {
            if (std::fabs(d) < 9.0e15) return static_cast<int64_t>(d);
            throw too_large();
        }
    }
    throw wrong_type(key, "an integer", *v);
}

std::optional<double> get_number(const json& body, const char* key) {
    const json* v = field(body, key);
    if (!v) return std::nullopt;
    if (!v->is_number()) throw wrong_type(key, "a number", *v);
    return v->get<double>();
}

template <typename T>
T in_range(const char* key, T value, T lo, T hi) {
    if (value < lo || value > hi) throw bad_field(key, fmt::format("'{}' must be between {} and {}, got {}", key, lo, hi, value));
    return value;
}

// The sampler refuses a repetition penalty of 0; a double that rounds to 0 as a float is refused too.
float positive_float(const char* key, double value, double hi) {
    const auto f = static_cast<float>(value);
    if (!(value > 0.0 && value <= hi && f > 0.0f))
        throw bad_field(key, fmt::format("'{}' must be greater than 0 and at most {}, got {}{}", key, hi, value,
                                         value > 0.0 && f == 0.0f ? " (0 as a 32-bit float)" : ""));
    return f;
}

void reject_unsupported(const json& body) {
    if (const json* v = field(body, "n"); v && !(v->is_number_integer() && v->get<int64_t>() == 1))
        throw bad_field("n", "'n' must be 1: strata generates one choice per request", "unsupported_value");
    if (get_bool(body, "echo").value_or(false))
        throw bad_field("echo", "'echo' is not supported", "unsupported_value");
    if (const json* v = field(body, "best_of"); v && !(v->is_number_integer() && v->get<int64_t>() == 1))
        throw bad_field("best_of", "'best_of' must be 1", "unsupported_value");
    if (const json* v = field(body, "functions"); v && !(v->is_array() && v->empty()))
        throw bad_field("functions", "'functions' (the deprecated form of 'tools') is not supported; send 'tools'",
                        "unsupported_value");
    if (const json* v = field(body, "response_format")) {
        if (!v->is_object()) throw wrong_type("response_format", "an object", *v);
        const auto t = v->find("type");
        if (t != v->end() && *t != "text")
            throw bad_field("response_format", "only {\"type\": \"text\"} is supported in 'response_format'",
                            "unsupported_value");
    }
    if (const json* v = field(body, "suffix"); v && !(v->is_string() && v->get<std::string>().empty()))
        throw bad_field("suffix", "'suffix' (text after the completion) is not supported", "unsupported_value");
}

sampling_options parse_sampling(const json& body, const sampling_options& defaults) {
    sampling_options s = defaults;
    if (auto v = get_number(body, "temperature")) s.temperature = static_cast<float>(in_range("temperature", *v, 0.0, 2.0));
    if (auto v = get_number(body, "top_p")) s.top_p = static_cast<float>(in_range("top_p", *v, 0.0, 1.0));
    if (auto v = get_int(body, "top_k")) s.top_k = static_cast<int>(in_range<int64_t>("top_k", *v, 0, 1 << 20));
    if (auto v = get_number(body, "min_p")) s.min_p = static_cast<float>(in_range("min_p", *v, 0.0, 1.0));
    if (auto v = get_number(body, "presence_penalty"))
        s.presence_penalty = static_cast<float>(in_range("presence_penalty", *v, -2.0, 2.0));
    if (auto v = get_number(body, "frequency_penalty"))
        s.frequency_penalty = static_cast<float>(in_range("frequency_penalty", *v, -2.0, 2.0));
    if (auto v = get_number(body, "repeat_penalty")) s.repeat_penalty = positive_float("repeat_penalty", *v, 10.0);
    if (auto v = get_int(body, "repeat_last_n"))  // -1: the whole context, as in llama.cpp
        s.repeat_last_n = static_cast<int>(in_range<int64_t>("repeat_last_n", *v, -1, 1 << 20));
    if (auto v = get_int(body, "seed")) {
        if (*v >= 0) s.seed = static_cast<uint64_t>(*v);
        else s.seed.reset();  // llama.cpp: -1 asks for a random seed
    }
    return s;
}

// OpenAI logit_bias: {"token id": bias}, the id as a decimal string within the vocabulary, the bias a
// number in [-100, 100].
std::vector<std::pair<int32_t, float>> parse_logit_bias(const json& body, int n_vocab) {
    const json* v = field(body, "logit_bias");
    if (!v) return {};
    if (!v->is_object()) throw wrong_type("logit_bias", "an object mapping token ids to biases", *v);
    std::vector<std::pair<int32_t, float>> out;
    for (auto it = v->begin(); it != v->end(); ++it) {
        const std::string& key = it.key();
        const std::string where = fmt::format("logit_bias[\"{}\"]", key.substr(0, 32));
        const bool digits = !key.empty() && key.size() <= 10 && key.find_first_not_of("0123456789") == std::string::npos;
        if (!digits)
            throw bad_field("logit_bias", fmt::format("'logit_bias' key \"{}\" is not a token id (a non-negative "
                                                      "integer as a string)", key.substr(0, 32)));
        const int64_t id = std::stoll(key);
        if (id >= n_vocab)
            throw bad_field("logit_bias", fmt::format("token id {} in 'logit_bias' is outside the vocabulary (0..{})",
                                                      id, n_vocab - 1));
        if (!it->is_number()) throw wrong_type(where, "a number", *it);
        const double bias = it->get<double>();
        if (!(bias >= -100.0 && bias <= 100.0))
            throw bad_field("logit_bias", fmt::format("'{}' must be between -100 and 100, got {}", where, bias));
        out.emplace_back(static_cast<int32_t>(id), static_cast<float>(bias));
    }
    return out;
}

std::vector<std::string> parse_stop(const json& body) {
    const json* v = field(body, "stop");
    if (!v) return {};
    if (v->is_string()) return v->get<std::string>().empty() ? std::vector<std::string>{} : std::vector{v->get<std::string>()};
    if (!v->is_array()) throw wrong_type("stop", "a string or an array of strings", *v);
    if (v->size() > 16) throw bad_field("stop", fmt::format("'stop' holds at most 16 strings, got {}", v->size()));
    std::vector<std::string> out;
    for (size_t i = 0; i < v->size(); ++i) {
        if (!(*v)[i].is_string()) throw wrong_type(fmt::format("stop[{}]", i), "a string", (*v)[i]);
        if (!(*v)[i].get<std::string>().empty()) out.push_back((*v)[i].get<std::string>());
    }
    return out;
}

// OpenAI content: a string or an array of parts of which strata reads the text ones. Null content
// belongs to assistant turns with tool calls (it renders as "").
std::string message_content(const json& m, size_t i, bool has_tool_calls) {
    const std::string where = fmt::format("messages[{}].content", i);
    const auto it = m.find("content");
    if (it == m.end() || it->is_null()) {
        if (has_tool_calls) return {};
        throw bad_field(where, fmt::format("'{}' is required", where), "missing_required_parameter");
    }
    if (it->is_string()) return it->get<std::string>();
    if (!it->is_array()) throw wrong_type(where, "a string or an array of content parts", *it);
    std::string text;
    for (size_t k = 0; k < it->size(); ++k) {
        const json& part = (*it)[k];
        const std::string pw = fmt::format("{}[{}]", where, k);
        if (!part.is_object()) throw wrong_type(pw, "an object", part);
        const auto type = part.find("type");
        if (type == part.end() || !type->is_string()) throw bad_field(pw + ".type", fmt::format("'{}.type' must be a string", pw), "invalid_type");
        if (*type != "text")
            throw bad_field(pw + ".type", fmt::format("content parts of type '{}' are not supported: strata reads text only",
                                                      type->get<std::string>()), "unsupported_value");
        const auto t = part.find("text");
        if (t == part.end() || !t->is_string()) throw bad_field(pw + ".text", fmt::format("'{}.text' must be a string", pw), "invalid_type");
        text += t->get<std::string>();
    }
    return text;
}

// An assistant's tool calls as templates expect them: function.arguments as an object when the
// request's JSON string holds one (transformers' convention), else left as the string.
json message_tool_calls(const json& calls, size_t i) {
    const std::string where = fmt::format("messages[{}].tool_calls", i);
    if (!calls.is_array()) throw wrong_type(where, "an array of tool calls", calls);
    json out = json::array();
    for (size_t k = 0; k < calls.size(); ++k) {
        const std::string cw = fmt::format("{}[{}]", where, k);
        const json& c = calls[k];
        if (!c.is_object()) throw wrong_type(cw, "an object", c);
        const auto fn = c.find("function");
        if (fn == c.end() || !fn->is_object() || !fn->contains("name") || !(*fn)["name"].is_string())
            throw bad_field(cw + ".function.name", fmt::format("'{}.function.name' must be a string", cw), "invalid_type");
        json call = c;
        if (const auto args = fn->find("arguments"); args != fn->end() && args->is_string()) {
            json parsed = json::parse(args->get<std::string>(), nullptr, false);
            if (parsed.is_object()) call["function"]["arguments"] = std::move(parsed);
        }
        out.push_back(std::move(call));
    }
    return out;
}

// The messages as the chat template sees them: every field kept, roles checked, content as a string.
json parse_messages(const json& body) {
    const json* v = field(body, "messages");
    if (!v) throw bad_field("messages", "'messages' is required", "missing_required_parameter");
    if (!v->is_array()) throw wrong_type("messages", "an array of messages", *v);
    if (v->empty()) throw bad_field("messages", "'messages' must hold at least one message");
    json out = json::array();
    for (size_t i = 0; i < v->size(); ++i) {
        const json& m = (*v)[i];
        if (!m.is_object()) throw wrong_type(fmt::format("messages[{}]", i), "an object", m);
        const auto role = m.find("role");
        const std::string rw = fmt::format("messages[{}].role", i);
        if (role == m.end() || role->is_null()) throw bad_field(rw, fmt::format("'{}' is required", rw), "missing_required_parameter");
        if (!role->is_string()) throw wrong_type(rw, "a string", *role);
        std::string r = role->get<std::string>();
        if (r == "developer") r = "system";  // OpenAI's newer name for the system role
        if (r != "system" && r != "user" && r != "assistant" && r != "tool")
            throw bad_field(rw, fmt::format("'{}' is '{}'; strata accepts system, developer, user, assistant and tool", rw,
                                            role->get<std::string>()));
        json msg = m;
        msg["role"] = r;
        const auto calls = m.find("tool_calls");
        const bool has_calls = calls != m.end() && !calls->is_null() && !(calls->is_array() && calls->empty());
        if (has_calls) msg["tool_calls"] = message_tool_calls(*calls, i);
        else msg.erase("tool_calls");
        msg["content"] = message_content(m, i, has_calls);
        out.push_back(std::move(msg));
    }
    return out;
}

// tools: function definitions, passed to the template as they are; tool_choice "none" leaves them out.
json parse_tools(const json& body) {
    const json* v = field(body, "tools");
    if (!v || (v->is_array() && v->empty())) return nullptr;
    if (!v->is_array()) throw wrong_type("tools", "an array of tools", *v);
    for (size_t k = 0; k < v->size(); ++k) {
        const json& t = (*v)[k];
        const std::string tw = fmt::format("tools[{}]", k);
        if (!t.is_object()) throw wrong_type(tw, "an object", t);
        if (t.value("type", "function") != "function")
            throw bad_field(tw + ".type", fmt::format("'{}.type' must be \"function\"", tw), "unsupported_value");
        const auto fn = t.find("function");
        if (fn == t.end() || !fn->is_object() || !fn->contains("name") || !(*fn)["name"].is_string())
            throw bad_field(tw + ".function.name", fmt::format("'{}.function.name' must be a string", tw), "invalid_type");
    }
    if (const json* c = field(body, "tool_choice")) {
        if (c->is_string() && *c == "none") return nullptr;
        if (!c->is_string() && !c->is_object()) throw wrong_type("tool_choice", "a string or an object", *c);
    }
    return *v;
}

// What the chat template renders: messages, tools, the generation prompt (left out, and the last
// message continued, when the conversation ends with an assistant turn: a prefill), and the
// template's keyword arguments (chat_template_kwargs, reasoning_effort).
json chat_context(const json& body) {
    json ctx = {{"messages", parse_messages(body)}, {"tools", parse_tools(body)}};
    if (const json* c = field(body, "tool_choice")) ctx["tool_choice"] = *c;
    const bool prefill = ctx["messages"].back()["role"] == "assistant";
    ctx["add_generation_prompt"] = !prefill;
    ctx["continue_final_message"] = prefill;
    if (const json* e = field(body, "reasoning_effort")) {
        if (!e->is_string()) throw wrong_type("reasoning_effort", "a string", *e);
        ctx["reasoning_effort"] = *e;
    }
    if (const json* k = field(body, "chat_template_kwargs")) {
        if (!k->is_object()) throw wrong_type("chat_template_kwargs", "an object", *k);
        for (auto it = k->begin(); it != k->end(); ++it)
            if (it.key() != "messages" && it.key() != "tools") ctx[it.key()] = it.value();
    }
    return ctx;
}

// The context again with the client's key order (nlohmann::json sorts keys; transformers keeps the
// order, and tojson in a template shows it): the messages, tools and keyword arguments of the raw
// body, with the validated role, content and tool calls.
nlohmann::ordered_json ordered_context(const json& ctx, std::string_view raw) {
    using ojson = nlohmann::ordered_json;
    ojson out = ojson::parse(ctx.dump());
    const ojson o = parse_json_body_ordered(raw);
    if (!o.is_object() || !o.contains("messages") || o["messages"].size() != ctx["messages"].size()) return out;
    for (size_t i = 0; i < ctx["messages"].size(); ++i) {
        const json& v = ctx["messages"][i];
        ojson m = o["messages"][i];
        m["role"] = v["role"];
        m["content"] = v["content"];
        if (v.contains("tool_calls")) {
            for (ojson& c : m["tool_calls"])
                if (c["function"].contains("arguments") && c["function"]["arguments"].is_string()) {
                    ojson args = ojson::parse(c["function"]["arguments"].get<std::string>(), nullptr, false);
                    if (args.is_object()) c["function"]["arguments"] = std::move(args);
                }
        } else {
            m.erase("tool_calls");
        }
        out["messages"][i] = std::move(m);
    }
    if (!ctx["tools"].is_null() && o.contains("tools")) out["tools"] = o["tools"];
    if (o.contains("chat_template_kwargs") && o["chat_template_kwargs"].is_object())
        for (auto it = o["chat_template_kwargs"].begin(); it != o["chat_template_kwargs"].end(); ++it)
            if (it.key() != "messages" && it.key() != "tools") out[it.key()] = it.value();
    return out;
}

std::vector<int32_t> token_ids(const json& v, const std::string& where, int n_vocab) {
    std::vector<int32_t> ids;
    for (size_t i = 0; i < v.size(); ++i) {
        if (!v[i].is_number_integer()) throw wrong_type(fmt::format("{}[{}]", where, i), "a token id (integer)", v[i]);
        const bool outside = v[i].is_number_unsigned() ? v[i].get<uint64_t>() >= static_cast<uint64_t>(n_vocab)
                                                       : v[i].get<int64_t>() < 0 || v[i].get<int64_t>() >= n_vocab;
        if (outside)
            throw bad_field(where, fmt::format("token id {} in '{}' is outside the vocabulary (0..{})", v[i].dump(), where,
                                               n_vocab - 1));
        ids.push_back(static_cast<int32_t>(v[i].get<int64_t>()));
    }
    return ids;
}

// A string, one string in an array, token ids, or one array of token ids.
std::vector<int32_t> parse_prompt(const json& body, const model& m) {
    const json* v = field(body, "prompt");
    if (!v) throw bad_field("prompt", "'prompt' is required", "missing_required_parameter");
    const json* p = v;
    if (v->is_array() && v->size() == 1 && ((*v)[0].is_string() || (*v)[0].is_array())) p = &(*v)[0];
    if (p->is_string()) {
        if (p->get<std::string>().empty()) throw bad_field("prompt", "'prompt' is empty");
        return m.tokenize(p->get<std::string>(), true, true);
    }
    if (p->is_array()) {
        if (p->empty()) throw bad_field("prompt", "'prompt' is empty");
        if (!(*p)[0].is_number_integer())
            throw bad_field("prompt", "'prompt' must be a string, one string in an array, or token ids: strata "
                                      "answers one prompt per request", "invalid_type");
        return token_ids(*p, "prompt", m.info().n_vocab);
    }
    throw wrong_type("prompt", "a string or an array of token ids", *v);
}

void parse_logprobs(const json& body, endpoint kind, completion_request& r) {
    if (kind == endpoint::chat) {
        r.logprobs = get_bool(body, "logprobs").value_or(false);
        if (auto n = get_int(body, "top_logprobs")) {
            r.top_logprobs = static_cast<int>(in_range<int64_t>("top_logprobs", *n, 0, 20));
            if (!r.logprobs && r.top_logprobs > 0)
                throw bad_field("top_logprobs", "'top_logprobs' needs 'logprobs': true");
        }
    } else if (auto n = get_int(body, "logprobs")) {
        r.logprobs = true;
        r.top_logprobs = static_cast<int>(in_range<int64_t>("logprobs", *n, 0, 20));
    }
    r.generation.logprobs = r.logprobs;
    r.generation.top_logprobs = r.top_logprobs;
}

}  // namespace

json parse_body(std::string_view body) { return parse_json_body(body); }

bool opens_thinking(std::string_view prompt) { return opens_reasoning(prompt); }

completion_request parse_completion_request(const json& body, endpoint kind, const model& m,
                                            const sampling_options& defaults, bool special_in_content,
                                            std::string_view raw_body) {
    completion_request r;
    r.kind = kind;
    if (const json* v = field(body, "model"); v && !v->is_string()) throw wrong_type("model", "a string", *v);
    reject_unsupported(body);
    r.stream = get_bool(body, "stream").value_or(false);
    if (const json* so = field(body, "stream_options")) {
        if (!so->is_object()) throw wrong_type("stream_options", "an object", *so);
        r.include_usage = get_bool(*so, "include_usage").value_or(false);
    }
    r.generation.sampling = parse_sampling(body, defaults);
    r.generation.sampling.logit_bias = parse_logit_bias(body, m.info().n_vocab);
    r.generation.stop = parse_stop(body);
    r.generation.ignore_eos = get_bool(body, "ignore_eos").value_or(false);
    parse_logprobs(body, kind, r);
    for (const char* key : {"prompt_cache_key", "user"}) {
        const json* v = field(body, key);
        if (!v || v->is_null()) continue;
        if (!v->is_string()) throw wrong_type(key, "a string", *v);
        check_conversation_key(key, v->get_ref<const std::string&>());
        if (r.conversation.empty()) r.conversation = v->get<std::string>();
    }
    r.generation.cache_scope = cache_scope_of(r.conversation);

    // max_completion_tokens is the chat API's newer name; n_predict is llama-server's.
    std::optional<int64_t> max_tokens;
    const char* max_key = "max_tokens";
    for (const char* key : {"max_tokens", "max_completion_tokens", "n_predict"})
        if (auto v = get_int(body, key); v && !max_tokens) max_tokens = v, max_key = key;

    const char* prompt_field = kind == endpoint::chat ? "messages" : "prompt";
    if (kind == endpoint::chat) {
        const json ctx = chat_context(body);
        try {
            const std::string ctx_text = raw_body.empty() ? ctx.dump() : ordered_context(ctx, raw_body).dump();
            model::chat_prompt p = m.tokenize_chat_context(ctx_text, special_in_content);
            r.prompt = std::move(p.tokens);
            r.thinking_opened = opens_thinking(p.text);
        } catch (const request_error& e) {
            throw bad_field("messages", e.what());
        }
        r.tools_offered = !ctx["tools"].is_null();
    } else {
        if (const json* v = field(body, "tools"); v && !(v->is_array() && v->empty()))
            throw bad_field("tools", "'tools' belongs to /v1/chat/completions", "unsupported_value");
        r.prompt = parse_prompt(body, m);
    }

    const int n_ctx = m.info().n_ctx;
    const auto n_prompt = static_cast<int64_t>(r.prompt.size());
    if (n_prompt == 0) throw bad_field(prompt_field, fmt::format("'{}' gives an empty prompt", prompt_field));
    if (n_prompt >= n_ctx)
        throw bad_field(prompt_field,
                        fmt::format("the prompt has {} tokens, but the context holds {} (and at least one token must "
                                    "be generated)", n_prompt, n_ctx),
                        "context_length_exceeded");
    if (max_tokens) {
        if (*max_tokens < 1) throw bad_field(max_key, fmt::format("'{}' must be at least 1, got {}", max_key, *max_tokens));
        if (*max_tokens > n_ctx)
            throw bad_field(max_key, fmt::format("'{}' is {}, but the context holds {} tokens", max_key, *max_tokens, n_ctx),
                            "context_length_exceeded");
        r.generation.max_tokens = static_cast<int>(*max_tokens);
    } else {
        r.generation.max_tokens = static_cast<int>(n_ctx - n_prompt);
    }
    return r;
}

void check_conversation_key(std::string_view name, std::string_view key) {
    if (key.size() > max_conversation_key_bytes)
        throw bad_field(std::string(name), fmt::format("'{}' is {} bytes long; at most {} are accepted", name, key.size(),
                                                       max_conversation_key_bytes));
    for (const char c : key)
        if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f)
            throw bad_field(std::string(name), fmt::format("'{}' holds a control character", name));
}

std::string cache_scope_of(std::string_view conversation) {
    return conversation.empty() ? std::string() : "conversation:" + std::string(conversation);
}

tokenize_request parse_tokenize_request(const json& body) {
    tokenize_request r;
    const json* v = field(body, "content");
    if (!v) throw bad_field("content", "'content' is required", "missing_required_parameter");
    if (!v->is_string()) throw wrong_type("content", "a string", *v);
    r.content = v->get<std::string>();
    r.add_special = get_bool(body, "add_special").value_or(false);
    r.parse_special = get_bool(body, "parse_special").value_or(true);
    r.with_pieces = get_bool(body, "with_pieces").value_or(false);
    return r;
}

std::vector<int32_t> parse_detokenize_request(const json& body) {
    const json* v = field(body, "tokens");
    if (!v) throw bad_field("tokens", "'tokens' is required", "missing_required_parameter");
    if (!v->is_array()) throw wrong_type("tokens", "an array of token ids", *v);
    return token_ids(*v, "tokens", std::numeric_limits<int>::max());
}

}  // namespace strata::server
