/* plan_sample.h: the hand-built plan the plan format's tests share (a
 * parameter, its optimizer state, two inputs, a step tensor, temporaries, a
 * kernel, a GEMM and a copy), a scratch directory for its file, and loading
 * it back with the loader's message; the comparison of two plans field by
 * field. Header-only: each test program has its
 * own copy. The including file includes Criterion, <stdio.h>, <stdlib.h>,
 * <string.h>, plan/plan.h and tests/support/tmpdir.h first. */
#ifndef TCC_TEST_PLAN_SAMPLE_H
#define TCC_TEST_PLAN_SAMPLE_H

static char dir[64], path[128];

static void make_dir(void)
{
    tmpdir_make(dir, "plan");
    snprintf(path, sizeof path, "%s/plan.json", dir);
}

static void remove_dir(void)
{
    tmpdir_remove(dir);
}


/* ---- the hand-built plan ---- */

static const char *SOURCE = "void k0(char *const *a)\n"
                            "{\n"
                            "    float *loss = (float *)a[0];\n"
                            "    const float *y = (const float *)a[1];\n"
                            "    float s = 0;\n"
                            "    for (int i = 0; i < 20; i++)\n"
                            "        s += y[i];\n"
                            "    *loss = s; /* \"quoted\" \\ backslash */\n"
                            "}\n";

static void tensor(Plan *p, int i, const char *name, PlanDType dt, PlanRole role, int rank,
                   const int64_t *shape, uint64_t offset)
{
    PlanTensor *t = &p->tensors[i];
    int64_t n = 1;
    t->name = strdup(name);
    t->dtype = dt;
    t->role = role;
    t->rank = rank;
    for (int d = 0; d < rank; d++)
        n *= t->shape[d] = shape[d];
    t->bytes = (uint64_t)n * plan_dtype_size(dt);
    t->offset = offset;
    t->init = strdup("");
    t->layer = -1;
    t->value = i;
    t->stage = -1;
}

static int *ints(int n, const int *v)
{
    int *a = malloc(sizeof(int) * (size_t)n);
    memcpy(a, v, sizeof(int) * (size_t)n);
    return a;
}

/*   0 w    param f32[3,5] normal(0.02)    4 step  step  f32[]
 *   1 x    input f32[4,3]                 5 loss  temp  f32[]
 *   2 y    temp  f32[4,5]                 6 w.m   state f32[3,5]
 *   3 tok  input i32[4], ids < 10
 * instrs: y = x @ w (gemm); loss = k0(y); w.m = w (copy). */
static Plan *sample(void)
{
    Plan *p = calloc(1, sizeof *p);
    p->version = PLAN_VERSION;
    p->model = strdup("sample");
    p->naxes = 1;
    p->axes = calloc(1, sizeof *p->axes);
    p->axes[0] = (PlanAxis){strdup("dp"), strdup("data"), 1, 0};
    p->slab_bytes = 512;
    p->ntensors = 7;
    p->tensors = calloc(7, sizeof *p->tensors);
    tensor(p, 0, "w", PD_F32, PT_PARAM, 2, (int64_t[]){3, 5}, 0);
    free(p->tensors[0].init);
    p->tensors[0].init = strdup("normal");
    p->tensors[0].init_arg = 0.02;
    tensor(p, 1, "x", PD_F32, PT_INPUT, 2, (int64_t[]){4, 3}, 64);
    tensor(p, 2, "", PD_F32, PT_TEMP, 2, (int64_t[]){4, 5}, 128);
    tensor(p, 3, "tok", PD_I32, PT_INPUT, 1, (int64_t[]){4}, 256);
    p->tensors[3].limit = 10;
    tensor(p, 4, "step", PD_F32, PT_STEP, 0, NULL, 320);
    tensor(p, 5, "loss", PD_F32, PT_TEMP, 0, NULL, 384);
    tensor(p, 6, "w.m", PD_F32, PT_STATE, 2, (int64_t[]){3, 5}, 448);
    p->tensors[6].layer = 2;
    p->nkernels = 1;
    p->kernels = calloc(1, sizeof *p->kernels);
    p->kernels[0] = (PlanKernel){strdup("k0"), 2, 1, 4, 256};
    p->ninstrs = 3;
    p->instrs = calloc(3, sizeof *p->instrs);
    p->instrs[0].kind = PI_GEMM;
    p->instrs[0].gemm = (PlanGemm){.a = 1,
                                   .b = 0,
                                   .c = 2,
                                   .m = 4,
                                   .n = 5,
                                   .k = 3,
                                   .lda = 3,
                                   .ldb = 5,
                                   .ldc = 5,
                                   .batch = 1,
                                   .alpha = 1,
                                   .beta = 0};
    p->instrs[0].layer = -1;
    p->instrs[1] = (PlanInstr){.kind = PI_KERNEL,
                               .kernel = 0,
                               .nargs = 2,
                               .args = ints(2, (int[]){5, 2}),
                               .phase = 1,
                               .layer = 0};
    p->instrs[2] = (PlanInstr){
        .kind = PI_COPY, .nargs = 2, .args = ints(2, (int[]){6, 0}), .phase = 3, .layer = -1};
    p->kernel_source = strdup(SOURCE);
    p->loss = 5;
    p->lr = -1;
    p->grad_norm = -1;
    p->flops = 120;
    return p;
}

