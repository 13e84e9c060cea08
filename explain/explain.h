/* explain.h: what tcc tells about a plan instead of building it: --verify's
 * comparison (verify_report.c) and the reports of --emit=schedule, memory,
 * cost and trace (reports.c). Each compiles through the compile API. */
#ifndef TCC_EXPLAIN_H
#define TCC_EXPLAIN_H

#include "driver/driver.h"

/* --verify: g (compiled for the mesh) against the model on one device. */
int ex_verify_mesh(Ctx *c, Options *o, Graph *g);
int ex_emit_schedule(Ctx *c, const Options *o, const TrainConfig *tc, Graph *g);
int ex_emit_memory(Ctx *c, const Options *o, double budget);
int ex_emit_cost(Ctx *c, Options *o);
int ex_emit_trace(Ctx *c, Options *o);

/* ---- why-chains (why.c, docs/passes.md "Why-chains") ----
 * The reasons behind one value's sharding, for --why NAME. */
typedef struct WhyChain WhyChain;
/* Right after the shard pass: the value `name` names in g (a value or
 * parameter name, with or without its repeat index, or %N as
 * --dump-after=shard numbers it; of several, the first forward one), each
 * mesh axis of its sharding followed back to where it started, and the ways
 * its op weighed. NULL after reporting that nothing has that name, with the
 * names close to it. */
WhyChain *ex_why_trace(Ctx *c, Graph *g, const Settings *s, const char *name);
/* After the partition pass over the same graph: the chain, then the
 * collectives the value's op, its pin and its readers need, with bytes. */
void ex_why_print(FILE *f, const WhyChain *w);

/* By value id of g (a graph after every pass, the one-device plan's): an
 * estimate of the relative error rounding leaves in the value, the root of
 * the sum of squares of the units its chain of operations rounds to
 * (rounding.c); 0 for a value no float op makes. stored (by value id,
 * or NULL: all): whether the plan stores the value in its dtype, or computes
 * it inside the kernel that reads it, in f32. */
double *ex_rounding_error(Arena *a, const Graph *g, const char *stored);

#endif
