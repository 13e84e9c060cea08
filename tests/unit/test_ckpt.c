/* test_ckpt.c: checkpoints (runtime/ckpt.c) on a plan built here by hand:
 * params of every float dtype and odd shapes (one name that needs JSON
 * escaping), optimizer state, an input, a temporary and the step tensor.
 * A save and a load restore every param and state tensor bit for bit and the
 * metadata, and nothing else; the file is read back here as plain safetensors;
 * the newest step wins and a torn temporary file is ignored; every refusal
 * (another model or plan, a tensor missing or of another shape or dtype, a
 * truncated or corrupt file) names the file and leaves the runtime unchanged.
 * On a mesh of two devices (threads backend): the file holds whole tensors, the
 * same bytes as one device's from the same values; every rank gets its blocks
 * back; a refused load changes nothing; a save that fails on rank 0 fails on
 * every rank and leaves no temporary file. */
#define _XOPEN_SOURCE 700 /* nftw */
#include <criterion/criterion.h>
#include <cjson/cJSON.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runtime/comm/comm.h"
#include "runtime/runtime.h"
#include "tests/support/tmpdir.h"

#define ODD_NAME "emb \"q\" \\ \xc3\xa9" /* a quote, a backslash and an e-acute */

static char dir[64], cache[96], ck[96];

static void make_dir(void)
{
    tmpdir_make(dir, "ckpt");
    snprintf(cache, sizeof cache, "%s/cache", dir);
    snprintf(ck, sizeof ck, "%s/ckpt", dir);
}

static void remove_dir(void)
{
    tmpdir_remove(dir);
}

TestSuite(ckpt, .init = make_dir, .fini = remove_dir);

/* ---- a plan ---- */

static void tensor(Plan *p, int i, const char *name, PlanDType dt, PlanRole role, int rank,
                   const int64_t *shape, const char *init)
{
    PlanTensor *t = &p->tensors[i];
    int64_t n = 1;
    t->name = strdup(name);
    t->init = strdup(init);
    t->init_arg = 0.5;
    t->dtype = dt;
    t->role = role;
    t->rank = rank;
    for (int d = 0; d < rank; d++)
        n *= t->shape[d] = shape[d];
    t->bytes = (uint64_t)n * plan_dtype_size(dt);
    t->offset = p->slab_bytes;
    t->layer = t->value = -1;
    p->slab_bytes += (t->bytes + PLAN_ALIGN - 1) / PLAN_ALIGN * PLAN_ALIGN;
}

/* No instructions: checkpoints only look at the tensors. */
static Plan *test_plan(const char *model)
{
    Plan *p = calloc(1, sizeof *p);
    p->version = PLAN_VERSION;
    p->model = strdup(model);
    p->ntensors = 9;
    p->tensors = calloc(9, sizeof *p->tensors);
    p->instrs = calloc(1, sizeof *p->instrs);
    p->kernels = calloc(1, sizeof *p->kernels);
    p->kernel_source = strdup("");
    p->loss = p->lr = p->grad_norm = -1;
    tensor(p, 0, "w", PD_F32, PT_PARAM, 2, (int64_t[]){3, 5}, "normal");
    tensor(p, 1, "b", PD_F64, PT_PARAM, 1, (int64_t[]){7}, "zeros");
    tensor(p, 2, "h.0.attn.w", PD_F32, PT_PARAM, 2, (int64_t[]){4, 12}, "uniform");
    tensor(p, 3, ODD_NAME, PD_BF16, PT_PARAM, 3, (int64_t[]){2, 3, 1}, "ones");
    tensor(p, 4, "m.w", PD_F32, PT_STATE, 2, (int64_t[]){3, 5}, "");
    tensor(p, 5, "v.b", PD_F16, PT_STATE, 1, (int64_t[]){7}, "");
    tensor(p, 6, "x", PD_F32, PT_INPUT, 1, (int64_t[]){2}, "");
    tensor(p, 7, "", PD_F32, PT_TEMP, 1, (int64_t[]){3}, "");
    tensor(p, 8, "step", PD_F32, PT_STEP, 0, NULL, "");
    return p;
}

static int is_saved(const PlanTensor *t)
{
    return t->role == PT_PARAM || t->role == PT_STATE;
}

static Runtime *open_ok(const Plan *p)
{
    char err[1024] = "";
    Runtime *rt = rt_open(p, cache, err, sizeof err);
    cr_assert_not_null(rt, "%s", err);
    return rt;
}

/* Every byte of every tensor from a generator seeded by seed (NaNs and all). */
static void fill(Runtime *rt, uint32_t seed)
{
    const Plan *p = rt_plan(rt);
    for (int i = 0; i < p->ntensors; i++) {
        unsigned char *b = rt_tensor_data(rt, i);
        for (uint64_t j = 0; j < p->tensors[i].bytes; j++) {
            seed = seed * 1664525u + 1013904223u;
            b[j] = (unsigned char)(seed >> 24);
        }
    }
}

