/* cpu.h: private to the runtime: the CPU device that the executor drives.
 * It owns the slab and the kernels compiled from the plan's C source, and
 * runs GEMMs with BLAS. Not part of the public API (runtime.h is). */
#ifndef TCC_CPU_H
#define TCC_CPU_H

#include <stddef.h>

#include "plan/plan.h"
#include "runtime/comm/comm.h"

/* The calling convention of every kernel: args[j] is the first byte of the
 * j-th tensor argument of the instruction, in the slab. */
typedef void (*RtKernelFn)(char *const *args);
/* The source's tcc_run_group: fns[i](args[i]) for i < n in one parallel region. */
typedef void (*RtGroupFn)(int n, RtKernelFn const *fns, char *const *const *args);

typedef struct CpuDevice {
    char *slab;          /* anonymous pages, zero-filled by the kernel on first touch */
    uint64_t slab_bytes; /* the plan's slab of this device's stage (slab_bytes until attach) */
    size_t mapped;       /* bytes mapped: slab_bytes rounded up to pages */
    void *so;        /* the dlopen handle of the kernels (NULL when there are none) */
    RtKernelFn *fns; /* by kernel index */
    RtKernelFn *ws;  /* by kernel index: NAME_ws, the loop shared out in a region, or NULL */
    RtGroupFn run_group; /* NULL when the plan has no groups */
    char so_path[4096];
    float *wide;      /* bf16 GEMMs: f32 copies of A, B and C (grown by the first step) */
    size_t wide_len;  /* floats in wide */
    RtAccount *account; /* where wide is counted (the Runtime's), or NULL */
} CpuDevice;

/* Allocate the slab, then compile (or find in cache_dir) and load the kernels
 * of p, which has passed plan_check. 0, or -1 with a message; d is then empty. */
int rt_cpu_open(CpuDevice *d, const Plan *p, const char *cache_dir, char *err, size_t n);

/* Called first in main: starts the program again, once, with the idle
 * threads of OpenMP and OpenBLAS set to sleep instead of spinning
 * (OMP_WAIT_POLICY=passive, OPENBLAS_THREAD_TIMEOUT=4), each unless the user
 * set it; both are read when those runtimes start, before main. */
void rt_cpu_quiet_threads(char **argv);

/* The same with kernels already linked into the program (fns by kernel
 * index, the plan's order; when the plan has groups, then the NAME_ws of
 * each, NULL where it has none, and tcc_run_group cast to RtKernelFn), or
 * compiled from the plan when linked is NULL. */
int rt_cpu_open_linked(CpuDevice *d, const Plan *p, const RtKernelFn *linked,
                       const char *cache_dir, char *err, size_t n);

/* Keep only the first bytes of the slab (a pipeline stage's own slab): the
 * pages beyond are unmapped. bytes <= d->slab_bytes. */
void rt_cpu_fit(CpuDevice *d, uint64_t bytes);

/* The bytes of the slab's first d->slab_bytes that lie in pages written so
 * far (see cpu.c for how they are counted). 0, or -1 with a message. */
int rt_cpu_touched(const CpuDevice *d, uint64_t *bytes, char *err, size_t n);

/* C = alpha op(A) op(B) + beta C, batch times: f32 and f64 only. 0, or -1. */
int rt_cpu_gemm(CpuDevice *d, const Plan *p, const PlanGemm *g, char *err, size_t n);

void rt_cpu_close(CpuDevice *d);

/* The folder for compiled kernels: given, else $TCC_CACHE, else ~/.cache/tcc,
 * else /tmp/tcc-cache-$UID (which must be ours), made when missing; its path
 * into out[size]. 0, or -1 with a message. */
int rt_cache_dir(const char *given, char *out, size_t size, char *err, size_t n);

#endif
