#!/usr/bin/env bash
# peer.sh: tcc against PyTorch on this CPU, the same model, shapes and
# optimizer (bench/README.md, "The PyTorch peer"). `make bench-peer`.
#
# Installs Debian's python3-torch when `import torch` fails (this benchmark
# only; make test never needs it). For each shape, tcc's program and
# bench/peer_gpt.py train in turns, ROUNDS rounds each (default 3), each run
# STEPS steps; a run's figure is the median of its steps after the first.
# Both run f32 on every core, PyTorch with GOMP_SPINCOUNT=0, tcc's programs
# with the threads' settings they give themselves. Then AdamW's
# share: the time of tcc's adamw kernels on the 124M shape (TCC_PROFILE),
# against the memory bandwidth that bench/stream.c measures in the same run.
#   ROUNDS=3 STEPS=6 bash bench/peer.sh
#   TORCH2=1 bash bench/peer.sh          (PyTorch 2 with torch.compile)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

ROUNDS=${ROUNDS:-3}
STEPS=${STEPS:-6}
OUT=build/bench/peer
CC=${CC:-cc}
mkdir -p "$OUT"

# Debian's package goes with Debian's python (/usr/bin/python3), which may
# not be the python3 on PATH. TORCH2=1: PyTorch 2 from PyPI instead, in a
# venv of its own (build/bench/torch2: about 5 GB with its CUDA libraries),
# compiled with torch.compile (TCC_PEER_COMPILE=1) and fused AdamW.
PY=${PYTHON:-python3}
if [ "${TORCH2:-0}" = 1 ]; then
    VENV=build/bench/torch2
    if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
        echo "peer: installing PyTorch 2 from PyPI into $VENV for this benchmark"
        /usr/bin/python3 -m venv "$VENV" && "$VENV/bin/pip" install -q torch
    fi
    PY=$VENV/bin/python
    export TCC_PEER_COMPILE=${TCC_PEER_COMPILE:-1} # 0: eager
elif ! "$PY" -c "import torch" 2>/dev/null; then
    PY=/usr/bin/python3
    if ! "$PY" -c "import torch" 2>/dev/null; then
        echo "peer: installing python3-torch (Debian) for this benchmark"
        apt-get update -qq && apt-get install -y -qq python3-torch >/dev/null
    fi
fi
make -s tcc
"$CC" -O3 -march=native -fopenmp -o "$OUT/stream" bench/stream.c
"$CC" -O2 -std=c11 -o "$OUT/sgemm_peak" bench/sgemm_peak.c -lopenblas
"$CC" -O2 -shared -fPIC -o "$OUT/kprof.so" bench/kprof.c -ldl

# PyTorch as a careful user runs it: GOMP_SPINCOUNT=0 (its idle OpenMP
# workers sleep at once). tcc's programs set their own (rt_cpu_quiet_threads).
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) cores"
"$OUT/sgemm_peak" 1024 2 2 | head -1
echo "torch $("$PY" -c "import torch; print(torch.__version__)") at $PY"


# name L D H S B V (steps: the tiny shape runs more of them)
SHAPES=("gpt2-124m 12 768 12 64 4 50304 $STEPS"
        "gpt2-L4-D256 4 256 4 256 8 50304 $STEPS"
        "gpt-tiny 4 128 4 64 16 256 $((STEPS * 4))")

ratio() { python3 -c "import sys; print(float(sys.argv[1]) / float(sys.argv[2]))" "$1" "$2"; }
median() { sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
# a tcc run's step times (ms), then a PyTorch run's, without the first step
tcc_steps() { "$1" --steps "$2" | awk '/^step / {for (i = 1; i < NF; i++) if ($(i + 1) == "ms") print $i}' | tail -n +2; }
torch_steps() { GOMP_SPINCOUNT=0 "$PY" bench/peer_gpt.py "$@" | awk '/^step / {print $4}' | tail -n +2; }

printf '\n%-14s %5s %10s %10s %7s\n' shape round "tcc ms" "torch ms" ratio
summary=()
for shape in "${SHAPES[@]}"; do
    read -r name L D H S B V steps <<<"$shape"
    ./tcc bench/gpt2_mb1.tdl -D L="$L" -D D="$D" -D H="$H" -D S="$S" -D B="$B" -D V="$V" \
        --set precision=f32 --set recompute=none -o "$OUT/$name"
    t_all=() p_all=()
    for r in $(seq "$ROUNDS"); do
        t=$(tcc_steps "$OUT/$name" "$steps" | median)
        p=$(torch_steps "$L" "$D" "$H" "$S" "$B" "$V" "$steps" | median)
        t_all+=("$t") p_all+=("$p")
        printf '%-14s %5d %10.1f %10.1f %7.2f\n' "$name" "$r" "$t" "$p" "$(python3 -c "print($t / $p)")"
    done
    t=$(printf '%s\n' "${t_all[@]}" | median) p=$(printf '%s\n' "${p_all[@]}" | median)
    summary+=("$(printf '%-14s median %10.1f %10.1f %7.2f' "$name" "$t" "$p" "$(ratio "$t" "$p")")")
done
printf '%s\n' "${summary[@]}"

# AdamW against the memory bandwidth: 28 bytes a parameter (read p, g, m, v;
# write p, m, v; f32), over the adamw kernels' time a step; the bandwidth is
# the better of two triads, before and after the profile.
echo
"$OUT/stream" 256 | tee "$OUT/stream.txt"
params=$(./tcc bench/gpt2_mb1.tdl -D L=12 -D D=768 -D H=12 -D S=64 -D B=4 -D V=50304 \
    --set precision=f32 --set recompute=none --emit=memory | awk '/^  parameters/ {print $2 / 4}')
KPROF_OUT="$OUT/kprof.txt" LD_PRELOAD="$OUT/kprof.so" "$OUT/gpt2-124m" --steps 3 > "$OUT/kprof.log"
ms=$(awk '/trained/ {for (i = 1; i < NF; i++) if ($(i + 1) ~ /^ms\/step/) print $i}' "$OUT/kprof.log")
python3 bench/kprof.py "$OUT/gpt2-124m" "$OUT/kprof.txt" 3 "$ms" 12 > "$OUT/kprof.table"
# the update's time from TCC_PROFILE: the kernels of a group share the
# group's time (one parallel region: kprof sees tcc_run_group alone)
TCC_PROFILE="$OUT/profile.txt" "$OUT/gpt2-124m" --steps 3 > /dev/null
adamw=$(awk -F'\t' '$3 ~ /_adamw$/ {s += $2} END {print s / 1000}' "$OUT/profile.txt")
"$OUT/stream" 256 | tee -a "$OUT/stream.txt" # again after: this machine's bandwidth moves
bw=$(awk '{print $3}' "$OUT/stream.txt" | sort -g | tail -1)
python3 -c "import sys; n, ms, bw = map(float, sys.argv[1:]); g = 28 * n / (ms / 1e3) / 1e9
print('adamw: %d parameters, %.1f ms a step: %.1f GB/s, %.0f%% of the triad\'s %.1f GB/s' % (n, ms, g, 100 * g / bw, bw))" \
    "$params" "$adamw" "$bw"
echo "the 124M profile: $OUT/kprof.table"
