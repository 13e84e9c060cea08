/* exec.h: private to the runtime: the Runtime object that the runtime's files
 * share (exec.c opens and runs it, host_slab.c holds its tensors' accessors,
 * guard.c, mesh.c, profile.c and init.c work on it). Not part of the public
 * API (runtime.h is). */
#ifndef TCC_EXEC_H
#define TCC_EXEC_H

#include "runtime/comm/comm.h"
#include "runtime/cpu.h"
#include "runtime/gpu/cuda.h"
#include "runtime/runtime.h"

#define RT_MAX_GROUPS 256 /* one communicator per subset of at most 8 mesh axes */

typedef struct RtProfile RtProfile; /* profile.c */

struct Runtime {
    const Plan *p;
    Plan *own; /* a loop plan given to rt_open: its expanded copy, which p is (else NULL) */
    CpuDevice dev; /* on the cuda device: only its slab, the host mirror (docs/runtime.md) */
    CudaDevice *gpu;  /* NULL on the CPU */
    int host_stale;   /* gpu: the mirror misses the device's last step (but its outputs) */
    int dev_stale;    /* gpu: the host may have written the mirror since the last upload */
    char sticky[512]; /* gpu: a failed download behind rt_tensor_data, for the next call */
    char **argv;   /* the argument pointers of every instruction, back to back */
    char ***args;  /* by instruction: its first pointer in argv */
    RtKernelFn *gfns; /* a group's NAME_ws functions and their arguments (walk) */
    char *const **gargs;
    float **steps; /* the step tensors, NULL-terminated: written before each step */
    /* the mesh: this device's coordinates and its groups */
    RtWorld *world;                /* NULL on one device */
    int coord[PLAN_MAX_AXES];      /* by plan axis: this device's index along it */
    RtComm *group[RT_MAX_GROUPS];  /* the groups along ordered lists of axes (mesh.c) */
    int group_key[RT_MAX_GROUPS];
    char *scratch;                 /* for all_to_all packing (allocated at attach) */
    size_t scratch_bytes;
    /* pipeline stages: this device runs only the instructions of its stage */
    int nstages;                   /* plan_stages: 1 without a pipeline axis */
    int stage;                     /* this device's block index over the pipeline axes; -1
                                      until rt_attach with more than one stage */
    int npipe;                     /* the pipeline-role axes, in plan order */
    int8_t pipe[PLAN_MAX_AXES];
    RtAccount mem; /* the buffers it holds outside the slab (rt_memory) */
    /* the step in two parts (rt_step_begin, rt_step_end; runtime/guard.c) */
    int64_t step_now; /* the step being run */
    int *split;       /* by stage: its first instruction that writes a parameter or optimizer
                         state (p->ninstrs when none, or when the update cannot be held back) */
    int held;         /* every split comes after the loss and the gradient norm, and no message
                         crosses one: rt_step_begin stops before the update */
    int ngrads;       /* the parameters whose gradient the plan names (PARAM.grad) */
    int *grad_param, *grad_tensor, *grad_at; /* by grad_at: where the optimizer first reads it */
    int64_t poison_step, poison_last; /* TCC_TEST_NAN_GRAD: a NaN into tensor poison_tensor */
    int poison_at, poison_tensor;     /* before instruction poison_at of those steps (-1: none) */
    int64_t stall_step; /* TCC_TEST_STALL: world rank stall_rank (-1: none) stops at this step */
    int stall_rank;
    int64_t hang_step; /* TCC_TEST_GPU_HANG: the cuda device hangs before instruction hang_at */
    int hang_at;       /* of step hang_step (-1: never) */
    RtProfile *prof; /* TCC_PROFILE: instruction times (profile.c); NULL when not asked */
};

/* ---- host_slab.c: the tensors on the host, the host mirror ---- */
/* Whether this device's slab holds tensor t: always on one stage; on a
 * pipeline, the tensors of its own stage and those of every stage. */
int rt_holds(const Runtime *rt, int t);

/* The first byte of tensor t in the host slab (the mirror on the cuda device),
 * with no transfer: for the tensors the executor moves itself each step. */
char *rt_host(Runtime *rt, int t);
/* The cuda device only, before a step: the whole mirror to the device when the
 * host may have written it since (dev_stale), else the per-step tensors
 * (inputs, step, hyperparameters, coordinates). 0, or -1 with a message. */