/* A copy of the whole slab (tensor 0 is at offset 0). */
static unsigned char *snapshot(Runtime *rt)
{
    const Plan *p = rt_plan(rt);
    unsigned char *s = malloc(p->slab_bytes);
    memcpy(s, rt_tensor_data(rt, 0), p->slab_bytes);
    return s;
}

/* Tensors of the roles picked by want_saved equal those in the snapshot. */
static void check_tensors(Runtime *rt, const unsigned char *snap, int want_saved)
{
    const Plan *p = rt_plan(rt);
    for (int i = 0; i < p->ntensors; i++) {
        const PlanTensor *t = &p->tensors[i];
        if (is_saved(t) == want_saved)
            cr_assert(!memcmp(rt_tensor_data(rt, i), snap + t->offset, t->bytes),
                      "tensor %d '%s' differs", i, t->name);
    }
}

static void unchanged(Runtime *rt, const unsigned char *snap)
{
    cr_assert(!memcmp(rt_tensor_data(rt, 0), snap, rt_plan(rt)->slab_bytes),
              "a refused load changed the slab");
}

static void save_ok(Runtime *rt, const char *where, int64_t step)
{
    char err[1024] = "";
    CkptMeta m = {step, 1000 + step, 0xfedcba9876543210ULL};
    cr_assert_eq(rt_ckpt_save(rt, where, &m, err, sizeof err), 0, "%s", err);
}

static CkptMeta load_ok(Runtime *rt, const char *where)
{
    char err[1024] = "";
    CkptMeta m = {-7, -7, 7};
    cr_assert_eq(rt_ckpt_load_latest(rt, where, &m, err, sizeof err), 1, "%s", err);
    return m;
}

/* A refused load: -1, a message naming the file and containing want, the
 * slab and the caller's meta untouched. */
static void load_refused(Runtime *rt, const char *file, const char *want)
{
    char err[1024] = "";
    CkptMeta m = {-7, -7, 7};
    unsigned char *snap = snapshot(rt);
    cr_assert_eq(rt_ckpt_load_latest(rt, ck, &m, err, sizeof err), -1, "loaded; want '%s'", want);
    cr_assert(strstr(err, file), "the message does not name %s: %s", file, err);
    cr_assert(strstr(err, want), "want '%s', got: %s", want, err);
    cr_assert(m.step == -7 && m.data_position == -7 && m.seed == 7);
    unchanged(rt, snap);
    free(snap);
}

/* ---- files ---- */

static char *path_in(const char *folder, const char *name)
{
    static char buf[4][256];
    static int k;
    char *out = buf[k++ % 4];
    snprintf(out, sizeof buf[0], "%s/%s", folder, name);
    return out;
}

static unsigned char *read_all(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "%s", path);
    fseek(f, 0, SEEK_END);
    *len = (size_t)ftell(f);
    rewind(f);
    unsigned char *b = malloc(*len + 1);
    cr_assert_eq(fread(b, 1, *len, f), *len);
    fclose(f);
    return b;
}

static void write_all(const char *path, const void *b, size_t len)
{
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f, "%s", path);
    cr_assert_eq(fwrite(b, 1, len, f), len);
    cr_assert_eq(fclose(f), 0);
}

static uint64_t get_le64(const unsigned char *b)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | b[i];
    return v;
}

static void put_le64(unsigned char *b, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        b[i] = (unsigned char)(v >> (8 * i));
}

static int count_entries(const char *folder)
{
    char cmd[256];
    snprintf(cmd, sizeof cmd, "ls -A %s | wc -l", folder);
    FILE *f = popen(cmd, "r");
    int n = -1;
    cr_assert_not_null(f);
    cr_assert_eq(fscanf(f, "%d", &n), 1);
    pclose(f);
    return n;
}

/* Rewrite the header of a checkpoint with edit, keeping its data. */
static void edit_header(const char *path, void (*edit)(cJSON *root))
{
    size_t len;
    unsigned char *b = read_all(path, &len);
    uint64_t hlen = get_le64(b);
    cJSON *root = cJSON_ParseWithLength((const char *)b + 8, hlen);
    cr_assert_not_null(root);
    edit(root);
    char *text = cJSON_PrintUnformatted(root);
    size_t tlen = strlen(text), data = len - 8 - hlen;
    unsigned char *out = malloc(8 + tlen + data);
    put_le64(out, tlen);
    memcpy(out + 8, text, tlen);
    memcpy(out + 8 + tlen, b + 8 + hlen, data);
    write_all(path, out, 8 + tlen + data);
    free(out);
    free(text);
    cJSON_Delete(root);
    free(b);
}

/* ---- a save and a load ---- */

