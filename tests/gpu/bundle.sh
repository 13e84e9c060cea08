# bundle.sh: sourced by tests/gpu/check.sh and bench/gpu.sh. use_bundle
# takes the executables and libraries of a bundle made by tests/gpu/pack.sh
# ($TCC_BUNDLE) into the current folder and the environment, with the CUDA
# libraries this machine has (toolkit or Python wheels), wherever they are.
# Needs $OUT (a folder for its links) and a function `say`.
# The CUDA libraries of this machine (toolkit or Python wheels) for the
# bundle's executables, and their link-time names for `tcc -o`.
use_bundle() {
    local b links lib dir found
    b=$(cd "$TCC_BUNDLE" && pwd) || return 1
    links=$OUT/cudalinks
    mkdir -p "$links"
    for lib in libcudart.so.13 libnvrtc.so.13 libcublasLt.so.13 libnccl.so.2; do
        found=$(find /usr/local/cuda/lib64/ /usr/local/cuda/targets/ /usr/lib/ /opt/ \
            -name "$lib" 2>/dev/null | head -1)
        if [ -z "$found" ]; then
            say "bundle: no $lib on this machine"
            return 1
        fi
        dir=$(dirname "$found")
        say "bundle: $lib from $dir"
        ln -sf "$found" "$links/${lib%%.so*}.so"
        case ":${LD_LIBRARY_PATH:-}:" in *":$dir:"*) ;; *) LD_LIBRARY_PATH=$dir:${LD_LIBRARY_PATH:-} ;; esac
    done
    cp "$b"/bin/tcc "$b"/bin/tccrun "$b"/bin/tccnvrtc "$b"/bin/tccdata . || return 1
    export LD_LIBRARY_PATH=$b/lib:$LD_LIBRARY_PATH
    export LIBRARY_PATH=$b/lib:$links${LIBRARY_PATH:+:$LIBRARY_PATH}
    export TCC_LIBDIR=$b/lib
}
