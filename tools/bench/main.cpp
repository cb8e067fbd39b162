// strata-bench MODE [options]: benchmark programs that print a figure next to a baseline
// measured in the same run.
#include <cstdio>
#include <exception>
#include <sstream>
#include <string_view>
#include <vector>

#include "modes.hpp"

namespace strata::bench {

static std::vector<mode>& modes() {
    static std::vector<mode> all;
    return all;
}

register_mode::register_mode(const mode& m) { modes().push_back(m); }

std::vector<std::string> split_list(const std::string& s) {
    std::vector<std::string> out;
    std::stringstream ss(s);
    for (std::string item; std::getline(ss, item, ',');)
        if (!item.empty()) out.push_back(item);
    return out;
}

}  // namespace strata::bench

int main(int argc, char** argv) {
    using strata::bench::modes;
    if (argc >= 2) {
        for (const auto& m : modes())
            if (m.name == std::string_view(argv[1])) {
                try {
                    return m.run(argc - 1, argv + 1);
                } catch (const std::exception& e) {
                    std::fprintf(stderr, "strata-bench %s: %s\n", argv[1], e.what());
                    return 2;
                }
            }
    }
    std::fprintf(stderr, "usage: strata-bench MODE [options]   (MODE --help for its options)\nmodes:\n");
    for (const auto& m : modes())
        std::fprintf(stderr, "  %-10.*s %.*s\n", int(m.name.size()), m.name.data(), int(m.summary.size()),
                     m.summary.data());
    return argc >= 2 ? 2 : 0;
}
