/* verify_report.c: --verify. Reads the graph compiled for the mesh; compiles
 * the same model for one device (every axis of size 1) through the compile
 * API, runs both plans side by side on the same random inputs (runtime's
 * rt_verify) and prints the comparison; when it fails, compiles both again
 * with every value kept and names the first value of step 1 that differs.
 * Key idea: the one-device program is the reference; a value is judged at
 * the scale of its own elements that differ. */
#include "explain/explain.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The scale under which a value counts as zero: 1e-6 of the median of the
 * compared values' nonzero scales. A median, not the largest: one mask of
 * -1e30 would otherwise lift the floor over every real value (issue 38). */
static double zero_floor(Arena *a, const Plan *one, const double *diff, const double *scale)
{
    double *s = arena_alloc(a, sizeof(double) * (size_t)(one->ntensors + 1));
    int n = 0;
    for (int t = 0; t < one->ntensors; t++)
        if (diff[t] >= 0 && scale[t] > 0 && isfinite(scale[t]))
            s[n++] = scale[t];
    qsort(s, (size_t)n, sizeof *s, cmp_double);
    return n ? 1e-6 * s[n / 2] : 0;
}

/* After a failed --verify: both plans again with every value kept (own
 * memory, nothing fused), step 1 of each, and the first value in the
 * one-device program's order that differs beyond tol at its own scale. A
 * value whose scale is under the zero floor (zero_floor) is judged at that
 * floor: the rounding noise of a true zero (a key bias's gradient) is no
 * divergence. Values the mesh holds as partial sums are skipped (their
 * blocks are not the whole value); the value their reduction makes is not.
 * When none differs it says step 1 agrees only if step 1's loss does. */
static void first_divergence(Ctx *c, const Options *o, Graph *g, Graph *g1, double tol)
{
    Plan mesh, one;
    char err[512];
    printf("looking for the first value of step 1 that differs (every value kept)\n");
    Settings sm, s;
    if (drv_settings(c, o, g, &sm) || drv_settings(c, o, g1, &s) ||
        cg_build_plan(c, g, &sm.train, CG_KEEP_VALUES, &mesh) != 0 ||
        cg_build_plan(c, g1, &s.train, CG_KEEP_VALUES, &one) != 0)
        return;
    double *diff = arena_alloc(c->arena, sizeof(double) * (size_t)(one.ntensors + 1));
    double *scale = arena_alloc(c->arena, sizeof(double) * (size_t)(one.ntensors + 1));
    int *t_of = arena_alloc(c->arena, sizeof(int) * (size_t)(g1->values.len + 1));
    if (rt_verify_values(&mesh, &one, 1, NULL, diff, scale, err, sizeof err) != 0) {
        fprintf(stderr, "tcc: error: --verify: %s\n", err);
        return;
    }
    /* with data parallelism a microbatch holds other rows on the mesh (its
     * block of each device's rows) than on one device: only their sums compare */
    int data = 1, per_mb;
    const TrainConfig tc = s.train;
    for (int a = 0; a < g->mesh.naxes; a++)
        if (g->mesh.axes[a].role == ROLE_DATA || g->mesh.axes[a].role == ROLE_FSDP)
            data *= g->mesh.axes[a].size;
    per_mb = data == 1 || tc.microbatches == 1;
    if (!per_mb)
        printf("(%d microbatches over %d data-parallel devices: the values of one "
               "microbatch hold other rows on the mesh, so only what sums them is compared; "
               "--set microbatches=1 compares every value)\n",
               (int)tc.microbatches, data);
    double floor = zero_floor(c->arena, &one, diff, scale);
    for (int i = 0; i < g1->values.len; i++)
        t_of[i] = -1;
    for (int t = one.ntensors - 1; t >= 0; t--) {
        int v = one.tensors[t].value;
        if (v >= 0 && v < g1->values.len)
            t_of[v] = t;
    }
    for (int i = 0; i < g1->ops.len; i++) {
        const Op *op = g1->ops.data[i];
        for (int r = 0; r < op->nres; r++) {
            const Value *v1 = op->res[r];
            int t = t_of[v1->id];
            /* parameters and state hold their updated values by now (the
             * comparison above judged them) */
            if (t < 0 || diff[t] < 0 || v1->id >= g->values.len ||
                one.tensors[t].role == PT_PARAM || one.tensors[t].role == PT_STATE ||
                (!per_mb && op->mb >= 0))
                continue;
            const Value *vm = g->values.data[v1->id];
            if (vm->shard.partial || vm->rank != v1->rank ||
                (vm->name != v1->name && (!vm->name || !v1->name || strcmp(vm->name, v1->name))))
                continue;
            double rel = diff[t] / fmax(scale[t], floor);
            if (!(rel > tol))
                continue;
            const Op *def = vm->def;
            Loc loc = def->loc.line > 0 ? def->loc : vm->loc;
            int coll = def->kind >= OP_ALL_REDUCE && def->kind <= OP_SHARD_SLICE;
            printf("first diverging value of step 1 (in the one-device program's order):\n  ");
            ir_print_op(stdout, g, def);
            if (loc.line > 0)
                printf("  at %s:%d:%d\n", loc.file ? loc.file : "?", loc.line, loc.col);
            printf("  sharding on the mesh: ");
            ir_print_value_type(stdout, g, vm);
            printf(" (%s%s%s)\n", ir_why_name(vm->shard.why.kind),
                   vm->shard.why.detail ? ": " : "",
                   vm->shard.why.detail ? vm->shard.why.detail : "");
            if (coll)
                printf("  made by: %s, a collective of the partition pass\n", ir_ops[def->kind].name);
            else
                printf("  made by: %s, partitioned on the mesh by its sharding rule\n",
                       ir_ops[def->kind].name);
            for (int a = 0; a < def->nargs; a++) { /* the collectives that fed it */
                const Op *in = def->args[a]->def;
                if (in && in->kind >= OP_ALL_REDUCE && in->kind <= OP_SHARD_SLICE) {
                    printf("  operand %d made by the partition pass (%s):\n    ", a,
                           def->args[a]->shard.why.detail ? def->args[a]->shard.why.detail
                                                          : ir_ops[in->kind].name);
                    ir_print_op(stdout, g, in);
                }
            }
            printf("  difference: max |mesh - one| %.3g, %.3g of its scale %.3g (tolerance %.3g)\n",
                   diff[t], rel, scale[t], tol);
            return;
        }
    }
    int l = one.loss;
    if (l >= 0 && diff[l] >= 0 && !(diff[l] > tol * scale[l]))
        printf("every value of step 1 agrees within the tolerance: the steps after diverge\n");
    else if (l >= 0 && diff[l] >= 0)
        printf("step 1's loss differs (%.3g relative, tolerance %.3g), but no value that both "
               "programs hold whole differs beyond the tolerance before it: the difference "
               "arises where only the mesh holds the value (a partial sum, a collective's "
               "result)%s\n",
               diff[l] / fmax(scale[l], 1e-300), tol,
               per_mb ? "" : ", or in one microbatch's values, which are not compared here");
    else
        printf("no value of step 1 that both programs hold whole differs beyond the tolerance "
               "(the loss is not among them)\n");
}

