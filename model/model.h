/* model.h: the models of a compiled step: the device tables and this
 * machine's CPU (devices.c, cpu_cost.c), the memory model and its reports
 * (memory_model.c, memory_report.c), the cost model (cost_model.c) and the
 * planner's per-layer profile (cost_profile.c). Each reads a Plan that
 * codegen built and the graphs it came from; none changes them. */
#ifndef TCC_MODEL_H
#define TCC_MODEL_H

#include "plan/plan.h"
#include "passes/passes.h"

/* ---- devices (model/devices.c) ---- */
/* An accelerator: its memory and its datasheet peaks. */
typedef struct DeviceSpec {
    const char *name;     /* --gpu NAME: "h100-sxm" */
    const char *what;     /* "NVIDIA H100 SXM5 80GB" */
    double memory;        /* bytes on the board */
    double bf16_tflops;   /* dense bf16 tensor-core peak, TFLOP/s */
    double f32_tflops;    /* fp32 (non-tensor) peak, TFLOP/s */
    double hbm_gbs;       /* memory bandwidth, GB/s */
} DeviceSpec;
/* The row called name, or NULL. */
const DeviceSpec *dev_lookup(const char *name);
/* Every row, ended by one whose name is NULL. */
const DeviceSpec *dev_table(void);

/* Fractions of a device's datasheet peaks that kinds of work reach, fitted
 * once to published runs (docs/cost.md), and the fixed cost of a launch. */
typedef struct CostConsts {
    double gemm_eff;  /* large GEMMs: fraction of the dense peak */
    double gemm_dim;  /* a GEMM dimension d keeps d / (d + gemm_dim) of that */
    double attn_eff;  /* attention kernels: fraction of the dense peak */
    double mem_eff;   /* memory-bound kernels: fraction of the memory bandwidth */
    double link_eff;  /* collectives: fraction of a link's bandwidth */
    double launch_s;  /* seconds per kernel or GEMM */
} CostConsts;

/* A cluster of such devices: nodes of gpus_per_node GPUs joined by NVLink
 * inside a node and by a network card per GPU between nodes. Bandwidths are
 * per GPU, one direction, in GB/s; latencies per message step, in us. Mesh
 * axes map to ranks with the last axis innermost (ranks node by node). */
typedef struct ClusterSpec {
    const char *name;     /* --cluster NAME: "dgx-a100" */
    const char *what;
    const DeviceSpec *gpu;
    int gpus_per_node;
    double nvlink_gbs, network_gbs;
    double nvlink_us, network_us;
    CostConsts k;         /* what its GPUs and links reach of their peaks */
} ClusterSpec;
/* The named cluster, or NULL. */
const ClusterSpec *dev_cluster_lookup(const char *name);
/* The cluster a GPU comes in when none is named: its vendor's 8-GPU server. */
const ClusterSpec *dev_cluster_default(const DeviceSpec *gpu);
/* A cluster from a file of KEY = VALUE lines ('#' comments): gpu first, then
 * any of gpus_per_node, nvlink_gbs, network_gbs, nvlink_latency_us,
 * network_latency_us, gemm_efficiency, gemm_dim, attention_efficiency,
 * memory_efficiency, link_efficiency, launch_us over the default cluster of
 * that gpu (docs/cost.md). 0, or -1 with "FILE:LINE: why" in err. */
int dev_cluster_read(Arena *a, const char *path, ClusterSpec *out, char *err, size_t n);

/* ---- this machine's CPU as a device (model/cpu_cost.c, docs/cost.md "The CPU") ----
 * What the CPU runtime's step costs: measured on the machine (tcc.c asks the
 * runtime: rt_cpu_measure) or read from a file that --calibrate-cpu wrote. */
typedef enum {
    CPU_CORES, CPU_GEMM1, CPU_CONVERT, CPU_OP, CPU_CHAIN, CPU_DIV, CPU_CALL, CPU_TANH,
    CPU_STREAM, CPU_SPEEDUP, CPU_FORK, CPU_MEMORY, CPU_VOP, CPU_LOOP_SPEEDUP, CPU_STREAM_PAR,
    CPU_CHAIN64, CPU_NKEYS
} CpuKey;
typedef struct CpuSpec {
    double v[CPU_NKEYS]; /* by CpuKey, in the file's units (docs/cost.md) */
    unsigned given;      /* the keys set, a bit each (1u << key) */
    const char *what;    /* "AMD EPYC, OpenBLAS Cooperlake" */
} CpuSpec;
/* The key of CpuKey k in a file ("gemm1_gflops"). */
const char *cpu_spec_key(CpuKey k);
/* A CPU file: "gpu = cpu" first, then KEY = VALUE lines ('#' comments) of the
 * keys of cpu_spec_key and `what` (free text). 0; 1 when the first setting is
 * not gpu = cpu (a cluster file: dev_cluster_read says more); -1 with
 * "FILE:LINE: why" in err. Keys not given stay unset (given). */
