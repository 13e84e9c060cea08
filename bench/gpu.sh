#!/usr/bin/env bash
# gpu.sh (make bench-gpu): tcc's training step on one GPU against llm.c's,
# on the same token shard and GPU, in one run. Its whole output is the
# record of the run (bench/records/DATE-gpu-*.txt): the command, the
# commit, nvidia-smi, the log lines.
#   1. GPT-2 124M, bf16, B = 64, S = 1024 (one microbatch, as llm.c runs it;
#      no recomputation: the plan's 26 GiB fit any 80 GB GPU, and the
#      sample's selective recomputation moves 16% more bytes a step):
#      tcc's program and llm.c's train_gpt2cu (../shared/peers/llmc-gpu/run.sh)
#      STEPS steps each (default 30) on a byte-level shard made by tccdata
#      from the machine's license texts; ms/step, tokens/s and MFU are the
#      medians of steps 11..STEPS, and the losses of both are printed side by
#      side (both start from random weights of the same shapes); then tcc's
#      program 15 steps without CUDA graphs (TCC_CUDA_GRAPHS=0), for what
#      the graphs save.
#   2. tcc's GPT-2 step profiled (TCC_PROFILE: each instruction waited for,
#      4 steps): the 15 instructions that take the most time, with their
#      share and their achieved TFLOP/s (GEMMs, attention) or GB/s (the rest).
#   3. A Llama-style 1B (L=16, D=2048, H=32, KV=8, F=8192, V=128256,
#      S=2048, B=8) by tcc alone: ms/step, tokens/s, MFU.
# The last line is exactly
#   gpt2-124M bf16: tcc T tokens/s, llm.c L tokens/s, ratio R, MFU M%
# MFU = the plan's model FLOPs of a step (6 N tokens plus attention) over
# the step time, over PEAK_TFLOPS (default the dense bf16 peak of the GPU
# nvidia-smi names: 989 for an H100 or H200).
# Usage: bash bench/gpu.sh [STEPS]; OUT=DIR keeps the logs; TCC_BUNDLE=DIR
# runs a bundle of tests/gpu/pack.sh (a GPU machine that cannot build tcc);
# LLMC=PATH/run.sh names llm.c's runner; SKIP_LLAMA=1 leaves step 3 out.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
STEPS=${1:-30}
OUT=${OUT:-$(mktemp -d /tmp/tcc-bench-gpu.XXXXXX)}
mkdir -p "$OUT"
LLMC=${LLMC:-../shared/peers/llmc-gpu/run.sh}
say() { printf '%s\n' "$*"; }

say "# bench/gpu.sh $STEPS, $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
    say "bench/gpu.sh: no GPU here (nvidia-smi lists none)"
    exit 1
fi
nvidia-smi
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
case "$GPU" in
*H100* | *H200* | *H800*) peak=989 ;;
*A100* | *A800*) peak=312 ;;
*) peak=0 ;;
esac
PEAK=${PEAK_TFLOPS:-$peak}

# ---- build (or a bundle), data ----
if [ -n "${TCC_BUNDLE:-}" ]; then
    . tests/gpu/bundle.sh
    use_bundle >"$OUT/build.log" 2>&1 || { cat "$OUT/build.log"; exit 1; }
elif ! make -j"$(nproc)" tcc tccdata >"$OUT/build.log" 2>&1; then
    tail -20 "$OUT/build.log"
    exit 1
