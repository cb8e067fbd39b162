// strata-bench server --conversations N --history T: N conversations, each opened with a prompt of
// about T tokens, take turns on one in-process server; time to first token of the returning turns
// with the conversation cache on and off (two servers in one run, one after the other).
#pragma once

#include <string>

namespace strata::bench {

struct conversation_bench_options {
    std::string model;       // empty: generate the demo model (context 8192) in a temporary folder
    int conversations = 4;
    int history = 2000;      // tokens of each conversation's first prompt
    int turns = 3;           // turns per conversation (the first one opens it)
    int max_tokens = 16;     // tokens per answer
    int cache_ram_mib = -1;  // the cache-on arm's budget (-1: the engine's default)
    bool edit = false;       // after the turns, each conversation's last question once more, reworded
};

// Prints the table; returns 0, or 1 when a request failed.
int run_conversation_bench(const conversation_bench_options& o);

}  // namespace strata::bench
