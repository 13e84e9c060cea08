#!/usr/bin/env bash
# bench/compile_scale.sh: what compiling a cluster-scale plan costs, as the
# microbatches grow. Each configuration is compiled to a plan (--emit=plan,
# -v for the passes' times) under /usr/bin/time: its wall time, max RSS,
# plan size and per-pass milliseconds.
#  - Llama 3.1 405B (126 layers) on dp=128, tp=8, pp=16 (16,384 GPUs), the
#    sample's settings (interleaved, 2 chunks, full recompute, bf16): 16
#    microbatches (global batch 2,048) and 128 (global batch 16,384);
#  - GPT 1T of Narayanan et al. 2021 (128 layers, hidden 25,600, 160 heads,
#    sequence 2,048) on tp=8, pp=64, dp=6 (3,072 GPUs), interleaved (which
#    needs the microbatches a multiple of the 64 stages): 64 and its
#    published 512 microbatches (global batches 384 and 3,072).
# Exit 1 when one takes 2 s or more, or 1 GiB of memory or more.
set -euo pipefail
cd "$(dirname "$0")/.."
make -s tcc >/dev/null
out=build/bench/compile
mkdir -p "$out"
echo "machine: $(nproc) cores, $(uname -m), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
L405=(samples/llama.tdl -D L=126 -D D=16384 -D H=128 -D KV=8 -D F=53248 -D V=128256 -D S=8192
      --mesh dp=128,tp=8,pp=16)
G1T=(samples/gpt2.tdl -D V=51200 -D L=128 -D D=25600 -D H=160 -D S=2048 --mesh dp=6,tp=8,pp=64
     --set schedule=interleaved --set virtual_stages=2 --set recompute=full)
bad=0
row() { # NAME MICROBATCHES BATCH ARGS...
    local name=$1 mb=$2 b=$3
    shift 3
    rm -rf "$out/plan"
    /usr/bin/time -f "%e %M" -o "$out/time" ./tcc "$@" -D B="$b" --set microbatches="$mb" \
        --emit=plan -o "$out/plan" -v 2> "$out/log"
    read -r wall kb < "$out/time"
    local size passes
    size=$(stat -c %s "$out/plan/plan.json")
    passes=$(awk '$1 == "tcc:" && $2 != "verify" && $4 == "ms" {printf "%s %.0f, ", $2, $3}' "$out/log")
    printf '%-8s %4d microbatches: %5.2f s, %6.0f MiB max RSS, plan %5.1f MB | %s\n' "$name" "$mb" \
        "$wall" "$(echo "$kb / 1024" | bc -l)" "$(echo "$size / 1000000" | bc -l)" "${passes%, }"
    if [ "$(echo "$wall >= 2" | bc)" = 1 ] || [ "$kb" -ge 1048576 ]; then bad=1; fi
}
row 405B 16 2048 "${L405[@]}"
row 405B 128 16384 "${L405[@]}"
row GPT-1T 64 384 "${G1T[@]}"
row GPT-1T 512 3072 "${G1T[@]}"
[ "$bad" = 0 ] && echo "every configuration under 2 s and 1 GiB" || { echo "over 2 s or 1 GiB"; exit 1; }
