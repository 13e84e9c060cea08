/* test_plan.c: the plan format (plan/): names, the hash, the JSON
 * round trip, and the loader's refusal of every kind of bad file with its
 * message. The plan is built here by hand: a parameter, its optimizer state,
 * two inputs, a step tensor, temporaries, a kernel, a GEMM and a copy. Bad
 * files come three ways: text edits of a written plan (truncation, flipped
 * bytes), JSON edits with cJSON (missing or mistyped fields), and plans
 * changed in memory and written again with a correct hash (bad meaning). */
#define _XOPEN_SOURCE 700 /* nftw */
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <ftw.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "plan/plan.h"
#include "tests/support/tmpdir.h"

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

TestSuite(plan, .init = make_dir, .fini = remove_dir);

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
    p->axes[0] = (PlanAxis){strdup("dp"), strdup("data"), 1};
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

/* ---- names ---- */

Test(plan, dtype_and_role_names)
{
    cr_assert_eq(plan_dtype_size(PD_F32), 4);
    cr_assert_eq(plan_dtype_size(PD_F64), 8);
    cr_assert_eq(plan_dtype_size(PD_BF16), 2);
    cr_assert_eq(plan_dtype_size(PD_F16), 2);
    cr_assert_eq(plan_dtype_size(PD_I32), 4);
    cr_assert_eq(plan_dtype_size(PD_COUNT), 0);
    cr_assert_str_eq(plan_dtype_name(PD_BF16), "bf16");
    cr_assert_str_eq(plan_dtype_name((PlanDType)-1), "?");
    cr_assert_str_eq(plan_role_name(PT_PARAM), "param");
    cr_assert_str_eq(plan_role_name(PT_STEP), "step");
    cr_assert_str_eq(plan_role_name(PT_COUNT), "?");
}

/* ---- round trip ---- */

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

Test(plan, write_then_load_gives_every_field_back)
{
    char err[512] = "";
    Plan *p = sample();
    p->tensors[0].init_arg = 0.1 + 0.2; /* needs 17 digits to come back */
    p->instrs[0].gemm.alpha = 1.0 / 3;
    p->instrs[0].gemm.beta = -0.0;
    p->flops = 9007199254740991.0;
    cr_assert_eq(plan_check(p, err, sizeof err), 0, "%s", err);
    write_ok(p);
    char tmp[160];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    cr_assert_neq(access(tmp, F_OK), 0, "the temporary file is left behind");
    Plan *q = plan_load(path, err, sizeof err);
    cr_assert_not_null(q, "%s", err);
    same_plan(p, q);
    /* And again: the file is a fixed point. */
    write_ok(q);
    Plan *r = plan_load(path, err, sizeof err);
    cr_assert_not_null(r, "%s", err);
    same_plan(q, r);
    plan_free(p);
    plan_free(q);
    plan_free(r);
}

Test(plan, the_json_has_format_version_and_hash_first)
{
    Plan *p = sample();
    write_ok(p);
    FILE *f = fopen(path, "r");
    char head[200] = "";
    cr_assert_not_null(f);
    cr_assert_gt(fread(head, 1, sizeof head - 1, f), 0);
    fclose(f);
    cr_assert(strstr(head, "\"format\":\t\"tcc-plan\""), "%s", head);
    char version[32];
    snprintf(version, sizeof version, "\"version\":\t%d", PLAN_VERSION);
    cr_assert(strstr(head, version), "%s", head);
    char want[40];
    snprintf(want, sizeof want, "\"hash\":\t\"%s\"", p->hash);
    cr_assert(strstr(head, want), "%s", head);
    plan_free(p);
}

/* ---- the hash ---- */

/* Change field `which` of p; 0 once there are no more fields. */
static int mutate(Plan *p, int which)
{
    PlanTensor *t = &p->tensors[3];
    PlanGemm *g = &p->instrs[0].gemm;
    switch (which) {
    case 1:
        p->version++;
        break;
    case 2:
        p->model[0] = 'S';
        break;
    case 3:
        p->axes[0].name[0] = 'x';
        break;
    case 4:
        p->axes[0].role[0] = 'x';
        break;
    case 5:
        p->axes[0].size = 2;
        break;
    case 6:
        p->slab_bytes += 64;
        break;
    case 7:
        t->name[0] = 'T';
        break;
    case 8:
        t->dtype = PD_F32;
        break;
    case 9:
        t->rank = 2, t->shape[1] = 1;
        break;
    case 10:
        t->shape[0] = 5;
        break;
    case 11:
        t->offset = 0;
        break;
    case 12:
        t->bytes = 20;
        break;
    case 13:
        t->role = PT_TEMP;
        break;
    case 14:
        free(t->init), t->init = strdup("ones");
        break;
    case 15:
        t->init_arg = 1e-300;
        break;
    case 16:
        t->layer = 7;
        break;
    case 17:
        t->limit = 11;
        break;
    case 18:
        t->value = 99;
        break;
    case 19:
        p->instrs[1].kind = PI_COPY;
        break;
    case 20:
        p->instrs[1].kernel = 1;
        break;
    case 21:
        p->instrs[1].args[1] = 1;
        break;
    case 22:
        p->instrs[1].nargs = 1;
        break;
    case 23:
        p->instrs[1].phase = 2;
        break;
    case 24:
        p->instrs[1].layer = 3;
        break;
    case 25:
        g->a = 2;
        break;
    case 26:
        g->b = 2;
        break;
    case 27:
        g->c = 1;
        break;
    case 28:
        g->trans_a = 1;
        break;
    case 29:
        g->trans_b = 1;
        break;
    case 30:
        g->m = 2;
        break;
    case 31:
        g->n = 2;
        break;
    case 32:
        g->k = 2;
        break;
    case 33:
        g->lda = 9;
        break;
    case 34:
        g->ldb = 9;
        break;
    case 35:
        g->ldc = 9;
        break;
    case 36:
        g->batch = 2;
        break;
    case 37:
        g->stride_a = 1;
        break;
    case 38:
        g->stride_b = 1;
        break;
    case 39:
        g->stride_c = 1;
        break;
    case 40:
        g->alpha = 2;
        break;
    case 41:
        g->beta = 1;
        break;
    case 42:
        p->kernels[0].name[0] = 'K';
        break;
    case 43:
        p->kernels[0].nargs = 3;
        break;
    case 44:
        p->kernels[0].pattern = 0;
        break;
    case 45:
        p->kernel_source[0] = 'V';
        break;
    case 46:
        p->loss = 4;
        break;
    case 47:
        p->lr = 5;
        break;
    case 48:
        p->grad_norm = 5;
        break;
    case 49:
        p->flops = 121;
        break;
    case 50:
        p->ntensors = 6;
        break;
    case 51:
        p->ninstrs = 2;
        break;
    case 52:
        p->kernel_source[strlen(p->kernel_source) - 1] = 0;
        break;
    case 53:
        t->stage = 0;
        break;
    case 54:
        p->instrs[1].stage = 1;
        break;
    case 55:
        strcpy(p->train_hash, "0123456789abcdef");
        break;
    case 56:
        p->instrs[1].group = 2;
        break;
    default:
        return 0;
    }
    return 1;
}

