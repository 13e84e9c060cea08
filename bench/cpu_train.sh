#!/usr/bin/env bash
# bench/cpu_train.sh: CPU training throughput of programs built by tcc, against
# the sgemm rate OpenBLAS reaches on the same machine in the same environment.
#
# Builds ./tcc and bench/sgemm_peak.c, compiles two GPT-2 shapes, then for each
# of two OpenBLAS settings -- (a) the environment as it is, (b) with
# OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset for the benchmark commands only --
# measures the sgemm peak, trains each model for a few steps on random tokens and
# measures the sgemm peak again. The mean step time leaves out the first WARMUP
# steps (first touch of the slab, OpenBLAS buffers). Each run also reports how
# many cores other processes kept busy meanwhile: on a shared machine that, more
# than anything else, moves the numbers. Prints one table at the end; the logs
# stay in BENCH_DIR.
#
#   bash bench/cpu_train.sh            (or: make bench)
# Environment:
#   STEPS1, STEPS2   steps of model 1 and model 2 (defaults 5 and 5)
#   V1               vocabulary of model 1 (default 50304)
#   WARMUP           leading steps left out of the mean (default 2)
#   SETTINGS         settings to run, in order (default "a b"); "p" adds one more:
#                    as preset plus OMP_WAIT_POLICY=passive
#   BENCH_DIR        where binaries and logs go (default build/bench)
set -euo pipefail

cd "$(dirname "$0")/.."
STEPS1=${STEPS1:-5}
STEPS2=${STEPS2:-5}
V1=${V1:-50304}
WARMUP=${WARMUP:-2}
SETTINGS=${SETTINGS:-a b}
BENCH_DIR=${BENCH_DIR:-build/bench}
CC=${CC:-cc}

if ((STEPS1 <= WARMUP || STEPS2 <= WARMUP)); then
    echo "cpu_train.sh: STEPS1 and STEPS2 must exceed WARMUP ($WARMUP)" >&2
    exit 2
fi

mkdir -p "$BENCH_DIR"
echo "== build"
make --no-print-directory -j"$(nproc)" tcc
"$CC" -O2 -std=c11 -Wall -Wextra -o "$BENCH_DIR/sgemm_peak" bench/sgemm_peak.c -lopenblas

# name | source | -D flags | steps | shape shown in the table
MODELS=(
    "gpt2-small|samples/gpt2.tdl|-D L=4 -D D=256 -D S=256 -D B=8 -D V=$V1|$STEPS1|L4 D256 H4 S256 B8 V$V1 mb8"
    "gpt2-124M|bench/gpt2_mb1.tdl|-D L=12 -D D=768 -D H=12 -D S=64 -D B=4 -D V=50304|$STEPS2|L12 D768 H12 S64 B4 V50304 mb1"
)

for m in "${MODELS[@]}"; do
    IFS='|' read -r name src defs _ _ <<<"$m"
    echo "== compile $name: tcc $src $defs"
    t0=$(date +%s)
    # shellcheck disable=SC2086 # defs is a list of words
    ./tcc "$src" $defs -v -o "$BENCH_DIR/$name" 2>&1 | grep -E "codegen" || true
    echo "   $(($(date +%s) - t0)) s"
done

# Mean over the log lines after the warm-up: ms/step, tok/s, GFLOP/s. The GFLOP
# of a step is the line's GFLOP/s times its seconds (the plan's model FLOPs).
summarize() { # LOG WARMUP
    awk -v w="$2" '
        /^step +[0-9]+\/[0-9]+ +loss/ {
            split($2, s, "/"); st = s[1] + 0
            ms = tok = gf = -1
            for (i = 3; i < NF; i++) {
                if ($(i + 1) == "ms") ms = $i
                if ($(i + 1) == "tok/s") tok = $i
                if ($(i + 1) == "GFLOP/s") gf = $i
            }
            if (st > w && ms > 0) { n++; sms += ms; work += gf * ms / 1e3; tokms += tok * ms }
        }
        END {
            if (n == 0) { print "- - - 0"; exit }
            mean = sms / n
            printf "%.1f %.0f %.2f %d\n", mean, tokms / n / mean, work / n / (mean / 1e3), n
        }' "$1"
}

# CPU seconds that all processes spent busy so far (user, nice, system, irq,
# softirq, steal), from /proc/stat: with the run's own CPU time it gives how
# much of the machine other processes took during the run.
HZ=$(getconf CLK_TCK)
busy_s() { awk -v hz="$HZ" '/^cpu / { printf "%.2f\n", ($2 + $3 + $4 + $7 + $8 + $9) / hz }' /proc/stat; }

