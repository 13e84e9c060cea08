/* no_cuda.c: the cuda device of a runtime built without the CUDA toolkit.
 * Reads: nothing. Writes: "built without CUDA" into each call's err.
 * Key idea: the runtime calls the cuda device through cuda.h whether or not
 * the toolkit is there; without it (runtime.mk: HAVE_CUDA 0) this file stands
 * in for cuda.c and nccl.c, so the rest of the runtime has no #ifdef: there
 * are no devices (rt_cuda_count is 0), rt_cuda_open fails, and every other
 * call fails too, never being reached on a device that was not opened. */
#include "runtime/gpu/cuda.h"

static int no_cuda(char *err, size_t n)
{
    return plan_errorf(err, n, "built without CUDA");
}

int rt_cuda_count(char *err, size_t n)
{
    no_cuda(err, n);
    return 0;
}

CudaDevice *rt_cuda_open(const Plan *p, int ordinal, const char *cache_dir, int graphs, char *err,
                         size_t n)
{
    no_cuda(err, n);
    return NULL;
}

void rt_cuda_close(CudaDevice *d)
{
}

int rt_cuda_put(CudaDevice *d, const char *host, uint64_t off, uint64_t bytes, char *err, size_t n)
{
    return no_cuda(err, n);
}

int rt_cuda_get(CudaDevice *d, char *host, uint64_t off, uint64_t bytes, char *err, size_t n)
{
    return no_cuda(err, n);
}

int rt_cuda_sync(CudaDevice *d, char *err, size_t n)
{
    return no_cuda(err, n);
}
int rt_cuda_hang(CudaDevice *d, char *err, size_t n)
{
    return no_cuda(err, n);
}
int rt_cuda_run(CudaDevice *d, int i, char *err, size_t n)
{
    return no_cuda(err, n);
}
int rt_cuda_group(CudaDevice *d, int slot, RtComm *c, char *err, size_t n)
{
    return no_cuda(err, n);
}
int rt_cuda_coll(CudaDevice *d, int i, int slot, int64_t blk, char *err, size_t n)
{
    return no_cuda(err, n);
}

/* There is never a device to call it on (rt_cuda_open fails). */
int rt_cuda_channels(CudaDevice *d, const int8_t *axes, int naxes, RtComm *c, char *err, size_t n)
{
    return no_cuda(err, n);
}
int rt_cuda_walk_begin(CudaDevice *d, int from, int to, int fwd, char *err, size_t n)
{
    return no_cuda(err, n);
}
int rt_cuda_walk_end(CudaDevice *d, int from, int to, int fwd, int ok, char *err, size_t n)
{
    return no_cuda(err, n);
}
