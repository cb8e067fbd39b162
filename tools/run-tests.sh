#!/usr/bin/env bash
# Builds strata and runs every test lane: unit/model/server tests, the ISA-dependent tests again as an
# AVX2-only and a scalar-only CPU runs them (STRATA_MAX_ISA), the real-NUMA VM lane, the
# address/undefined-behaviour sanitizer build over the unit tests, the thread sanitizer over the
# pool, engine API and server tests, the CUDA backend's gpu-labelled tests on the CPU emulator
# (STRATA_CUDA=EMU; the Release build's own gpu tests skip without a device), and 60 s of libFuzzer on
# the request parser (its targets built in the sanitizer build, which clang compiles for both).
# Usage: tools/run-tests.sh            (from anywhere; builds under build/, build-asan/, build-tsan/,
#                                       build-emu/)
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)

tools/install-deps.sh

# Each lane prints its counts and adds them to the final line; in CI (CI=true) a lane that skips
# although tools/install-deps.sh installs what it needs is a failure.
lanes=()
log=$(mktemp)
trap 'rm -f "$log"' EXIT

# ctest_lane NAME CTEST_ARGS...: runs ctest, reads its summary ("100% tests passed, 0 tests failed
# out of N") and its skipped tests into lane_passed and lane_skipped, and records the lane (unless
# NAME is empty).
ctest_lane() {
  local name=$1 total
  shift
  ctest "$@" | tee "$log"
  total=$(sed -n 's/^[0-9]*% tests passed, [0-9]* tests* failed out of \([0-9]*\)$/\1/p' "$log" | tail -1)
  [ -n "$total" ] || { echo "== $name lane: ctest printed no summary line" >&2; exit 1; }
  lane_skipped=$(grep -cE '^[[:space:]]*[0-9]+ - .* \(Skipped\)$' "$log" || true)  # disabled ones are not in N
  lane_passed=$((total - lane_skipped))
  [ -z "$name" ] || record_lane "$name" "$lane_passed passed$([ "$lane_skipped" -eq 0 ] || echo " ($lane_skipped skipped)")"
}
# gtest_run BINARY [ARGS...]: runs a GoogleTest binary; sets gtest_passed from its "[  PASSED  ] N tests".
gtest_run() {
  "$@" | tee "$log"
  gtest_passed=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) tests*\.$/\1/p' "$log" | tail -1)
  [ -n "$gtest_passed" ] || { echo "== $1 printed no passed count" >&2; exit 1; }
}
# Each lane's line also gives the seconds since the previous lane ended (its build included), to keep CI
# within its time budget.
lane_clock=$SECONDS
record_lane() {
  echo "== $1 lane: $2 ($((SECONDS - lane_clock)) s)"
  lanes+=("$1 $2")
  lane_clock=$SECONDS
}
# skipped_in_ci LANE WHY: a lane whose tools tools/install-deps.sh installs must not skip in CI.
skipped_in_ci() {
  if [ "${CI:-}" = true ]; then
    echo "== $1 lane: FAILED: skipped in CI ($2) although tools/install-deps.sh installs what it needs" >&2
    exit 1
  fi
}

# Every build goes through ccache: the CUDA-emulator build (build-emu) then compiles only what the
# emulator changes and takes the kernel and pool objects from the Release build. Depend mode hashes the
# compiler's own dependency list, so a miss costs no extra preprocessor run.
export CCACHE_DEPEND=1
launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)

echo "== build (Release, warnings as errors)"
tools/configure-tests.sh build "${launcher[@]}" >/dev/null
cmake --build build -j"$jobs"

echo "== tests"
ctest_lane unit+model+server+readme+install --test-dir build --output-on-failure --no-tests=error -j"$jobs" -LE 'numa-vm|webui|deploy|sdk'

