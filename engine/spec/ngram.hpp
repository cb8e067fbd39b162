// The n-gram drafter (prompt lookup): the continuation of the most recent earlier occurrence of the
// context's last n tokens, trying the longest n first. No weights; strong where the output quotes or
// edits text already in the context.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace strata::engine::spec {

struct ngram_params {
    int n_min = 2;  // shortest suffix matched
    int n_max = 4;  // longest suffix matched
};

// Up to k tokens that followed the latest earlier occurrence of ctx's last n tokens (n from n_max down
// to n_min; the first n with a match wins); empty when none matches.
std::vector<int32_t> ngram_draft(std::span<const int32_t> ctx, int k, const ngram_params& p = {});

}  // namespace strata::engine::spec
