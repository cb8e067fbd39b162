#!/usr/bin/env bash
# The GPU check, for the device machine (one CUDA GPU, Ubuntu 24.04, nvcc 13, no oneTBB): builds the
# CUDA backend, runs the gpu-labelled tests, then benchmarks the bench preset CPU-only and hybrid at
# about 100 %, 50 % and 20 % of the routed experts resident, and prints one table plus the overlap
# figure from STRATA_DECODE_TIMING, and the kernels' own speed (strata-bench gpu-kernels). Budget: under
# 6 minutes on 16 cores when it builds there, about 1 minute with tools/gpu-pack.sh.
#
# Prepare here first, either  tools/gpu-pack.sh  (builds the programs here for sm_90 and packs them with
# their libraries into .gpu-pack/: no compiling on the device) and run with carry=[".gpu-pack"], or
# tools/gpu-deps.sh  (Debian's TBB packages into .gpu-deps/) and run with carry=[".gpu-deps"] to build there.
# Then, with the device tool:  run  command="tools/gpu-check.sh"  carry=[...]
# Environment: GPU_CHECK_OUT (default $OUT or /tmp/gpu-check): logs and the table.
# Rehearsal without a GPU (checks this script, not the GPU): GPU_CHECK_CUDA=EMU (the CPU emulator of
# docs/GPU.md), GPU_CHECK_PRESET=tiny (the model; default bench), GPU_CHECK_BUILD (build directory;
# default build-gpu-check).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${GPU_CHECK_OUT:-${OUT:-/tmp/gpu-check}}
mkdir -p "$out"
jobs=$(nproc)
cuda=${GPU_CHECK_CUDA:-ON}
preset=${GPU_CHECK_PRESET:-bench}
build=${GPU_CHECK_BUILD:-build-gpu-check}
test_timeout=120; [ "$cuda" = EMU ] && test_timeout=900
t_start=$(date +%s)
stage() { echo "== [$(( $(date +%s) - t_start )) s] $*"; }

