#!/usr/bin/env bash
# Builds strata and runs every test lane: unit/model/server tests, the real-NUMA VM lane, the
# address/undefined-behaviour sanitizer build over the unit tests, the thread sanitizer over the
# pool tests, and the CUDA backend's gpu-labelled tests on the CPU emulator (STRATA_CUDA=EMU; the
# Release build's own gpu tests skip without a device).
# Usage: tools/run-tests.sh            (from anywhere; builds under build/, build-asan/, build-tsan/)
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)

tools/install-deps.sh

echo "== build (Release, warnings as errors)"
# The CUDA code (when nvcc is present) is compiled for one architecture here to keep CI short.
# Tests on explicitly: tools/run-demo.sh configures the same build/ with them off.
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DSTRATA_WERROR=ON -DSTRATA_BUILD_TESTS=ON \
  -DSTRATA_CUDA_ARCHITECTURES=90 >/dev/null
cmake --build build -j"$jobs"

echo "== tests"
ctest --test-dir build --output-on-failure --no-tests=error -j"$jobs" -LE 'numa-vm'

if ctest --test-dir build -N -L numa-vm | grep -q 'Total Tests: [1-9]'; then
  echo "== real NUMA lane (VM with 2 and 4 virtual nodes)"
  ctest --test-dir build --output-on-failure --no-tests=error -L numa-vm
else
  echo "== numa-vm lane: skipped: no numa-vm tests are registered in build/"
fi

echo "== address/undefined-behaviour sanitizer build, unit tests and the engine API tests"
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSTRATA_SANITIZE=address -DSTRATA_CUDA=OFF >/dev/null
cmake --build build-asan -j"$jobs" --target strata-unit-tests test_engine_api
export ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 LSAN_OPTIONS="suppressions=$PWD/tests/lsan.supp"
ctest --test-dir build-asan --output-on-failure --no-tests=error -j"$jobs" -L unit
build-asan/tests/engine/test_engine_api
unset ASAN_OPTIONS UBSAN_OPTIONS LSAN_OPTIONS

echo "== thread sanitizer build, pool tests"
cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSTRATA_SANITIZE=thread -DSTRATA_CUDA=OFF >/dev/null
pool_tests=(strata_test_arenas_pool strata_test_arenas_moe strata_test_arenas_store)
cmake --build build-tsan -j"$jobs" --target "${pool_tests[@]}"
for t in "${pool_tests[@]}"; do
  TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" "build-tsan/tests/arenas/$t"
done

echo "== CUDA backend on the CPU emulator: gpu-labelled tests (docs/GPU.md, \"CUDA emulator\")"
cmake -S . -B build-emu -DCMAKE_BUILD_TYPE=Release -DSTRATA_WERROR=ON -DSTRATA_CUDA=EMU >/dev/null
cmake --build build-emu -j"$jobs" --target strata-gpu-tests
ctest --test-dir build-emu --output-on-failure --no-tests=error -j"$jobs" -L gpu

echo "== all test lanes passed"
