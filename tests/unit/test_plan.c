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
#include "tests/support/plan_sample.h"

TestSuite(plan, .init = make_dir, .fini = remove_dir);

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

/* Change field `which` (28 on) of p's instructions and what follows; 0 once
 * there are no more fields. */
static int mutate_late(Plan *p, int which)
{
    PlanTensor *t = &p->tensors[3];
    PlanGemm *g = &p->instrs[0].gemm;
    switch (which) {
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

/* Change field `which` of p; 0 once there are no more fields. */
static int mutate(Plan *p, int which)
{
    PlanTensor *t = &p->tensors[3];
    PlanGemm *g = &p->instrs[0].gemm;
    if (which >= 28)
        return mutate_late(p, which);
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

/* ---- the placement: ranks numbered by the axes' strides ---- */

/* The sample's one axis becomes three, dp = 2, tp = 3, pp = 2, placed with
 * tp innermost (stride 1), pp next (3), dp outermost (6). */
static void three_axes(Plan *p, int64_t dp, int64_t tp, int64_t pp)
{
    for (int a = 0; a < p->naxes; a++)
        free(p->axes[a].name), free(p->axes[a].role);
    free(p->axes);
    p->naxes = 3;
    p->axes = calloc(3, sizeof *p->axes);
    p->axes[0] = (PlanAxis){strdup("dp"), strdup("data"), 2, dp};
    p->axes[1] = (PlanAxis){strdup("tp"), strdup("tensor"), 3, tp};
    p->axes[2] = (PlanAxis){strdup("pp"), strdup("data"), 2, pp};
}

Test(plan, placement_numbers_ranks_by_the_strides_and_round_trips)
{
    char err[512] = "";
    Plan *p = sample();
    three_axes(p, 0, 0, 0);
    char row_major[17], placed[17];
    plan_hash(p, row_major);
    int seen[12] = {0}, c[PLAN_MAX_AXES];
    for (int r = 0; r < 12; r++) { /* row-major: the last axis innermost */
        plan_coords(p, r, c);
        cr_assert(c[2] == r % 2 && c[1] == r / 2 % 3 && c[0] == r / 6, "rank %d", r);
    }
    three_axes(p, 6, 1, 3);
    cr_assert_eq(plan_check(p, err, sizeof err), 0, "%s", err);
    for (int r = 0; r < 12; r++) {
        plan_coords(p, r, c);
        cr_assert(c[1] == r % 3 && c[2] == r / 3 % 2 && c[0] == r / 6, "rank %d: tp innermost", r);
        cr_assert_eq(plan_rank(p, c), r);
        seen[c[0] * 6 + c[1] * 2 + c[2]]++;
    }
    for (int k = 0; k < 12; k++)
        cr_assert_eq(seen[k], 1, "coordinates %d held by %d ranks", k, seen[k]);
    plan_hash(p, placed);
    cr_assert_str_neq(placed, row_major, "the placement is part of the plan's hash");
    write_ok(p);
    Plan *q = plan_load(path, err, sizeof err);
    cr_assert_not_null(q, "%s", err);
    same_plan(p, q);
    plan_free(q);
    plan_free(p);
}

static void stride_not_a_placement(Plan *p) { three_axes(p, 6, 1, 2); }
static void stride_on_some_axes(Plan *p) { three_axes(p, 6, 1, 0); }

Test(plan, strides_that_are_no_placement_are_refused)
{
    refused(stride_not_a_placement, "axes[2] (pp): stride 2 where the axes inside it make 3 (not a "
                                    "placement of the mesh)");
    refused(stride_on_some_axes, "axes: a stride on 2 of 3 axes (all or none)");
}

/* ---- the model's parameters (--init-from checks a checkpoint's config by them) ---- */

Test(plan, the_model_config_round_trips_and_is_hashed)
{
    char err[512] = "", before[17], after[17];
    Plan *p = sample();
    plan_hash(p, before);
    p->config = calloc(3, sizeof *p->config);
    p->config[0] = (PlanParam){strdup("H"), 12};
    p->config[1] = (PlanParam){strdup("D"), 768};
    p->nconfig = 2;
    plan_hash(p, after);
    cr_assert_str_neq(before, after, "the config is part of the plan's hash");
    write_ok(p);
    Plan *q = plan_load(path, err, sizeof err);
    cr_assert_not_null(q, "%s", err);
    cr_assert_eq(q->nconfig, 2);
    cr_assert_str_eq(q->config[0].name, "H");
    cr_assert_eq(q->config[0].value, 12);
    cr_assert_str_eq(q->config[1].name, "D");
    cr_assert_eq(q->config[1].value, 768);
    plan_free(q);
    plan_free(p);
}

Test(plan, a_config_of_other_than_integers_is_refused)
{
    load_json();
    cJSON *c = cJSON_AddObjectToObject(json, "config");
    cJSON_AddNumberToObject(c, "H", 1.5);
    store_json();
    expect_error("config.H: expected an integer");
    load_json();
    cJSON_AddStringToObject(json, "config", "H=12");
    store_json();
    expect_error("config: expected an object of integers");
}