static void write_ok(Plan *p)
{
    char err[512] = "";
    cr_assert_eq(plan_write(path, p, err, sizeof err), 0, "%s", err);
}

/* The message of loading path, which must fail; it names the file. */
static const char *load_error(void)
{
    static char err[1024];
    err[0] = 0;
    Plan *p = plan_load(path, err, sizeof err);
    cr_assert_null(p, "the plan should have been refused");
    cr_assert(!strncmp(err, path, strlen(path)), "message does not name the file: %s", err);
    cr_assert(!strchr(err, '\n'), "message is not one line: %s", err);
    return err;
}

static void expect_error(const char *want)
{
    const char *err = load_error();
    cr_assert(strstr(err, want), "want \"%s\" in: %s", want, err);
}

/* A change that breaks a plan (the refusal tests). */
typedef void (*Breaker)(Plan *p);

/* ---- the round trip: every field the same ---- */

static void same_tensor(const PlanTensor *a, const PlanTensor *b, int i)
{
    cr_assert_str_eq(a->name, b->name, "tensors[%d].name", i);
    cr_assert_eq(a->dtype, b->dtype, "tensors[%d].dtype", i);
    cr_assert_eq(a->rank, b->rank, "tensors[%d].rank", i);
    for (int d = 0; d < PLAN_MAX_RANK; d++)
        cr_assert_eq(a->shape[d], b->shape[d], "tensors[%d].shape[%d]", i, d);
    cr_assert_eq(a->offset, b->offset, "tensors[%d].offset", i);
    cr_assert_eq(a->bytes, b->bytes, "tensors[%d].bytes", i);
    cr_assert_eq(a->role, b->role, "tensors[%d].role", i);
    cr_assert_str_eq(a->init, b->init, "tensors[%d].init", i);
    cr_assert_eq(a->init_arg, b->init_arg, "tensors[%d].init_arg", i);
    cr_assert_eq(a->layer, b->layer, "tensors[%d].layer", i);
    cr_assert_eq(a->limit, b->limit, "tensors[%d].limit", i);
    cr_assert_eq(a->value, b->value, "tensors[%d].value", i);
    cr_assert_eq(a->stage, b->stage, "tensors[%d].stage", i);
}