ROWS=()
for setting in $SETTINGS; do
    case $setting in
    a) RUN=(env) label="a: as preset" ;;
    b) RUN=(env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE) label="b: both unset" ;;
    p) RUN=(env OMP_WAIT_POLICY=passive) label="p: as preset plus OMP_WAIT_POLICY=passive" ;;
    *) echo "cpu_train.sh: unknown setting '$setting' (a, b or p)" >&2 && exit 2 ;;
    esac
    echo
    echo "== setting $label"
    # shellcheck disable=SC2016 # expanded by that sh, after env
    "${RUN[@]}" sh -c 'echo "   OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE-<unset>} OPENBLAS_L2_SIZE=${OPENBLAS_L2_SIZE-<unset>} OMP_WAIT_POLICY=${OMP_WAIT_POLICY-<unset>}"'
    echo "   load average: $(cut -d' ' -f1-3 /proc/loadavg)"
    peak_log="$BENCH_DIR/sgemm_$setting.log"
    "${RUN[@]}" "$BENCH_DIR/sgemm_peak" 2048 4 3 | tee "$peak_log"
    peak0=$(sed -n 's/^sgemm n=[0-9]*: \([0-9.]*\) GFLOP\/s.*/\1/p' "$peak_log")
    core=$(sed -n 's/^openblas core: //p' "$peak_log")
    threads=$(sed -n 's/^openblas threads: //p' "$peak_log")
    first=${#ROWS[@]}
    for m in "${MODELS[@]}"; do
        IFS='|' read -r name _ _ steps shape <<<"$m"
        log="$BENCH_DIR/${name}_$setting.log" tf="$BENCH_DIR/${name}_$setting.time"
        echo "-- $name ($shape): $steps steps, the first $WARMUP left out of the mean"
        b0=$(busy_s)
        TIMEFORMAT='%R %U %S'
        if ! { time "${RUN[@]}" "$BENCH_DIR/$name" --steps "$steps" | tee "$log"; } 2>"$tf"; then
            cat "$tf" >&2
            echo "cpu_train.sh: $name failed" >&2
            exit 1
        fi
        b1=$(busy_s)
        read -r wall user sys < <(tail -n 1 "$tf")
        # cores busy on average during the run: this program, everything else
        read -r ours others < <(awk -v w="$wall" -v u="$user" -v s="$sys" -v b0="$b0" -v b1="$b1" \
            'BEGIN { o = b1 - b0 - u - s; if (o < 0) o = 0; printf "%.2f %.2f\n", (u + s) / w, o / w }')
        echo "   ${wall} s wall; cores busy on average: this program $ours, other processes $others"
        read -r ms tok gf n < <(summarize "$log" "$WARMUP")
        # the peak and its fraction are filled in once the second sgemm run is done
        ROWS+=("$setting|$name|$shape|$ms|$tok|$gf|$ours|$others|$n|$core/$threads")
    done
    # The sgemm rate again after the models: this machine's rate drifts (shared
    # host); the fraction is of the mean of the two.
    "${RUN[@]}" "$BENCH_DIR/sgemm_peak" 2048 4 3 | tee "$peak_log.after"
    peak1=$(sed -n 's/^sgemm n=[0-9]*: \([0-9.]*\) GFLOP\/s.*/\1/p' "$peak_log.after")
    for ((i = first; i < ${#ROWS[@]}; i++)); do
        IFS='|' read -r s name shape ms tok gf ours others n ct <<<"${ROWS[i]}"
        read -r frac peak < <(awk -v g="$gf" -v a="$peak0" -v b="$peak1" 'BEGIN {
            p = (a + b) / 2; if (p > 0 && g != "-") printf "%.1f%% ", 100 * g / p; else printf "- "
            printf "%.0f/%.0f\n", a, b }')
        ROWS[i]=$(printf '%-3s %-10s %-31s %8s %6s %7s %6s %7s %5s %6s %2s  %s' \
            "$s" "$name" "$shape" "$ms" "$tok" "$gf" "$frac" "$peak" "$ours" "$others" "$n" "$ct")
    done
done

echo
echo "== results ($(date +%Y-%m-%d), $(nproc) cpus, $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1))"
echo "   ms/step, tok/s, GFLOP/s: means over the steps after the first $WARMUP (n: how many);"
echo "   GFLOP/s counts model FLOPs (2mnk per GEMM plus attention); peak: sgemm n=2048 GFLOP/s"
echo "   in the same setting before/after the models, %peak: of their mean; cpu, other: cores"
echo "   busy on average during the run, this program and all other processes"
printf '%-3s %-10s %-31s %8s %6s %7s %6s %7s %5s %6s %2s  %s\n' \
    set model shape ms/step tok/s GFLOP/s %peak peak cpu other n "openblas core/threads"
for r in "${ROWS[@]}"; do
    echo "$r"
done