Test(plan, hash_is_stable_and_changes_with_every_field)
{
    char h0[17], h1[17], h[17];
    Plan *p = sample();
    plan_hash(p, h0);
    plan_hash(p, h1);
    cr_assert_str_eq(h0, h1);
    cr_assert_eq(strlen(h0), 16);
    cr_assert_eq(strspn(h0, "0123456789abcdef"), 16);
    plan_free(p);
    int which = 1;
    for (;; which++) {
        p = sample();
        int more = mutate(p, which);
        plan_hash(p, h);
        p->ntensors = 7; /* as built, so that plan_free frees it all */
        p->ninstrs = 3;
        plan_free(p);
        if (!more)
            break;
        cr_assert_str_neq(h, h0, "changing field %d leaves the hash as it was", which);
    }
    cr_assert_eq(which, 57);
}

Test(plan, hash_ignores_fields_an_instruction_does_not_use_and_negative_zero)
{
    char h0[17], h[17];
    Plan *p = sample();
    plan_hash(p, h0);
    p->instrs[0].kernel = 5;       /* a gemm has no kernel */
    p->instrs[1].gemm.m = 77;      /* a kernel launch has no gemm */
    p->tensors[0].shape[5] = 3;    /* beyond the rank */
    p->instrs[0].gemm.beta = -0.0; /* written as 0 */
    p->instrs[1].coll.peer = 4;    /* only a send or recv has a peer */
    p->instrs[2].coll.tag = 9;
    plan_hash(p, h);
    cr_assert_str_eq(h, h0);
    plan_free(p);
}

/* ---- refusals: text edits ---- */

static char *read_text(size_t *len)
{
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f);
    char *buf = malloc(1 << 16);
    *len = fread(buf, 1, 1 << 16, f);
    fclose(f);
    cr_assert_lt(*len, 1 << 16);
    buf[*len] = 0;
    return buf;
}

static void write_text(const char *text, size_t len)
{
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f);
    cr_assert_eq(fwrite(text, 1, len, f), len);
    fclose(f);
}

/* Replace the first `from` in the file with `to`. */
static void edit(const char *from, const char *to)
{
    size_t len;
    char *text = read_text(&len), *at = strstr(text, from);
    cr_assert_not_null(at, "\"%s\" is not in the plan", from);
    size_t head = (size_t)(at - text), nf = strlen(from), nt = strlen(to);
    char *out = malloc(len - nf + nt + 1);
    memcpy(out, text, head);
    memcpy(out + head, to, nt);
    memcpy(out + head + nt, at + nf, len - head - nf);
    write_text(out, len - nf + nt);
    free(out);
    free(text);
}

Test(plan, truncated_at_any_offset_is_an_unexpected_end_of_file)
{
    Plan *p = sample();
    write_ok(p);
    plan_free(p);
    size_t len;
    char *text = read_text(&len);
    cr_assert_eq(text[len - 2], '}');
    for (size_t cut = 0; cut < len - 1; cut++) {
        write_text(text, cut);
        expect_error("unexpected end of file");
    }
    free(text);
}

Test(plan, a_flipped_digit_is_a_hash_mismatch)
{
    Plan *p = sample();
    write_ok(p);
    plan_free(p);
    edit("\"flops\":\t120", "\"flops\":\t130");
    expect_error("hash mismatch: the plan was modified or corrupted");
}

Test(plan, an_edited_hash_is_a_hash_mismatch)
{
    Plan *p = sample();
    write_ok(p);
    char wrong[17];
    snprintf(wrong, sizeof wrong, "%s", p->hash);
    wrong[7] = wrong[7] == '0' ? '1' : '0';
    edit(p->hash, wrong);
    plan_free(p);
    expect_error("hash mismatch");
}

Test(plan, foreign_files_are_named_as_such)
{
    write_text("hello", 5);
    expect_error("not valid JSON (line 1, column 1)");
    write_text("{\"a\": 1}", 8);
    expect_error("not a tcc plan: \"format\" is missing");
    write_text("[1, 2]", 6);
    expect_error("not a tcc plan: the top level is not a JSON object");
    Plan *p = sample();
    write_ok(p);
    plan_free(p);
    edit("tcc-plan", "tcc-plam");
    expect_error("not a tcc plan: \"format\" is \"tcc-plam\", expected \"tcc-plan\"");
}

