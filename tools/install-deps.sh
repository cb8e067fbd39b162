#!/usr/bin/env bash
# Installs strata's build and test dependencies from Debian's packages (Debian 12).
# Idempotent: does nothing when everything is already there.
set -euo pipefail

packages=(
  build-essential cmake pkg-config
  # tools/run-tests.sh: the CUDA-emulator build reuses the Release build's objects through ccache
  ccache
  libtbb-dev libhwloc-dev libspdlog-dev libcxxopts-dev libgtest-dev libgmock-dev
  nlohmann-json3-dev libcpp-httplib-dev libpcre2-dev
  # the address-sanitizer lane and tools/fuzz-requests.sh: clang and its sanitizer and libFuzzer runtimes
  clang-14 libclang-rt-14-dev
  # the numa-vm test lane boots a small VM under software emulation
  qemu-system-x86 busybox-static cpio xz-utils
  # the web pages embed these browser libraries; the webui test lane drives headless chromium
  libjs-marked libjs-highlight.js libjs-chart.js chromium chromium-driver python3-selenium
  # the chat-template test's oracle (tests/engine/template/render_jinja.py)
  python3-jinja2
  # the deploy test lane: replicas behind HAProxy, promtool on /metrics, the Kubernetes manifests
  haproxy prometheus python3-yaml
)
# kubectl: Debian's kubernetes-client, unless another package (Google's kubectl) already provides it.
command -v kubectl >/dev/null || packages+=(kubernetes-client)

# tests/sdk: the openai Node SDK, pinned, from the npm registry into .sdk/ (ignored by git), run on
# node (Debian's nodejs and npm when the machine has no node of its own).
sdk_version=5.23.2
install_sdk() {
  local root dir
  root="$(cd "$(dirname "$0")/.." && pwd)"
  dir="$root/.sdk"
  if [ -f "$dir/node_modules/openai/package.json" ] &&
     grep -q "\"version\": \"$sdk_version\"" "$dir/node_modules/openai/package.json"; then
    return 0
  fi
  echo "install-deps: installing the openai Node SDK $sdk_version into $dir"
  npm install --prefix "$dir" --no-save --no-package-lock --no-audit --no-fund "openai@$sdk_version" >/dev/null
}
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then packages+=(nodejs npm); fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  # The numa-vm lane downloads Debian's kernel package: make sure the package lists are there.
  if [ "$(id -u)" -eq 0 ] && ! apt-cache show linux-image-amd64 >/dev/null 2>&1; then
    apt-get update -qq
  fi
  install_sdk
  exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
  echo "strata needs these Debian packages; run as root:" >&2
  echo "  apt-get update && apt-get install -y --no-install-recommends ${missing[*]}" >&2
  exit 1
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}"
install_sdk
