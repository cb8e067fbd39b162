// ThreadSanitizer suppressions for the arenas tests, compiled into the test binaries (TSan reads
// __tsan_default_suppressions at start; in other builds this is an unused function).
//
// Why: libtbb.so is not instrumented, so TSan does not see the synchronisation TBB performs when it
// recycles task objects (start_for, tree_node, blocked_range) between threads through its small
// object pool, and reports the template code inlined into our binary as racing. Only reports whose
// TOP frame is inside TBB's own headers, or an std::atomic constructor/access those headers inline,
// are suppressed (race_top); races in strata code or in phase bodies are still reported, because
// expert_pool.cpp annotates the hand-offs TBB makes (phase -> slice task -> join) for TSan.
extern "C" const char* __tsan_default_suppressions() {
    return "race_top:tbb::detail::\n"
           "race_top:std::__atomic_base\n"
           "race_top:std::atomic<bool>::\n"
           "race_top:std::atomic<int>::\n";
}