Test(plan, another_version_is_refused)
{
    Plan *p = sample();
    write_ok(p);
    plan_free(p);
    edit("\"version\":\t6", "\"version\":\t5"); /* the format before the microbatch loop */
    expect_error("plan version 5 is not supported (this runtime reads version 6)");
}

Test(plan, data_after_the_plan_and_a_missing_file_are_refused)
{
    Plan *p = sample();
    write_ok(p);
    plan_free(p);
    size_t len;
    char *text = read_text(&len);
    strcpy(text + len, "{}");
    write_text(text, len + 2);
    free(text);
    expect_error("unexpected data after the plan");
    unlink(path);
    expect_error("No such file or directory");
}

/* ---- refusals: JSON edits (shape and types of fields) ---- */

static cJSON *json;

static void load_json(void)
{
    Plan *p = sample();
    write_ok(p);
    plan_free(p);
    size_t len;
    char *text = read_text(&len);
    json = cJSON_Parse(text);
    free(text);
    cr_assert_not_null(json);
}

static void store_json(void)
{
    char *text = cJSON_Print(json);
    write_text(text, strlen(text));
    free(text);
    cJSON_Delete(json);
    json = NULL;
}

static cJSON *item(const char *list, int i)
{
    return cJSON_GetArrayItem(cJSON_GetObjectItem(json, list), i);
}

Test(plan, missing_and_mistyped_fields_are_named)
{
    static const struct {
        const char *list, *key, *value, *want;
        int i;
    } cases[] = {
        {"tensors", "shape", "\"4\"", "tensors[3].shape: expected an array of at most 8 integers",
         3},
        {"tensors", "shape", "[1,1,1,1,1,1,1,1,1]",
         "tensors[3].shape: expected an array of at most 8", 3},
        {"tensors", "shape", "[1.5]", "tensors[1].shape: expected an array", 1},
        {"tensors", "bytes", NULL, "tensors[2].bytes: missing", 2},
        {"tensors", "offset", "-64",
         "tensors[2].offset: expected an integer in [0, 9007199254740992]", 2},
        {"tensors", "offset", "1e300", "tensors[2].offset: expected an integer", 2},
        {"tensors", "dtype", "\"f8\"", "tensors[0].dtype: unknown dtype \"f8\"", 0},
        {"tensors", "dtype", "3", "tensors[0].dtype: expected a string", 0},
        {"tensors", "role", "\"weight\"", "tensors[0].role: unknown role \"weight\"", 0},
        {"tensors", "name", "null", "tensors[1].name: expected a string", 1},
        {"tensors", "colour", "1", "tensors[1]: unknown field \"colour\"", 1},
        {"instrs", "kind", "\"conv\"", "instrs[2].kind: unknown instruction kind \"conv\"", 2},
        {"instrs", "gemm", NULL, "instrs[0].gemm: missing", 0},
        {"instrs", "kernel", "1", "instrs[0]: unknown field \"kernel\"", 0},
        {"instrs", "args", "[0, \"1\"]", "instrs[1].args: expected an array of integers", 1},
        {"kernels", "nargs", "2.5", "kernels[0].nargs: expected an integer", 0},
        {"axes", "size", "true", "axes[0].size: expected an integer", 0},
        {"tensors", "stage", "\"1\"", "tensors[1].stage: expected an integer", 1},
        {"instrs", "stage", "0.5", "instrs[2].stage: expected an integer", 2},
        {"instrs", "peer", "1", "instrs[2]: unknown field \"peer\"", 2},
        {NULL, "loss", "\"5\"", "loss: expected an integer", 0},
        {NULL, "flops", "\"many\"", "flops: expected a finite number", 0},
        {NULL, "kernel_source", NULL, "kernel_source: missing", 0},
        {NULL, "stage_slab_bytes", NULL, "stage_slab_bytes: missing", 0},
        {NULL, "stage_slab_bytes", "[512, 512]",
         "stage_slab_bytes: expected an array of at most 1 integers", 0},
        {NULL, "stage_slab_bytes", "[]", "stage_slab_bytes: 0 sizes for 1 pipeline stages", 0},
        {NULL, "train_hash", "\"xyz\"", "train_hash: expected \"\" or 16 lowercase hex", 0},
        {NULL, "train_hash", NULL, "train_hash: missing", 0},
        {NULL, "tensors", "{}", "tensors: expected an array", 0},
        {NULL, "extra", "{}", "unknown field \"extra\"", 0},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        load_json();
        cJSON *o = cases[c].list ? item(cases[c].list, cases[c].i) : json;
        cJSON_DeleteItemFromObjectCaseSensitive(o, cases[c].key);
        if (cases[c].value)
            cJSON_AddItemToObject(o, cases[c].key, cJSON_Parse(cases[c].value));
        store_json();
        expect_error(cases[c].want);
    }
}

Test(plan, a_field_given_twice_is_refused)
{
    load_json();
    cJSON_AddItemToObject(item("kernels", 0), "nargs", cJSON_CreateNumber(2));
    store_json();
    expect_error("kernels[0]: field \"nargs\" appears twice");
}

/* ---- refusals: plans whose meaning is wrong (written with a correct hash) ---- */

typedef void (*Breaker)(Plan *p);

static void refused(Breaker breaker, const char *want)
{
    Plan *p = sample();
    breaker(p);
    write_ok(p);
    plan_free(p);
    expect_error(want);
}