Test(ckpt, a_load_restores_params_and_state_bitwise_and_the_meta)
{
    Plan *p = test_plan("test");
    Runtime *rt = open_ok(p);
    fill(rt, 1);
    unsigned char *saved = snapshot(rt);
    save_ok(rt, ck, 3);
    cr_assert_eq(access(path_in(ck, "step-00000003.safetensors"), F_OK), 0);
    cr_assert_eq(count_entries(ck), 1, "no temporary file is left");
    fill(rt, 2);
    unsigned char *before = snapshot(rt);
    CkptMeta m = load_ok(rt, ck);
    cr_assert_eq(m.step, 3);
    cr_assert_eq(m.data_position, 1003);
    cr_assert_eq(m.seed, 0xfedcba9876543210ULL);
    check_tensors(rt, saved, 1);
    check_tensors(rt, before, 0); /* inputs, temporaries, the step: not checkpointed */
    free(saved);
    free(before);
    rt_close(rt);
    plan_free(p);
}

Test(ckpt, meta_may_be_null_and_data_position_minus_one_round_trips)
{
    Plan *p = test_plan("test");
    Runtime *rt = open_ok(p);
    char err[512] = "";
    CkptMeta m = {0, -1, 0};
    cr_assert_eq(rt_ckpt_save(rt, ck, &m, err, sizeof err), 0, "%s", err);
    cr_assert_eq(access(path_in(ck, "step-00000000.safetensors"), F_OK), 0);
    m = load_ok(rt, ck);
    cr_assert(m.step == 0 && m.data_position == -1 && m.seed == 0);
    cr_assert_eq(rt_ckpt_load_latest(rt, ck, NULL, err, sizeof err), 1, "%s", err);
    rt_close(rt);
    plan_free(p);
}

/* The file read as plain safetensors: length, header, dtypes, shapes,
 * contiguous offsets in plan order, string metadata, the bytes themselves. */
static void check_entry(const cJSON *e, const PlanTensor *t, uint64_t off)
{
    static const char *names[PD_COUNT] = {"F32", "F64", "BF16", "F16", "I32"};
    const cJSON *dtype = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(e, "shape");
    const cJSON *offs = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    cr_assert(cJSON_IsObject(e) && cJSON_IsString(dtype), "tensor '%s'", t->name);
    cr_assert_str_eq(dtype->valuestring, names[t->dtype]);
    cr_assert_eq(cJSON_GetArraySize(shape), t->rank);
    for (int d = 0; d < t->rank; d++)
        cr_assert_eq(cJSON_GetArrayItem(shape, d)->valuedouble, (double)t->shape[d]);
    cr_assert_eq(cJSON_GetArraySize(offs), 2);
    cr_assert_eq(cJSON_GetArrayItem(offs, 0)->valuedouble, (double)off);
    cr_assert_eq(cJSON_GetArrayItem(offs, 1)->valuedouble, (double)(off + t->bytes));
}

static void check_metadata(const cJSON *md, const Plan *p)
{
    char hash[17];
    plan_hash(p, hash);
    const char *want[][2] = {{"format", "tcc-checkpoint"}, {"model", "test"},
                             {"plan_hash", hash},          {"step", "42"},
                             {"data_position", "1042"},    {"seed", "18364758544493064720"}};
    cr_assert_eq(cJSON_GetArraySize(md), 6);
    for (int i = 0; i < 6; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(md, want[i][0]);
        cr_assert(cJSON_IsString(v), "metadata '%s' is not a string", want[i][0]);
        cr_assert_str_eq(v->valuestring, want[i][1]);
    }
}

Test(ckpt, the_file_is_plain_safetensors)
{
    Plan *p = test_plan("test");
    Runtime *rt = open_ok(p);
    fill(rt, 5);
    save_ok(rt, ck, 42);
    size_t len;
    unsigned char *b = read_all(path_in(ck, "step-00000042.safetensors"), &len);
    uint64_t hlen = get_le64(b), off = 0;
    cr_assert(len >= 8 && hlen <= len - 8);
    cr_assert_eq(hlen % 8, 0, "the data starts 8-byte aligned");
    cJSON *root = cJSON_ParseWithLength((const char *)b + 8, hlen);
    cr_assert(cJSON_IsObject(root));
    check_metadata(cJSON_GetObjectItemCaseSensitive(root, "__metadata__"), p);
    cr_assert_eq(cJSON_GetArraySize(root), 1 + 6, "the metadata and the 6 saved tensors");
    const unsigned char *data = b + 8 + hlen;
    for (int i = 0; i < p->ntensors; i++) {
        const PlanTensor *t = &p->tensors[i];
        if (!is_saved(t))
            continue;
        check_entry(cJSON_GetObjectItemCaseSensitive(root, t->name), t, off);
        cr_assert(!memcmp(data + off, rt_tensor_data(rt, i), t->bytes), "'%s'", t->name);
        off += t->bytes;
    }
    cr_assert_eq(8 + hlen + off, len, "nothing after the last tensor");
    cr_assert_not_null(cJSON_GetObjectItemCaseSensitive(root, ODD_NAME), "escaped name");
    cJSON_Delete(root);
    free(b);
    rt_close(rt);
    plan_free(p);
}

