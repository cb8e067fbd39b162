#include "model/ple.hpp"

#include <algorithm>
#include <vector>

#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

namespace strata::engine {

void ple_rows_of(const hparams& hp, const float* window, const int32_t* tokens, int t, int64_t* rows) {
    const int n_gram = hp.ple_ngram, n_prev = n_gram - 1, per = hp.ple_heads_per_ngram;
    const uint64_t eos = static_cast<uint64_t>(hp.ple_eos);
    uint64_t ctx[16];
    ctx[0] = static_cast<uint64_t>(tokens[t]);
    bool cut = false;
    for (int s = 1; s < n_gram; ++s) {
        int64_t tok = -1;
        if (t - s >= 0)
            tok = tokens[t - s];
        else if (const float w = window[n_prev + (t - s)]; w > 0.0f)
            tok = static_cast<int64_t>(w) - 1;
        cut = cut || tok < 0 || static_cast<uint64_t>(tok) == eos;
        ctx[s] = cut ? eos : static_cast<uint64_t>(tok);
    }
    for (int n = 2; n <= n_gram; ++n) {
        uint64_t mixed = ctx[0] * hp.ple_mult[0];
        for (int j = 1; j < n; ++j) mixed ^= ctx[j] * hp.ple_mult[static_cast<size_t>(j)];
        for (int g = 0; g < per; ++g) {
            const size_t h = static_cast<size_t>((n - 2) * per + g);
            rows[h] = static_cast<int64_t>(mixed % hp.ple_vocab[h] + hp.ple_offset[h]);
        }
    }
}

void ple_push_window(const hparams& hp, float* window, const int32_t* tokens, int n) {
    const int n_prev = hp.ple_ngram - 1;
    std::vector<float> all(window, window + n_prev);
    for (int i = 0; i < n; ++i) all.push_back(static_cast<float>(tokens[i] + 1));
    for (int j = 0; j < n_prev; ++j) window[j] = all[all.size() - static_cast<size_t>(n_prev) + static_cast<size_t>(j)];
}

uint64_t thread_major_faults() {
    rusage u{};
    if (getrusage(RUSAGE_THREAD, &u) != 0) return 0;
    return static_cast<uint64_t>(u.ru_majflt);
}

uint64_t resident_bytes(const void* p, size_t n) {
    if (!p || n == 0) return 0;
    const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
    const uintptr_t begin = reinterpret_cast<uintptr_t>(p) / page * page;
    const uintptr_t end = (reinterpret_cast<uintptr_t>(p) + n + page - 1) / page * page;
    std::vector<unsigned char> in((end - begin) / page);
    if (mincore(reinterpret_cast<void*>(begin), end - begin, in.data()) != 0) return 0;
    uint64_t pages = 0;
    for (unsigned char c : in) pages += c & 1u;
    return std::min<uint64_t>(pages * page, n);
}

}  // namespace strata::engine
