#!/usr/bin/env bash
# Builds strata, generates the demo model if it is absent, and serves it with strata-server on
# http://127.0.0.1:8080 (OpenAI-compatible). Ctrl-C stops it.
# Usage: tools/run-demo.sh [strata-server flags...]     e.g. --port 9000 --api-key secret
set -euo pipefail
cd "$(dirname "$0")/.."

tools/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DSTRATA_BUILD_TESTS=OFF >/dev/null
cmake --build build -j"$(nproc)" --target strata strata-make-model strata-server

model=models/demo.gguf
[ -f "$model" ] || build/tools/make_model/strata-make-model --preset demo -o "$model"
build/tools/strata/strata info "$model"

cat <<'HOW'

strata-server is starting on the demo model (random weights: the text is gibberish, the pipeline and
the speed are real).

  Chat in a browser:  http://127.0.0.1:8080/            Live view: http://127.0.0.1:8080/dashboard

From another terminal:

  curl http://127.0.0.1:8080/v1/chat/completions -H 'Content-Type: application/json' \
       -d '{"messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 32}'

  OpenAI clients: base URL http://127.0.0.1:8080/v1, any API key (unless --api-key is set).
  Status: curl http://127.0.0.1:8080/v1/status     Metrics: curl http://127.0.0.1:8080/metrics

HOW
exec build/server/strata-server -m "$model" "$@"
