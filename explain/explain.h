/* explain.h: what tcc tells about a plan instead of building it: --verify's
 * comparison (verify_report.c) and the reports of --emit=schedule, memory,
 * cost and trace (reports.c). Each compiles through the compile API. */
#ifndef TCC_EXPLAIN_H
#define TCC_EXPLAIN_H

#include "driver/driver.h"

/* --verify: g (compiled for the mesh) against the model on one device. */
int ex_verify_mesh(Ctx *c, Options *o, Graph *g);
int ex_emit_schedule(Ctx *c, const Options *o, Graph *g);
int ex_emit_memory(Ctx *c, const Options *o, double budget);
int ex_emit_cost(Ctx *c, Options *o);
int ex_emit_trace(Ctx *c, Options *o);

#endif