int cpu_spec_read(Arena *a, const char *path, CpuSpec *out, char *err, size_t n);
/* The file that cpu_spec_read reads back to s (every key given). */
void cpu_spec_write(FILE *f, const CpuSpec *s);

/* ---- the memory model (model/memory_model.c, docs/memory.md) ---- */
typedef enum {
    MC_PARAMS,      /* parameters, and their low-precision or gathered copies */
    MC_GRADS,       /* parameter gradients: accumulators and their reductions */
    MC_OPTIMIZER,   /* optimizer state */
    MC_ACTIVATIONS, /* forward (and recomputed) values, held for the backward */
    MC_TEMPORARIES, /* the rest of the step's values, data inputs */
    MC_COMM,        /* the runtime's staging for collectives */
    MC_WORKSPACE,   /* GEMM workspace */
    MC_RESERVED,    /* allowances: CUDA context, NCCL's buffers */
    MC_COUNT
} MemCat;
const char *mem_cat_name(MemCat c); /* "params", the JSON key */

typedef struct MemItem {
    const char *name; /* the TDL name, or what computes it */
    Loc loc;
    MemCat cat;
    double bytes;     /* one copy */
    int count;        /* copies alive (microbatches in flight) */
} MemItem;

typedef struct StageMemory {
    double cat[MC_COUNT]; /* at the stage's largest moment */
    double peak;          /* their sum */
    int inflight;         /* microbatches in flight at that moment */
    char moment[96];      /* "backward of microbatch 3", "optimizer" */
    double saved;         /* what one microbatch's forward holds for its backward */
    double saved_layers;  /* the part of it made in layers (repeat iterations) */
    MemItem top[5];       /* the largest tensors alive then */
    int ntop;
} StageMemory;

typedef struct MemoryModel {
    int nstages;
    StageMemory *stage;
    int peak_stage;       /* the stage with the device's largest moment */
    double peak;
    int microbatches;
    const char *schedule; /* its name */
    int gpu;              /* 1: a CUDA device's workspace and allowances are counted */
} MemoryModel;

/* Bytes the runtime reserves beside the slab on a CUDA device (docs/memory.md). */
#define MEM_CUDA_CONTEXT (768.0 * 1048576.0) /* context, cuBLASLt handle, loaded kernels */
#define MEM_NCCL (512.0 * 1048576.0)         /* NCCL's channel buffers */
/* The margin a plan leaves under a GPU's memory by default (--memory-headroom):
 * for what the model does not count (the allocator's rounding, libraries'
 * allocations beyond the workspace and channel buffers above, the model's own
 * error). Not measured yet on a device: docs/memory.md. */
#define MEM_HEADROOM (2.0 * 1073741824.0)

/* The memory of every stage of one step with the train block's microbatches
 * and schedule, from the plan p of ONE microbatch's step (the microbatch
 * pass's model mode; or the whole step when microbatches = 1) and the
 * per-device graph it was built from (local). gpu: count the CUDA device's
 * workspace, scratch and allowances, else the CPU runtime's buffers. 0, or -1
 * after reporting. */
int mem_model(Ctx *c, const Graph *g, const TrainConfig *tc, const Graph *local, const Plan *p, int gpu,
                      MemoryModel *out);

/* The largest moment of stage s in plan p as compiled (every microbatch in
 * it): persistent tensors, the temporaries alive together, the runtime's
 * buffers as mem_model counts them; cat (MC_COUNT of them, or NULL):
 * that moment by category. */
double mem_plan_peak(Arena *a, const Plan *p, const Graph *local, int s, int gpu,
                             double *cat);


/* By value id of the per-device graph l: 1 for a parameter's gradient (what the
 * optimizer reads, and the reductions and sums of microbatch parts into it). */