int rt_mirror_upload(Runtime *rt, char *err, size_t n);
/* The cuda device only, after a step: the outputs (loss, lr, grad_norm) to the
 * host, the rest of the mirror marked stale. 0, or -1 with a message. */
int rt_mirror_download(Runtime *rt, char *err, size_t n);

/* ---- mesh.c ---- */
/* The group slot of the group along axes (mesh.c), or -1 when there is none. */
int rt_group_slot(Runtime *rt, const int8_t *axes, int naxes);

/* This device's block index over axes (major to minor). */
int64_t rt_block_index(const Runtime *rt, const int8_t *axes, int naxes);
/* Element offset of this device's block along each dim of tensor t. */
void rt_block_origin(const Runtime *rt, const PlanTensor *t, int64_t *origin);
/* Copy this device's block of a tensor out of its global value (global has
 * the global shape; out the local shape), or back into it when put is set. */
void rt_block_copy(const Runtime *rt, const PlanTensor *t, void *global, void *local, int put);
/* The global shape of tensor t (its local shape times the split counts). */
void rt_global_shape(const Plan *p, const PlanTensor *t, int64_t *shape);
/* Free the groups and scratch (not the world: the caller's). */
void rt_mesh_close(Runtime *rt);
/* Instruction i, a PI_COLL: 0, or -1 with a message. */
int rt_mesh_coll(Runtime *rt, int i, char *err, size_t n);
/* With more than one stage: loss, lr and grad_norm (those of a stage >= 0)
 * broadcast over the pipeline group from the devices of their stage, so that
 * every device holds them. 0, or -1 with a message. */
int rt_mesh_outputs(Runtime *rt, char *err, size_t n);
/* The elementwise maximum of v[0..count) over every device of the mesh
 * (collective when attached; nothing on one device). 0, or -1 with a message. */
int rt_mesh_agree(Runtime *rt, int32_t *v, size_t count, char *err, size_t n);

/* ---- guard.c ---- */
/* The split of the step and the gradient table, from the plan and the
 * TCC_TEST_NAN_GRAD hook (rt_open_device); their memory (rt_close). */
int rt_guard_open(Runtime *rt, char *err, size_t n);
void rt_guard_close(Runtime *rt);
/* The test hook: whether it is due before instruction i of this step; a NaN
 * into element 0 of the gradient poison_tensor. 0 or -1. */
int rt_guard_due(const Runtime *rt, int i);
int rt_guard_poison(Runtime *rt, char *err, size_t n);
/* The other test hook (TCC_TEST_STALL), at the start of a step: when it is due
 * on this rank, wait until the world is broken (under mpirun: until the job
 * ends), then -1 with a message; else 0. */
int rt_guard_stall(Runtime *rt, char *err, size_t n);
/* TCC_TEST_GPU_HANG=STEP:INSTR (tests only): on the cuda device, a kernel
 * that never ends before instruction INSTR of step STEP, for the watchdog to
 * find; refused on the CPU device (cuda: 0) and for an INSTR out of range. */
int rt_guard_gpu_hang(Runtime *rt, int cuda, char *err, size_t n);
/* rt_step_blame's place in its walk (exec.c): the first parameter found with a
 * non-finite gradient (-1: none yet) and the next entry of the gradient table. */
typedef struct RtBlame {
    int first, g;
} RtBlame;
/* Before instruction i of the walk: the test hook when due, then each gradient
 * the optimizer first reads at or before i. 0, or -1 with a message. */
int rt_guard_blame_at(Runtime *rt, RtBlame *b, int i, char *err, size_t n);
/* After the walk: the gradients read only after the split, then the first
 * parameter agreed over the mesh into *param (-1: none). 0, or -1 with a message. */
int rt_guard_blame_end(Runtime *rt, RtBlame *b, int *param, char *err, size_t n);

/* ---- profile.c ----
 * TCC_PROFILE's instruction times (on the cuda device each instruction is
 * waited for: exec.c). _add counts seconds of instruction i in the current
 * step (the first step of the run is left out); _close writes the file (world
 * rank 0) and frees. */
int rt_profile_open(Runtime *rt, RtDeviceKind kind, char *err, size_t n);
void rt_profile_add(Runtime *rt, int i, double seconds);
void rt_profile_close(Runtime *rt);
double rt_profile_now(void);

#endif
