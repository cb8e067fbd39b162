#!/usr/bin/env bash
# Builds strata, generates the demo model if it is absent, and runs a chat generation on it.
# Usage: tools/run-demo.sh ["your message"]
set -euo pipefail
cd "$(dirname "$0")/.."

tools/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DSTRATA_BUILD_TESTS=OFF >/dev/null
cmake --build build -j"$(nproc)" --target strata strata-make-model

model=models/demo.gguf
[ -f "$model" ] || build/tools/make_model/strata-make-model --preset demo -o "$model"
build/tools/strata/strata info "$model"
echo
# The demo model has random weights: the text is gibberish, the speed and the pipeline are real.
build/tools/strata/strata run -m "$model" --chat -p "${1:-Hello! How are you today?}" -n 64 --seed 42