char *mem_gradient_values(Arena *a, const Graph *l);
/* 1 for a parameter, or a copy, cast or gather of one made for the step. */
int mem_weight_value(const Value *v);

/* The per-stage table of --emit=memory; budget 0: none (what a plan may use:
 * the device's memory less headroom). */
void mem_print(FILE *f, const MemoryModel *mm, double budget, double headroom);
/* The same as JSON (malloc'ed; free it): per stage the MC_* keys, peak, the
 * moment, the largest tensors; the device's peak, the budget and headroom. */
char *mem_json(const MemoryModel *mm, const char *model, const char *device, double budget,
               double headroom);

/* Stage s's program (its instructions of plan p, in order) cut into the
 * pieces of schedule sc, as the memory model cuts it: piece[i] of position i
 * is -1 before the first piece (weight casts, gathers), npieces for the
 * optimizer after the last; map[kind * v + chunk] is the program's piece of
 * the schedule's piece (kind, chunk), -1 when the stage has none. */
typedef struct StagePieces {
    int n;
    const int *instr, *piece;
    int npieces;
    const int *map;
} StagePieces;
void mem_stage_pieces(Arena *a, const Plan *p, const Schedule *sc, int s, StagePieces *out);

/* ---- the cost model (model/cost_model.c, docs/cost.md) ---- */

/* What the cost model needs of a device and its links (per device, one
 * direction): FLOP/s, bytes/s, seconds. */
typedef struct CostDevice {
    const char *name, *what;
    double peak16, peak32;    /* dense 16-bit and f32 FLOP/s */
    double mem_bw;            /* memory bandwidth */
    double intra_bw, inter_bw; /* inside a node, between nodes */
    double intra_lat, inter_lat;
    int per_node;             /* devices per node */
    int cpu;                  /* 1: collectives block the compute (the CPU runtime) */
    CostConsts k;
    const CpuSpec *host;      /* cpu: this machine */
    int threads;              /* cpu: OpenMP and OpenBLAS threads of a device */
    double share;             /* cpu: of a core, what each thread gets (devices share them) */
} CostDevice;
void cost_device_of_cluster(const ClusterSpec *c, CostDevice *d);
/* A device of a mesh of `devices` ranks of the threads backend on this machine
 * (every key of s given): cores / devices threads each (at least 1). */
void cost_device_of_cpu(const CpuSpec *s, int64_t devices, CostDevice *d);
/* cost_compute_time and cost_coll_time of a cpu device (model/cpu_cost.c). */
double cost_cpu_compute_time(const Plan *p, const CostDevice *d, const PlanInstr *in);
double cost_cpu_coll_time(const Plan *p, const CostDevice *d, const PlanInstr *in);
/* A link of d: bandwidth (bytes/s, the reachable fraction) and latency (s) of
 * a group whose members' ranks span `span` (inside a node when span < per_node). */
typedef struct CostLink {
    double bw, lat;
} CostLink;
CostLink cost_link(const CostDevice *d, int64_t span);
/* The plan's placement in words, innermost axis first, each with where its
 * groups lie on d ("tp=8 (in a server), pp=2 (across servers)"), into buf;
 * returns the first axis of role tensor or sequence, of more than one
 * device, whose groups cross servers (-1: none), the one a warning names. */
int cost_placement_text(const Plan *p, const CostDevice *d, char *buf, size_t n);
/* Seconds of an all-reduce of S bytes over n members (the faster of ring and
 * tree), and of an all-gather (S: the output), reduce-scatter or all-to-all
 * (S: the input) by ring. */
double cost_all_reduce(double S, int n, CostLink l);
double cost_gather(double S, int n, CostLink l);
/* Seconds of one collective (or send/receive) of plan p on d, by the ring and
 * tree formulas over the links its group crosses (docs/cost.md). */
double cost_coll_time(const Plan *p, const CostDevice *d, const PlanInstr *in);
/* Seconds of one kernel, GEMM or copy: max(FLOPs at the reachable rate,
 * bytes at the reachable bandwidth) + a launch. */
double cost_compute_time(const Plan *p, const CostDevice *d, const PlanInstr *in);

typedef struct StageCost {
    double total;        /* the stage's step: start to its optimizer's end */
    double compute;      /* kernels and GEMMs */
    double comm_exposed; /* time the compute waits for collectives */
    double bubble;       /* the rest: waiting for other stages */
    double optimizer;    /* the optimizer's piece, in total */
} StageCost;

