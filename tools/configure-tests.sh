#!/usr/bin/env bash
# The test command's configure step (tools/run-tests.sh), on its own so that the readme test runs the
# very same line: Release, warnings as errors, tests on whatever an earlier configure of the folder
# left in its cache (tools/run-demo.sh configures build/ with the tests off).
# Usage: tools/configure-tests.sh BUILD_DIR [more cmake arguments]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build=${1:?usage: tools/configure-tests.sh BUILD_DIR [cmake arguments]}
shift
# The CUDA code (when nvcc is present) is compiled for one architecture here to keep CI short.
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DSTRATA_WERROR=ON -DSTRATA_BUILD_TESTS=ON \
  -DSTRATA_CUDA_ARCHITECTURES=90 "$@"
