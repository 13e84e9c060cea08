#!/usr/bin/env bash
# bench/planner.sh: the planner's speed and quality.
#  1. Llama 3.1 405B on 16,384 H100s (batch 2,048 x 8K): the planning time
#     (profiles and search, as tcc prints it) against its budget of one
#     second, measured RUNS times, with the machine's core count; then the
#     whole command (the three checked layouts compiled and the cost printed).
#  2. Every published run of tests/data/published.tsv: the published layout
#     compiled with its own settings and the planner's plan for the same GPUs,
#     GPU and batch, both predicted by the cost model (planner_published.py).
# Exit 1 when the planning took a second or more, or the planner lost a row.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-5}
make -s tcc >/dev/null
out=build/bench/planner
mkdir -p "$out"
echo "machine: $(nproc) cores, $(uname -m)"
L405=(samples/llama.tdl -D L=126 -D D=16384 -D H=128 -D KV=8 -D F=53248 -D V=128256 -D S=8192 -D B=2048)
worst=0
for i in $(seq "$RUNS"); do
    ms=$(./tcc "${L405[@]}" --gpus 16384 --gpu h100-sxm --plan=auto --emit=cost -o "$out/l405.json" 2>&1 |
         sed -n 's/^plan: .* in \([0-9]*\) ms.*/\1/p')
    echo "405B on 16384 H100s: planning $ms ms"
    worst=$(( ms > worst ? ms : worst ))
done
start=$(date +%s.%N)
./tcc "${L405[@]}" --gpus 16384 --gpu h100-sxm --plan=auto --explain --emit=cost -o "$out/l405.json" 2> "$out/l405.log"
end=$(date +%s.%N)
grep -E "^plan: (chose|compiled)" "$out/l405.log"
printf '405B: planning at most %d ms of 1000; the whole command %.2f s\n' "$worst" "$(echo "$end - $start" | bc)"
python3 tests/lit/cost/planner_published.py ./tcc samples tests/data/published.tsv "$out" || lost=1
[ "$worst" -lt 1000 ] && [ -z "${lost:-}" ]
