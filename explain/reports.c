/* reports.c: the reports a user asks for instead of a program: the
 * pipeline schedule (--emit=schedule), the memory of each stage
 * (--emit=memory), the cost model's step (--emit=cost) and the schedule as a
 * trace (--emit=trace). Reads the options and the graph; compiles through
 * the compile API and the planner's memory probes; writes text or JSON. */
#include "explain/explain.h"
#include "planner/planner.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* --emit=schedule: the static pipeline schedule of the train block on the
 * mesh's pipeline axis (docs/schedules.md), with unit costs. */
int ex_emit_schedule(Ctx *c, const Options *o, const TrainConfig *train, Graph *g)
{
    const TrainConfig tc = *train;
    char err[256];
    int p = ir_pipeline_stages(&g->mesh);
    SchedKind kind = sched_kind_of(&tc);
    Schedule s;
    SchedTimes t;
    if (sched_build(c->arena, kind, p, (int)tc.microbatches, (int)tc.virtual_stages, &s,
                    err, sizeof err) != 0 ||
        sched_simulate(c->arena, &s, NULL, NULL, 0, &t, err, sizeof err) != 0) {
        fprintf(stderr, "tcc: error: schedule: %s\n", err);
        return -1;
    }
    FILE *f = o->out ? fopen(o->out, "w") : stdout;
    if (!f) {
        fprintf(stderr, "tcc: error: cannot write '%s': %s\n", o->out, strerror(errno));
        return -1;
    }
    sched_print(&s, f);
    if (o->out && fclose(f) != 0) {
        fprintf(stderr, "tcc: error: writing '%s' failed\n", o->out);
        return -1;
    }
    printf("%s schedule: %d stages, %d microbatches, %d virtual stages: bubble fraction %.4f "
           "(unit costs: F 1, backward 2)\n",
           sched_kind_name(s.kind), p, (int)tc.microbatches, (int)tc.virtual_stages, t.bubble);
    return 0;
}

/* ---- the memory model and the device's budget (model/memory_model.c) ---- */

static void print_header(FILE *f, const Graph *g, const TrainConfig *tc, const MemoryModel *mm,
                         const Options *o, double budget)
{
    CgMemory m;
    cg_memory(g, tc, &m);
    fprintf(f, "memory per device, mesh");
    for (int i = 0; i < g->mesh.naxes; i++)
        fprintf(f, "%s%s=%d", i ? " x " : " ", g->mesh.axes[i].name, g->mesh.axes[i].size);
    fprintf(f, " (%lld devices), %d microbatch%s, %s schedule\n", (long long)ir_mesh_size(&g->mesh),
            mm->microbatches, mm->microbatches == 1 ? "" : "es", mm->schedule);
    fprintf(f, "device: %s", drv_on_gpu(o) ? dev_lookup(o->gpu)->what : "cpu (this runtime)");
    if (budget > 0)
        fprintf(f, ", budget %.0f bytes (%.2f GiB)", budget, budget / GIB);
    fprintf(f, "\ntraining state of the whole model per device (before pipeline stages):\n");
    fprintf(f, "  parameters       %14.0f bytes\n", m.params);
    fprintf(f, "  gradients        %14.0f bytes\n", m.grads);
    fprintf(f, "  optimizer state  %14.0f bytes\n", m.state);
    fprintf(f, "  training state   %14.0f bytes\n", m.params + m.grads + m.state);
}

/* -o FILE (JSON when it ends in .json), else stdout; NULL after reporting. */
static FILE *open_out(const Options *o, int *json)
{
    *json = o->out && strlen(o->out) > 5 && !strcmp(o->out + strlen(o->out) - 5, ".json");
    FILE *f = o->out ? fopen(o->out, "w") : stdout;
    if (!f)
        fprintf(stderr, "tcc: error: cannot write '%s': %s\n", o->out, strerror(errno));
    return f;
}

int ex_emit_memory(Ctx *c, const Options *o, double budget)
{
    MemoryModel mm;
    OneStep one;
    if (pl_model_in(c, o, &mm, &one) != 0)
        return -1;
    const Graph *g = one.g;
    int json;
    FILE *f = open_out(o, &json);
    if (!f)
        return -1;
    if (json) {
        char *text = mem_json(&mm, g->name, drv_on_gpu(o) ? o->gpu : "cpu", budget,
                              budget > 0 ? pl_headroom_of(o) : 0);
        fputs(text, f);
        fputc('\n', f);
        free(text);
    } else {
        print_header(f, g, &one.s.train, &mm, o, budget);
        if (o->recompute_layers)
            pl_print_auto(f, o);
        fprintf(f, "the largest moment of each stage's step:\n");
        mem_print(f, &mm, budget, budget > 0 ? pl_headroom_of(o) : 0);
    }
    if (o->out && fclose(f) != 0) {
        fprintf(stderr, "tcc: error: writing '%s' failed\n", o->out);
        return -1;
    }
    if (budget > 0 && mm.peak > budget)
        return pl_refuse(c, o, &one.s.train, g, &mm, budget), -1;
    return 0;
}

