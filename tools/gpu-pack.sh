#!/usr/bin/env bash
# Builds the GPU check's programs here (CUDA code for sm_90, the H200's architecture) and packs them,
# with the shared libraries the device image lacks, into .gpu-pack/ (ignored by git, carried to the
# device machine): the device's minutes then go to tests and benchmarks, not to compiling.
# Usage: tools/gpu-pack.sh [BUILD_DIR]   (default build-gpu; ccache is used when installed)
# Then, with the device tool:  run  command="tools/gpu-check.sh"  carry=[".gpu-pack"]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-gpu}
pack=.gpu-pack
exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
grep -qx "/$pack/" "$exclude" 2>/dev/null || echo "/$pack/" >> "$exclude"
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache
                                         -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DSTRATA_CUDA=ON -DSTRATA_CUDA_ARCHITECTURES=90 \
  -DSTRATA_BUILD_TESTS=ON "${launcher[@]}" >/dev/null
programs=(tests/gpu/test_cuda_kernels tests/gpu/test_hybrid_forward tests/gpu/test_engine_gpu tests/gpu/test_host_pool
          tools/bench/strata-bench tools/make_model/strata-make-model)
cmake --build "$build" -j"$(nproc)" --target $(for p in "${programs[@]}"; do basename "$p"; done)
rm -rf "$pack"
mkdir -p "$pack/bin" "$pack/lib"
for p in "${programs[@]}"; do cp "$build/$p" "$pack/bin/"; done
# Every library the programs load, except the C runtime (the device's own is newer) and CUDA's (the
# device's toolkit and driver provide them, matched to its GPU).
for p in "${programs[@]}"; do ldd "$build/$p"; done | awk '$3 ~ /^\// { print $3 }' | sort -u |
  grep -Ev '/(libc|libm|libdl|libpthread|librt|libgcc_s|libstdc\+\+|ld-linux-x86-64|libcuda|libcudart|libcublas|libcublasLt)\.so' |
  while read -r lib; do cp -L "$lib" "$pack/lib/"; done
# oneTBB loads its hwloc binding at run time when an arena is constrained to a NUMA node.
cp -L /usr/lib/x86_64-linux-gnu/libtbbbind_2_5.so.3 "$pack/lib/" 2>/dev/null || true
du -sh "$pack"; ls "$pack/lib"
