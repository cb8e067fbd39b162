// ThreadSanitizer suppressions, compiled into every test binary of a STRATA_SANITIZE=thread build
// (TSan reads __tsan_default_suppressions at start; in other builds this is an unused function).
//
// Only oneTBB's own frames. libtbb.so is not instrumented, so TSan does not see how TBB orders the
// objects it manages: the task, range and tree-node objects its small object pool recycles between
// threads, and the wait node on the caller's stack that workers count down before TBB's wait (inside
// libtbb) lets the caller go on. Accesses to those objects, and later reuse of their memory, read as
// races. Suppressed are races whose top frame is TBB header code (race_top:tbb::detail::) and races
// with a stack through the TBB functions below, each of which touches only TBB's own objects and never
// calls strata code. A race between strata frames (std::atomic operations included) is reported;
// expert_pool.cpp annotates for TSan the hand-offs TBB makes between strata's own code.
extern "C" const char* __tsan_default_suppressions() {
    return "race_top:tbb::detail::\n"
           "race:tbb::detail::d1::fold_tree\n"
           "race:tbb::detail::d1::node::node\n"
           "race:tbb::detail::d1::tree_node::tree_node\n"
           "race:tbb::detail::d1::tree_node::mark_task_stolen\n"
           "race:tbb::detail::d1::dynamic_grainsize_mode*::check_being_stolen\n"
           "race:tbb::detail::d1::wait_node::wait_node\n"
           "race:tbb::detail::d1::wait_context::\n";
}