/* ---- --emit=cost ---- */

/* The device's name in the header: the cluster, or the CPU and its share. */
static const char *device_text(Ctx *c, const Options *o, const CostDevice *d)
{
    if (!d->cpu)
        return o->cluster_spec.what;
    return arena_printf(c->arena, "this machine's CPU (%s): %g cores, %d thread%s per device "
                                  "at %.2f of a core each",
                        d->what, d->host->v[CPU_CORES], d->threads, d->threads == 1 ? "" : "s",
                        d->share);
}

int ex_emit_cost(Ctx *c, Options *o)
{
    CostDevice d;
    OneStep one;
    MemoryModel mm;
    CostModel cm;
    if (pl_compile_one(c, o, &one) != 0 || drv_cost_device(c, o, &one.plan, &d) != 0 ||
        mem_model(c, one.g, &one.s.train, one.local, &one.plan, !d.cpu, &mm) != 0 ||
        cost_model(c, one.g, &one.s.train, one.local, &one.plan, &d, &cm) != 0)
        return -1;
    drv_warn_placement(c, o, &one.plan);
    double budget = pl_budget_of(o);
    if (d.cpu && budget <= 0) /* the devices of the threads backend share the memory */
        budget = d.host->v[CPU_MEMORY] * GIB / cm.devices;
    int json;
    FILE *f = open_out(o, &json);
    if (!f)
        return -1;
    if (json) {
        char *text = cost_json(&cm, one.g->name, d.name);
        cJSON *root = cJSON_Parse(text);
        free(text);
        cJSON_AddNumberToObject(root, "peak_memory_bytes", mm.peak);
        cJSON_AddBoolToObject(root, "fits", mm.peak <= budget);
        cJSON *place = cJSON_AddArrayToObject(root, "placement"); /* each axis's rank stride */
        for (int a = 0; place && a < one.plan.naxes; a++) {
            cJSON *x = cJSON_CreateObject();
            cJSON_AddStringToObject(x, "axis", one.plan.axes[a].name);
            cJSON_AddNumberToObject(x, "stride", (double)plan_axis_stride(&one.plan, a));
            cJSON_AddItemToArray(place, x);
        }
        text = cJSON_Print(root);
        cJSON_Delete(root);
        fprintf(f, "%s\n", text);
        free(text);
    } else {
        fprintf(f, "cost of one step, mesh");
        for (int i = 0; i < one.g->mesh.naxes; i++)
            fprintf(f, "%s%s=%d", i ? " x " : " ", one.g->mesh.axes[i].name,
                    one.g->mesh.axes[i].size);
        fprintf(f, " (%.0f devices) on %s\n", cm.devices, device_text(c, o, &d));
        if (!d.cpu && one.plan.naxes > 1) {
            char place[512];
            cost_placement_text(&one.plan, &d, place, sizeof place);
            fprintf(f, "placement, innermost first: %s%s\n", place,
                    o->place ? " (--place)" : " (by traffic)");
        }
        cost_print(f, &cm);
        double room = pl_budget_of(o) > 0 ? pl_headroom_of(o) : 0; /* none in a CPU's share */
        fprintf(f, "memory: peak %.2f GiB per device (stage %d) of %.2f GiB", mm.peak / GIB,
                mm.peak_stage, (budget + room) / GIB);
        if (room > 0)
            fprintf(f, " less %.2f GiB of headroom", room / GIB);
        fprintf(f, ": %s\n", mm.peak <= budget ? "fits" : "does not fit");
    }
    if (o->out && fclose(f) != 0) {
        fprintf(stderr, "tcc: error: writing '%s' failed\n", o->out);
        return -1;
    }
    return 0;
}

/* --emit=trace: the schedule of the step with each piece as long as the cost
 * model says on the device (--emit=cost's), as a Chrome trace. */
int ex_emit_trace(Ctx *c, Options *o)
{
    CostDevice d;
    OneStep one;
    CostModel cm;
    if (pl_compile_one(c, o, &one) != 0 || drv_cost_device(c, o, &one.plan, &d) != 0 ||
        cost_model(c, one.g, &one.s.train, one.local, &one.plan, &d, &cm) != 0)
        return -1;
    int json;
    FILE *f = open_out(o, &json);
    if (!f)
        return -1;
    int bad = sched_write_trace(&cm.sched, &cm.times, 1e6, f) != 0;
    if (o->out ? fclose(f) != 0 || bad : bad) {
        fprintf(stderr, "tcc: error: writing '%s' failed\n", o->out ? o->out : "<stdout>");
        return -1;
    }
    fprintf(o->out ? stdout : stderr, /* keep stdout pure JSON */
            "%s schedule: %d stages, %d microbatches, %d virtual stages on %s: step %.3f ms, "
            "the pieces %.3f ms of it, bubble fraction %.4f (the trace's durations)\n",
            cm.schedule, cm.sched.p, cm.sched.m, cm.sched.v, device_text(c, o, &d),
            cm.step_s * 1e3, cm.times.makespan * 1e3, cm.times.bubble);
    return 0;
}

