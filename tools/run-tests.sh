#!/usr/bin/env bash
# Builds strata and runs every test lane: unit/model/server tests, the real-NUMA VM lane, and the
# address/undefined-behaviour sanitizer build over the unit tests. GPU tests skip without a device.
# Usage: tools/run-tests.sh            (from anywhere; builds under build/, build-asan/)
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)

tools/install-deps.sh

echo "== build (Release, warnings as errors)"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DSTRATA_WERROR=ON >/dev/null
cmake --build build -j"$jobs"

echo "== tests"
ctest --test-dir build --output-on-failure -j"$jobs" -LE 'numa-vm'

if ctest --test-dir build -N -L numa-vm | grep -q 'Total Tests: [1-9]'; then
  echo "== real NUMA lane (VM with 2 and 4 virtual nodes)"
  ctest --test-dir build --output-on-failure -L numa-vm
fi

echo "== address/undefined-behaviour sanitizer build, unit tests"
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSTRATA_SANITIZE=address -DSTRATA_CUDA=OFF >/dev/null
cmake --build build-asan -j"$jobs"
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --test-dir build-asan --output-on-failure -j"$jobs" -L unit

echo "== all test lanes passed"