/* --verify=native's tolerance of each value it judges (the one-device plan's
 * loss and kept gradients "NAME:grad"): VERIFY_SIGMAS times the rounding the
 * value's chain of operations carries (ex_rounding_error) on each side, so
 * sqrt(2) of it in their difference. */
#define VERIFY_SIGMAS 4.0

static double *native_tolerances(Ctx *c, const Graph *g1, const Plan *one)
{
    char *stored = arena_alloc(c->arena, (size_t)g1->values.len + 1);
    memset(stored, 0, (size_t)g1->values.len + 1);
    for (int t = 0; t < one->ntensors; t++)
        if (one->tensors[t].value >= 0 && one->tensors[t].value < g1->values.len)
            stored[one->tensors[t].value] = 1;
    double *e = ex_rounding_error(c->arena, g1, stored);
    int *from = arena_alloc(c->arena, sizeof(int) * (size_t)(g1->values.len + 1));
    double *tols = arena_alloc(c->arena, sizeof(double) * (size_t)(one->ntensors + 1));
    for (int v = 0; v < g1->values.len; v++)
        from[v] = v;
    for (int i = 0; i < g1->ops.len; i++) /* a kept gradient: the value its update stores */
        if (g1->ops.data[i]->kind == OP_UPDATE)
            from[g1->ops.data[i]->args[0]->id] = g1->ops.data[i]->args[1]->id;
    for (int t = 0; t < one->ntensors; t++) {
        int v = one->tensors[t].value;
        tols[t] = v >= 0 && v < g1->values.len ? VERIFY_SIGMAS * sqrt(2.0) * e[from[v]] : 0;
    }
    return tols;
}

int ex_verify_mesh(Ctx *c, Options *o, Graph *g)
{
    Plan mesh, one;
    const char *spec = o->mesh;
    Settings sm, s;
    if (drv_settings(c, o, g, &sm) != 0 || cg_build_plan(c, g, &sm.train, 0, &mesh) != 0)
        return -1;
    char ones[64] = "", err[512];
    for (int i = 0; i < g->mesh.naxes && i < 16; i++)
        strcat(ones, i ? "x1" : "1");
    Graph *g1 = drv_passed(c, o, g->mesh.naxes ? intern(c->strings, ones) : NULL);
    if (!g1 || drv_settings(c, o, g1, &s) != 0 || cg_build_plan(c, g1, &s.train, 0, &one) != 0)
        return -1;

    const TrainConfig tc = s.train;
    int f64 = one.loss >= 0 && one.tensors[one.loss].dtype == PD_F64;
    int bf16 = !strcmp(tc.precision, "bf16");
    double tol = o->verify_tol > 0 ? o->verify_tol : f64 ? 1e-9 : bf16 ? 5e-2 : 1e-4;
    printf("verify: %s on %lld devices against one device, %d step%s, %s\n", g->name,
           (long long)plan_mesh_size(&mesh), o->verify, o->verify > 1 ? "s" : "",
           o->verify_native ? (bf16 ? "in the model's precision (bf16)" : "in the model's precision")
                            : "in float64 (precision = f64)");
    double *tols = o->verify_native && !(o->verify_tol > 0) ? native_tolerances(c, g1, &one) : NULL;
    int rc = tols ? rt_verify_each(&mesh, &one, o->verify, 1, tols, NULL, stdout, err, sizeof err)
                  : rt_verify(&mesh, &one, o->verify, 1, tol, NULL, stdout, err, sizeof err);
    if (rc < 0)
        fprintf(stderr, "tcc: error: --verify: %s\n", err);
    if (rc > 0) { /* every value compared: each microbatch's its own, so the step unrolled */
        Options u = *o;
        u.unroll = 1;
        const char *one_spec = g1->mesh.naxes ? intern(c->strings, ones) : NULL;
        Graph *gu = drv_passed(c, &u, spec), *g1u = gu ? drv_passed(c, &u, one_spec) : NULL;
        if (gu && g1u)
            first_divergence(c, o, gu, g1u, tol);
    }
    return rc ? -1 : 0;
}

