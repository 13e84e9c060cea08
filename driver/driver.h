/* driver.h: the compile API under the command line (driver/compile.c,
 * driver/settings.c). Options is what the command line asks; the functions
 * compile a model through lowering, the verifier and the pass table, and
 * write what was asked. The planner (planner/) and the reports and --verify
 * (explain/) compile through them. */
#ifndef TCC_DRIVER_H
#define TCC_DRIVER_H

#include "codegen/codegen.h"
#include "frontend/frontend.h"
#include "model/model.h"
#include "passes/passes.h"
#include "runtime/cpu.h"
#include "runtime/runtime.h"

#define MAX_SETS 32 /* --set settings */
#define MAX_WHY 8 /* --why NAME options */

typedef struct Options {
    const char *input;
    const char *from_ir;
    const char *out;
    const char *emit;       /* "ir", "plan", "c", "cuda", ... or NULL */
    const char *dump_after; /* a pass name, "all" or NULL */
    const char *stop_after; /* a pass name or NULL */
    int print_commands;
    int verbose;            /* -v: each stage's time and size on stderr */
    int portable; /* --portable: the executable runs on any x86-64 (no -march=native) */
    const char *mesh;       /* --mesh SPEC; NULL: the model's own */
    int repeat_limit;       /* the planner's profile: each repeat lowered at most this often (0: all) */
    /* train settings chosen over the model's own, after --set (the flags, the
     * planner's choices): unset when 0, NULL or -1 as noted */
    int64_t microbatches;   /* 0 */
    const char *recompute;  /* NULL */
    int zero;               /* --zero=N; -1 */
    int sequence_parallel;  /* --sequence-parallel: 1; 0 false; -1 */
    const char *roles[8];   /* --role AXIS=ROLE */
    int nroles;
    const char *place;      /* --place AXIS,AXIS,...: the mesh's placement, innermost first; NULL:
                               by traffic (codegen/placement.c) */
    const char *schedule;   /* --schedule=NAME: the train setting schedule; NULL */
    int virtual_stages;     /* 0 */
    int verify;             /* --verify[=STEPS]: steps to compare, 0 when absent */
    int verify_native;      /* --verify=native[,STEPS]: the model's own precision, not f64 */
    double verify_tol;      /* --verify-tol=X, 0: 1e-9, or per value in native mode */
    const char *gpu;        /* --gpu NAME: a row of model/devices.c, or "cpu" */
    double device_memory;   /* --device-memory SIZE in bytes, 0 when absent */
    double memory_headroom; /* --memory-headroom SIZE in bytes (has_headroom) */
    int has_headroom;       /* else MEM_HEADROOM of a GPU's memory, none of --device-memory's */
    const char *sets[MAX_SETS]; /* --set KEY=VALUE: train settings */
    int nsets;
    int gpus;               /* --gpus N: the planner's device count, 0 when absent */
    int plan_auto;          /* --plan=auto */
    int explain;            /* --explain */
    const char *cluster;    /* --cluster NAME|FILE */
    ClusterSpec cluster_spec; /* what --cluster or --gpu names (valid when has_cluster) */
    int has_cluster;
    CpuSpec cpu;            /* this machine: a CPU file's keys (--cluster FILE), the rest measured */
    int calibrate_cpu;      /* --calibrate-cpu */
    const char *why[MAX_WHY]; /* --why NAME: the values whose sharding to explain */
    int nwhy;
    /* the compile's choices that the passes read (Settings; --verify keeps
     * the gradients): recompute = auto's modes by layer (the planner's), the
     * unrolled microbatch step */
    const signed char *recompute_layers;
    int nrecompute_layers;
    int unroll;
} Options;


/* The model of o (TDL, or IR with --from-ir) lowered or parsed; NULL after
 * reporting. */
Graph *drv_load(Ctx *c, const Options *o);
/* The command line's train settings (--set, --zero, ...) and roles into g. */
int drv_apply_settings(Ctx *c, const Options *o, Graph *g);
/* KEY = VALUE into g's train block, replacing one of the same key. */
void drv_set_train(Graph *g, Attr *a);
/* The IR verifier after stage after_pass; an invalid IR is printed (an
 * internal error) unless it was read from a file. */
int drv_verify(Ctx *c, const Options *o, Graph *g, const char *after_pass);
/* What a caller does after each pass (--why's chains after shard): nonzero
 * stops the passes (after reporting). */
typedef struct PassHook {
    int (*after)(Ctx *c, Graph *g, const Settings *s, const char *pass, void *user);
    void *user;
} PassHook;
/* The settings the passes read: g's train block parsed (pass_settings)
 * and the choices of o; -1 after reporting a bad train block. */
int drv_settings(Ctx *c, const Options *o, const Graph *g, Settings *s);
/* The graph passes in order, each verified, up to --stop-after; hook (or
 * NULL) after each; the settings they read into *out (out NULL: none). */
int drv_run_passes(Ctx *c, const Options *o, Graph *g, const PassHook *hook, Settings *out);
/* One compile: the graph after the passes, its settings, and (when asked)
 * its plan, kernels and the per-device graph the plan was built from. */
typedef struct Compiled {
    Graph *g;
    Settings s;
    Plan plan;
    Kernel **kernels;
    const Graph *local;
} Compiled;
/* The compile API: the model of o loaded, its settings applied and checked,
 * every pass run (--dump-after, --stop-after as o says), and with plan its
 * plan built. 0, or -1 after reporting. */
int drv_compile(Ctx *c, const Options *o, int plan, Compiled *out);
/* The model through every pass again, on mesh (a --mesh spec), quietly. */
Graph *drv_passed(Ctx *c, const Options *o, const char *mesh);
/* A stage of the pipeline or "all"? */
int drv_known_pass(const char *name);
double drv_now_ms(void);
int drv_on_gpu(const Options *o); /* --gpu names a GPU */
/* The device's memory in bytes: --device-memory, else --gpu's, else 0. */
double drv_device_memory(const Options *o);
int drv_write_ir(const Options *o, const Graph *g);
/* The plan of g written as o asks: a program, plan.json, kernels, memory. */
int drv_write_plan(Ctx *c, const Options *o, const Graph *g);

/* The CPU figures a CPU file did not give (o->cpu), measured now. */
int drv_measure_cpu(Ctx *c, Options *o);
/* The device the cost model prices plan p on: --cluster's or --gpu's, else
 * this machine's CPU (measured where the CPU file is short). */
int drv_cost_device(Ctx *c, Options *o, const Plan *p, CostDevice *d);
/* A warning when a GPU cluster is given (--gpu, --cluster) and plan p's
 * tensor or sequence axis crosses its servers (cost_placement_text). */
void drv_warn_placement(Ctx *c, const Options *o, const Plan *p);
/* The stages of the pipeline with their one-line summaries (--help). */
void drv_print_stages(FILE *f);

#endif