static void offset_out_of_slab(Plan *p)
{
    p->tensors[4].offset = 512;
}
static void offset_misaligned(Plan *p)
{
    p->tensors[1].offset = 65;
}
static void kernel_out_of_range(Plan *p)
{
    p->instrs[1].kernel = 3;
}
static void gemm_too_big(Plan *p)
{
    p->instrs[0].gemm.m = 5;
    p->instrs[0].gemm.ldc = 4;
    p->instrs[0].gemm.n = 4;
}
static void gemm_batch_too_big(Plan *p)
{
    p->instrs[0].gemm.batch = 2;
    p->instrs[0].gemm.stride_b = 1; /* A and C shared, B slides one element */
}
static void gemm_ld_too_small(Plan *p)
{
    p->instrs[0].gemm.trans_a = 1; /* A is then k x m = 3 x 4: lda 3 < 4 */
}
static void gemm_dtypes_differ(Plan *p)
{
    p->tensors[2].dtype = PD_F64;
    p->tensors[2].bytes = 160;
    p->slab_bytes = 1024;
    p->tensors[3].offset = 320;
    p->tensors[4].offset = 384;
    p->tensors[5].offset = 448;
    p->tensors[6].offset = 512;
}
static void bytes_inconsistent(Plan *p)
{
    p->tensors[0].bytes = 56;
}
static void shape_negative(Plan *p)
{
    p->tensors[2].shape[1] = -5;
}
static void arg_count_mismatch(Plan *p)
{
    p->kernels[0].nargs = 3;
}
static void arg_out_of_range(Plan *p)
{
    p->instrs[2].args[1] = 7;
}
static void loss_out_of_range(Plan *p)
{
    p->loss = 9;
}
static void loss_not_a_scalar(Plan *p)
{
    p->grad_norm = 2;
}
static void copy_sizes_differ(Plan *p)
{
    p->instrs[2].args[1] = 1;
}
static void unknown_init(Plan *p)
{
    free(p->tensors[0].init);
    p->tensors[0].init = strdup("xavier");
}
static void duplicate_name(Plan *p)
{
    p->tensors[6].name[0] = 'x';
    p->tensors[6].name[1] = 0;
}
static void limit_on_a_float(Plan *p)
{
    p->tensors[1].limit = 3;
}
static void step_not_scalar(Plan *p)
{
    p->tensors[4].role = PT_STEP;
    p->tensors[4].dtype = PD_I32;
}
static void bad_kernel_name(Plan *p)
{
    p->kernels[0].name[0] = '0';
}
static void bad_phase(Plan *p)
{
    p->instrs[2].phase = 4;
}
static void group_of_one(Plan *p)
{
    p->instrs[1].group = 1;
}
static void group_past_the_end(Plan *p)
{
    p->instrs[1].group = 3;
}
static void group_over_a_copy(Plan *p)
{
    p->instrs[1].group = 2;
}

Test(plan, plans_with_a_wrong_meaning_are_refused_with_the_field)
{
    refused(offset_out_of_slab,
            "tensors[4].offset: bytes [512, 516) lie outside the slab (512 bytes)");
    refused(offset_misaligned, "tensors[1].offset: 65 is not a multiple of 64");
    refused(kernel_out_of_range, "instrs[1].kernel: 3 out of range (1 kernels)");
    refused(gemm_too_big, "instrs[0].gemm: A (tensors[1], 12 elements) is too small: the gemm "
                          "touches element 14");
    refused(gemm_batch_too_big, "instrs[0].gemm: B (tensors[0], 15 elements) is too small: the "
                                "gemm touches element 15");
    refused(gemm_ld_too_small, "instrs[0].gemm.lda: 3 is less than 4");
    refused(gemm_dtypes_differ, "instrs[0].gemm: operands are f32, f32 and f64");
    refused(bytes_inconsistent, "tensors[0].bytes: 56, but 15 elements of f32 take 60");
    refused(shape_negative, "tensors[2].shape: negative or too large");
    refused(arg_count_mismatch, "instrs[1].args: 2 arguments, but kernel \"k0\" takes 3");
    refused(arg_out_of_range, "instrs[2].args: tensor 7 out of range (7 tensors)");
    refused(loss_out_of_range, "loss: tensor 9 out of range");
    refused(loss_not_a_scalar, "grad_norm: tensors[2] must be a rank-0 f32 or f64 tensor");
    refused(copy_sizes_differ, "instrs[2]: copy of 48 bytes into a tensor of 60");
    refused(unknown_init,
            "tensors[0].init: \"xavier\" is not zeros, ones, normal, uniform or constant");
    refused(duplicate_name, "tensors[6].name: \"x\" is also the name of tensors[1]");
    refused(limit_on_a_float, "tensors[1].limit: 3 (only i32 inputs have a limit > 0)");
    refused(step_not_scalar, "tensors[4]: a step tensor must be f32[]");
    refused(bad_kernel_name, "kernels[0].name: \"00\" is not a C identifier");
    refused(bad_phase, "instrs[2].phase: out of range");
    refused(group_of_one, "instrs[1].group: 1 is not a group of the instructions that follow");
    refused(group_past_the_end, "instrs[1].group: 3 is not a group of the instructions that follow");
    refused(group_over_a_copy, "instrs[1].group: instrs[2] is not a kernel of its stage");
}

/* ---- pipeline stages ---- */

static void p2p(PlanInstr *in, PlanCollKind op, int t, int stage, int peer, int tag)
{
    *in =
        (PlanInstr){.kind = PI_COLL, .nargs = 1, .args = ints(1, &t), .layer = -1, .stage = stage};
    in->coll = (PlanColl){.op = op, .naxes = 1, .axes = {0}, .dim = -1, .dim2 = -1, .bytes = 16};
    in->coll.peer = peer;
    in->coll.tag = tag;
}