/* ---- which checkpoint ---- */

Test(ckpt, the_newest_step_wins)
{
    Plan *p = test_plan("test");
    Runtime *rt = open_ok(p);
    fill(rt, 1);
    save_ok(rt, ck, 3);
    fill(rt, 2);
    unsigned char *twelve = snapshot(rt);
    save_ok(rt, ck, 12);
    fill(rt, 3);
    cr_assert_eq(load_ok(rt, ck).step, 12);
    check_tensors(rt, twelve, 1);
    fill(rt, 4);
    unsigned char *big = snapshot(rt);
    save_ok(rt, ck, 100000000); /* nine digits: still read as a number, not a name */
    cr_assert_eq(access(path_in(ck, "step-100000000.safetensors"), F_OK), 0);
    fill(rt, 5);
    CkptMeta m = load_ok(rt, ck);
    cr_assert_eq(m.step, 100000000);
    cr_assert_eq(m.data_position, 100001000);
    check_tensors(rt, big, 1);
    free(twelve);
    free(big);
    rt_close(rt);
    plan_free(p);
}

Test(ckpt, a_torn_temporary_file_and_other_names_are_ignored)
{
    Plan *p = test_plan("test");
    Runtime *rt = open_ok(p);
    fill(rt, 1);
    unsigned char *three = snapshot(rt);
    save_ok(rt, ck, 3);
    fill(rt, 2);
    save_ok(rt, dir, 4); /* a complete file to cut, as a kill during the write would */
    size_t len;
    unsigned char *b = read_all(path_in(dir, "step-00000004.safetensors"), &len);
    write_all(path_in(ck, ".step-00000004.safetensors.tmp"), b, len / 2);
    write_all(path_in(ck, "step-00000009.safetensors.tmp"), b, len / 3);
    write_all(path_in(ck, "step-.safetensors"), b, 3);
    write_all(path_in(ck, "step-12x.safetensors"), b, 3);
    write_all(path_in(ck, "step-99999999999999999999999.safetensors"), b, 3);
    write_all(path_in(ck, "notes.txt"), b, 3);
    cr_assert_eq(load_ok(rt, ck).step, 3);
    check_tensors(rt, three, 1);
    free(b);
    free(three);
    rt_close(rt);
    plan_free(p);
}

Test(ckpt, a_missing_or_empty_folder_has_no_checkpoint)
{
    Plan *p = test_plan("test");
    Runtime *rt = open_ok(p);
    char err[512] = "";
    CkptMeta m = {-7, -7, 7};
    cr_assert_eq(rt_ckpt_load_latest(rt, ck, &m, err, sizeof err), 0, "%s", err);
    cr_assert_eq(mkdir(ck, 0777), 0);
    cr_assert_eq(rt_ckpt_load_latest(rt, ck, &m, err, sizeof err), 0, "%s", err);
    cr_assert_eq(m.step, -7, "meta is only filled by a load");
    write_all(path_in(dir, "file"), "x", 1);
    cr_assert_eq(rt_ckpt_load_latest(rt, path_in(dir, "file"), &m, err, sizeof err), -1);
    cr_assert(strstr(err, "opendir") && strstr(err, "Not a directory"), "%s", err);
    rt_close(rt);
    plan_free(p);
}

/* ---- saving ---- */

Test(ckpt, a_save_creates_one_folder_level_and_reports_the_rest)
{
    Plan *p = test_plan("test");
    Runtime *rt = open_ok(p);
    char err[512] = "";
    CkptMeta m = {1, -1, 1};
    save_ok(rt, ck, 1); /* ck does not exist yet */
    cr_assert_eq(rt_ckpt_save(rt, path_in(dir, "a/b"), &m, err, sizeof err), -1);
    cr_assert(strstr(err, "mkdir") && strstr(err, "No such file"), "%s", err);
    write_all(path_in(dir, "file"), "x", 1);
    cr_assert_eq(rt_ckpt_save(rt, path_in(dir, "file"), &m, err, sizeof err), -1);
    cr_assert(strstr(err, "not a directory"), "%s", err);
    m.step = -1;
    cr_assert_eq(rt_ckpt_save(rt, ck, &m, err, sizeof err), -1);
    cr_assert(strstr(err, "step must be >= 0"), "%s", err);
    rt_close(rt);
    plan_free(p);
}

Test(ckpt, a_failed_save_leaves_no_temporary_file)
{
    Plan *p = test_plan("test");
    Runtime *rt = open_ok(p);
    char err[512] = "";
    CkptMeta m = {5, -1, 1};
    cr_assert_eq(mkdir(ck, 0777), 0);
    cr_assert_eq(mkdir(path_in(ck, "step-00000005.safetensors"), 0777), 0); /* rename fails */
    cr_assert_eq(rt_ckpt_save(rt, ck, &m, err, sizeof err), -1);
    cr_assert(strstr(err, "rename") && strstr(err, ".step-00000005.safetensors.tmp"), "%s", err);
    cr_assert_eq(count_entries(ck), 1, "only the folder that was in the way");
    rt_close(rt);
    plan_free(p);
}