typedef struct CostInstr {
    int index, runs;
    const char *label;
    double time_s;
} CostInstr;

typedef struct CostModel {
    double step_s, tokens, tokens_per_s, devices;
    double model_flops;  /* per step: 3 x the forward's matmul and attention FLOPs */
    double hw_flops;     /* model_flops + the recomputed forward */
    double peak_flops;   /* per device: the dense 16-bit peak */
    double mfu, hfu, tflops_per_gpu;
    double p2p_s;        /* the largest message between pipeline stages */
    int nstages, microbatches, binding_stage;
    const char *schedule;
    StageCost *stage;
    Schedule sched;      /* and its pieces' times, in seconds (for --emit=trace) */
    SchedTimes times;
    /* stage 0's instructions in program order: the plan's index, the label
     * the runtime's profile gives it (plan_instr_label), the predicted time of
     * one run and the runs in a step (the microbatches for a microbatch's own) */
    int ninstrs;
    CostInstr *instrs;
} CostModel;

/* The step's time on device d from the plan p of ONE microbatch's step (the
 * microbatch pass's model mode), the graph g it came from (global shapes:
 * FLOPs, tokens) and the per-device graph local (which values are gradients).
 * 0, or -1 after reporting. */
int cost_model(Ctx *c, const Graph *g, const TrainConfig *tc, const Graph *local, const Plan *p, const CostDevice *d,
                    CostModel *out);
void cost_print(FILE *f, const CostModel *cm);
/* JSON (malloc'ed): step_time_s, tokens_per_s, mfu, tflops_per_gpu, stages, ... */
char *cost_json(const CostModel *cm, const char *model, const char *device);

/* ---- the cost profile (model/cost_profile.c, docs/cost.md) ---- */
/* A part's time and how it scales with rows per microbatch: its GEMMs' share
 * (their token dimension grows, and with it their efficiency) and its launches
 * (once per microbatch, whatever its rows). */
typedef struct CostTime {
    double t, gemm;
    int launches;
} CostTime;

/* One tensor-parallel size's step measured on a one-layer compile (every
 * repeat lowered once) with one row (sequence) per microbatch, full
 * recomputation and no pipeline: per microbatch, seconds and bytes per device. */
typedef struct CostProfile {
    int tp, ok;
    char why[160];               /* ok 0: why it does not compile */
    /* seconds per microbatch of one row: a layer's forward, recompute (full,
     * selective), backward; outside the layers, the embedding's (first stage)
     * and the head's (last stage) forward and backward */
    CostTime t_f, t_r, t_rsel, t_b, embed_f, embed_b, head_f, head_b;
    double row_tokens;           /* tokens of a row (the GEMMs' token dimension) */
    double act_none, act_sel, act_full; /* a layer's held activations by recompute level */
    double act_embed, act_head;  /* held outside the layers */
    double transient;            /* a layer's temporaries alive together in a piece, at most */
    double w_held;               /* what a layer's weight gradients (ZB-H1's W piece) read that
                                    the rest of its backward made or kept: held until W runs */
    double transient_embed, transient_head; /* the embedding's, the head's and loss's */
    double msg;                  /* the activation one stage sends the next */
    double params_layer, params_out, state_layer, state_out; /* master and state bytes */
    double params, grads, optimizer; /* bytes held per master byte (casts), per state byte */
    double params1;              /* parameters' under ZeRO 1 over two data ranks */
    /* the parameters' shapes on a device (ZeRO splits one along the first
     * dimension the data ranks divide, else keeps it whole): the layer's first */
    int nshapes, nshapes_layer;
    struct { double bytes; int rank; int64_t dim[4]; } shape[64];
    double base;                 /* workspace and reserved memory */
    double scratch_layer, scratch_opt, scratch_out; /* staging for copies and collectives:
                                    a layer's (per row), the optimizer's, the rest's */
    double rows, tokens;         /* rows (microbatches) of the whole batch, tokens of it */
    double flops_layer, flops_out, rc_flops_layer; /* model FLOPs per row; recompute per row */
    double uflops_embed, uflops_layer, uflops_head; /* forward FLOPs as the pipeline pass
                                                       weighs its units (ir_op_flops) */
} CostProfile;

int cost_profile(Ctx *c, const Graph *g, const TrainConfig *tc, const Graph *local, const Plan *p, const MemoryModel *mm,
                      const CostDevice *d, CostProfile *out);

#endif
