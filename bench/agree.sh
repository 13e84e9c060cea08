#!/usr/bin/env bash
# bench/agree.sh: what the agreements between ranks cost a training step. A
# mesh program's ranks make two all-reduces (max) of a few int32 per step
# (runtime/train.c): after the gradient norm, whether the loss and the norm
# are finite; after the step, whether a rank failed or a stop signal came
# (the second was there before the signals: it only carries one more int32).
# Times the call itself (bench/agree.c, 4 ranks as threads and under mpirun)
# and the step of gpt-tiny on a 2x2 mesh of the same backend, and prints the
# share of the step the two calls take.
#
#   bash bench/agree.sh
# Environment: ITERS (default 20000 calls), STEPS (default 20), BENCH_DIR
# (default build/bench).
set -euo pipefail

cd "$(dirname "$0")/.."
ITERS=${ITERS:-20000}
STEPS=${STEPS:-20}
BENCH_DIR=${BENCH_DIR:-build/bench}
mkdir -p "$BENCH_DIR"
make --no-print-directory tcc build/libtccrt.a >/dev/null
RT_LIBS="-lopenblas -lcjson -ldl -fopenmp -lm $(mpicc --showme:link) -pthread"
CUDA_LIBS= # a runtime built with the CUDA toolkit links its libraries
if [ -f build/obj/runtime/gpu/cuda.o ]; then
    CUDA_LIBS="-L${CUDA_HOME:-/usr/local/cuda}/lib64 -Wl,-rpath,${CUDA_HOME:-/usr/local/cuda}/lib64 -lnccl -lcublasLt -lnvrtc -lcudart"
fi
cc -O2 -std=c11 -D_POSIX_C_SOURCE=200809L -I. -o "$BENCH_DIR/agree" bench/agree.c \
    build/libtccrt.a $RT_LIBS $CUDA_LIBS
./tcc samples/gpt-tiny.tdl --mesh 2x2 -o "$BENCH_DIR/gpt-tiny-2x2" >/dev/null

MPIRUN="mpirun --oversubscribe --mca btl self,vader --mca btl_vader_single_copy_mechanism none"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
for comm in threads mpi; do
    if [ $comm = threads ]; then
        call=$("$BENCH_DIR/agree" "$ITERS" 4)
        step=$("$BENCH_DIR/gpt-tiny-2x2" --steps "$STEPS" --device cpu | tail -1)
    else
        call=$($MPIRUN -np 4 -x OMP_NUM_THREADS=1 "$BENCH_DIR/agree" "$ITERS")
        step=$($MPIRUN -np 4 -x OMP_NUM_THREADS=1 -x OPENBLAS_NUM_THREADS=1 \
            "$BENCH_DIR/gpt-tiny-2x2" --steps "$STEPS" --device cpu | tail -1)
    fi
    echo "$call"
    us=$(echo "$call" | awk '/of 3 int32/ { print $(NF - 3) }')
    ms=$(echo "$step" | sed -n 's/.*: \([0-9.]*\) ms\/step.*/\1/p')
    awk -v c=$comm -v us="$us" -v ms="$ms" 'BEGIN {
        printf "%s: gpt-tiny 2x2 %.1f ms/step; two agreements %.0f us = %.3f%% of a step\n",
               c, ms, 2 * us, 2 * us / (ms * 10) }'
done