Test(ckpt, a_name_that_is_not_utf8_is_refused_before_any_write)
{
    Plan *p = test_plan("test");
    free(p->tensors[4].name);
    p->tensors[4].name = strdup("m\xff");
    Runtime *rt = open_ok(p);
    char err[512] = "";
    CkptMeta m = {5, -1, 1};
    cr_assert_eq(rt_ckpt_save(rt, ck, &m, err, sizeof err), -1);
    cr_assert(strstr(err, "tensor 4 is not valid UTF-8"), "%s", err);
    cr_assert_eq(access(ck, F_OK), -1, "nothing was created");
    rt_close(rt);
    plan_free(p);
}

/* ---- refusals ---- */

#define STEP3 "step-00000003.safetensors"

/* rt with a checkpoint at step 3 in ck and other values now. */
static void saved_then_changed(Runtime *rt)
{
    fill(rt, 1);
    save_ok(rt, ck, 3);
    fill(rt, 2);
}

Test(ckpt, another_model_is_refused)
{
    Plan *p = test_plan("test"), *q = test_plan("other");
    Runtime *rt = open_ok(p), *other = open_ok(q);
    saved_then_changed(rt);
    fill(other, 9);
    load_refused(other, STEP3, "checkpoint of model 'test', this plan is 'other'");
    rt_close(rt);
    rt_close(other);
    plan_free(p);
    plan_free(q);
}

Test(ckpt, another_plan_is_refused_by_its_hash)
{
    Plan *p = test_plan("test"), *q = test_plan("test");
    free(q->tensors[1].init);
    q->tensors[1].init = strdup("ones"); /* the same tensors, another plan */
    Runtime *rt = open_ok(p), *other = open_ok(q);
    saved_then_changed(rt);
    fill(other, 9);
    char hp[17], hq[17], want[128];
    plan_hash(p, hp);
    plan_hash(q, hq);
    cr_assert_str_neq(hp, hq);
    snprintf(want, sizeof want, "checkpoint from another plan (hash %s, this plan %s)", hp, hq);
    load_refused(other, STEP3, want);
    rt_close(rt);
    rt_close(other);
    plan_free(p);
    plan_free(q);
}

static void drop_b(cJSON *root)
{
    cJSON_DeleteItemFromObjectCaseSensitive(root, "b");
}

static void widen_attn(cJSON *root)
{
    cJSON *e = cJSON_GetObjectItemCaseSensitive(root, "h.0.attn.w");
    cJSON_ReplaceItemInObjectCaseSensitive(e, "shape", cJSON_CreateIntArray((int[]){4, 8}, 2));
}

static void w_as_f64(cJSON *root)
{
    cJSON *e = cJSON_GetObjectItemCaseSensitive(root, "w");
    cJSON_ReplaceItemInObjectCaseSensitive(e, "dtype", cJSON_CreateString("F64"));
}

static void w_past_the_end(cJSON *root)
{
    cJSON *e = cJSON_GetObjectItemCaseSensitive(root, "w");
    cJSON_ReplaceItemInObjectCaseSensitive(e, "data_offsets",
                                           cJSON_CreateIntArray((int[]){1000, 1060}, 2));
}

static void w_too_short(cJSON *root)
{
    cJSON *e = cJSON_GetObjectItemCaseSensitive(root, "w");
    cJSON_ReplaceItemInObjectCaseSensitive(e, "data_offsets",
                                           cJSON_CreateIntArray((int[]){0, 56}, 2));
}

static void add_extra(cJSON *root)
{
    cJSON_AddItemToObject(root, "extra", cJSON_Duplicate(cJSON_GetObjectItem(root, "w"), 1));
}

static void other_format(cJSON *root)
{
    cJSON *md = cJSON_GetObjectItemCaseSensitive(root, "__metadata__");
    cJSON_ReplaceItemInObjectCaseSensitive(md, "format", cJSON_CreateString("pt"));
}

static void bad_seed(cJSON *root)
{
    cJSON *md = cJSON_GetObjectItemCaseSensitive(root, "__metadata__");
    cJSON_ReplaceItemInObjectCaseSensitive(md, "seed", cJSON_CreateString("-3"));
}

static void no_metadata(cJSON *root)
{
    cJSON_DeleteItemFromObjectCaseSensitive(root, "__metadata__");
}