/* Mesh pp=2 (pipeline).  0 x input f32[4] (every stage)   2 r    temp f32[4], stage 1
 *                         1 h temp  f32[4], stage 0       3 loss temp f32[],  stage 1
 * instrs: h = x (copy, stage 0); send h to stage 1 (tag 7); recv r from stage 0
 * (tag 7, stage 1); loss = k0(r) (stage 1). Each stage its own slab: x at 0 and
 * loss (an output: broadcast to every stage) at 64 on both, then h at 128 on
 * stage 0 (slab 192) and r at 128 on stage 1 (slab 256: one spare block). */
static Plan *two_stages(void)
{
    Plan *p = calloc(1, sizeof *p);
    p->version = PLAN_VERSION;
    p->model = strdup("pipe");
    p->naxes = 1;
    p->axes = calloc(1, sizeof *p->axes);
    p->axes[0] = (PlanAxis){strdup("pp"), strdup("pipeline"), 2};
    p->slab_bytes = 256;
    p->stage_slab_bytes = malloc(2 * sizeof *p->stage_slab_bytes);
    p->stage_slab_bytes[0] = 192;
    p->stage_slab_bytes[1] = 256;
    p->ntensors = 4;
    p->tensors = calloc(4, sizeof *p->tensors);
    tensor(p, 0, "x", PD_F32, PT_INPUT, 1, (int64_t[]){4}, 0);
    tensor(p, 1, "", PD_F32, PT_TEMP, 1, (int64_t[]){4}, 128);
    tensor(p, 2, "", PD_F32, PT_TEMP, 1, (int64_t[]){4}, 128);
    tensor(p, 3, "loss", PD_F32, PT_TEMP, 0, NULL, 64);
    p->tensors[1].stage = 0;
    p->tensors[2].stage = p->tensors[3].stage = 1;
    p->nkernels = 1;
    p->kernels = calloc(1, sizeof *p->kernels);
    p->kernels[0] = (PlanKernel){strdup("k0"), 2, 1, 4, 256};
    p->ninstrs = 4;
    p->instrs = calloc(4, sizeof *p->instrs);
    p->instrs[0] =
        (PlanInstr){.kind = PI_COPY, .nargs = 2, .args = ints(2, (int[]){1, 0}), .layer = -1};
    p2p(&p->instrs[1], PC_SEND, 1, 0, 1, 7);
    p2p(&p->instrs[2], PC_RECV, 2, 1, 0, 7);
    p->instrs[3] = (PlanInstr){
        .kind = PI_KERNEL, .nargs = 2, .args = ints(2, (int[]){3, 2}), .layer = -1, .stage = 1};
    p->kernel_source = strdup(SOURCE);
    p->loss = 3;
    p->lr = p->grad_norm = -1;
    return p;
}

Test(plan, stages_peer_and_tag_survive_a_round_trip)
{
    char err[512] = "";
    Plan *p = two_stages();
    cr_assert_eq(plan_stages(p), 2);
    cr_assert_str_eq(plan_coll_name(PC_SEND), "send");
    cr_assert_str_eq(plan_coll_name(PC_RECV), "recv");
    cr_assert_eq(plan_check(p, err, sizeof err), 0, "%s", err);
    char *text = plan_to_json(p, err, sizeof err);
    cr_assert_not_null(text, "%s", err);
    Plan *q = plan_parse("mem", text, strlen(text), err, sizeof err);
    cr_assert_not_null(q, "%s", err);
    same_plan(p, q);
    /* a default is not written: stage -1 of a tensor, stage 0 of an instruction */
    cJSON *root = cJSON_Parse(text);
    cJSON *tensors = cJSON_GetObjectItem(root, "tensors"),
          *instrs = cJSON_GetObjectItem(root, "instrs");
    cr_assert_null(cJSON_GetObjectItem(cJSON_GetArrayItem(tensors, 0), "stage"));
    cr_assert_eq(cJSON_GetObjectItem(cJSON_GetArrayItem(tensors, 2), "stage")->valueint, 1);
    cr_assert_eq(cJSON_GetObjectItem(cJSON_GetArrayItem(tensors, 1), "stage")->valueint, 0);
    cr_assert_null(cJSON_GetObjectItem(cJSON_GetArrayItem(instrs, 1), "stage"));
    cr_assert_null(cJSON_GetObjectItem(cJSON_GetArrayItem(instrs, 0), "peer"));
    cJSON *recv = cJSON_GetArrayItem(instrs, 2);
    cr_assert_str_eq(cJSON_GetObjectItem(recv, "op")->valuestring, "recv");
    cr_assert_eq(cJSON_GetObjectItem(recv, "stage")->valueint, 1);
    cr_assert_eq(cJSON_GetObjectItem(recv, "peer")->valueint, 0);
    cr_assert_eq(cJSON_GetObjectItem(recv, "tag")->valueint, 7);
    cJSON_Delete(root);
    /* every new field is in the hash */
    char h[17];
    for (int which = 0; which < 4; which++) {
        int *f[] = {&q->tensors[2].stage, &q->instrs[3].stage, &q->instrs[1].coll.peer,
                    &q->instrs[1].coll.tag};
        int old = *f[which];
        *f[which] = old + 1;
        plan_hash(q, h);
        cr_assert_str_neq(h, p->hash, "field %d is not hashed", which);
        *f[which] = old;
    }
    q->stage_slab_bytes[0] += 64;
    plan_hash(q, h);
    cr_assert_str_neq(h, p->hash, "stage_slab_bytes is not hashed");
    q->stage_slab_bytes[0] -= 64;
    /* stage_slab_bytes NULL: every stage's slab is slab_bytes, hashed as such */
    free(p->stage_slab_bytes);
    p->stage_slab_bytes = NULL;
    plan_hash(p, h);
    cr_assert_eq(plan_stage_slab(p, 1), 256);
    q->stage_slab_bytes[0] = 256;
    plan_hash(q, p->hash);
    cr_assert_str_eq(h, p->hash);
    free(text);
    plan_free(p);
    plan_free(q);
}

