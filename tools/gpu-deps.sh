#!/usr/bin/env bash
# Prepares .gpu-deps/ (ignored by git, carried to the device machine): Debian's oneTBB packages, which
# the device image (Ubuntu 24.04 with nvcc 13) lacks. tools/gpu-check.sh unpacks them there.
# Usage: tools/gpu-deps.sh [EXTRA_PACKAGE...]   (extra packages: anything else the device lacks)
set -euo pipefail
cd "$(dirname "$0")/.."
dir=.gpu-deps
grep -qx "/$dir/" .git/info/exclude 2>/dev/null || echo "/$dir/" >> .git/info/exclude
mkdir -p "$dir"
(cd "$dir" && apt-get download libtbb-dev libtbb12 libtbbmalloc2 libtbbbind-2-5 "$@")
ls -l "$dir"
