// Reasoning and tool-call extraction from the model's reply text, whole or streamed.
#include "chat_output.hpp"

#include <algorithm>
#include <array>
#include <optional>
#include <utility>
#include <vector>

namespace strata::server {

namespace {

using nlohmann::json;
constexpr size_t npos = std::string_view::npos;

// Reasoning blocks as templates write them: Qwen3, DeepSeek R1/V3.1, GLM-4.5+, Kimi K2 (<think>),
// Seed-OSS, Magistral, Kimi K1.5/VL, Command R7B.
constexpr std::array<std::pair<std::string_view, std::string_view>, 5> think_markers = {{
    {"<think>", "</think>"},
    {"<seed:think>", "</seed:think>"},
    {"[THINK]", "[/THINK]"},
    {"◁think▷", "◁/think▷"},
    {"<|START_THINKING|>", "<|END_THINKING|>"},
}};
// Kimi K2 may start its tool-call section without closing its reasoning first.
constexpr std::array<std::string_view, 2> kimi_sections = {"<|tool_calls_section_begin|>", "<|tool_call_section_begin|>"};
// Where a tool-call block may begin, per family.
constexpr std::array<std::string_view, 6> tool_starts = {"<tool_call>", "<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>",
                                                        kimi_sections[0], kimi_sections[1], "<|tool_call_begin|>"};
constexpr std::string_view python_tag = "<|python_tag|>";
constexpr size_t stream_scan_limit = 64 * 1024;  // bytes of tool-call text streamed as deltas

struct marker_form {
    std::string_view begin, sep, end;
};
constexpr marker_form deepseek_form{"<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>"};
constexpr marker_form kimi_form{"<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"};

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }

size_t skip_ws(std::string_view s, size_t i) {
    while (i < s.size() && is_space(s[i])) ++i;
    return i;
}

std::string_view trim(std::string_view s) {
    const size_t b = s.find_first_not_of(" \t\r\n");
    if (b == npos) return {};
    return s.substr(b, s.find_last_not_of(" \t\r\n") - b + 1);
}

// Between `open` and `close` after pos; false when either is absent.
bool between(std::string_view s, std::string_view open, std::string_view close, size_t& pos, std::string_view& out) {
    const size_t a = s.find(open, pos);
    if (a == npos) return false;
    const size_t b = s.find(close, a + open.size());
    if (b == npos) return false;
    out = s.substr(a + open.size(), b - a - open.size());
    pos = b + close.size();
    return true;
}

// Past the closing quote of the JSON string at s[i]; npos when it does not close within s.
size_t string_end(std::string_view s, size_t i) {
    for (size_t k = i + 1; k < s.size(); ++k) {
        if (s[k] == '\\') ++k;
        else if (s[k] == '"') return k + 1;
    }
    return npos;
}

// Past the JSON value that starts at s[i]; npos when it does not end within s (a scalar ends at the
// next separator, so one at the very end is not known to be complete).
size_t value_end(std::string_view s, size_t i) {
    if (i >= s.size()) return npos;
    if (s[i] == '"') return string_end(s, i);
    if (s[i] == '{' || s[i] == '[') {
        int depth = 0;
        for (size_t k = i; k < s.size(); ++k) {
            if (s[k] == '"') {
                const size_t e = string_end(s, k);
                if (e == npos) return npos;
                k = e - 1;
            } else if (s[k] == '{' || s[k] == '[') {
                ++depth;
            } else if ((s[k] == '}' || s[k] == ']') && --depth == 0) {
                return k + 1;
            }
        }
        return npos;
    }
    size_t k = i;
    while (k < s.size() && std::string_view(",}] \t\r\n").find(s[k]) == npos) ++k;
    return k == s.size() ? npos : k;
}

// JSON text without the whitespace outside strings. Character by character, so the minified prefix
// of a text is a prefix of the minified whole: streamed arguments add up to the final ones.
std::string minify(std::string_view s) {
    std::string out;
    bool in_string = false, escaped = false;
    for (char c : s) {
        if (in_string) {
            out += c;
            if (escaped) escaped = false;
            else if (c == '\\') escaped = true;
            else if (c == '"') in_string = false;
        } else if (!is_space(c)) {
            in_string = c == '"';
            out += c;
        }
    }
    return out;
}

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

// One call as far as it is known: arguments is JSON text (a prefix of it while streaming).
struct call {
    std::string name;
    std::string arguments;
};

enum class body_state { wait, named, bad };  // name not known yet; name known; not a call

// {"name": N, "arguments" | "parameters": {...}} as far as `s` goes: arguments keep the model's text
// (minified) and key order; a string holding them is taken as it is.
body_state read_json_body(std::string_view s, bool complete, call& c) {
    s = trim(s);
    if (complete) {
        const json j = json::parse(s, nullptr, false);
        if (!j.is_object() || !j.contains("name") || !j["name"].is_string()) return body_state::bad;
    }
    std::optional<std::string> name, args;
    bool from_arguments = false;
    size_t i = s.empty() || s[0] != '{' ? npos : skip_ws(s, 1);
    while (i < s.size() && s[i] == '"') {
        const size_t ke = string_end(s, i);
        if (ke == npos) break;
        const json key = json::parse(s.substr(i, ke - i), nullptr, false);
        const size_t colon = skip_ws(s, ke);
        if (colon >= s.size() || s[colon] != ':') break;
        const size_t v = skip_ws(s, colon + 1);
        if (v >= s.size()) break;
        const size_t ve = value_end(s, v);
        const std::string k = key.is_string() ? key.get<std::string>() : "";
        if (k == "name" && ve != npos) {
            const json n = json::parse(s.substr(v, ve - v), nullptr, false);
            if (n.is_string()) name = n.get<std::string>();
        } else if (k == "arguments" || (k == "parameters" && !from_arguments)) {
            from_arguments = from_arguments || k == "arguments";
            const json str = s[v] == '"' && ve != npos ? json::parse(s.substr(v, ve - v), nullptr, false) : json();
            if (s[v] != '"') args = minify(s.substr(v, ve == npos ? npos : ve - v));
            else if (str.is_string()) args = str.get<std::string>();
            else args.reset();  // a string of arguments is taken whole
        }
        if (ve == npos) break;
        i = skip_ws(s, ve);
        i = i < s.size() && s[i] == ',' ? skip_ws(s, i + 1) : npos;
    }
    if (!name) return body_state::wait;
    c.name = *name;
    c.arguments = args ? *args : complete ? "{}" : "";
    return body_state::named;
}

// The parameters of the XML forms (<parameter=K>V</parameter>, or <arg_key>K</arg_key>
// <arg_value>V</arg_value>) from pos: "{" and every complete one, in order; a value is JSON when it
// parses, else a string. Closed with "}" when complete. False when a parameter is malformed.
bool read_xml_args(std::string_view body, size_t pos, bool glm, bool complete, std::string& args) {
    args = "{";
    bool first = true;
    const auto add = [&](std::string_view key, std::string_view value) {
        json j = json::parse(trim(value), nullptr, false);
        if (j.is_discarded()) j = std::string(trim(value));
        args += (first ? "" : ",") + dump(std::string(trim(key))) + ":" + dump(j);
        first = false;
    };
    while (true) {
        std::string_view key, value;
        if (glm) {
            size_t p = pos;
            if (!between(body, "<arg_key>", "</arg_key>", p, key)) break;
            if (!between(body, "<arg_value>", "</arg_value>", p, value)) {
                if (complete) return false;
                break;
            }
            pos = p;
        } else {
            const size_t a = body.find("<parameter=", pos);
            if (a == npos) break;
            const size_t e = body.find('>', a), c = body.find("</parameter>", a);
            if (c == npos && !complete) break;
            if (e == npos || c == npos || e > c) return false;
            key = body.substr(a + 11, e - a - 11);
            value = body.substr(e + 1, c - e - 1);
            pos = c + 12;
        }
        add(key, value);
    }
    if (complete) args += "}";
    return true;
}

// One <tool_call> body in the JSON, XML-function or GLM form, as far as it goes.
body_state read_body(std::string_view body, bool complete, call& c) {
    const std::string_view t = body.substr(skip_ws(body, 0));
    if (t.empty()) return complete ? body_state::bad : body_state::wait;
    if (t[0] == '{') return read_json_body(t, complete, c);
    constexpr std::string_view fn = "<function=";
    if (!complete && fn.starts_with(t)) return body_state::wait;
    if (t.starts_with(fn)) {
        const size_t end = t.find('>');
        if (end == npos) return complete ? body_state::bad : body_state::wait;
        c.name = std::string(trim(t.substr(fn.size(), end - fn.size())));
        return read_xml_args(t, end + 1, false, complete, c.arguments) ? body_state::named : body_state::bad;
    }
    // GLM: the name, then <arg_key>/<arg_value> pairs. While streaming the name ends at a newline or '<'.
    size_t name_end = t.find("<arg_key>");
    if (!complete && name_end == npos) {
        name_end = t.find_first_of("<\n");
        if (name_end == npos) return body_state::wait;
    }
    const std::string name(trim(t.substr(0, name_end)));
    if (name.empty() || name.find_first_of("<>{} \n") != std::string::npos) return body_state::bad;
    c.name = name;
    return read_xml_args(t, name_end == npos ? t.size() : name_end, true, complete, c.arguments) ? body_state::named
                                                                                                 : body_state::bad;
}

// A Kimi/DeepSeek function name: "functions.NAME:0" -> NAME.
std::string marker_name(std::string_view raw) {
    std::string name(trim(raw));
    if (name.starts_with("functions.")) name = name.substr(10);
    if (const size_t colon = name.rfind(':'); colon != std::string::npos) name.resize(colon);
    return name;
}

// DeepSeek V3.1 (NAME<｜tool▁sep｜>{json}) and Kimi K2 (functions.NAME:N<|tool_call_argument_begin|>{json}).
bool read_marker_calls(std::string_view text, const marker_form& f, bool done, std::vector<call>& calls) {
    size_t pos = 0;
    while (true) {
        const size_t b = text.find(f.begin, pos);
        if (b == npos) break;
        const size_t s = text.find(f.sep, b + f.begin.size());
        if (s == npos) return !done;
        call c{marker_name(text.substr(b + f.begin.size(), s - b - f.begin.size())), {}};
        const size_t v = skip_ws(text, s + f.sep.size());
        const size_t ve = value_end(text, v);
        if (ve == npos) {
            if (done) return false;
            if (v < text.size() && text[v] == '{') c.arguments = minify(text.substr(v));
            calls.push_back(std::move(c));
            return true;
        }
        if (text[v] != '{' || !json::parse(text.substr(v, ve - v), nullptr, false).is_object()) return false;
        c.arguments = minify(text.substr(v, ve - v));
        calls.push_back(std::move(c));
        const size_t e = skip_ws(text, ve);
        if (!text.substr(e).starts_with(f.end)) return !done && f.end.starts_with(text.substr(e));
        pos = e + f.end.size();
    }
    return !done || !calls.empty();
}

// The calls in `text` (from a tool-call marker, or a bare JSON object), as far as it goes. done: the
// reply has ended, so every call must be whole and nothing but whitespace may follow the last <tool_call>
// block; false when the text is no call. While streaming: the calls whose names are known, the last one's
// arguments so far.
bool read_calls(std::string_view text, bool done, std::vector<call>& calls) {
    text = text.substr(skip_ws(text, 0));
    if (text.find(deepseek_form.begin) != npos) return read_marker_calls(text, deepseek_form, done, calls);
    if (text.find(kimi_form.begin) != npos) return read_marker_calls(text, kimi_form, done, calls);
    if (text.starts_with("<｜") || text.starts_with("<|tool_call")) return !done;  // a section opened, no call yet
    if (text.starts_with(python_tag)) text = text.substr(skip_ws(text, python_tag.size()));
    if (text.starts_with("{")) {
        call c;
        const body_state st = read_body(text, done, c);
        if (st == body_state::named) calls.push_back(std::move(c));
        return st != body_state::bad && (!done || st == body_state::named);
    }
    constexpr std::string_view open = "<tool_call>", close = "</tool_call>";
    size_t pos = 0;
    while (true) {
        const size_t i = skip_ws(text, pos);
        if (i == text.size()) break;
        if (!text.substr(i).starts_with(open)) return !done && open.starts_with(text.substr(i));
        const size_t b = i + open.size(), e = text.find(close, b);
        call c;
        const body_state st = read_body(text.substr(b, e == npos ? npos : e - b), e != npos, c);
        if (st == body_state::bad || (e == npos && done)) return false;
        if (st == body_state::named) calls.push_back(std::move(c));
        if (e == npos) break;
        pos = e + close.size();
    }
    return !done || !calls.empty();
}

std::string call_id(size_t index) { return "call_" + std::to_string(index); }

json call_json(const call& c, size_t index) {
    return {{"id", call_id(index)}, {"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments}}}};
}

size_t tool_start(std::string_view s) {
    size_t best = npos;
    for (std::string_view m : tool_starts) best = std::min(best, s.find(m));
    return best;
}

// Length of the longest tail of s that is a proper prefix of one of the markers in play.
size_t partial_marker(std::string_view s, bool reasoning_open, bool reasoning_close, bool tools) {
    size_t keep = 0;
    auto check = [&](std::string_view m) {
        for (size_t n = std::min(m.size() - 1, s.size()); n > keep; --n)
            if (s.substr(s.size() - n) == m.substr(0, n)) {
                keep = n;
                break;
            }
    };
    for (const auto& [open, close] : think_markers) {
        if (reasoning_open) check(open);
        if (reasoning_close) check(close);
    }
    if (reasoning_close)
        for (std::string_view m : kimi_sections) check(m);
    if (tools)
        for (std::string_view m : tool_starts) check(m);
    return keep;
}

// The earliest of `markers` in s: {position, marker length}; position npos when none.
template <class Markers, class Pick>
std::pair<size_t, size_t> earliest(std::string_view s, const Markers& markers, Pick pick) {
    std::pair<size_t, size_t> best{npos, 0};
    for (const auto& m : markers) {
        const std::string_view text = pick(m);
        const size_t at = s.find(text);
        if (at < best.first) best = {at, text.size()};
    }
    return best;
}

}  // namespace

bool opens_reasoning(std::string_view prompt) {
    const size_t end = prompt.find_last_not_of(" \t\n\r");
    if (end == npos) return false;
    const std::string_view p = prompt.substr(0, end + 1);
    return std::any_of(think_markers.begin(), think_markers.end(), [&](const auto& m) { return p.ends_with(m.first); });
}

parsed_reply parse_reply(std::string_view text, const reply_options& opt) {
    reply_stream s(opt);
    reply_stream::delta d = s.push(text);
    parsed_reply tail = s.finish();
    tail.reasoning = d.reasoning + tail.reasoning;
    tail.content = d.content + tail.content;
    tail.tool_call_deltas = json::array();
    return tail;
}

namespace {

// The tool_calls deltas that bring what was sent (each call's arguments so far) up to `calls`: a new
// call's first delta has its id, type and name; later ones add argument text.
void emit_calls(const std::vector<call>& calls, std::vector<std::string>& sent, json& out) {
    for (size_t i = 0; i < calls.size(); ++i) {
        if (i == sent.size()) {
            json first = call_json(calls[i], i);
            first["index"] = i;
            out.push_back(std::move(first));
            sent.push_back(calls[i].arguments);
        } else if (calls[i].arguments.size() > sent[i].size() && calls[i].arguments.starts_with(sent[i])) {
            out.push_back({{"index", i}, {"function", {{"arguments", calls[i].arguments.substr(sent[i].size())}}}});
            sent[i] = calls[i].arguments;
        }
    }
}

}  // namespace

reply_stream::delta reply_stream::push(std::string_view piece) {
    delta out;
    if (in_tools_) {
        tool_text_ += piece;
        // Each piece re-reads the call text: past the limit the rest waits for finish(), so a runaway
        // call costs bounded work per token.
        std::vector<call> calls;
        if (tool_text_.size() <= stream_scan_limit && read_calls(tool_text_, false, calls))
            emit_calls(calls, sent_, out.tool_calls);
        return out;
    }
    pending_ += piece;
    const auto say = [&](std::string_view text) {
        out.content += text;
        if (text.find_first_not_of(" \t\r\n") != npos) at_start_ = false;
    };
    while (!pending_.empty()) {
        if (in_reasoning_) {
            const auto close = earliest(pending_, think_markers, [](const auto& m) { return m.second; });
            const auto section = earliest(pending_, kimi_sections, [](std::string_view m) { return m; });
            if (close.first == npos && section.first == npos) {
                const size_t keep = partial_marker(pending_, false, true, false);
                out.reasoning += pending_.substr(0, pending_.size() - keep);
                pending_.erase(0, pending_.size() - keep);
                return out;
            }
            const bool by_section = section.first < close.first;
            const size_t at = by_section ? section.first : close.first;
            out.reasoning += pending_.substr(0, at);
            pending_.erase(0, by_section ? at : at + close.second);  // a section's marker stays: the calls follow
            in_reasoning_ = false;
            continue;
        }
        const auto open = opt_.split_reasoning ? earliest(pending_, think_markers, [](const auto& m) { return m.first; })
                                               : std::pair<size_t, size_t>{npos, 0};
        size_t tool = opt_.tools ? tool_start(pending_) : npos;
        if (opt_.tools && at_start_) {
            // Llama 3.1 answers with a bare JSON object (after <|python_tag|> or alone): held while the
            // reply's content has not begun.
            const std::string_view t = std::string_view(pending_).substr(skip_ws(pending_, 0));
            if (t.empty() || (python_tag.starts_with(t) && open.first == npos)) return out;
            if (t.starts_with("{") || t.starts_with(python_tag)) tool = std::min(tool, pending_.size() - t.size());
        }
        if (open.first != npos && (tool == npos || open.first < tool)) {
            say(std::string_view(pending_).substr(0, open.first));
            pending_.erase(0, open.first + open.second);
            in_reasoning_ = true;
            continue;
        }
        if (tool != npos) {
            say(std::string_view(pending_).substr(0, tool));
            std::string rest = pending_.substr(tool);
            pending_.clear();
            in_tools_ = true;
            delta more = push(rest);
            out.tool_calls = std::move(more.tool_calls);
            return out;
        }
        const size_t keep = partial_marker(pending_, opt_.split_reasoning, false, opt_.tools);
        say(std::string_view(pending_).substr(0, pending_.size() - keep));
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
        std::vector<call> calls;
        if (read_calls(tool_text_, true, calls)) {
            for (size_t i = 0; i < calls.size(); ++i) r.tool_calls.push_back(call_json(calls[i], i));
            emit_calls(calls, sent_, r.tool_call_deltas);
        } else {
            r.content += tool_text_;
        }
    }
    tool_text_.clear();
    return r;
}

}  // namespace strata::server