static void same_instr(const PlanInstr *a, const PlanInstr *b, int i)
{
    cr_assert_eq(a->kind, b->kind, "instrs[%d].kind", i);
    cr_assert_eq(a->kernel, b->kernel, "instrs[%d].kernel", i);
    cr_assert_eq(a->nargs, b->nargs, "instrs[%d].nargs", i);
    for (int j = 0; j < a->nargs; j++)
        cr_assert_eq(a->args[j], b->args[j], "instrs[%d].args[%d]", i, j);
    const PlanGemm *x = &a->gemm, *y = &b->gemm;
    int64_t xs[] = {x->a,   x->b,   x->c,   x->trans_a, x->trans_b,  x->m,        x->n,       x->k,
                    x->lda, x->ldb, x->ldc, x->batch,   x->stride_a, x->stride_b, x->stride_c};
    int64_t ys[] = {y->a,   y->b,   y->c,   y->trans_a, y->trans_b,  y->m,        y->n,       y->k,
                    y->lda, y->ldb, y->ldc, y->batch,   y->stride_a, y->stride_b, y->stride_c};
    for (int j = 0; j < 15; j++)
        cr_assert_eq(xs[j], ys[j], "instrs[%d].gemm field %d", i, j);
    cr_assert_eq(x->alpha, y->alpha, "instrs[%d].gemm.alpha", i);
    cr_assert_eq(x->beta, y->beta, "instrs[%d].gemm.beta", i); /* -0 == 0 */
    cr_assert_eq(a->phase, b->phase, "instrs[%d].phase", i);
    cr_assert_eq(a->layer, b->layer, "instrs[%d].layer", i);
    cr_assert_eq(a->stage, b->stage, "instrs[%d].stage", i);
    cr_assert_eq(a->group, b->group, "instrs[%d].group", i);
    if (a->kind == PI_COLL) {
        cr_assert_eq(a->coll.op, b->coll.op, "instrs[%d].coll.op", i);
        cr_assert_eq(a->coll.naxes, b->coll.naxes, "instrs[%d].coll.naxes", i);
        for (int j = 0; j < a->coll.naxes; j++)
            cr_assert_eq(a->coll.axes[j], b->coll.axes[j], "instrs[%d].coll.axes[%d]", i, j);
        cr_assert_eq(a->coll.peer, b->coll.peer, "instrs[%d].coll.peer", i);
        cr_assert_eq(a->coll.tag, b->coll.tag, "instrs[%d].coll.tag", i);
    }
}

static void same_plan(const Plan *a, const Plan *b)
{
    cr_assert_eq(a->version, b->version);
    cr_assert_str_eq(a->model, b->model);
    cr_assert_eq(a->naxes, b->naxes);
    for (int i = 0; i < a->naxes; i++) {
        cr_assert_str_eq(a->axes[i].name, b->axes[i].name);
        cr_assert_str_eq(a->axes[i].role, b->axes[i].role);
        cr_assert_eq(a->axes[i].size, b->axes[i].size);
        cr_assert_eq(a->axes[i].stride, b->axes[i].stride);
    }
    cr_assert_eq(a->slab_bytes, b->slab_bytes);
    for (int s = 0; s < plan_stages(a); s++)
        cr_assert_eq(plan_stage_slab(a, s), plan_stage_slab(b, s), "stage %d", s);
    cr_assert_str_eq(a->train_hash, b->train_hash);
    cr_assert_eq(a->ntensors, b->ntensors);
    for (int i = 0; i < a->ntensors; i++)
        same_tensor(&a->tensors[i], &b->tensors[i], i);
    cr_assert_eq(a->ninstrs, b->ninstrs);
    for (int i = 0; i < a->ninstrs; i++)
        same_instr(&a->instrs[i], &b->instrs[i], i);
    cr_assert_eq(a->nkernels, b->nkernels);
    for (int i = 0; i < a->nkernels; i++) {
        cr_assert_str_eq(a->kernels[i].name, b->kernels[i].name);
        cr_assert_eq(a->kernels[i].nargs, b->kernels[i].nargs);
        cr_assert_eq(a->kernels[i].pattern, b->kernels[i].pattern);
    }
    cr_assert_str_eq(a->kernel_source, b->kernel_source);
    cr_assert_eq(a->loss, b->loss);
    cr_assert_eq(a->lr, b->lr);
    cr_assert_eq(a->grad_norm, b->grad_norm);
    cr_assert_eq(a->flops, b->flops);
    cr_assert_str_eq(a->hash, b->hash);
}

#endif