# 1. Dependencies: unpack the carried .deb files into a private prefix (never into /).
deps=/tmp/strata-deps
if ls .gpu-deps/*.deb >/dev/null 2>&1; then
  stage "unpacking $(ls .gpu-deps/*.deb | wc -l) carried packages into $deps"
  for f in .gpu-deps/*.deb; do dpkg -x "$f" "$deps"; done
fi
tbb_dir=$deps/usr/lib/x86_64-linux-gnu/cmake/TBB
tbb_flag=(); [ -d "$tbb_dir" ] && tbb_flag=(-DTBB_DIR="$tbb_dir")
export CMAKE_PREFIX_PATH="$deps/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
export LD_LIBRARY_PATH="$deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PKG_CONFIG_PATH="$deps/usr/lib/x86_64-linux-gnu/pkgconfig:$deps/usr/share/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
[ "$cuda" = EMU ] || nvidia-smi --query-gpu=name,memory.total,memory.used,pci.bus_id --format=csv,noheader || true

# 2. The programs: prebuilt by tools/gpu-pack.sh, or built here for the device's own architecture.
gpu_tests=(test_cuda_kernels test_hybrid_forward test_engine_gpu test_host_pool)
if [ -d .gpu-pack/bin ] && [ "$cuda" != EMU ]; then
  stage "using the programs prebuilt by tools/gpu-pack.sh in .gpu-pack"
  bindir=$PWD/.gpu-pack/bin
  export LD_LIBRARY_PATH="$PWD/.gpu-pack/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  # CUDA's runtime and cuBLAS come from the device's toolkit (or the Python wheels that ship them).
  for lib in libcudart.so.13 libcublas.so.13 libcublasLt.so.13; do
    ldconfig -p | grep -q "$lib" && continue
    found=$(find /usr/local /opt /usr/lib -name "$lib" -print -quit 2>/dev/null)
    [ -n "$found" ] && export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$(dirname "$found")"
    [ -n "$found" ] || echo "warning: $lib not found on this machine"
  done
  test_bin() { echo "$bindir/$1"; }
  bench=$bindir/strata-bench
  make_model=$bindir/strata-make-model
  stage "gpu tests, one program at a time"
  tests_rc=0
  for t in "${gpu_tests[@]}"; do
    timeout 150 "$bindir/$t" >"$out/$t.log" 2>&1
    rc=$?
    printf "  %-20s rc %d: %s\n" "$t" "$rc" "$(grep -E '^\[  (PASSED|FAILED|SKIPPED) +\] [0-9]+ tests?' "$out/$t.log" | tr '\n' ' ')"
    grep -E '^\[  FAILED  \] [A-Za-z]' "$out/$t.log" | sort -u | head -20
    [ $rc -eq 0 ] || tests_rc=1
  done
else
  stage "configure"
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DSTRATA_CUDA="$cuda" -DSTRATA_CUDA_ARCHITECTURES=native \
    -DSTRATA_BUILD_TESTS=ON "${tbb_flag[@]}" >"$out/configure.log" 2>&1 \
    || { tail -30 "$out/configure.log"; echo "configure FAILED (missing packages? add them to tools/gpu-deps.sh)"; exit 1; }
  stage "build"
  cmake --build "$build" -j"$jobs" --target "${gpu_tests[@]}" strata-bench strata-make-model \
    >"$out/build.log" 2>&1 || { grep -E "error|Error" "$out/build.log" | head -30; echo "build FAILED"; exit 1; }
  test_bin() { echo "$build/tests/gpu/$1"; }
  bench="$build"/tools/bench/strata-bench
  make_model="$build"/tools/make_model/strata-make-model

  # 3. Tests with a device.
  stage "ctest -L gpu"
  (cd "$build" && ctest -L gpu --output-on-failure --timeout "$test_timeout" -j"$jobs") >"$out/ctest-gpu.log" 2>&1
  tests_rc=$?
  grep -E "tests passed|tests failed|Failed|\*\*\*" "$out/ctest-gpu.log" | head -30
fi

# 3b. Kernel parity per weight format: test_cuda_kernels' per-format suites (matvec at several token
# counts, batched matvec, dequantise-to-f16, and for the code-book formats and MXFP4 the dequantised
# values bit for bit) against the CPU reference, one line per format.
stage "kernel parity per weight format"
"$(test_bin test_cuda_kernels)" --gtest_filter='Formats/*:CodeBookValues.*' >"$out/kernel-parity.log" 2>&1
parity_rc=$?
awk '$2 == "OK" && $4 ~ /^Formats\// { n = split($4, p, "/"); ok[p[n]]++; seen[p[n]] = 1 }
     $2 == "FAILED" && $4 ~ /^Formats\// && !(($4) in done) { done[$4] = 1; n = split($4, p, "/"); bad[p[n]]++; seen[p[n]] = 1 }
     END { for (f in seen) printf "  %-8s %d passed, %d failed\n", f, ok[f], bad[f] }' "$out/kernel-parity.log" | sort
[ $parity_rc -eq 0 ] || { echo "kernel parity FAILED (see $out/kernel-parity.log)"; tests_rc=1; }

# 4. Benchmark on the bench preset.
model=/tmp/strata-$preset.gguf
stage "strata-make-model --preset $preset"
[ -f "$model" ] || "$make_model" --preset "$preset" -o "$model" >"$out/make-model.log" 2>&1 \
  || { tail -5 "$out/make-model.log"; echo "make-model FAILED"; exit 1; }
stage "strata-bench model: CPU only, 100 / 50 / 20 % resident"
timeout 180 "$bench" model -m "$model" -p 128 -n 48 -r 2 --gpu 0 --residency cpu,100,50,20 2>"$out/bench.log" | tee "$out/table.md"

# 5. Overlap: per-token time against the larger of the GPU and CPU shares, at 50 % resident (the CPU-only
# baseline arm runs too but logs no timing lines). Lines at position 0 are each session's one-token
# prompt, which also sets up its VRAM KV cache, and the first line left is strata-bench's warm-up: dropped.
stage "decode timing at 50 % resident"
STRATA_DECODE_TIMING=1 timeout 90 "$bench" model -m "$model" -p 32 -n 48 -r 1 --gpu 0 --residency 50 >/dev/null 2>"$out/timing.log"
grep -o "decode token at position .*" "$out/timing.log" | grep -v "position 0:" | tail -n +2 | awk '
  { for (i = 1; i <= NF; ++i) {
      if ($i == "position") { sub(":", "", $(i+2)); tok += $(i+2) }
      if ($i == "experts") gpu += $(i+1)
      if ($i == "complement") cpu += $(i+1)
      if ($i == "copies") cp += $(i+1)
      if ($i == "waited") wt += $(i+1)
    } n++ }
  END { if (n == 0) { print "no STRATA_DECODE_TIMING lines"; exit }
        larger = (gpu > cpu + cp) ? gpu : cpu + cp
        printf "overlap over %d decode tokens (ms per token): total %.2f, GPU experts %.2f, CPU complement %.2f, copies %.2f, GPU waited %.2f; total / max(GPU, CPU + copies) = %.2f\n",
               n, tok / n, gpu / n, cpu / n, cp / n, wt / n, (tok / n) / (larger / n) }' | tee "$out/overlap.txt"

# 6. The kernels alone: matvec and batched-expert GB/s per format against a device copy, launch costs.
stage "strata-bench gpu-kernels"
[ "$cuda" = EMU ] && kargs=(--mib 4 --experts 8 -r 3) || kargs=()
timeout 120 "$bench" gpu-kernels "${kargs[@]}" 2>&1 | tee "$out/gpu-kernels.md"

stage "done (gpu tests: $([ $tests_rc -eq 0 ] && echo passed || echo FAILED))"
exit $tests_rc