fi
./tccdata -o "$OUT/data" --val-fraction 0 /usr/share/common-licenses/* >"$OUT/data.log" 2>&1 ||
    { cat "$OUT/data.log"; exit 1; }
DATA=$OUT/data_train.bin

# Medians of steps 11..: the ms and tok/s columns of a tcc log ("3: ms", "4: tok/s").
med() { sort -g | awk '{ v[NR] = $1 } END { print NR ? v[int((NR + 1) / 2)] : "nan" }'; }
column() { awk -v w="$2" '/^step / { n++; if (n <= 10) next;
    for (i = 2; i <= NF; i++) if ($i == w) print $(i - 1) }' "$1"; }
flops() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["flops"])' "$1"; }
mfu() { awk -v f="$1" -v ms="$2" -v p="$PEAK" 'BEGIN { printf "%.1f", p > 0 ? f / (ms * 1e-3) / (p * 1e12) * 100 : 0 }'; }

# ---- 1. GPT-2 124M: tcc ----
G="samples/gpt2.tdl --set microbatches=1 --set precision=bf16 --set recompute=none"
say "## tcc GPT-2 124M bf16 B=64 S=1024: ./tcc $G -o $OUT/gpt2"
# shellcheck disable=SC2086
./tcc $G --emit=plan -o "$OUT/gpt2.plan" >/dev/null && ./tcc $G -o "$OUT/gpt2" >"$OUT/gpt2.build.log" 2>&1 ||
    { cat "$OUT/gpt2.build.log"; exit 1; }
"$OUT/gpt2" --device cuda --data "$DATA" --steps "$STEPS" --log-every 1 >"$OUT/gpt2.log" 2>&1
cat "$OUT/gpt2.log"
T_MS=$(column "$OUT/gpt2.log" ms | med)
T_TOK=$(column "$OUT/gpt2.log" tok/s | med)
T_MFU=$(mfu "$(flops "$OUT/gpt2.plan/plan.json")" "$T_MS")
say "tcc gpt2-124M: median ms/step $T_MS, tokens/s $T_TOK, MFU% $T_MFU (steps 11..$STEPS)"
# the same step without CUDA graphs (every kernel, GEMM and copy launched by the host): what the graphs save
TCC_CUDA_GRAPHS=0 "$OUT/gpt2" --device cuda --data "$DATA" --steps 15 --log-every 1 >"$OUT/gpt2-eager.log" 2>&1 ||
    say "tcc gpt2-124M without CUDA graphs: exit status $?"
cat "$OUT/gpt2-eager.log"
say "tcc gpt2-124M without CUDA graphs: median ms/step $(column "$OUT/gpt2-eager.log" ms | med) (steps 11..15)"

# ---- 1. GPT-2 124M: llm.c ----
say "## llm.c GPT-2 124M bf16 B=64 T=1024: $LLMC $DATA 64 1024 $STEPS"
if [ -x "$LLMC" ]; then
    bash "$LLMC" "$DATA" 64 1024 "$STEPS" >"$OUT/llmc.log" 2>&1
    cat "$OUT/llmc.log"
    L_TOK=$(sed -n 's/^llm.c gpt2-124M .*tokens\/s \([0-9.]*\),.*/\1/p' "$OUT/llmc.log" | tail -1)
else
    say "no llm.c runner at $LLMC"
fi
L_TOK=${L_TOK:-nan}
say "## losses, step by step (tcc, llm.c)"
paste <(sed -n 's/^step *\([0-9]*\)\/[0-9]* *loss \([0-9.]*\).*/\1 \2/p' "$OUT/gpt2.log") \
      <(sed -n 's/^step *\([0-9]*\)\/[0-9]*: *train loss \([0-9.]*\).*/\2/p' "$OUT/llmc.log" 2>/dev/null)

# ---- 2. where tcc's step goes ----
say "## tcc GPT-2 124M, 4 steps profiled (each instruction waited for)"
TCC_PROFILE=$OUT/gpt2.prof "$OUT/gpt2" --device cuda --data "$DATA" --steps 4 >/dev/null 2>&1
python3 bench/gpu_profile.py "$OUT/gpt2.prof" "$OUT/gpt2.plan/plan.json" 15

# ---- 3. Llama-style 1B: tcc ----
if [ -z "${SKIP_LLAMA:-}" ]; then
    M="samples/llama.tdl -D L=16 -D D=2048 -D H=32 -D KV=8 -D F=8192 -D V=128256 -D S=2048 -D B=8 --set microbatches=1"
    say "## tcc Llama-style 1B bf16: ./tcc $M -o $OUT/llama"
    # shellcheck disable=SC2086
    if ./tcc $M --emit=plan -o "$OUT/llama.plan" >/dev/null && ./tcc $M -o "$OUT/llama" >"$OUT/llama.build.log" 2>&1; then
        "$OUT/llama" --device cuda --data "$DATA" --steps "$STEPS" --log-every 1 >"$OUT/llama.log" 2>&1
        cat "$OUT/llama.log"
        M_MS=$(column "$OUT/llama.log" ms | med)
        say "tcc llama-1B: median ms/step $M_MS, tokens/s $(column "$OUT/llama.log" tok/s | med), MFU% $(mfu "$(flops "$OUT/llama.plan/plan.json")" "$M_MS") (steps 11..$STEPS)"
    else
        cat "$OUT/llama.build.log"
    fi
fi

R=$(awk -v t="$T_TOK" -v l="$L_TOK" 'BEGIN { printf (l > 0 ? "%.2f" : "nan"), (l > 0 ? t / l : 0) }')
say "gpt2-124M bf16: tcc $T_TOK tokens/s, llm.c $L_TOK tokens/s, ratio $R, MFU $T_MFU%"
