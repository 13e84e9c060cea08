#!/usr/bin/env bash
# pack.sh: a bundle for check.sh on a GPU machine that cannot build tcc (no
# flex, bison, OpenBLAS, cJSON or OpenMPI there, and nothing to install them
# from). Builds here, then copies into DIR (default .gpu) the executables,
# the runtime library that `tcc -o` links, and the shared libraries they load
# that a machine with only a C compiler and CUDA would lack. CUDA's own
# libraries (cudart, NVRTC, cuBLASLt, NCCL) stay behind: the GPU machine has
# its own, and check.sh finds them there.
# Usage: bash tests/gpu/pack.sh [DIR]; then, on the GPU machine, with DIR
# beside the checkout's files: TCC_BUNDLE=DIR bash tests/gpu/check.sh
set -euo pipefail

DIR=${1:-.gpu}
make -j"$(nproc 2>/dev/null || echo 2)" tcc tccrun tccnvrtc tccdata >/dev/null
rm -rf "$DIR"
mkdir -p "$DIR/bin" "$DIR/lib"
cp tcc tccrun tccnvrtc tccdata "$DIR/bin/"
cp build/libtccrt.a "$DIR/lib/"

# A program as tcc writes them: it links what the executables do, and MPI.
probe=$(mktemp -d /tmp/tcc-pack.XXXXXX)
trap 'rm -rf "$probe"' EXIT
./tcc samples/mlp.tdl -o "$probe/mlp" >/dev/null

# Everything they load but the C library, the compiler's runtimes and CUDA.
skip='^(libc|libm|libdl|libpthread|librt|libstdc\+\+|libgcc_s|libgomp|libz|libudev|ld-linux-x86-64|linux-vdso)\.|^lib(cudart|nvrtc|nvrtc-builtins|cublas|cublasLt|nccl)\.'
ldd tcc tccrun tccnvrtc "$probe/mlp" | awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }' |
    sort -u | while read -r name path; do
    [[ $name =~ $skip ]] && continue
    cp -L "$path" "$DIR/lib/$name"
    # the link-time name (-lopenblas finds libopenblas.so)
    ln -sf "$name" "$DIR/lib/${name%%.so*}.so"
done
echo "pack.sh: $(ls "$DIR/lib" | wc -l) files in $DIR/lib, $(du -sh "$DIR" | cut -f1) in all"