/* A one-stage plan's JSON has no "stage", "peer" or "tag" at all. */
Test(plan, a_one_stage_plan_writes_no_stage)
{
    char err[512] = "";
    Plan *p = sample();
    cr_assert_eq(plan_stages(p), 1);
    char *text = plan_to_json(p, err, sizeof err);
    cr_assert_not_null(text, "%s", err);
    cr_assert_null(strstr(text, "\"stage\""), "%s", text);
    cr_assert_null(strstr(text, "\"peer\""), "%s", text);
    free(text);
    plan_free(p);
}

/* plan_check on the two-stage plan after breaker: the message, which names the field. */
static void check_refuses(Breaker breaker, const char *want)
{
    char err[512] = "";
    Plan *p = two_stages();
    breaker(p);
    cr_assert_eq(plan_check(p, err, sizeof err), -1, "want \"%s\": the plan passed", want);
    cr_assert(strstr(err, want), "want \"%s\" in: %s", want, err);
    plan_free(p);
}

static void peer_out_of_range(Plan *p)
{
    p->instrs[1].coll.peer = 2;
}
static void peer_is_own_stage(Plan *p)
{
    p->instrs[2].coll.peer = 1;
}
static void instr_stage_out_of_range(Plan *p)
{
    p->instrs[3].stage = 2;
}
static void instr_stage_negative(Plan *p)
{
    p->instrs[0].stage = -1;
}
static void tensor_stage_out_of_range(Plan *p)
{
    p->tensors[2].stage = 2;
}
static void tensor_stage_below_minus_one(Plan *p)
{
    p->tensors[0].stage = -2;
}
static void send_of_two_tensors(Plan *p)
{
    free(p->instrs[1].args);
    p->instrs[1].args = ints(2, (int[]){1, 2});
    p->instrs[1].nargs = 2;
}
static void tag_too_large(Plan *p)
{
    p->instrs[1].coll.tag = 32768;
}
static void tag_negative(Plan *p)
{
    p->instrs[2].coll.tag = -1;
}
static void send_over_no_axes(Plan *p)
{
    p->instrs[1].coll.naxes = 0;
}
static void outside_its_stage_slab(Plan *p)
{
    p->stage_slab_bytes[1] = 128; /* r at 128 */
    p->stage_slab_bytes[0] = 256;
}
static void output_outside_a_stage_slab(Plan *p)
{
    p->tensors[3].offset = 192; /* inside stage 1's, not stage 0's */
}
static void largest_stage_slab_is_not_the_slab(Plan *p)
{
    p->stage_slab_bytes[1] = 192;
}
static void stage_slab_beyond_the_slab(Plan *p)
{
    p->stage_slab_bytes[0] = 320;
}
static void touches_another_stages_tensor(Plan *p)
{
    p->instrs[3].args[1] = 1; /* h lives on stage 0 only */
}
static void stage_tensor_split_over_pp(Plan *p)
{
    p->tensors[1].nsplit[0] = 1;
    p->tensors[1].split[0][0] = 0;
}

Test(plan, bad_stages_peers_tags_and_sends_are_refused_with_the_field)
{
    check_refuses(peer_out_of_range, "instrs[1].coll.peer: 2 is outside [0, 2)");
    check_refuses(peer_is_own_stage, "instrs[2].coll.peer: 1 is the instruction's own stage");
    check_refuses(instr_stage_out_of_range, "instrs[3].stage: 2 is outside [0, 2)");
    check_refuses(instr_stage_negative, "instrs[0].stage: -1 is outside [0, 2)");
    check_refuses(tensor_stage_out_of_range, "tensors[2].stage: 2 is outside [-1, 2)");
    check_refuses(tensor_stage_below_minus_one, "tensors[0].stage: -2 is outside [-1, 2)");
    check_refuses(send_of_two_tensors, "instrs[1].args: a send takes 1 tensor, not 2");
    check_refuses(tag_too_large, "instrs[1].coll.tag: 32768 is outside [0, 32767]");
    check_refuses(tag_negative, "instrs[2].coll.tag: -1 is outside [0, 32767]");
    check_refuses(send_over_no_axes, "instrs[1].coll.axes: a send runs over the pipeline axes");
    check_refuses(stage_tensor_split_over_pp,
                  "tensors[1].split: a tensor of stage 0 is split over the pipeline axis 0");
    check_refuses(outside_its_stage_slab, "tensors[2].offset: bytes [128, 144) lie outside the "
                                          "slab (128 bytes on its stage)");
    check_refuses(output_outside_a_stage_slab, "tensors[3].offset: bytes [192, 196) lie outside "
                                               "the slab (192 bytes on some stage)");
    check_refuses(largest_stage_slab_is_not_the_slab,
                  "slab_bytes: 256, but the largest stage slab is 192");
    check_refuses(stage_slab_beyond_the_slab,
                  "stage_slab_bytes[0]: 320 is more than slab_bytes 256");
    check_refuses(touches_another_stages_tensor,
                  "instrs[3]: an instruction of stage 1 touches tensors[1] of stage 0");
}

/* A one-stage plan has stage 0 only; its instructions cannot name another. */
Test(plan, a_one_stage_plan_refuses_stage_1)
{
    char err[512] = "";
    Plan *p = sample();
    p->instrs[2].stage = 1;
    cr_assert_eq(plan_check(p, err, sizeof err), -1);
    cr_assert(strstr(err, "instrs[2].stage: 1 is outside [0, 1)"), "%s", err);
    plan_free(p);
}