echo "== the web pages in headless chromium (tests/webui; screenshots in build/tests/webui/artifacts)"
ctest --test-dir build --output-on-failure --no-tests=error -V -L webui | tee "$log"
if grep -q '^webui: skipped' "$log"; then
  why=$(sed -n 's/^.*webui: skipped: //p' "$log" | head -1)
  echo "== webui lane: skipped: $why"
  skipped_in_ci webui "$why"
  record_lane webui "skipped"
else
  webui_passed=$(sed -n 's/^.*webui: \([0-9]*\) passed, 0 failed.*$/\1/p' "$log" | tail -1)
  [ -n "$webui_passed" ] || { echo "== webui lane: the browser test printed no passed count" >&2; exit 1; }
  record_lane webui "$webui_passed passed"
fi

echo "== three replicas behind the shipped HAProxy configuration, and the Kubernetes manifests (tests/deploy)"
ctest --test-dir build --output-on-failure --no-tests=error -V -L deploy | tee "$log"
if grep -q '^.*deploy: skipped' "$log"; then
  why=$(sed -n 's/^.*deploy: skipped: //p' "$log" | head -1)
  echo "== deploy lane: skipped: $why"
  skipped_in_ci deploy "$why"
  record_lane deploy "skipped"
else
  deploy_passed=$(sed -n 's/^.*deploy: \([0-9]*\) passed, 0 failed.*$/\1/p' "$log" | tail -1)
  [ -n "$deploy_passed" ] || { echo "== deploy lane: the deploy test printed no passed count" >&2; exit 1; }
  record_lane deploy "$deploy_passed passed"
fi
echo "== the openai Node SDK's tool-calling flow against the server (tests/sdk)"
ctest --test-dir build --output-on-failure --no-tests=error -V -L sdk | tee "$log"
if grep -q 'sdk: skipped' "$log"; then
  why=$(sed -n 's/^.*sdk: skipped: //p' "$log" | head -1)
  echo "== sdk lane: skipped: $why"
  skipped_in_ci sdk "$why"
  record_lane sdk "skipped"
else
  sdk_passed=$(sed -n 's/^.*sdk: \([0-9]*\) passed, 0 failed.*$/\1/p' "$log" | tail -1)
  [ -n "$sdk_passed" ] || { echo "== sdk lane: the SDK test printed no passed count" >&2; exit 1; }
  record_lane sdk "$sdk_passed passed"
fi

echo "== the ISA-dependent tests as a CPU without AVX-512 runs them (STRATA_MAX_ISA=avx2), and the kernel tests without AVX2 (scalar)"
# The engine suites whose logits go through the kernels: the forward pass, the KV cache, the MoE phases.
isa_engine='^(Archs/)?(Forward|ForwardParity|ForwardRepack|KvCache|MoePhases)[./]'
STRATA_MAX_ISA=avx2 ctest_lane "" --test-dir build --output-on-failure --no-tests=error -j"$jobs" -L isa-kernels
isa_passed=$lane_passed isa_skipped=$lane_skipped
STRATA_MAX_ISA=avx2 ctest_lane "" --test-dir build --output-on-failure --no-tests=error -j"$jobs" -R "$isa_engine"
record_lane isa-avx2 "$((isa_passed + lane_passed)) passed ($((isa_skipped + lane_skipped)) skipped: the AVX-512 instances)"
STRATA_MAX_ISA=scalar ctest_lane isa-scalar --test-dir build --output-on-failure --no-tests=error -j"$jobs" -L isa-kernels

if ctest --test-dir build -N -L numa-vm | grep -q 'Total Tests: [1-9]'; then
  echo "== real NUMA lane (VM with 2 and 4 virtual nodes)"
  ctest_lane numa-vm --test-dir build --output-on-failure --no-tests=error -L numa-vm
  if [ "$lane_skipped" -gt 0 ]; then
    missing=()
    for tool in qemu-system-x86_64 cpio busybox; do
      command -v "$tool" >/dev/null || [ -x "/bin/$tool" ] || missing+=("$tool")
    done
    why="$lane_skipped of its tests skipped${missing[*]:+: ${missing[*]} not found}"
    echo "== numa-vm lane: $why"
    skipped_in_ci numa-vm "$why"
  fi
