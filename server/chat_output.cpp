// Reasoning and tool-call extraction from the model's reply text.
#include "chat_output.hpp"

#include <array>

namespace strata::server {

namespace {

using nlohmann::json;

constexpr std::string_view think_open = "<think>", think_close = "</think>";
// Where a tool-call block may begin, per family.
constexpr std::array<std::string_view, 5> tool_starts = {"<tool_call>", "<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>",
                                                        "<|tool_calls_section_begin|>", "<|tool_call_begin|>"};

std::string_view trim(std::string_view s) {
    const size_t b = s.find_first_not_of(" \t\r\n");
    if (b == std::string_view::npos) return {};
    return s.substr(b, s.find_last_not_of(" \t\r\n") - b + 1);
}

// Between `open` and `close` after pos; npos when absent.
bool between(std::string_view s, std::string_view open, std::string_view close, size_t& pos, std::string_view& out) {
    const size_t a = s.find(open, pos);
    if (a == std::string_view::npos) return false;
    const size_t b = s.find(close, a + open.size());
    if (b == std::string_view::npos) return false;
    out = s.substr(a + open.size(), b - a - open.size());
    pos = b + close.size();
    return true;
}

json make_call(std::string name, const json& args, size_t index) {
    return {{"id", "call_" + std::to_string(index)},
            {"type", "function"},
            {"function", {{"name", std::move(name)}, {"arguments", args.is_string() ? args.get<std::string>() : args.dump()}}}};
}

// A parameter value as the XML forms write it: JSON when it parses, else the string.
json xml_value(std::string_view v) {
    v = trim(v);
    json j = json::parse(v, nullptr, false);
    return j.is_discarded() ? json(std::string(v)) : j;
}

// One <tool_call> body in the JSON, XML-function or GLM form; false when it is none of them.
bool parse_tool_call_body(std::string_view body, json& calls) {
    body = trim(body);
    if (body.starts_with("{")) {
        json j = json::parse(body, nullptr, false);
        if (!j.is_object() || !j.contains("name") || !j["name"].is_string()) return false;
        const json args = j.contains("arguments") ? j["arguments"] : j.value("parameters", json::object());
        calls.push_back(make_call(j["name"], args, calls.size()));
        return true;
    }
    json args = json::object();
    size_t pos = 0;
    std::string_view part;
    if (body.starts_with("<function=")) {
        const size_t end = body.find('>');
        if (end == std::string_view::npos) return false;
        std::string name(trim(body.substr(10, end - 10)));
        pos = end + 1;
        while (true) {
            const size_t a = body.find("<parameter=", pos);
            if (a == std::string_view::npos) break;
            const size_t e = body.find('>', a);
            const size_t c = body.find("</parameter>", a);
            if (e == std::string_view::npos || c == std::string_view::npos || e > c) return false;
            args[std::string(trim(body.substr(a + 11, e - a - 11)))] = xml_value(body.substr(e + 1, c - e - 1));
            pos = c + 12;
        }
        calls.push_back(make_call(std::move(name), args, calls.size()));
        return true;
    }
    const size_t first_key = body.find("<arg_key>");
    std::string name(trim(body.substr(0, first_key)));
    if (name.empty() || name.find_first_of("<>{} \n") != std::string::npos) return false;
    std::string_view key, val;
    while (between(body, "<arg_key>", "</arg_key>", pos, key)) {
        if (!between(body, "<arg_value>", "</arg_value>", pos, val)) return false;
        args[std::string(trim(key))] = xml_value(val);
    }
    calls.push_back(make_call(std::move(name), args, calls.size()));
    return true;
}

// DeepSeek V3.1 (NAME<｜tool▁sep｜>{json}) and Kimi K2 (functions.NAME:N<|tool_call_argument_begin|>{json}).
bool parse_marker_calls(std::string_view text, std::string_view begin, std::string_view sep, std::string_view end,
                        json& calls) {
    size_t pos = 0;
    std::string_view body;
    bool any = false;
    while (between(text, begin, end, pos, body)) {
        const size_t s = body.find(sep);
        if (s == std::string_view::npos) return false;
        std::string name(trim(body.substr(0, s)));
        if (name.starts_with("functions.")) name = name.substr(10);
        if (const size_t colon = name.rfind(':'); colon != std::string::npos) name.resize(colon);
        json args = json::parse(trim(body.substr(s + sep.size())), nullptr, false);
        if (!args.is_object()) return false;
        calls.push_back(make_call(std::move(name), args, calls.size()));
        any = true;
    }
    return any;
}

// The tool calls in `text` (which starts at a tool-call marker or is a bare JSON object).
bool parse_tool_calls(std::string_view text, json& calls) {
    json found = json::array();
    if (text.find("<｜tool▁call▁begin｜>") != std::string_view::npos) {
        if (!parse_marker_calls(text, "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>", found)) return false;
    } else if (text.find("<|tool_call_begin|>") != std::string_view::npos) {
        if (!parse_marker_calls(text, "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>", found))
            return false;
    } else if (text.starts_with("<tool_call>")) {
        size_t pos = 0;
        std::string_view body;
        while (between(text, "<tool_call>", "</tool_call>", pos, body))
            if (!parse_tool_call_body(body, found)) return false;
        if (found.empty() || !trim(text.substr(pos)).empty()) return false;
    } else {
        if (!parse_tool_call_body(text, found)) return false;
    }
    calls = std::move(found);
    return true;
}

size_t tool_start(std::string_view s) {
    size_t best = std::string_view::npos;
    for (std::string_view m : tool_starts) best = std::min(best, s.find(m));
    return best;
}

// Length of the longest tail of s that is a proper prefix of one of the markers.
size_t partial_marker(std::string_view s, bool reasoning, bool tools) {
    size_t keep = 0;
    auto check = [&](std::string_view m) {
        for (size_t n = std::min(m.size() - 1, s.size()); n > keep; --n)
            if (s.substr(s.size() - n) == m.substr(0, n)) {
                keep = n;
                break;
            }
    };
    if (reasoning) {
        check(think_open);
        check(think_close);
    }
    if (tools)
        for (std::string_view m : tool_starts) check(m);
    return keep;
}

}  // namespace

parsed_reply parse_reply(std::string_view text, const reply_options& opt) {
    reply_stream s(opt);
    reply_stream::delta d = s.push(text);
    parsed_reply tail = s.finish();
    tail.reasoning = d.reasoning + tail.reasoning;
    tail.content = d.content + tail.content;
    if (opt.tools && tail.tool_calls.empty()) {
        // Llama 3.1 answers a call with a bare JSON object (after <|python_tag|> or alone).
        std::string_view t = trim(tail.content);
        if (t.starts_with("<|python_tag|>")) t = trim(t.substr(14));
        json calls;
        if (t.starts_with("{") && parse_tool_calls(t, calls)) {
            tail.tool_calls = std::move(calls);
            tail.content.clear();
        }
    }
    return tail;
}

reply_stream::delta reply_stream::push(std::string_view piece) {
    delta out;
    if (in_tools_) {
        tool_text_ += piece;
        return out;
    }
    pending_ += piece;
    while (!pending_.empty()) {
        if (in_reasoning_) {
            const size_t close = pending_.find(think_close);
            if (close == std::string::npos) {
                const size_t keep = partial_marker(pending_, true, false);
                out.reasoning += pending_.substr(0, pending_.size() - keep);
                pending_.erase(0, pending_.size() - keep);
                return out;
            }
            out.reasoning += pending_.substr(0, close);
            pending_.erase(0, close + think_close.size());
            in_reasoning_ = false;
            continue;
        }
        const size_t open = opt_.split_reasoning ? pending_.find(think_open) : std::string::npos;
        const size_t tool = opt_.tools ? tool_start(pending_) : std::string::npos;
        if (open != std::string::npos && (tool == std::string::npos || open < tool)) {
            out.content += pending_.substr(0, open);
            pending_.erase(0, open + think_open.size());
            in_reasoning_ = true;
            continue;
        }
        if (tool != std::string::npos) {
            out.content += pending_.substr(0, tool);
            tool_text_ = pending_.substr(tool);
            pending_.clear();
            in_tools_ = true;
            return out;
        }
        const size_t keep = partial_marker(pending_, opt_.split_reasoning, opt_.tools);
        out.content += pending_.substr(0, pending_.size() - keep);
        pending_.erase(0, pending_.size() - keep);
        return out;
    }
    return out;
}

parsed_reply reply_stream::finish() {
    parsed_reply r;
    (in_reasoning_ ? r.reasoning : r.content) += pending_;
    pending_.clear();
    if (in_tools_) {
        if (!parse_tool_calls(trim(tool_text_), r.tool_calls)) r.content += tool_text_;
    }
    tool_text_.clear();
    return r;
}

}  // namespace strata::server
