#!/usr/bin/env bash
# Fuzzes strata-server's request parsing with libFuzzer for a fixed time, in two targets that share
# it: the request bodies through the handlers' validation (tests/fuzz/fuzz_requests.cpp, seeds in
# tests/fuzz/corpus), and the HTTP front's framing of arbitrary byte streams with the head helpers
# and the JSON body parser (tests/fuzz/fuzz_front.cpp, seeds in tests/fuzz/front-corpus). Says how
# many executions ran and whether anything was found. Exit status 0: nothing found.
# Usage: tools/fuzz-requests.sh [SECONDS [BUILD_DIR]]   (default 60 in all, and build-fuzz/: configured here
#        with clang, ASan and UBSan unless BUILD_DIR already holds such a build, as the test command's
#        build-asan/ does)
# A finding is written to BUILD_DIR/findings/ (crash-*, leak-*, timeout-*): fix it, then keep the
# input in the target's seed corpus so every later run replays it.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
build=${2:-build-fuzz}
clangxx=${STRATA_FUZZ_CXX:-clang++-14}
clangc=${STRATA_FUZZ_CC:-clang-14}

if [ ! -f "$build/CMakeCache.txt" ]; then
  # Line tables only (-g1): findings still name file:line; the instrumented build is much faster.
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG" \
    "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG" -DSTRATA_SANITIZE=address -DSTRATA_FUZZ=ON \
    -DSTRATA_BUILD_TESTS=OFF -DSTRATA_CUDA=OFF -DCMAKE_CXX_COMPILER="$clangxx" -DCMAKE_C_COMPILER="$clangc" >/dev/null
elif ! grep -q '^STRATA_FUZZ:BOOL=ON$' "$build/CMakeCache.txt"; then
  echo "fuzz-requests: $build is a build without STRATA_FUZZ=ON; name another folder" >&2
  exit 2
fi
cmake --build "$build" -j"$(nproc)" --target fuzz_requests fuzz_front

# New inputs go to scratch corpora; the seed corpora in the repository only change by hand.
findings=$build/findings
rm -rf "$findings"
mkdir -p "$findings"
export ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export LSAN_OPTIONS="suppressions=$PWD/tests/lsan.supp"
half=$(( seconds / 2 > 5 ? seconds / 2 : 5 ))
total_runs=0
# fuzz TARGET SEEDS SECONDS: runs one target; exits 1 with the log's tail when it finds something.
fuzz() {
  local target=$1 seeds=$2 secs=$3 status=0
  local work=$build/corpus-$target log=$build/$target.log
  mkdir -p "$work"
  "$build/tests/fuzz/$target" -max_total_time="$secs" -timeout=10 -rss_limit_mb=4096 -max_len=65536 \
    -print_final_stats=1 -artifact_prefix="$findings/" "$work" "$seeds" >"$log" 2>&1 || status=$?
  local runs
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || true)
  if [ "$status" -ne 0 ] || [ "$(ls "$findings" | wc -l)" -ne 0 ]; then
    tail -n 60 "$log" >&2
    echo "fuzz-requests: $target FOUND something after ${runs:-?} executions (exit $status); inputs in $findings/" >&2
    exit 1
  fi
  echo "fuzz-requests: $target: ${runs} executions in ${secs} s from $(ls "$seeds" | wc -l) seed inputs; nothing found"
  total_runs=$(( total_runs + ${runs:-0} ))
}
fuzz fuzz_requests tests/fuzz/corpus "$half"
fuzz fuzz_front tests/fuzz/front-corpus "$half"
# The last line is the test command's record of this lane (tools/run-tests.sh reads "N executions").
echo "fuzz-requests: ${total_runs} executions in $(( 2 * half )) s (fuzz_requests and fuzz_front); nothing found (no crash, leak, timeout, 5xx or broken framing invariant)"
