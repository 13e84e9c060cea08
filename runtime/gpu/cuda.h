/* cuda.h: private to the runtime: the cuda device that the executor drives
 * instead of the CPU one (--device cuda). It owns one cudaMalloc per device
 * (the slab, the cuBLASLt workspace and the scratch of copies and
 * collectives), the plan's kernels compiled by NVRTC and loaded with the CUDA
 * runtime's library calls, a compute and a communication stream, one NCCL
 * communicator per group of the mesh, and for the pipeline's sends and recvs a
 * communicator and stream per ordered pair of stages. The host keeps a mirror
 * of the slab (the CPU device's): exec.c moves bytes between the two
 * (docs/runtime.md).
 * Built without the CUDA toolkit, every call fails with "built without CUDA"
 * (no_cuda.c).
 * Every call returns 0, or -1 with "CALL: the library's text" in err. */
#ifndef TCC_CUDA_H
#define TCC_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "runtime/comm/comm.h"
#include "plan/plan.h"

typedef struct CudaDevice CudaDevice;

/* The CUDA devices this process sees (>= 1), or 0 with why there are none in
 * err: "cudaGetDeviceCount: no CUDA-capable device is detected", the driver's
 * absence, or "built without CUDA". */
int rt_cuda_count(char *err, size_t n);

/* Device ordinal for plan p (which passed plan_check): the slab, the kernels of
 * p->gpu_source compiled for the device's sm_XY (cache_dir as rt_nvrtc_compile's),
 * the GEMM descriptors and algorithms, the streams and events; graphs: walks
 * are captured into CUDA graphs (rt_cuda_walk_begin). NULL with a message
 * (the plan has kernels but no CUDA rendering: says so). */
CudaDevice *rt_cuda_open(const Plan *p, int ordinal, const char *cache_dir, int graphs, char *err,
                         size_t n);
void rt_cuda_close(CudaDevice *d); /* d may be NULL */

/* bytes at slab offset off from the host mirror to the device (put) or back;
 * queued on the compute stream after the work before it. */
int rt_cuda_put(CudaDevice *d, const char *host, uint64_t off, uint64_t bytes, char *err, size_t n);
int rt_cuda_get(CudaDevice *d, char *host, uint64_t off, uint64_t bytes, char *err, size_t n);
/* Wait for every stream: afterwards the host mirror holds what was gotten.
 * The watchdog: a wait that lasts rt_comm_timeout's seconds fails, naming the
 * first collective queued since the last wait that has not completed and the
 * members of its group that have not come to it (asked over its host
 * communicator, which may take a timeout more), or else the compute
 * instructions it is stuck in; the NCCL communicators are aborted, and every
 * later call fails at once. */
int rt_cuda_sync(CudaDevice *d, char *err, size_t n);
/* TCC_TEST_GPU_HANG (tests only): a kernel that never ends, on the compute
 * stream until the watchdog fires. */
int rt_cuda_hang(CudaDevice *d, char *err, size_t n);

/* Queue instruction i (a kernel, GEMM or copy) on the compute stream, after
 * the collectives whose tensors it touches. */
int rt_cuda_run(CudaDevice *d, int i, char *err, size_t n);

/* CUDA graphs (TCC_CUDA_GRAPHS: rt_cuda_graphs_setting, runtime.h). Before a walk of the instructions [from, to) (fwd: only the forward ones)
 * that the executor would queue one by one: 1 when the walk's graph was
 * launched (the walk is done: queue nothing); 0 when the executor queues the
 * walk itself, into a capture when this is the walk's first time (with graphs
 * on, no capture of it failed before, and room for it), and then calls
 * rt_cuda_walk_end; -1 on a failure. A graph starts after the collectives in
 * flight before it, and its own have all ended when it ends. While a capture
 * is open nothing runs and the watchdog sets no marks; a replay's watchdog
 * names the graph's instructions as a whole. */
int rt_cuda_walk_begin(CudaDevice *d, int from, int to, int fwd, char *err, size_t n);
/* After the walk rt_cuda_walk_begin left to the executor (ok: it queued every
 * instruction): a capture is closed, instantiated and launched (0). 1: the
 * capture failed (a message in err when the graph API failed; none when the
 * walk did, !ok): the executor queues the walk again, without a graph, which
 * it keeps for that walk from then on. 0 as well when nothing was captured. */
int rt_cuda_walk_end(CudaDevice *d, int from, int to, int fwd, int ok, char *err, size_t n);

/* The NCCL communicator of group slot for the members of c (collective over
 * c: its member 0 makes the unique id and broadcasts it over c). */
int rt_cuda_group(CudaDevice *d, int slot, RtComm *c, char *err, size_t n);
/* The pipeline channels of the plan's sends and recvs over the group along
 * axes, whose host communicator is c (gpumap.h): for each ordered pair of
 * stages this device is part of, in the plan's order of pairs, a 2-rank NCCL
 * communicator (the sender makes the unique id and sends it to the receiver
 * over c) and a stream. Collective over the pairs: each member of the group
 * calls it once for the same axes. Nothing where the group has no sends. */
int rt_cuda_channels(CudaDevice *d, const int8_t *axes, int naxes, RtComm *c, char *err, size_t n);
/* Queue collective i (a PI_COLL) on the communication stream with the
 * communicator of group slot (-1 for a slice); a send or recv on the stream
 * and communicator of its channel instead. blk: this device's block index in
 * the group (the slice it keeps). */
int rt_cuda_coll(CudaDevice *d, int i, int slot, int64_t blk, char *err, size_t n);

#endif
