#!/usr/bin/env bash
# demo.sh: the main job. Turns the licence texts every Debian machine carries
# into byte-level token files (tccdata), compiles samples/gpt-tiny.tdl for a
# 2x2 mesh (2-way data x 2-way tensor parallel) into a training program
# (tcc --mesh 2x2 -o), trains it on the threads backend (4 ranks in one
# process) with validation and checkpoints, and draws the loss curve. Writes
# build/demo/. STEPS=N changes the length, MESH=2x1 (or 1) the mesh.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

STEPS=${STEPS:-400}
MESH=${MESH:-2x2}
out=build/demo
mkdir -p "$out"

# Text: the licences, else this project's own documents.
shopt -s nullglob
texts=(/usr/share/common-licenses/*)
[ ${#texts[@]} -gt 0 ] || texts=(docs/*.md README.md)
echo "== data: ${#texts[@]} text files -> byte tokens"
./tccdata -o "$out/data" "${texts[@]}" | sed -n '1,6p'

echo "== compile: tcc samples/gpt-tiny.tdl --mesh $MESH -o $out/gpt-tiny"
./tcc samples/gpt-tiny.tdl --mesh "$MESH" -o "$out/gpt-tiny" -v 2>&1 |
    grep -E 'codegen|microbatch|partition' || true

echo "== train: $STEPS steps on the mesh $MESH (threads backend)"
rm -rf "$out/ckpt"
start=$(date +%s.%N)
"$out/gpt-tiny" --data "$out/data_train.bin" --val "$out/data_val.bin" --steps "$STEPS" \
    --log-every 20 --eval-every 100 --ckpt "$out/ckpt" --comm threads | tee "$out/train.log"
awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "== wall time: %.1f s\n", b - a }'

echo "== loss curve (train loss every 20 steps; ln 256 = 5.55 is a uniform guess)"
awk '$1 == "step" && $2 ~ /\// {
        split($2, s, "/"); loss = $4
        bar = ""; for (i = 0; i < loss * 10; i++) bar = bar "#"
        printf "  step %5d  %.3f  %s\n", s[1], loss, bar
    }' "$out/train.log"

final=$(awk '/val loss/ { v = $5 } END { print v }' "$out/train.log")
awk -v v="$final" 'BEGIN {
    if (v != "" && v + 0 < 2.5) { printf "== done: validation loss %.3f (below 2.5)\n", v; exit 0 }
    printf "== validation loss %s: not below 2.5 yet (try STEPS=800)\n", v; exit 1
}'
