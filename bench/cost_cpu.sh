#!/usr/bin/env bash
# bench/cost_cpu.sh: the cost model's CPU prediction against the real step.
# For each model and mesh: measure this machine (tcc --calibrate-cpu, into a
# CPU file), predict the step with it (tcc --cluster FILE --emit=cost), build
# the trainer, train STEPS steps on random tokens (the threads backend for a
# mesh) and take the median step time after WARMUP steps. Prints predicted
# and measured ms/step, their ratio, the cores other processes kept busy
# during the run (from /proc/stat: the model assumes a machine of our own),
# and the OpenBLAS core the calibration saw, then where the time goes by
# instruction groups (the trainer runs with TCC_PROFILE); fails when a ratio is outside
# [LO, HI]. Each calibration runs just before its trainer, so both see the
# machine in the same state. The model predicts a machine of our own: each
# row first waits (up to WAIT seconds) for the other processes to leave the
# cores (below QUIET cores busy over a second), and is measured again (up to
# TRIES times in all) when they came back during its run.
#
#   bash bench/cost_cpu.sh          (or: make bench-cost)
# Environment: STEPS1 (gpt-tiny, default 30), STEPS2 (the GPT-2 shape, default
# 6), WARMUP (default 2), LO and HI (default 0.75 and 1.25), MESHES (default
# "1 2x2"), QUIET (default 0.25), WAIT (default 300), TRIES (default 3),
# BENCH_DIR (default build/bench, where the files and logs stay), GROUPS_TOP
# (default 6: under each row, the instruction groups that take longest,
# predicted against measured on rank 0, by bench/cost_compare.py; empty: none).
set -euo pipefail

cd "$(dirname "$0")/.."
STEPS1=${STEPS1:-30}
STEPS2=${STEPS2:-6}
WARMUP=${WARMUP:-2}
LO=${LO:-0.75}
HI=${HI:-1.25}
MESHES=${MESHES:-1 2x2}
QUIET=${QUIET:-0.25}
WAIT=${WAIT:-300}
TRIES=${TRIES:-3}
BENCH_DIR=${BENCH_DIR:-build/bench}
GROUPS_TOP=${GROUPS_TOP-6}
mkdir -p "$BENCH_DIR"
make --no-print-directory tcc >/dev/null

# name | source | -D flags | steps
MODELS=(
    "gpt-tiny|samples/gpt-tiny.tdl||$STEPS1"
    "gpt2-L2|samples/gpt2.tdl|-D L=2 -D D=256 -D S=128 -D B=16 -D V=8192|$STEPS2"
)

median_ms() { # LOG: the median step time after the warm-up
    awk -v w="$WARMUP" '/^step +[0-9]+\/[0-9]+ +loss/ {
            split($2, s, "/")
            for (i = 3; i < NF; i++) if ($(i + 1) == "ms" && s[1] + 0 > w) t[n++] = $i
        }
        END {
            if (!n) { print "nan"; exit }
            for (i = 0; i < n; i++) for (j = i + 1; j < n; j++) if (t[j] < t[i]) { x = t[i]; t[i] = t[j]; t[j] = x }
            printf "%.1f\n", n % 2 ? t[(n - 1) / 2] : (t[n / 2 - 1] + t[n / 2]) / 2
        }' "$1"
}

HZ=$(getconf CLK_TCK)
busy_s() { awk -v hz="$HZ" '/^cpu / { printf "%.2f\n", ($2 + $3 + $4 + $7 + $8 + $9) / hz }' /proc/stat; }

# Wait until other processes keep fewer than QUIET cores busy over a second
# (at most WAIT seconds).
wait_quiet() {
    local t0=$SECONDS b0 b1
    while ((SECONDS - t0 < WAIT)); do
        b0=$(busy_s) && sleep 1 && b1=$(busy_s)
        awk -v a="$b0" -v b="$b1" -v q="$QUIET" 'BEGIN { exit !(b - a < q) }' && return 0
    done
    echo "   (the machine stayed busy for $WAIT s: measuring anyway)" >&2
}

# One try of a row: calibrate, predict, train; sets pred, meas, other.
measure() { # TAG SRC DEFS STEPS MESHOPT...
    local tag=$1 src=$2 defs=$3 steps=$4 b0 b1 wall user sys
    shift 4
    wait_quiet
    ./tcc --calibrate-cpu -o "$tag.cpu"
    # shellcheck disable=SC2086 # defs is a list of words
    ./tcc "$src" $defs "$@" --cluster "$tag.cpu" --emit=cost -o "$tag.json"
    pred=$(python3 -c "import json; print('%.1f' % (1e3 * json.load(open('$tag.json'))['step_time_s']))")
    b0=$(busy_s)
    TIMEFORMAT='%R %U %S'
    { time TCC_PROFILE="$tag.prof" "$tag" --steps "$steps" --comm threads >"$tag.log" 2>&1; } 2>"$tag.time"
    b1=$(busy_s)
    read -r wall user sys < <(tail -n 1 "$tag.time")
    other=$(awk -v w="$wall" -v u="$user" -v s="$sys" -v b0="$b0" -v b1="$b1" \
        'BEGIN { o = b1 - b0 - u - s; printf "%.2f\n", o < 0 ? 0 : o / w }')
    meas=$(median_ms "$tag.log")
}

printf "%-9s %-5s %12s %12s %7s %6s  %s\n" model mesh "predicted ms" "measured ms" ratio other "openblas"
fails=0
for m in "${MODELS[@]}"; do
    IFS='|' read -r name src defs steps <<<"$m"
    for mesh in $MESHES; do
        tag="$BENCH_DIR/cost-$name-$mesh" meshopt=()
        [[ $mesh != 1 ]] && meshopt=(--mesh "$mesh")
        # shellcheck disable=SC2086 # defs is a list of words
        ./tcc "$src" $defs "${meshopt[@]}" -o "$tag"
        for ((try = 1; try <= TRIES; try++)); do
            measure "$tag" "$src" "$defs" "$steps" "${meshopt[@]}"
            awk -v o="$other" -v q="$QUIET" 'BEGIN { exit !(o < q) }' && break
        done
        blas=$(sed -n 's/^what = .*, OpenBLAS /OpenBLAS /p' "$tag.cpu")
        ratio=$(awk -v p="$pred" -v m="$meas" 'BEGIN { printf "%.2f\n", p / m }')
        ok=$(awk -v r="$ratio" -v lo="$LO" -v hi="$HI" 'BEGIN { print (r >= lo && r <= hi) }')
        printf "%-9s %-5s %12s %12s %7s %6s  %s%s\n" "$name" "$mesh" "$pred" "$meas" "$ratio" \
            "$other" "$blas" "$([[ $ok == 1 ]] || echo "  <- outside [$LO, $HI]")"
        [[ $ok == 1 ]] || fails=$((fails + 1))
        [[ -n $GROUPS_TOP ]] && python3 bench/cost_compare.py "$tag.json" "$tag.prof" "$GROUPS_TOP" | sed 's/^/      /'
    done
done
echo "(median of the steps after the first $WARMUP; other: cores other processes kept busy during"
echo " the run; $(nproc) cores, $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1))"
if ((fails)); then
    echo "cost_cpu.sh: $fails prediction(s) outside [$LO, $HI]" >&2
    exit 1
fi
