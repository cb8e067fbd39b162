// A Jinja2-compatible template engine for chat templates: the statements, expressions, filters and
// tests that Hugging Face chat templates use, rendered as transformers renders them (Jinja2's
// ImmutableSandboxedEnvironment with trim_blocks and lstrip_blocks, loop controls, and the globals
// raise_exception, strftime_now and a json.dumps-style tojson). The output is meant to be
// byte-identical to Jinja2's; tests/engine/template checks that against python3-jinja2.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "template/value.hpp"

namespace strata::jinja {

namespace detail {
struct node;
}

struct render_options {
    // The time strftime_now formats (seconds since the epoch, shown in local time); unset: now.
    std::optional<std::int64_t> now;
};

class template_program {
public:
    // Parses the template; throws template_error "line N: ..." on a syntax error.
    explicit template_program(std::string_view source);

    // Renders with the context's keys as variables. Throws template_error "line N: ..." when
    // rendering fails (including the template's own raise_exception).
    std::string render(const nlohmann::json& context, const render_options& opt = {}) const;
    std::string render(const nlohmann::ordered_json& context, const render_options& opt = {}) const;

private:
    std::shared_ptr<const std::vector<detail::node>> body_;
};

}  // namespace strata::jinja
