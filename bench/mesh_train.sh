#!/usr/bin/env bash
# bench/mesh_train.sh: training throughput of one model on meshes of the
# threads backend (every rank a thread of one process), against the same model
# on one device in the same run. Compiles samples/gpt-tiny.tdl (the demo's
# model) for each mesh, trains STEPS steps on the same random tokens, takes the
# mean step time after WARMUP steps, and prints ms/step, tokens/s and the ratio
# to one device. The ranks share this machine's cores (each gets
# cores / ranks OpenMP threads), so on a small machine this measures the
# overhead and the per-device work split, not a speed-up from more hardware.
#
#   bash bench/mesh_train.sh        (or: make bench-mesh)
# Environment: STEPS (default 30), WARMUP (default 5), MESHES (default
# "1 2x1 1x2 2x2"), BENCH_DIR (default build/bench). OpenBLAS and OpenMP run
# as preset (OPENBLAS_CORETYPE, OPENBLAS_L2_SIZE left alone).
set -euo pipefail

cd "$(dirname "$0")/.."
STEPS=${STEPS:-30}
WARMUP=${WARMUP:-5}
MESHES=${MESHES:-1 2x1 1x2 2x2}
BENCH_DIR=${BENCH_DIR:-build/bench}
mkdir -p "$BENCH_DIR"
make --no-print-directory tcc tccrun >/dev/null

mean_ms() { # LOG: mean ms/step after the warm-up
    awk -v w="$WARMUP" '/^step +[0-9]+\/[0-9]+ +loss/ {
            split($2, s, "/")
            for (i = 3; i < NF; i++) if ($(i + 1) == "ms" && s[1] + 0 > w) { n++; t += $i }
        }
        END { if (n) printf "%.1f\n", t / n; else print "nan" }' "$1"
}

tokens=$(awk '/^model/ { match($0, /B = [0-9]+/); b = substr($0, RSTART + 4, RLENGTH - 4);
                          match($0, /S = [0-9]+/); s = substr($0, RSTART + 4, RLENGTH - 4);
                          print b * s }' samples/gpt-tiny.tdl)
printf "%-6s %10s %10s %8s\n" mesh ms/step tok/s "vs 1"
base=""
for mesh in $MESHES; do
    bin="$BENCH_DIR/mesh-$mesh"
    ./tcc samples/gpt-tiny.tdl --mesh "$mesh" -o "$bin"
    "$bin" --steps "$STEPS" --comm threads >"$bin.log" 2>&1
    ms=$(mean_ms "$bin.log")
    base=${base:-$ms}
    awk -v m="$mesh" -v ms="$ms" -v b="$base" -v tok="$tokens" \
        'BEGIN { printf "%-6s %10.1f %10.0f %7.2fx\n", m, ms, tok / ms * 1000, b / ms }'
done
echo "(the same $tokens tokens a step on every mesh; $STEPS steps, the first $WARMUP left out; $(nproc) cores)"
