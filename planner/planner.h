/* planner.h: the plan search (--plan=auto, search.c) and the fit of a plan
 * to the device's memory with recompute = auto's choice (fit.c), over the
 * compile API. */
#ifndef TCC_PLANNER_H
#define TCC_PLANNER_H

#include "driver/driver.h"

#define GIB (1024.0 * 1024.0 * 1024.0)

/* The step of one microbatch (the microbatch pass's model mode) compiled in c
 * as the options say: the graph after the passes, its settings, its plan and
 * the per-device graph it was built from. */
typedef Compiled OneStep;

/* The step of one microbatch compiled as o says. */
int pl_compile_one(Ctx *c, const Options *o, OneStep *one);
/* The memory model of that step, and the step (*one). */
int pl_model_in(Ctx *c, const Options *o, MemoryModel *mm, OneStep *one);
/* recompute = auto: the layers to recompute so the step fits budget, into o. */
int pl_choose_recompute(Ctx *c, Options *o, double budget);
/* The refusal of a step over the budget, with the levers that would fit it. */
void pl_refuse(Ctx *c, const Options *o, const TrainConfig *tc, const Graph *g, const MemoryModel *mm,
               double budget);
/* The recompute = auto choice, as a comment line. */
void pl_print_auto(FILE *f, const Options *o);

/* The margin left under the device's memory (drv_device_memory): --memory-headroom, else MEM_HEADROOM of a GPU's
 * memory and none of --device-memory's (a budget given as it is). */
double pl_headroom_of(const Options *o);
/* What a plan may use: the device's memory less the headroom; 0: no budget. */
double pl_budget_of(const Options *o);
/* recompute = auto chosen, and the step's peak checked against the budget. */
int pl_fit_budget(Ctx *c, Options *o, const TrainConfig *tc, const Graph *g);
/* --plan=auto: the search, its report, and o set to the choice. */
int pl_plan_auto(Ctx *c, Options *o);

/* ---- the analytic ranking (rank.c, docs/cost.md) ---- */
/* What the planner may choose over, and what it knows. */
typedef struct PlanSpace {
    int gpus, layers;
    int64_t batch;           /* rows of the global batch */
    int axes;                /* which mesh roles the model has: 1 data, 2 tensor, 4 pipeline */
    const CostDevice *d;
    double budget;           /* bytes per device */
    const CostProfile *prof; /* by tensor-parallel size */
    int nprof;
    int bf16;                /* the step keeps 16-bit activations (messages) */
} PlanSpace;

enum { PLAN_FITS, PLAN_OVER, PLAN_NODIV };

/* The compiler's per-layer recomputation (recompute = auto), which the
 * driver tries on the planner's winner once compiled (not a level the
 * analytic search ranks: its per-stage choice is the compiled memory's). */
#define PLAN_RC_AUTO 3

typedef struct PlanChoice {
    int tp, pp, dp, v, mbs, m, zero, rc; /* rc: RC_NONE, RC_SELECTIVE, RC_FULL, PLAN_RC_AUTO */
    SchedKind sched;
    double step_s, compute_s, bubble_s, comm_s, opt_s, mfu, peak;
    int status;
} PlanChoice;

/* Every candidate of the space, each predicted analytically from the
 * profiles (no compile): *out sorted by step time, those that fit first. */
int pl_search_space(Arena *a, const PlanSpace *sp, PlanChoice **out, int *n);

#endif
