// The one exception type request handlers throw: it becomes an OpenAI-style error object
// {"error": {"message", "type", "param", "code"}} with its HTTP status.
#pragma once

#include <stdexcept>
#include <string>

namespace strata::server {

struct api_error : std::runtime_error {
    int status;
    std::string type;    // "invalid_request_error" | "authentication_error" | "not_found_error" | ...
    std::string param;   // the request field at fault; empty: none
    std::string code;    // a machine-readable reason; empty: none

    api_error(int status_, std::string message, std::string type_ = "invalid_request_error", std::string param_ = {},
              std::string code_ = {})
        : std::runtime_error(std::move(message)),
          status(status_),
          type(std::move(type_)),
          param(std::move(param_)),
          code(std::move(code_)) {}
};

inline api_error bad_field(const std::string& field, std::string message, std::string code = "invalid_value") {
    return api_error(400, std::move(message), "invalid_request_error", field, std::move(code));
}

}  // namespace strata::server