/* peer and tag: required on a send or recv, unknown on any other collective. */
Test(plan, peer_and_tag_belong_to_send_and_recv_only)
{
    char err[512] = "", *text;
    for (int c = 0; c < 2; c++) {
        Plan *p = two_stages();
        cr_assert_not_null(text = plan_to_json(p, err, sizeof err), "%s", err);
        plan_free(p);
        cJSON *root = cJSON_Parse(text),
              *send = cJSON_GetArrayItem(cJSON_GetObjectItem(root, "instrs"), 1);
        free(text);
        if (c == 0)
            cJSON_DeleteItemFromObject(send, "tag");
        else
            cJSON_ReplaceItemInObject(send, "op", cJSON_CreateString("all_reduce"));
        text = cJSON_Print(root);
        cJSON_Delete(root);
        cr_assert_null(plan_parse("mem", text, strlen(text), err, sizeof err));
        cr_assert(strstr(err, c == 0 ? "mem: instrs[1].tag: missing"
                                     : "mem: instrs[1]: unknown field \"peer\" (only send and "
                                       "recv have it)"),
                  "%s", err);
        free(text);
    }
}

/* ---- the writer refuses what JSON cannot hold ---- */

Test(plan, write_refuses_integers_beyond_2_to_the_53)
{
    char err[512] = "";
    Plan *p = sample();
    p->slab_bytes = (1ULL << 53) + 64;
    cr_assert_eq(plan_write(path, p, err, sizeof err), -1);
    cr_assert(strstr(err, "slab_bytes") && strstr(err, "2^53"), "%s", err);
    p->slab_bytes = 1ULL << 53; /* the largest exact one is fine */
    cr_assert_eq(plan_write(path, p, err, sizeof err), 0, "%s", err);
    p->tensors[0].init_arg = NAN;
    cr_assert_eq(plan_write(path, p, err, sizeof err), -1);
    cr_assert(strstr(err, "tensors[0].init_arg: nan is not finite"), "%s", err);
    plan_free(p);
}

/* ---- no input crashes the loader ---- */

static uint64_t next(uint64_t *s)
{
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return *s >> 33;
}

Test(plan, random_byte_edits_never_crash_and_never_pass)
{
    Plan *p = sample();
    write_ok(p);
    plan_free(p);
    size_t len;
    char *text = read_text(&len), *copy = malloc(len + 1);
    uint64_t s = 42;
    for (int round = 0; round < 3000; round++) {
        memcpy(copy, text, len);
        int edits = 1 + (int)(next(&s) % 3);
        for (int e = 0; e < edits; e++)
            copy[next(&s) % len] =
                round % 2 ? (char)next(&s) : "0123456789{}[],:\"-.e"[next(&s) % 20];
        if (!memcmp(copy, text, len))
            continue;
        write_text(copy, len);
        char err[512];
        Plan *q = plan_load(path, err, sizeof err);
        /* An edit may only pass if it changed nothing that counts (whitespace). */
        if (q) {
            char h[17];
            plan_hash(q, h);
            cr_assert_str_eq(h, q->hash);
            plan_free(q);
        }
    }
    free(copy);
    free(text);
}

/* Format 4: a kernel's GPU launch, the CUDA source and a GEMM's bias
 * epilogue come back from the file, and nonsense in them is refused. */
Test(plan, gpu_launch_source_and_bias_epilogue_survive_a_round_trip)
{
    char err[512] = "";
    Plan *p = sample();
    p->kernels[0].grid = 3000000000LL / 2;
    p->kernels[0].block = 1024;
    free(p->gpu_source);
    p->gpu_source = strdup("extern \"C\" __global__ void k0(float *a0, float *a1) {}\n");
    p->tensors = realloc(p->tensors, sizeof *p->tensors * 8);
    memset(&p->tensors[7], 0, sizeof p->tensors[7]);
    tensor(p, 7, "bias", PD_F32, PT_TEMP, 1, (int64_t[]){5}, 512);
    p->ntensors = 8;
    p->slab_bytes = 576;
    p->instrs[0].gemm.epilogue = PE_BIAS;
    p->instrs[0].gemm.bias = 7;
    cr_assert_eq(plan_check(p, err, sizeof err), 0, "%s", err);
    write_ok(p);
    Plan *q = plan_load(path, err, sizeof err);
    cr_assert_not_null(q, "%s", err);
    cr_assert_eq(q->kernels[0].grid, 1500000000LL);
    cr_assert_eq(q->kernels[0].block, 1024);
    cr_assert_str_eq(q->gpu_source, p->gpu_source);
    cr_assert_eq(q->instrs[0].gemm.epilogue, PE_BIAS);
    cr_assert_eq(q->instrs[0].gemm.bias, 7);
    cr_assert_eq(q->instrs[2].gemm.epilogue, PE_NONE);
    plan_free(q);

    p->kernels[0].block = 1025;
    cr_assert_eq(plan_check(p, err, sizeof err), -1);
    cr_assert(strstr(err, "kernels[0]: grid 1500000000 of block 1025"), "%s", err);
    p->kernels[0].block = 0;
    cr_assert_eq(plan_check(p, err, sizeof err), -1, "grid without block passed");
    p->kernels[0].grid = 0; /* no launch at all is fine */
    cr_assert_eq(plan_check(p, err, sizeof err), 0, "%s", err);

    p->tensors[7].shape[0] = 4;
    p->tensors[7].bytes = 16;
    cr_assert_eq(plan_check(p, err, sizeof err), -1);
    cr_assert(strstr(err, "instrs[0].gemm.bias: tensors[7] must be 5 elements of f32, with beta 0"),
              "%s", err);
    p->tensors[7].shape[0] = 5;
    p->tensors[7].bytes = 20;
    p->instrs[0].gemm.beta = 1;
    cr_assert_eq(plan_check(p, err, sizeof err), -1, "a bias with beta 1 passed");
    p->instrs[0].gemm.beta = 0;
    p->instrs[0].gemm.epilogue = 7;
    cr_assert_eq(plan_check(p, err, sizeof err), -1);
    cr_assert(strstr(err, "gemm.epilogue: 7 is not an epilogue"), "%s", err);
    p->instrs[0].gemm.epilogue = PE_NONE;
    /* an f32 C is for bf16 products only: f64 A and B would write doubles into it */
    for (int t = 0; t < 2; t++) {
        p->tensors[t].dtype = PD_F64;
        p->tensors[t].bytes *= 2;
    }
    cr_assert_eq(plan_check(p, err, sizeof err), -1, "f64 x f64 into f32 passed");
    cr_assert(strstr(err, "operands are f64, f64 and f32"), "%s", err);
    for (int t = 0; t < 2; t++) {
        p->tensors[t].dtype = PD_BF16;
        p->tensors[t].bytes /= 4;
    }
    err[0] = 0; /* (the sample's copy of w then has the wrong size: only the gemm matters) */
    plan_check(p, err, sizeof err);
    cr_assert(!strstr(err, "gemm"), "bf16 x bf16 into f32 refused: %s", err);
    plan_free(p);
}

