#!/usr/bin/env bash
# demo.sh: the main job. Turns the licence texts every Debian machine carries
# into byte-level token files (tccdata), compiles samples/gpt-tiny.tdl into a
# training program (tcc -o), trains it with validation and checkpoints, and
# draws the loss curve. Writes build/demo/. STEPS=N changes the length.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

STEPS=${STEPS:-400}
out=build/demo
mkdir -p "$out"

# Text: the licences, else this project's own documents.
shopt -s nullglob
texts=(/usr/share/common-licenses/*)
[ ${#texts[@]} -gt 0 ] || texts=(docs/*.md README.md)
echo "== data: ${#texts[@]} text files -> byte tokens"
./tccdata -o "$out/data" "${texts[@]}" | sed -n '1,6p'

echo "== compile: tcc samples/gpt-tiny.tdl -o $out/gpt-tiny"
./tcc samples/gpt-tiny.tdl -o "$out/gpt-tiny" -v 2>&1 | grep -E 'codegen|microbatch' || true

echo "== train: $STEPS steps"
rm -rf "$out/ckpt"
"$out/gpt-tiny" --data "$out/data_train.bin" --val "$out/data_val.bin" --steps "$STEPS" \
    --log-every 20 --eval-every 100 --ckpt "$out/ckpt" | tee "$out/train.log"

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
