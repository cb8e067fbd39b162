// strata-bench model --spec: decode tok/s without speculation, with each drafter, with forced drafts
// (the known continuation: 100 % acceptance, the ceiling), the verification cost curve k = 1..8 in
// decode steps, the break-even acceptance per k, and the speed as a function of a forced acceptance rate.
#pragma once

#include <string>

namespace strata::bench {

struct spec_bench_options {
    std::string path;
    int n_gen = 64;
    int reps = 3;
    int n_prompt = 64;
    int max_k = 8;
};

// Prints the tables; returns the exit status.
int run_spec_bench(const spec_bench_options& o);

}  // namespace strata::bench
