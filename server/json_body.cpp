#include "json_body.hpp"

#include <algorithm>
#include <array>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include <spdlog/fmt/fmt.h>

#include "api_error.hpp"
#include "text.hpp"

namespace strata::server {
namespace {

using json = nlohmann::json;

// Every top-level field an endpoint reads (OpenAI's and llama-server's names), sorted.
constexpr auto read_fields = std::to_array<std::string_view>({
    "add_generation_prompt", "add_special", "best_of", "cache_prompt", "chat_template_kwargs",
    "content", "echo", "enable_thinking", "frequency_penalty", "function_call", "functions", "ignore_eos",
    "logit_bias", "logprobs", "max_completion_tokens", "max_tokens", "messages", "min_p", "model", "n",
    "n_predict", "parallel_tool_calls", "parse_special", "presence_penalty", "prompt", "prompt_cache_key",
    "reasoning_effort", "reasoning_format", "repeat_last_n", "repeat_penalty", "response_format", "seed", "stop",
    "stream", "stream_options", "suffix", "temperature", "tokens", "tool_choice", "tools", "top_k",
    "top_logprobs", "top_p", "user", "with_pieces",
});

static_assert(std::is_sorted(read_fields.begin(), read_fields.end()), "is_read_field searches a sorted list");

// Builds the document from the parser's events. Values under a skipped field only move `skip_depth`.
// J is nlohmann::json or nlohmann::ordered_json (the client's key order, for chat templates).
template <class J>
class body_builder {
public:
    explicit body_builder(size_t max_values) : max_values_(max_values) {}

    bool null() { return value(J(nullptr)); }
    bool boolean(bool v) { return value(J(v)); }
    bool number_integer(typename J::number_integer_t v) { return value(J(v)); }
    bool number_unsigned(typename J::number_unsigned_t v) { return value(J(v)); }
    bool number_float(typename J::number_float_t v, const std::string&) { return value(J(v)); }
    bool string(std::string& v) { return value(J(std::move(v))); }
    bool binary(typename J::binary_t&) { return value(J()); }  // never produced by the text parser

    bool start_object(size_t) { return open(J::object()); }
    bool start_array(size_t) { return open(J::array()); }
    bool end_object() { return close(); }
    bool end_array() { return close(); }

    bool key(std::string& k) {
        if (skip_depth_ > 0) return true;
        keys_.resize(stack_.size());
        keys_.back() = k;
        if (stack_.size() == 1 && !is_read_field(k)) skip_next_ = true;
        else key_ = std::move(k);
        return true;
    }

    bool parse_error(size_t, const std::string&, const nlohmann::detail::exception& e) {
        if (e.id != 406) throw api_error(400, fmt::format("the request body is not valid JSON: {}", e.what()),
                                         "invalid_request_error", "", "invalid_json");
        // A number beyond a double (1e999): the parser's text says which, the key path says where.
        const std::string what = e.what();
        const size_t quote = what.find('\'');
        const std::string number = quote == std::string::npos ? what : what.substr(quote);
        const std::string where = path();
        if (where.empty())
            throw api_error(400, fmt::format("the request body holds a number too large for a 64-bit float: {}", number),
                            "invalid_request_error", "", "invalid_value");
        throw bad_field(where, fmt::format("'{}' is a number too large for a 64-bit float: {}", where, number));
    }

    J take() { return std::move(root_); }

private:
    bool skipping() {
        if (skip_depth_ > 0) return true;
        if (!skip_next_) return false;
        skip_next_ = false;
        return true;
    }

    void count() {
        if (++values_ > max_values_)
            throw api_error(400, fmt::format("the request body holds more than {} JSON values (arrays, objects, "
                                             "strings, numbers, ...)", max_values_),
                            "invalid_request_error", "", "too_many_values");
    }

    // Places a value in the container being filled; returns where it now lives.
    J* place(J&& v) {
        count();
        if (stack_.empty()) {
            root_ = std::move(v);
            return &root_;
        }
        J& top = *stack_.back();
        if (top.is_array()) {
            top.push_back(std::move(v));
            return &top.back();
        }
        if constexpr (std::is_same_v<J, nlohmann::ordered_json>) {
            // ordered_json's operator[] searches the object linearly: an index per open object keeps a
            // wide object linear (a repeated key replaces the earlier value, as the parser does).
            auto& index = index_[stack_.size() - 1];
            auto& members = static_cast<std::vector<typename J::object_t::value_type>&>(
                top.template get_ref<typename J::object_t&>());
            const auto [it, inserted] = index.try_emplace(key_, members.size());
            if (!inserted) {
                members[it->second].second = std::move(v);
                return &members[it->second].second;
            }
            members.emplace_back(key_, std::move(v));
            return &members.back().second;
        } else {
            J& slot = top[key_];
            slot = std::move(v);
            return &slot;
        }
    }

    bool value(J&& v) {
        if (!skipping()) place(std::move(v));
        return true;
    }

    bool open(J&& container) {
        if (skipping()) {
            ++skip_depth_;
            return true;
        }
        stack_.push_back(place(std::move(container)));
        if constexpr (std::is_same_v<J, nlohmann::ordered_json>) index_.resize(stack_.size()), index_.back().clear();
        return true;
    }

    bool close() {
        if (skip_depth_ > 0) --skip_depth_;
        else stack_.pop_back();
        return true;
    }

    // The object keys that lead to the value being parsed ("stream_options.include_usage").
    std::string path() const {
        std::string s;
        for (size_t i = 0; i < std::min(keys_.size(), stack_.size()); ++i)
            if (stack_[i]->is_object() && !keys_[i].empty()) s += (s.empty() ? "" : ".") + keys_[i];
        return s;
    }

    size_t max_values_;
    size_t values_ = 0;
    J root_;
    std::vector<J*> stack_;       // the open containers being filled, outermost first
    std::vector<std::string> keys_;  // the last key seen at each open level
    std::string key_;                // the key of the next value in the innermost object
    bool skip_next_ = false;         // the next value belongs to a skipped field
    std::vector<std::unordered_map<std::string, size_t>> index_;  // ordered_json: key -> member, per open level
    size_t skip_depth_ = 0;          // containers open inside a skipped field
};

template <class J>
std::string describe(const J& v) {
    const std::string t = v.type_name();
    return (t == "object" || t == "array") ? "an " + t : (t == "null" ? "null" : "a " + t);
}

}  // namespace

bool is_read_field(std::string_view name) {
    return std::binary_search(read_fields.begin(), read_fields.end(), name);
}

template <class J>
J parse_body_as(std::string_view body, size_t max_values) {
    if (const auto bad = find_invalid_utf8(body))
        throw api_error(400, fmt::format("the request body is not valid UTF-8 (first bad byte at offset {})", *bad),
                        "invalid_request_error", "", "invalid_utf8");
    body_builder<J> b(max_values);
    J::sax_parse(body.begin(), body.end(), &b);
    J j = b.take();
    if (!j.is_object())
        throw api_error(400, fmt::format("the request body must be a JSON object, got {}", describe(j)),
                        "invalid_request_error", "", "invalid_json");
    return j;
}

json parse_json_body(std::string_view body, size_t max_values) { return parse_body_as<json>(body, max_values); }

nlohmann::ordered_json parse_json_body_ordered(std::string_view body, size_t max_values) {
    return parse_body_as<nlohmann::ordered_json>(body, max_values);
}

}  // namespace strata::server
