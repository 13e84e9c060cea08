#!/usr/bin/env bash
# same_plans.sh BEFORE_TCC AFTER_TCC: a restructuring changes no plan. Every
# sample, at the small shapes of verify_matrix.py, on one device and on the
# meshes verify-matrix uses (2x2, 2x1x2, 2x2x2), compiled by both compilers
# with --emit=plan: the plan.json files must be byte-identical. Prints one
# line per plan and 'N same, N differ'; exits 1 when any differs.
set -u
before=$1 after=$2
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
tmp=$(mktemp -d /tmp/same-plans.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
declare -A SHAPE=(
    [mlp]="-D B=16 -D I=12 -D H=8 -D C=6"
    [gpt-tiny]="-D L=1 -D D=32 -D H=2 -D S=16 -D B=8"
    [gpt2]="-D L=1 -D D=32 -D H=2 -D S=16 -D V=64 -D B=16 --set microbatches=2"
    [llama]="-D L=1 -D D=32 -D H=2 -D KV=2 -D F=64 -D S=16 -D V=64 -D B=16 --set microbatches=2"
    [bert]="-D L=1 -D D=32 -D H=2 -D S=16 -D V=64 -D B=8"
    [vit]="-D HW=16 -D P=4 -D D=32 -D L=2 -D K=4 -D B=8"
    [mixtral]=""
)
same=0 differ=0
for m in mlp gpt-tiny gpt2 llama bert vit mixtral; do
    for mesh in 1 2x2 2x1x2 2x2x2; do
        for side in before after; do
            tcc=$before; [ $side = after ] && tcc=$after
            # shellcheck disable=SC2086
            "$tcc" "$here/samples/$m.tdl" ${SHAPE[$m]} --mesh $mesh --emit=plan -o "$tmp/$side" \
                >"$tmp/$side.log" 2>&1 || echo "(no plan: $(tail -1 "$tmp/$side.log"))" >"$tmp/$side/plan.json"
        done
        if cmp -s "$tmp/before/plan.json" "$tmp/after/plan.json"; then
            same=$((same + 1))
        else
            differ=$((differ + 1))
            echo "$m $mesh: the plans differ"
        fi
        rm -rf "$tmp/before" "$tmp/after"
    done
done
echo "$same same, $differ differ"
[ "$differ" = 0 ]