else
  echo "== numa-vm lane: skipped: no numa-vm tests are registered in build/"
  skipped_in_ci numa-vm "no numa-vm tests are registered"
  record_lane numa-vm "skipped"
fi

echo "== address/undefined-behaviour sanitizer build (clang), unit tests and the engine API tests"
# The ASan build keeps line tables only (-g1): reports still name file:line, and it builds and links in
# much less time and disk than with full debug information. Clang builds it, with the libFuzzer targets
# of the fuzz lane below: one sanitizer build serves both. TSan keeps g++ and full debug information:
# with -g1 the TBB header code inlined into strata frames is attributed to the strata line, so the
# suppressions of TBB's own task objects (tests/tsan.supp, race_top) no longer match.
lines_only=(-DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG"
            "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG")
cmake -S . -B build-asan "${lines_only[@]}" "${launcher[@]}" -DCMAKE_CXX_COMPILER=clang++-14 -DCMAKE_C_COMPILER=clang-14 \
  -DSTRATA_SANITIZE=address -DSTRATA_FUZZ=ON -DSTRATA_CUDA=OFF >/dev/null
cmake --build build-asan -j"$jobs" --target strata-unit-tests test_engine_api fuzz_requests fuzz_front
export ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 LSAN_OPTIONS="suppressions=$PWD/tests/lsan.supp"
ctest_lane "" --test-dir build-asan --output-on-failure --no-tests=error -j"$jobs" -L unit
asan_unit=$lane_passed
gtest_run build-asan/tests/engine/test_engine_api
unset ASAN_OPTIONS UBSAN_OPTIONS LSAN_OPTIONS
record_lane asan "$((asan_unit + gtest_passed)) passed"

echo "== thread sanitizer build, pool, engine API and server tests (tests/tsan.supp names the oneTBB frames it ignores)"
cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -g -DNDEBUG" \
  "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O2 -g -DNDEBUG" "${launcher[@]}" -DSTRATA_SANITIZE=thread -DSTRATA_CUDA=OFF >/dev/null
tsan_bins=(arenas/strata_test_arenas_pool arenas/strata_test_arenas_moe arenas/strata_test_arenas_store engine/test_engine_api
           server/test_server)
cmake --build build-tsan -j"$jobs" --target strata_test_arenas_pool strata_test_arenas_moe strata_test_arenas_store test_engine_api test_server
tsan_tests=0
for t in "${tsan_bins[@]}"; do
  TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$PWD/tests/tsan.supp" gtest_run "build-tsan/tests/$t"
  tsan_tests=$((tsan_tests + gtest_passed))
done
record_lane tsan "${#tsan_bins[@]} binaries passed ($tsan_tests tests)"

echo "== CUDA backend on the CPU emulator: gpu-labelled tests (docs/GPU.md, \"CUDA emulator\")"
cmake -S . -B build-emu "${launcher[@]}" -DCMAKE_BUILD_TYPE=Release -DSTRATA_WERROR=ON -DSTRATA_CUDA=EMU >/dev/null
cmake --build build-emu -j"$jobs" --target strata-gpu-tests
ctest_lane gpu-emulator --test-dir build-emu --output-on-failure --no-tests=error -j"$jobs" -L gpu

echo "== request parser fuzzing (libFuzzer, 60 s, the targets of build-asan; tools/fuzz-requests.sh)"
tools/fuzz-requests.sh 60 build-asan | tee "$log"
record_lane fuzz "$(tail -n 1 "$log" | grep -o '^fuzz-requests: [0-9]* executions' | sed 's/fuzz-requests: //'), nothing found"

summary=$(printf '%s, ' "${lanes[@]}")
echo "== all test lanes passed: ${summary%, }"
