#!/usr/bin/env bash
# demo.sh: compile every sample model for an 8x4x2 mesh and show the start of
# its graph IR. Reads samples/*.tdl with ./tcc; writes build/demo/NAME.tir.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1

MESH=${MESH:-8x4x2}
mkdir -p build/demo
shopt -s nullglob
samples=(samples/*.tdl)
if [ ${#samples[@]} -eq 0 ]; then
    echo "demo: no samples in samples/"
    exit 1
fi

# ops, parameters and trained elements of one printed graph
summary()
{
    awk '
    /^%/ { ops++ }
    / = param / {
        params++
        t = $0
        gsub(/@\([^)]*\)/, "", t)   # drop shardings: [768@(tp,dp)] -> [768]
        gsub(/@[A-Za-z_0-9]+/, "", t)
        if (match(t, /\[[0-9,]*\]/)) {
            n = 1
            k = split(substr(t, RSTART + 1, RLENGTH - 2), d, ",")
            for (i = 1; i <= k; i++) n *= d[i]
            elems += n
        }
    }
    END { printf "summary: %d ops, %d parameter tensors, %.0f parameters\n", ops, params, elems }
    ' "$1"
}

failed=0
for sample in "${samples[@]}"; do
    name=$(basename "$sample" .tdl)
    out=build/demo/$name.tir
    echo "==== ./tcc $sample --mesh $MESH --emit=ir"
    if ! ./tcc "$sample" --mesh "$MESH" --emit=ir >"$out"; then
        echo "demo: $sample failed"
        failed=$((failed + 1))
        continue
    fi
    head -n 40 "$out"
    echo "... $(wc -l <"$out") lines in all ($out)"
    summary "$out"
    echo
done
echo "demo: ${#samples[@]} samples, $failed failed"
[ "$failed" -eq 0 ]