Test(ckpt, an_edited_header_is_refused_with_what_is_wrong)
{
    static const struct {
        void (*edit)(cJSON *);
        const char *want;
    } cases[] = {
        {drop_b, "tensor 'b' of the plan is missing from the checkpoint"},
        {widen_attn, "tensor 'h.0.attn.w' has shape [4,8] in the checkpoint, [4,12] in the plan"},
        {w_as_f64, "tensor 'w' has dtype F64 in the checkpoint, F32 in the plan"},
        {w_past_the_end, "tensor 'w': data_offsets [1000, 1060] outside the 394 bytes of data"},
        {w_too_short, "tensor 'w': data_offsets [0, 56] hold 56 bytes, the tensor has 60"},
        {add_extra, "tensor 'extra' of the checkpoint is not saved by this plan"},
        {other_format, "not a tcc checkpoint"},
        {no_metadata, "not a tcc checkpoint"},
        {bad_seed, "metadata 'seed' is '-3', expected an integer >= 0"},
    };
    Plan *p = test_plan("test");
    Runtime *rt = open_ok(p);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        saved_then_changed(rt);
        edit_header(path_in(ck, STEP3), cases[i].edit);
        load_refused(rt, STEP3, cases[i].want);
    }
    rt_close(rt);
    plan_free(p);
}

Test(ckpt, a_truncated_newest_file_is_refused_not_skipped)
{
    Plan *p = test_plan("test");
    Runtime *rt = open_ok(p);
    fill(rt, 1);
    save_ok(rt, ck, 2); /* a good older one that must not be used instead */
    saved_then_changed(rt);
    size_t len;
    unsigned char *b = read_all(path_in(ck, STEP3), &len);
    size_t hlen = (size_t)get_le64(b);
    const struct {
        size_t cut;
        const char *want;
    } cases[] = {
        {0, "truncated: 0 bytes, less than the header length"},
        {5, "truncated: 5 bytes, less than the header length"},
        {8, "truncated: the header needs"},
        {8 + hlen / 2, "truncated: the header needs"},
        {8 + hlen - 1, "truncated: the header needs"},
        {8 + hlen, "truncated: the file has"},
        {8 + hlen + 61, "truncated: the file has"},
        {len - 1, "truncated: the file has"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        write_all(path_in(ck, STEP3), b, cases[i].cut);
        load_refused(rt, STEP3, cases[i].want);
    }
    write_all(path_in(ck, STEP3), b, len);
    FILE *f = fopen(path_in(ck, STEP3), "ab");
    cr_assert_not_null(f);
    fputc('!', f);
    fclose(f);
    load_refused(rt, STEP3, "corrupt: the file has 939 bytes, 938 expected");
    free(b);
    rt_close(rt);
    plan_free(p);
}

Test(ckpt, a_corrupt_header_or_an_absurd_length_is_refused)
{
    Plan *p = test_plan("test");
    Runtime *rt = open_ok(p);
    saved_then_changed(rt);
    size_t len;
    unsigned char *b = read_all(path_in(ck, STEP3), &len);
    size_t hlen = (size_t)get_le64(b);
    unsigned char *c = malloc(len);
    const char *garbage[] = {"{\"w\": nope", "[1, 2, 3]", "{} {}", "\"just a string\""};
    for (size_t i = 0; i < sizeof garbage / sizeof garbage[0]; i++) {
        memcpy(c, b, len);
        memset(c + 8, ' ', hlen);
        memcpy(c + 8, garbage[i], strlen(garbage[i]));
        write_all(path_in(ck, STEP3), c, len);
        load_refused(rt, STEP3, "corrupt: the header is not a JSON object");
    }
    for (int bad = 0; bad < 2; bad++) {
        memcpy(c, b, len);
        c[8 + 3] = bad ? 0xff : 0; /* a NUL or a byte that is never UTF-8, in a key */
        write_all(path_in(ck, STEP3), c, len);
        load_refused(rt, STEP3, "corrupt: the header is not UTF-8 text");
    }
    const uint64_t lengths[] = {UINT64_MAX, 100000000, (uint64_t)1 << 40};
    for (size_t i = 0; i < sizeof lengths / sizeof lengths[0]; i++) {
        memcpy(c, b, len);
        put_le64(c, lengths[i]);
        write_all(path_in(ck, STEP3), c, len);
        load_refused(rt, STEP3, "corrupt: a header length of");
    }
    free(c);
    free(b);
    rt_close(rt);
    plan_free(p);
}

Test(ckpt, a_file_renamed_to_another_step_is_refused)
{
    Plan *p = test_plan("test");
    Runtime *rt = open_ok(p);
    saved_then_changed(rt);
    cr_assert_eq(rename(path_in(ck, STEP3), path_in(ck, "step-00000005.safetensors")), 0);
    load_refused(rt, "step-00000005.safetensors", "metadata 'step' is 3, the file name says 5");
    rt_close(rt);
    plan_free(p);
}

/* No crash, no leak, no half-done load: each byte of the header changed
 * three ways gives a refusal that leaves the slab as it was, or a load. */
Test(ckpt, every_single_byte_change_of_the_header_is_refused_or_harmless)
{
    Plan *p = test_plan("test");
    Runtime *rt = open_ok(p);
    saved_then_changed(rt);
    size_t len;
    unsigned char *b = read_all(path_in(ck, STEP3), &len);
    size_t hlen = (size_t)get_le64(b);
    unsigned char *c = malloc(len), *snap = snapshot(rt);
    int refused = 0;
    for (size_t i = 0; i < 8 + hlen; i++)
        for (int k = 0; k < 3; k++) {
            char err[1024] = "";
            memcpy(c, b, len);
            c[i] ^= (unsigned char[]){0x01, 0x20, 0x80}[k];
            write_all(path_in(ck, STEP3), c, len);
            int rc = rt_ckpt_load_latest(rt, ck, NULL, err, sizeof err);
            cr_assert(rc == 1 || rc == -1, "byte %zu: %d", i, rc);
            if (rc == -1) {
                cr_assert(strstr(err, STEP3), "%s", err);
                unchanged(rt, snap);
                refused++;
            } else {
                memcpy(rt_tensor_data(rt, 0), snap, p->slab_bytes);
            }
        }
    cr_assert_gt(refused, 2 * (int)hlen, "most changes are refused");
    free(snap);
    free(c);
    free(b);
    rt_close(rt);
    plan_free(p);
}

/* ---- on a mesh ---- */

/* The model of test_plan's first tensors on a mesh of `devices` along one
 * axis dp: w f32 [4, 6] split along dim 0, b f64 [6] whole on every device,
 * m.w f32 [4, 6] state split along dim 1, and an input. The tensors' shapes
 * are per device; their whole values are the same on every mesh. */
static Plan *mesh_plan(int devices)
{
    Plan *p = calloc(1, sizeof *p);
    p->version = PLAN_VERSION;
    p->model = strdup("test");
    p->naxes = 1;
    p->axes = calloc(1, sizeof *p->axes);
    p->axes[0] = (PlanAxis){strdup("dp"), strdup("data"), devices, 0};
    p->ntensors = 4;
    p->tensors = calloc(4, sizeof *p->tensors);
    p->instrs = calloc(1, sizeof *p->instrs);
    p->kernels = calloc(1, sizeof *p->kernels);
    p->kernel_source = strdup("");
    p->loss = p->lr = p->grad_norm = -1;
    tensor(p, 0, "w", PD_F32, PT_PARAM, 2, (int64_t[]){4 / devices, 6}, "normal");
    tensor(p, 1, "b", PD_F64, PT_PARAM, 1, (int64_t[]){6}, "uniform");
    tensor(p, 2, "m.w", PD_F32, PT_STATE, 2, (int64_t[]){4, 6 / devices}, "");
    tensor(p, 3, "x", PD_F32, PT_INPUT, 2, (int64_t[]){4 / devices, 6}, "");
    p->tensors[0].nsplit[0] = p->tensors[2].nsplit[1] = p->tensors[3].nsplit[0] = 1;
    return p;
}

/* The state m.w, element (i, j) of its whole value = i * 6 + j + 0.5, into
 * this device's block (its columns from 3 * rank on a mesh of 2). */
static void fill_state(Runtime *rt, int rank)
{
    const PlanTensor *t = &rt_plan(rt)->tensors[2];
    float *m = rt_tensor_data(rt, 2);
    for (int64_t i = 0; i < t->shape[0]; i++)
        for (int64_t j = 0; j < t->shape[1]; j++)
            m[i * t->shape[1] + j] = (float)(i * 6 + rank * t->shape[1] + j) + 0.5f;
}

typedef struct MeshRun {
    const Plan *p;
    const char *where;   /* the checkpoint folder */
    const char *refused; /* a folder whose checkpoint each rank must refuse, or NULL */
    int save_fails;      /* the save is expected to fail on every rank */
} MeshRun;

#define RANK_CHECK(cond, ...)                                                                      \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            rc = -1;                                                                               \
            snprintf(err, n, __VA_ARGS__);                                                         \
            goto done;                                                                             \
        }                                                                                          \
    } while (0)

