// Request bodies as JSON: one linear pass of nlohmann-json's SAX parser that builds the document the
// handlers read, and only that. The values of top-level fields the server never reads are checked
// for well-formedness and skipped, so an ignored field costs no memory whatever it holds, and the
// document kept is capped in values so no body can make it much larger than itself.
#pragma once

#include <cstddef>
#include <string_view>

#include <nlohmann/json.hpp>

namespace strata::server {

// Values (of any type, containers included) a body's document may hold: a prompt of a million token
// ids fits, while the document stays within a few tens of MiB.
inline constexpr size_t max_json_values = size_t(1) << 20;

// True for the top-level fields some endpoint reads; the rest are skipped unparsed into values.
// A handler that reads a new field must add its name to the list in json_body.cpp.
bool is_read_field(std::string_view name);

// The body as a JSON object. Throws api_error 400: invalid UTF-8 (byte offset), malformed JSON (the
// parser's position), a number beyond a double (its field), more than max_values values kept
// (code "too_many_values"), or a body that is not an object.
nlohmann::json parse_json_body(std::string_view body, size_t max_values = max_json_values);
// The same document with the client's key order (chat templates show it), as bounded as the above.
nlohmann::ordered_json parse_json_body_ordered(std::string_view body, size_t max_values = max_json_values);

}  // namespace strata::server
