#!/usr/bin/env bash
# strata as an installed library: `cmake --install` into a temporary prefix, then the embedding
# example (docs/examples/embed.cpp) built out of tree against it twice, with CMake's find_package(strata)
# and with pkg-config's strata.pc, and each run on the tiny model written by the installed
# strata-make-model.
# Usage: install_embed.sh BUILD_DIR SOURCE_DIR CXX_COMPILER
set -euo pipefail
build=$1 root=$2 cxx=$3
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
prefix=$scratch/prefix
fail() { echo "FAIL: $*"; exit 1; }

echo "-- cmake --install $build --prefix $prefix"
cmake --install "$build" --prefix "$prefix" >/dev/null
for p in strata strata-server strata-make-model strata-bench placement-report; do
  [ -x "$prefix/bin/$p" ] || fail "the program $p is not installed in $prefix/bin"
done
[ -f "$prefix/include/strata/engine.hpp" ] || fail "the public header strata/engine.hpp is not installed"
config=$(find "$prefix" -name strataConfig.cmake)
pc=$(find "$prefix" -name strata.pc)
[ -n "$config" ] || fail "no strataConfig.cmake under $prefix"
[ -n "$pc" ] || fail "no strata.pc under $prefix"

"$prefix/bin/strata-make-model" --preset tiny -o "$scratch/tiny.gguf" >/dev/null

run_example() {  # run_example HOW BINARY
  local out
  out=$("$2" "$scratch/tiny.gguf" 2>"$scratch/$1.err") || { cat "$scratch/$1.err"; fail "the example built with $1 failed on the tiny model"; }
  grep -Eq '^[0-9]+ prompt tokens, [1-9][0-9]* generated' <<<"$out" || { echo "$out"; fail "the example built with $1 generated no tokens"; }
  echo "$1: $(tail -1 <<<"$out")"
}

echo "-- CMake: find_package(strata), strata::engine"
cmake -S "$root/docs/examples" -B "$scratch/cmake-build" -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_BUILD_TYPE=Release >"$scratch/cmake.log" 2>&1 || { cat "$scratch/cmake.log"; fail "configuring against the installed package"; }
cmake --build "$scratch/cmake-build" >>"$scratch/cmake.log" 2>&1 || { cat "$scratch/cmake.log"; fail "building against the installed package"; }
run_example cmake "$scratch/cmake-build/strata-example-embed"

echo "-- pkg-config: strata.pc"
export PKG_CONFIG_PATH=$(dirname "$pc")
flags=$(pkg-config --cflags --libs strata) || fail "pkg-config --cflags --libs strata"
# shellcheck disable=SC2086  # the flags are words
"$cxx" -std=c++20 -O1 "$root/docs/examples/embed.cpp" $flags -o "$scratch/embed-pc" || fail "building with pkg-config's flags: $flags"
run_example pkg-config "$scratch/embed-pc"