/* The staging beside the slab is what runtime/gpu stages, instruction by
 * instruction: the destination of a copy whose tensors may share bytes; the
 * output of an all_gather (the input of a reduce_scatter) along a dimension
 * other than the outermost; twice an all_to_all's input; nothing for an
 * all-reduce, a plain copy or an outermost gather. The device's is the
 * largest. On the CPU a bucket's inputs. */
Test(plan, staging_is_what_each_copy_and_collective_stages)
{
    Plan p = {0};
    p.ntensors = 6;
    p.tensors = calloc(6, sizeof(PlanTensor));
    const int64_t s44[] = {4, 4}, s84[] = {8, 4}, s48[] = {4, 8};
    tensor(&p, 0, "a", PD_F32, PT_TEMP, 2, s44, 0);    /* 64 bytes at 0 */
    tensor(&p, 1, "b", PD_F32, PT_TEMP, 2, s44, 32);   /* overlaps a */
    tensor(&p, 2, "c", PD_F32, PT_TEMP, 2, s44, 256);  /* apart */
    tensor(&p, 3, "g0", PD_F32, PT_TEMP, 2, s84, 512); /* a gathered along dim 0 */
    tensor(&p, 4, "g1", PD_F32, PT_TEMP, 2, s48, 768); /* a gathered along dim 1 */
    tensor(&p, 5, "f", PD_F32, PT_TEMP, 2, s44, 0);    /* a frame tensor */
    p.tensors[5].frame = 1;
    int ab[] = {0, 1}, ca[] = {2, 0}, aa[] = {0, 0}, g0[] = {0, 3}, g1[] = {0, 4}, r1[] = {4, 0},
        fc[] = {5, 2};
    struct {
        PlanInstrKind kind;
        PlanCollKind op;
        int dim, *args;
        uint64_t want;
    } cases[] = {
        {PI_COPY, 0, 0, ab, 64},                  /* overlapping: through the staging */
        {PI_COPY, 0, 0, ca, 0},                   /* apart: straight */
        {PI_COPY, 0, 0, aa, 0},                   /* the same bytes: nothing */
        {PI_COPY, 0, 0, fc, 64},                  /* a frame's: may overlap */
        {PI_COLL, PC_ALL_GATHER, 0, g0, 0},       /* outermost: NCCL's own layout */
        {PI_COLL, PC_ALL_GATHER, 1, g1, 128},     /* inner: the gathered chunks */
        {PI_COLL, PC_REDUCE_SCATTER, 1, r1, 128}, /* inner: the blocks to reduce */
        {PI_COLL, PC_REDUCE_SCATTER, 0, g0 + 0, 0},
        {PI_COLL, PC_ALL_TO_ALL, 1, ca, 128},     /* sent and received blocks */
        {PI_COLL, PC_ALL_REDUCE, 0, ca, 0},
    };
    int n = (int)(sizeof cases / sizeof cases[0]);
    cases[7].args = (int[]){3, 0};
    p.ninstrs = n;
    p.instrs = calloc((size_t)n, sizeof(PlanInstr));
    uint64_t most = 0;
    for (int i = 0; i < n; i++) {
        PlanInstr *in = &p.instrs[i];
        in->kind = cases[i].kind, in->nargs = 2, in->args = cases[i].args;
        in->coll.op = cases[i].op, in->coll.dim = cases[i].dim;
        cr_expect_eq(plan_instr_scratch(&p, in, 1), cases[i].want, "case %d: %lu bytes, want %lu",
                     i, (unsigned long)plan_instr_scratch(&p, in, 1),
                     (unsigned long)cases[i].want);
        most = cases[i].want > most ? cases[i].want : most;
    }
    cr_expect_eq(plan_scratch_bytes(&p, 1), most);
    /* the CPU's: twice an all_to_all's input, a bucket's inputs */
    cr_expect_eq(plan_instr_scratch(&p, &p.instrs[8], 0), 128);
    int bucket[] = {0, 1, 2, 5};
    p.instrs[9].args = bucket, p.instrs[9].nargs = 4;
    cr_expect_eq(plan_instr_scratch(&p, &p.instrs[9], 0), 128);
    cr_expect_eq(plan_instr_scratch(&p, &p.instrs[0], 0), 0);
    for (int t = 0; t < p.ntensors; t++)
        free(p.tensors[t].name), free(p.tensors[t].init);
    free(p.tensors), free(p.instrs);
}