/* One rank: init, a save, the saved tensors overwritten, a load that gives
 * back this device's blocks bit for bit; a refused load that changes nothing. */
static int mesh_rank(RtWorld *w, void *arg, char *err, size_t n)
{
    const MeshRun *r = arg;
    char msg[1024] = "";
    int rc = 0, rank = rt_world_rank(w);
    unsigned char *before = NULL, *after = NULL;
    Runtime *rt = rt_open(r->p, cache, err, n);
    if (!rt)
        return -1;
    RANK_CHECK(!rt_attach(rt, w, msg, sizeof msg), "rank %d: attach: %s", rank, msg);
    rt_init_params(rt, 7);
    fill_state(rt, rank);
    before = snapshot(rt);
    CkptMeta m = {5, 1005, 7};
    int saved_rc = rt_ckpt_save(rt, r->where, &m, msg, sizeof msg);
    RANK_CHECK(saved_rc == (r->save_fails ? -1 : 0), "rank %d: save: %d %s", rank, saved_rc, msg);
    if (r->save_fails) {
        RANK_CHECK(strstr(msg, rank == 0 ? "rename " : "not written: another rank failed"),
                   "rank %d: %s", rank, msg);
        goto done;
    }
    for (int i = 0; i < r->p->ntensors; i++)
        if (is_saved(&r->p->tensors[i]))
            memset(rt_tensor_data(rt, i), 0xab, r->p->tensors[i].bytes);
    CkptMeta got = {0};
    int loaded = rt_ckpt_load_latest(rt, r->where, &got, msg, sizeof msg);
    RANK_CHECK(loaded == 1, "rank %d: load: %d %s", rank, loaded, msg);
    RANK_CHECK(got.step == 5 && got.data_position == 1005 && got.seed == 7, "rank %d: meta", rank);
    for (int i = 0; i < r->p->ntensors; i++) {
        const PlanTensor *t = &r->p->tensors[i];
        RANK_CHECK(!is_saved(t) || !memcmp(rt_tensor_data(rt, i), before + t->offset, t->bytes),
                   "rank %d: tensor '%s' is not its block", rank, t->name);
    }
    if (r->refused) {
        after = snapshot(rt);
        RANK_CHECK(rt_ckpt_load_latest(rt, r->refused, NULL, msg, sizeof msg) == -1 &&
                       strstr(msg, "checkpoint from another plan"),
                   "rank %d: not refused: %s", rank, msg);
        RANK_CHECK(!memcmp(rt_tensor_data(rt, 0), after, r->p->slab_bytes),
                   "rank %d: a refused load changed the slab", rank);
    }
done:
    free(before);
    free(after);
    rt_close(rt);
    return rc;
}

