/* test_plan_stages.c: the plan format's pipeline stages (plan/): peers,
 * tags and schedule tables survive a round trip, and the checker refuses
 * stages that cannot communicate (a send without its receive, mismatched
 * collectives, a deadlock), each with its message. The plan is the shared
 * hand-built one (tests/support/plan_sample.h) cut into stages. */
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
    p->axes[0] = (PlanAxis){strdup("pp"), strdup("pipeline"), 2, 0};
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

