// strata-bench modes: each bench_<mode>.cpp registers one with a static register_mode.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace strata::bench {

struct mode {
    std::string_view name;
    std::string_view summary;
    int (*run)(int argc, char** argv);  // argv[0] is the mode's name
};

struct register_mode {
    explicit register_mode(const mode& m);
};

// "a,b,,c" -> {"a", "b", "c"}: the comma lists the modes' options take (formats, thread counts, arms).
std::vector<std::string> split_list(const std::string& s);

}  // namespace strata::bench
