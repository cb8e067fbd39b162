// The symbol list both BPE flavours merge over: a doubly linked list of byte ranges in one string and a
// heap of candidate pairs, checked for staleness when popped. Internal to the tokenizer.
#pragma once

#include <cstdint>
#include <queue>
#include <string_view>
#include <vector>

namespace strata::tok {

struct merge_symbol {
    size_t begin;
    size_t length;  // 0 once merged into its left neighbour
    int prev;
    int next;       // -1 at the ends
};

// A candidate merge of symbols `left` and `right`, valid while both still have the lengths seen here.
// `priority` orders the heap: higher first; the lower left index first among equals.
struct merge_candidate {
    double priority;
    int left;
    int right;
    size_t left_length;
    size_t right_length;

    bool operator<(const merge_candidate& o) const {
        return priority != o.priority ? priority < o.priority : left > o.left;
    }
};

// Runs merges until none is left. `score(a, b, priority)` says whether the texts a and b join and,
// when they do, sets the priority of joining them.
template <typename ScoreFn>
void run_merges(std::string_view text, std::vector<merge_symbol>& sym, ScoreFn score) {
    std::priority_queue<merge_candidate> heap;
    const auto consider = [&](int l, int r) {
        if (l < 0 || r < 0) return;
        const merge_symbol& a = sym[static_cast<size_t>(l)];
        const merge_symbol& b = sym[static_cast<size_t>(r)];
        double priority = 0;
        if (score(text.substr(a.begin, a.length), text.substr(b.begin, b.length), priority))
            heap.push({priority, l, r, a.length, b.length});
    };
    for (size_t i = 1; i < sym.size(); ++i) consider(static_cast<int>(i - 1), static_cast<int>(i));
    while (!heap.empty()) {
        const merge_candidate c = heap.top();
        heap.pop();
        merge_symbol& a = sym[static_cast<size_t>(c.left)];
        merge_symbol& b = sym[static_cast<size_t>(c.right)];
        if (a.length != c.left_length || b.length != c.right_length || a.next != c.right) continue;  // stale
        a.length += b.length;
        b.length = 0;
        a.next = b.next;
        if (b.next >= 0) sym[static_cast<size_t>(b.next)].prev = c.left;
        consider(a.prev, c.left);
        consider(c.left, a.next);
    }
}

}  // namespace strata::tok
