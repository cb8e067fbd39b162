#!/usr/bin/env bash
# Fuzzes strata-server's request parser (tests/fuzz/fuzz_requests.cpp) with libFuzzer for a fixed
# time, starting from the seed corpus of real requests in tests/fuzz/corpus, and says how many
# executions ran and whether anything was found. Exit status 0: nothing found.
# Usage: tools/fuzz-requests.sh [SECONDS]   (default 60; builds with clang under build-fuzz/)
# A finding is written to build-fuzz/findings/ (crash-*, leak-*, timeout-*): fix it, then keep the
# input in tests/fuzz/corpus so every later run replays it.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
clangxx=${STRATA_FUZZ_CXX:-clang++-14}
clangc=${STRATA_FUZZ_CC:-clang-14}

cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSTRATA_FUZZ=ON -DSTRATA_BUILD_TESTS=OFF \
  -DSTRATA_CUDA=OFF -DCMAKE_CXX_COMPILER="$clangxx" -DCMAKE_C_COMPILER="$clangc" >/dev/null
cmake --build build-fuzz -j"$(nproc)" --target fuzz_requests

# New inputs go to a scratch corpus; the seed corpus in the repository only changes by hand.
work=build-fuzz/corpus
findings=build-fuzz/findings
rm -rf "$findings"
mkdir -p "$work" "$findings"
log=build-fuzz/fuzz-requests.log
export ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export LSAN_OPTIONS="suppressions=$PWD/tests/lsan.supp"
status=0
build-fuzz/tests/fuzz/fuzz_requests -max_total_time="$seconds" -timeout=10 -rss_limit_mb=4096 -max_len=65536 \
  -print_final_stats=1 -artifact_prefix="$findings/" "$work" tests/fuzz/corpus >"$log" 2>&1 || status=$?

runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || true)
found=$(ls "$findings" 2>/dev/null | wc -l)
if [ "$status" -ne 0 ] || [ "$found" -ne 0 ]; then
  tail -n 60 "$log" >&2
  echo "fuzz-requests: FOUND something after ${runs:-?} executions (exit $status); inputs in $findings/" >&2
  exit 1
fi
echo "fuzz-requests: ${runs} executions in ${seconds} s from $(ls tests/fuzz/corpus | wc -l) seed inputs; nothing found (no crash, leak, timeout or 5xx)"
