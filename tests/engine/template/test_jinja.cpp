// The renderer's behaviour case by case: whitespace control, scoping, operators, filters, tests,
// Python methods and errors (each expected text is what Jinja2 3.1 renders for the same source).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "template/jinja.hpp"

namespace {

using nlohmann::json;
using strata::jinja::template_error;
using strata::jinja::template_program;

std::string render(const std::string& src, const json& ctx = json::object()) {
    return template_program(src).render(ctx);
}

TEST(Jinja, WhitespaceControl) {
    EXPECT_EQ(render("a  {{- 'b' -}}  c"), "abc");
    // trim_blocks drops the newline after a block tag; lstrip_blocks the indent before it.
    EXPECT_EQ(render("x\n    {% if true %}\n  y\n    {% endif %}\nz"), "x\n  y\nz");
    EXPECT_EQ(render("{% if true %}  y{% endif %}"), "  y");
    EXPECT_EQ(render("a {#- note -#}  b"), "ab");
    EXPECT_EQ(render("a\n  {# note #}\nb"), "a\nb");
    EXPECT_EQ(render("  {%+ if true %}x{% endif %}"), "  x");
    EXPECT_EQ(render("{{ 'a' }}\n{{ 'b' }}"), "a\nb");
}

TEST(Jinja, ScopesAndNamespaces) {
    EXPECT_EQ(render("{% set x = 1 %}{% for i in [1, 2] %}{% set x = i %}{% endfor %}{{ x }}"), "1");
    EXPECT_EQ(render("{% set ns = namespace(x=1) %}{% for i in [1, 2] %}{% set ns.x = i %}{% endfor %}{{ ns.x }}"), "2");
    EXPECT_EQ(render("{% if true %}{% set x = 3 %}{% endif %}{{ x }}"), "3");
    EXPECT_EQ(render("{% set x %}a{{ 1 + 1 }}{% endset %}[{{ x }}]"), "[a2]");
    EXPECT_EQ(render("{% macro m(a, b='B') %}{{ a }}{{ b }}{% endmacro %}{{ m(1) }}{{ m(2, b=3) }}"), "1B23");
}

TEST(Jinja, Loops) {
    EXPECT_EQ(render("{% for x in 'abc' %}{{ loop.index }}{{ x }}{% if not loop.last %},{% endif %}{% endfor %}"),
              "1a,2b,3c");
    EXPECT_EQ(render("{% for x in [] %}x{% else %}empty{% endfor %}"), "empty");
    EXPECT_EQ(render("{% for x in [1, 2, 3, 4] if x is even %}{{ x }}{{ loop.length }}{% endfor %}"), "2242");
    EXPECT_EQ(render("{% for x in [1, 2, 3] %}{% if x == 2 %}{% continue %}{% endif %}{{ x }}{% endfor %}"), "13");
    EXPECT_EQ(render("{% for x in [1, 2, 3] %}{% if x == 2 %}{% break %}{% endif %}{{ x }}{% endfor %}"), "1");
    EXPECT_EQ(render("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}", {{"d", {{"a", 1}, {"b", true}}}}), "a=1;b=True;");
    EXPECT_EQ(render("{% for x in [1, 2] %}{{ loop.previtem }}|{{ loop.nextitem }};{% endfor %}"), "|2;1|;");
}

TEST(Jinja, Expressions) {
    EXPECT_EQ(render("{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 / 2 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 1 + 2 * 3 }}"), "3 -4 3.5 2 1024 7");
    EXPECT_EQ(render("{{ 'a' ~ 1 ~ none }} {{ 'x' if false }}|{{ 'y' if 0 else 'z' }}"), "a1None |z");
    EXPECT_EQ(render("{{ [1, 2, 3][1:] }} {{ 'hello'[::-1] }} {{ 'héllo'[1] }} {{ [1,2][-1] }}"), "[2, 3] olleh é 2");
    EXPECT_EQ(render("{{ 'b' in 'abc' }} {{ 2 not in [1, 2] }} {{ 'k' in {'k': 1} }}"), "True False True");
    EXPECT_EQ(render("{{ {'a': [1, 'x', none, 1.5]} }} {{ (1,) }} {{ \"it's\" }}"), "{'a': [1, 'x', None, 1.5]} (1,) it's");
    EXPECT_EQ(render("{{ [\"it's\"] }} {{ 1e-5 }} {{ 1.0e16 }} {{ 0.1 + 0.2 }}"), "[\"it's\"] 1e-05 1e+16 0.30000000000000004");
    EXPECT_EQ(render("{{ x.y }}|{{ x['z'] }}|{{ n.a }}", {{"x", {{"y", 1}}}, {"n", nullptr}}), "1||");
}

TEST(Jinja, StringMethods) {
    EXPECT_EQ(render("{{ '  a b  '.strip() }}|{{ 'xxaxx'.strip('x') }}|{{ '\\n\\na'.lstrip('\\n') }}"), "a b|a|a");
    EXPECT_EQ(render("{{ 'a,b,,c'.split(',') }} {{ ' a  b '.split() }} {{ 'a b c'.split(' ', 1) }} {{ 'a b c'.rsplit(' ', 1) }}"),
              "['a', 'b', '', 'c'] ['a', 'b'] ['a', 'b c'] ['a b', 'c']");
    EXPECT_EQ(render("{{ 'abc'.startswith('ab') }} {{ 'abc'.endswith(('x', 'c')) }} {{ 'aXa'.replace('a', 'b') }}"),
              "True True bXb");
    EXPECT_EQ(render("{{ 'hello world'.title() }} {{ 'ABC'.lower() }} {{ 'abc'.upper() }}"), "Hello World abc ABC");
}

TEST(Jinja, Filters) {
    EXPECT_EQ(render("{{ {'b': 'é\"', 'a': [1, 2.5, none, true]} | tojson }}"), "{\"b\": \"é\\\"\", \"a\": [1, 2.5, null, true]}");
    EXPECT_EQ(render("{{ {'a': [1, {}]} | tojson(indent=2) }}"), "{\n  \"a\": [\n    1,\n    {}\n  ]\n}");
    EXPECT_EQ(render("{{ 'é' | tojson(ensure_ascii=True) }}"), "\"\\u00e9\"");
    EXPECT_EQ(render("{{ [3, 1, 2] | join(', ') }} {{ [1, 2] | length }} {{ x | default('d') }} {{ [1, 2] | first }}"),
              "3, 1, 2 2 d 1");
    EXPECT_EQ(render("{{ ms | selectattr('role', 'equalto', 'user') | map(attribute='c') | list }}",
                     {{"ms", {{{"role", "user"}, {"c", 1}}, {{"role", "bot"}, {"c", 2}}}}}),
              "[1]");
    EXPECT_EQ(render("{{ ['a', 'b', 'c'] | reject('equalto', 'b') | list }} {{ '  x ' | trim }} {{ '42' | int + 1 }}"),
              "['a', 'c'] x 43");
    EXPECT_EQ(render("{{ 'a\\nb\\n\\nc' | indent(2) }}|{{ 'a\\nb' | indent(2, true) }}"), "a\n  b\n\n  c|  a\n  b");
    EXPECT_EQ(render("{% filter upper %}abc{% endfilter %}"), "ABC");
}

TEST(Jinja, Tests) {
    EXPECT_EQ(render("{{ x is defined }} {{ none is none }} {{ 'a' is string }} {{ {} is mapping }} {{ [] is iterable }}"),
              "False True True True True");
    EXPECT_EQ(render("{{ 1 is number }} {{ 'a' is not mapping }} {{ false is false }} {{ 3 is divisibleby 3 }}"),
              "True True True True");
}

TEST(Jinja, Errors) {
    try {
        render("line one\n{{ raise_exception('bad role') }}");
        FAIL() << "no error";
    } catch (const template_error& e) {
        EXPECT_STREQ(e.what(), "line 2: bad role");
    }
    EXPECT_THROW(render("{% if %}"), template_error);
    EXPECT_THROW(render("{% for x in y %}"), template_error);
    EXPECT_THROW(render("{{ x.y }}"), template_error);  // attribute of an undefined value
    EXPECT_THROW(render("{% set l = [] %}{{ l.append(1) }}"), template_error);  // the sandbox forbids it
    EXPECT_THROW(render("{{ 1 + 'a' }}"), template_error);
}

}  // namespace
