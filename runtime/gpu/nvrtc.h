/* nvrtc.h: private to the runtime: CUDA C -> a cubin for one architecture
 * with NVRTC, cached on disk by the hash of the source and the architecture,
 * and the per-kernel resource report (registers, spills, shared memory) that
 * ptxas writes into the compile log. Needs no GPU: NVRTC compiles anywhere. */
#ifndef TCC_NVRTC_H
#define TCC_NVRTC_H

#include <stddef.h>

/* The name NVRTC gives the source in its messages: "tcc_kernels.cu(LINE): error: ...". */
#define RT_NVRTC_PROGRAM "tcc_kernels.cu"

typedef struct RtCubin {
    void *image; /* the cubin (an ELF image), malloc'ed */
    size_t size;
    char *log;      /* NVRTC's log with ptxas' resource lines ("" from the cache), malloc'ed */
    int from_cache; /* 1 when the image was read from the cache */
} RtCubin;

/* Compile src for arch ("sm_80", "sm_90", ...). With cache_dir (NULL: none;
 * "": the runtime's default cache folder, as for CPU kernels) the cubin is
 * looked up under CACHE/nv-HASH-ARCH.cubin first and stored there after a
 * compile (atomically). 0, or -1 with the first error line of the log in err. */
int rt_nvrtc_compile(const char *src, const char *arch, const char *cache_dir, RtCubin *out,
                     char *err, size_t n);
/* The same with nextra more NVRTC options after the usual ones (e.g.
 * "--maxrregcount=32"); they are part of the cache key. An architecture this
 * NVRTC cannot compile for is refused with the list of those it can. */
int rt_nvrtc_compile_with(const char *src, const char *arch, const char *const *extra, int nextra,
                          const char *cache_dir, RtCubin *out, char *err, size_t n);
void rt_cubin_free(RtCubin *c);
/* NVRTC's version (13.0: 13 and 0). */
void rt_nvrtc_version(int *major, int *minor);

/* What ptxas says one kernel uses. */
typedef struct RtKernelUse {
    char name[128];
    int regs, barriers;
    long stack, spill_stores, spill_loads, smem, cmem; /* bytes */
    int is_function; /* 1: a device function the kernels call (only its stack and
                        spills are known), 0: a kernel */
} RtKernelUse;

/* The kernels of a compile log and the device functions that were not
 * inlined, in log order: a malloc'ed array (*out) and its length, 0 when the
 * log has no resource lines. */
int rt_nvrtc_usage(const char *log, RtKernelUse **out);

/* The lines of the log that are warnings, NVRTC's ("FILE(LINE): warning #N-D:
 * ...") and ptxas' ("ptxas warning : ..."), each with its newline (malloc'ed,
 * "" when none). */
char *rt_nvrtc_warnings(const char *log);

#endif
