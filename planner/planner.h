/* planner.h: the plan search (--plan=auto, search.c) and the fit of a plan
 * to the device's memory with recompute = auto's choice (fit.c), over the
 * compile API. */
#ifndef TCC_PLANNER_H
#define TCC_PLANNER_H

#include "driver/driver.h"

#define GIB (1024.0 * 1024.0 * 1024.0)

/* Another setting or mesh to try (a lever), or none. */
typedef struct Probe {
    const char *mesh; /* a --mesh spec, NULL: as given */
    const char *set;  /* a --set KEY=VALUE, NULL: none */
} Probe;

/* The step of one microbatch (the microbatch pass's model mode) compiled in c
 * as the options and the probe pr say: the graph after the passes (*gout),
 * its plan and the per-device graph it was built from. */
typedef struct OneStep {
    Graph *g;
    Plan plan;
    const Graph *local;
} OneStep;

/* The step of one microbatch compiled as o and the probe pr say (pr NULL:
 * as given): the graph after the passes, its plan and per-device graph. */
int pl_compile_one(Ctx *c, const Options *o, const Probe *pr, OneStep *one);
/* The memory model of that step; *gout its graph (gout may be NULL). */
int pl_model_in(Ctx *c, const Options *o, const Probe *pr, MemoryModel *mm, Graph **gout);
/* recompute = auto: the layers to recompute so the step fits budget. */
int pl_choose_recompute(Ctx *c, const Options *o, double budget);
/* The refusal of a step over the budget, with the levers that would fit it. */
void pl_refuse(Ctx *c, const Options *o, const Graph *g, const MemoryModel *mm, double budget);
/* The recompute = auto choice, as a comment line. */
void pl_print_auto(FILE *f, const Ctx *c);

/* The device's memory in bytes: --device-memory, else --gpu's, else 0. */
double pl_budget_of(const Options *o);
/* recompute = auto chosen, and the step's peak checked against the budget. */
int pl_fit_budget(Ctx *c, const Options *o, const Graph *g);
/* --plan=auto: the search, its report, and o set to the choice. */
int pl_plan_auto(Ctx *c, Options *o);

#endif