/* The data section of a checkpoint file and its header (parsed). */
static unsigned char *data_of(const char *path, size_t *len, cJSON **header)
{
    unsigned char *b = read_all(path, len);
    uint64_t hlen = get_le64(b);
    *header = cJSON_ParseWithLength((const char *)b + 8, hlen);
    cr_assert_not_null(*header);
    *len -= 8 + hlen;
    memmove(b, b + 8 + hlen, *len);
    return b;
}

Test(ckpt, a_mesh_checkpoint_holds_whole_tensors_the_same_bytes_as_one_device)
{
    char err[1024] = "", mesh_dir[128], one_dir[128];
    snprintf(mesh_dir, sizeof mesh_dir, "%s/mesh", dir);
    snprintf(one_dir, sizeof one_dir, "%s/one", dir);
    Plan *one = mesh_plan(1), *two = mesh_plan(2);
    Runtime *rt = open_ok(one);
    rt_init_params(rt, 7);
    fill_state(rt, 0);
    CkptMeta m = {5, 1005, 7};
    cr_assert_eq(rt_ckpt_save(rt, one_dir, &m, err, sizeof err), 0, "%s", err);
    MeshRun r = {two, mesh_dir, one_dir, 0};
    cr_assert_eq(rt_run_threads(2, mesh_rank, &r, err, sizeof err), 0, "%s", err);

    size_t nm, no;
    cJSON *hm, *ho;
    unsigned char *dm = data_of(path_in(mesh_dir, "step-00000005.safetensors"), &nm, &hm);
    unsigned char *dn = data_of(path_in(one_dir, "step-00000005.safetensors"), &no, &ho);
    cr_assert_eq(nm, no);
    cr_assert(!memcmp(dm, dn, nm), "the tensors' bytes differ from one device's");
    const char *names[] = {"w", "b", "m.w"};
    for (int i = 0; i < 3; i++) {
        char *a = cJSON_PrintUnformatted(cJSON_GetObjectItem(hm, names[i]));
        char *b = cJSON_PrintUnformatted(cJSON_GetObjectItem(ho, names[i]));
        cr_assert_str_eq(a, b, "'%s': the entries differ", names[i]);
        free(a);
        free(b);
    }
    char *state = cJSON_PrintUnformatted(cJSON_GetObjectItem(hm, "m.w"));
    cr_assert_str_eq(state, "{\"dtype\":\"F32\",\"shape\":[4,6],\"data_offsets\":[144,240]}");
    free(state);
    cJSON_Delete(hm);
    cJSON_Delete(ho);
    free(dm);
    free(dn);
    rt_close(rt);
    plan_free(one);
    plan_free(two);
}

Test(ckpt, a_failed_save_on_rank_0_fails_every_rank)
{
    char err[1024] = "";
    Plan *two = mesh_plan(2);
    cr_assert_eq(mkdir(ck, 0777), 0);
    cr_assert_eq(mkdir(path_in(ck, "step-00000005.safetensors"), 0777), 0); /* rename fails */
    MeshRun r = {two, ck, NULL, 1};
    cr_assert_eq(rt_run_threads(2, mesh_rank, &r, err, sizeof err), 0, "%s", err);
    cr_assert_eq(count_entries(ck), 1, "no temporary file is left");
    plan_free(two);
}
