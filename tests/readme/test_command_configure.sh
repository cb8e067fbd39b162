#!/usr/bin/env bash
# The README's two commands in order: tools/run-demo.sh leaves a build configured without tests, then
# tools/run-tests.sh's configure step (tools/configure-tests.sh) must turn them on over that same
# build, so its ctest lanes have test binaries to build and run. Configures a scratch build only.
# Usage: test_command_configure.sh SOURCE_DIR
set -euo pipefail
root=$1
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
build=$scratch/build
# CUDA off: the compiler detection is not what this checks, and it is slow.
cache_value() { sed -n "s/^$1:[A-Z]*=//p" "$build/CMakeCache.txt"; }

echo "-- the demo's configure: tests off"
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DSTRATA_BUILD_TESTS=OFF -DSTRATA_CUDA=OFF >/dev/null
[ "$(cache_value STRATA_BUILD_TESTS)" = OFF ] || { echo "FAIL: the scratch build should start with STRATA_BUILD_TESTS=OFF"; exit 1; }
if cmake --build "$build" --target help | grep -q 'strata-unit-tests'; then
  echo "FAIL: a build configured with the tests off already has the strata-unit-tests target"; exit 1
fi

echo "-- the test command's configure over it"
"$root/tools/configure-tests.sh" "$build" -DSTRATA_CUDA=OFF >/dev/null
value=$(cache_value STRATA_BUILD_TESTS)
[ "$value" = ON ] || { echo "FAIL: after tools/configure-tests.sh, STRATA_BUILD_TESTS is '$value', not ON"; exit 1; }
targets=$(cmake --build "$build" --target help)
for t in strata-unit-tests strata-model-tests strata-server-tests test_make_model; do
  grep -q "\\b$t\\b" <<<"$targets" || { echo "FAIL: the build has no target $t after the test command's configure"; exit 1; }
done
registered=$(ctest --test-dir "$build" -N | sed -n 's/^Total Tests: //p')
[ "${registered:-0}" -gt 0 ] || { echo "FAIL: ctest lists no tests after the test command's configure"; exit 1; }
echo "OK: STRATA_BUILD_TESTS=ON, the test targets exist, ctest lists $registered tests before the build"
