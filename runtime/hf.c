/* hf.c: a Hugging Face model directory as a run's first parameters
 * (--init-from DIR): config.json and model.safetensors, or the shards that
 * model.safetensors.index.json names.
 * Reads: the directory's config (checked against the plan's model: its
 * tensors' shapes and the TDL's parameters, plan.config) and the tensors the
 * plan's parameters map to. Writes: this device's block of every parameter it
 * holds; optimizer state stays as initialised (zeros): a fine-tune starts.
 * Key idea: each parameter of the plan has one counterpart in the
 * checkpoint, found by name and moved by one transform (a copy, the first
 * rows, or a permutation of the fused attention's columns); every value is
 * converted through double to the parameter's dtype. Every rank checks every
 * tensor's entry and reads the data of those it holds a block of, keeping
 * its block, so the mesh does not matter. Nothing is written until every
 * tensor has been read and checked, so a refused directory leaves the
 * parameters as they were.
 * rt_hf_export writes the other way: config.json from the plan, and every
 * parameter gathered whole, moved back and stored as F32.
 * Models: GPT-2 (model_type "gpt2"), named as samples/gpt2.tdl names them. */
#include "runtime/exec.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define MAX_HEADER 100000000ULL /* bytes; the limit of the safetensors reference reader */
#define MAX_FILES 64

/* One safetensors file: its header, and where its data begins. */
typedef struct StFile {
    char path[4096];
    cJSON *header;
    uint64_t data_at, size;
} StFile;

typedef struct Hf {
    const char *dir;
    cJSON *config;
    cJSON *index;  /* weight_map of a sharded model, or NULL */
    StFile files[MAX_FILES];
    int nfiles;
    char *err;
    size_t n;
} Hf;

/* How a parameter's global value comes from its tensor in the checkpoint. */
typedef enum {
    HF_COPY,  /* the same shape */
    HF_ROWS,  /* the first rows of a longer tensor (positions beyond the model's S) */
    HF_QKV,   /* [.., 3D]: q, k, v each head by head (Hugging Face) to head by head each q, k, v
                 (tcc's fused attention operand, docs/language.md) */
} HfMove;

static char *read_text(const char *path, char *err, size_t n)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        plan_errorf(err, n, "%s: %s", path, strerror(errno));
        return NULL;
    }
    char *buf = NULL;
    long len = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    if (len < 0 || len > 100000000L || fseek(f, 0, SEEK_SET) != 0 ||
        !(buf = malloc((size_t)len + 1)) || fread(buf, 1, (size_t)len, f) != (size_t)len) {
        plan_errorf(err, n, "%s: cannot read it", path);
        free(buf);
        buf = NULL;
    } else {
        buf[len] = 0;
    }
    fclose(f);
    return buf;
}

static cJSON *read_json(const char *path, char *err, size_t n)
{
    char *text = read_text(path, err, n);
    if (!text)
        return NULL;
    cJSON *j = cJSON_Parse(text);
    free(text);
    if (!j)
        plan_errorf(err, n, "%s: not valid JSON", path);
    return j;
}

/* The header of the safetensors file path (8 bytes little-endian: its
 * length, then JSON), into f. */
static int open_st(Hf *h, StFile *f, const char *path)
{
    snprintf(f->path, sizeof f->path, "%s", path);
    FILE *fp = fopen(path, "rb");
    if (!fp)
        return plan_errorf(h->err, h->n, "%s: %s", path, strerror(errno));
    unsigned char b[8];
    uint64_t len = 0;
    char *text = NULL;
    int rc = -1;
    if (fread(b, 1, 8, fp) != 8) {
        plan_errorf(h->err, h->n, "%s: truncated: no safetensors header", path);
        goto out;
    }
    for (int i = 7; i >= 0; i--)
        len = len << 8 | b[i];
    if (fseek(fp, 0, SEEK_END) != 0 || (long)(f->size = (uint64_t)ftell(fp)) < 0 ||
        len > MAX_HEADER || 8 + len > f->size) {
        plan_errorf(h->err, h->n, "%s: corrupt: a header of %" PRIu64 " bytes in a file of %" PRIu64,
                    path, len, f->size);
        goto out;
    }
    if (!(text = malloc((size_t)len + 1)) || fseek(fp, 8, SEEK_SET) != 0 ||
        fread(text, 1, (size_t)len, fp) != len) {
        plan_errorf(h->err, h->n, "%s: cannot read its header", path);
        goto out;
    }
    text[len] = 0;
    if (!(f->header = cJSON_Parse(text)) || !cJSON_IsObject(f->header)) {
        plan_errorf(h->err, h->n, "%s: corrupt: the header is not a JSON object", path);
        cJSON_Delete(f->header);
        f->header = NULL;
        goto out;
    }
    f->data_at = 8 + len;
    rc = 0;
out:
    free(text);
    fclose(fp);
    return rc;
}

/* The file that holds tensor name (the single file, or the index's shard). */
static StFile *file_of(Hf *h, const char *name)
{
    char path[4096];
    const char *file = "model.safetensors";
    if (h->index) {
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(h->index, name);
        if (!cJSON_IsString(f))
            return NULL;
        file = f->valuestring;
        if (strchr(file, '/')) {
            plan_errorf(h->err, h->n, "model.safetensors.index.json: shard '%s' is not a file of %s",
                        file, h->dir);
            return NULL;
        }
    }
    snprintf(path, sizeof path, "%s/%s", h->dir, file);
    for (int i = 0; i < h->nfiles; i++)
        if (!strcmp(h->files[i].path, path))
            return &h->files[i];
    if (h->nfiles == MAX_FILES) {
        plan_errorf(h->err, h->n, "%s: more than %d shards", h->dir, MAX_FILES);
        return NULL;
    }
    StFile *f = &h->files[h->nfiles];
    if (open_st(h, f, path))
        return NULL;
    h->nfiles++;
    return f;
}

/* The checkpoint's tensor key: NAME or transformer.NAME (how GPT2LMHeadModel
 * saves it); NULL, with the message, when neither is there. */
static const cJSON *find(Hf *h, const char *name, StFile **in, char *key, size_t keyn)
{
    const char *prefixes[] = {"", "transformer."};
    for (int i = 0; i < 2; i++) {
        snprintf(key, keyn, "%s%s", prefixes[i], name);
        h->err[0] = 0;
        StFile *f = file_of(h, key);
        if (!f && h->err[0])
            return NULL;
        const cJSON *e = f ? cJSON_GetObjectItemCaseSensitive(f->header, key) : NULL;
        if (e) {
            *in = f;
            return e;
        }
    }
    plan_errorf(h->err, h->n, "%s: no tensor '%s' (nor 'transformer.%s')", h->dir, name, name);
    return NULL;
}

static double half_to_double(uint16_t x)
{
    int e = x >> 10 & 31, m = x & 1023;
    double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(m + 1024, e - 25);
    return x >> 15 ? -v : v;
}

/* A JSON integer in [0, max] into *v. */
static int json_u64(const cJSON *x, uint64_t max, uint64_t *v)
{
    if (!cJSON_IsNumber(x) || x->valuedouble < 0 || x->valuedouble > (double)max ||
        x->valuedouble != floor(x->valuedouble))
        return -1;
    *v = (uint64_t)x->valuedouble;
    return 0;
}

/* The tensor key of f, its dtype, shape and data range checked, as doubles;
 * with data 0 only checked (a tensor this device holds no block of): a
 * non-NULL pointer that must not be read or freed is returned then. */
static double *read_tensor(Hf *h, StFile *f, const char *key, const cJSON *e, const int64_t *want,
                           int rank, int data)
{
    static double checked;
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(e, "shape");
    const cJSON *off = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    static const char *const names[] = {"F64", "F32", "BF16", "F16"};
    static const int sizes[] = {8, 4, 2, 2};
    int k = -1;
    for (int i = 0; i < 4 && cJSON_IsString(dt); i++)
        if (!strcmp(dt->valuestring, names[i]))
            k = i;
    if (k < 0) {
        plan_errorf(h->err, h->n, "%s: tensor '%s': dtype %s (F64, F32, BF16 or F16 are read)",
                    f->path, key, cJSON_IsString(dt) ? dt->valuestring : "missing");
        return NULL;
    }
    int ok = cJSON_IsArray(sh) && cJSON_GetArraySize(sh) == rank;
    uint64_t count = 1;
    for (int d = 0; ok && d < rank; d++) {
        const cJSON *x = cJSON_GetArrayItem(sh, d);
        ok = cJSON_IsNumber(x) && x->valuedouble == (double)want[d];
        count *= (uint64_t)want[d];
    }
    if (!ok) {
        char *got = sh ? cJSON_PrintUnformatted(sh) : NULL, mine[256] = "";
        for (int d = 0; d < rank; d++)
            snprintf(mine + strlen(mine), sizeof mine - strlen(mine), "%s%" PRId64, d ? ", " : "",
                     want[d]);
        plan_errorf(h->err, h->n, "%s: tensor '%s' has shape %s, the model needs [%s]", f->path, key,
                    got ? got : "(none)", mine);
        cJSON_free(got);
        return NULL;
    }
    uint64_t bytes = count * (uint64_t)sizes[k], b, t;
    if (!cJSON_IsArray(off) || cJSON_GetArraySize(off) != 2 ||
        json_u64(cJSON_GetArrayItem(off, 0), f->size, &b) ||
        json_u64(cJSON_GetArrayItem(off, 1), f->size, &t) || t < b || t - b != bytes ||
        f->data_at + t > f->size) {
        plan_errorf(h->err, h->n, "%s: tensor '%s': corrupt or truncated data_offsets", f->path, key);
        return NULL;
    }
    if (!data)
        return &checked;
    unsigned char *raw = malloc((size_t)bytes + 1);
    double *out = malloc(sizeof(double) * (size_t)count + 1);
    FILE *fp = fopen(f->path, "rb");
    if (!raw || !out || !fp || fseeko(fp, (off_t)(f->data_at + b), SEEK_SET) ||
        fread(raw, 1, (size_t)bytes, fp) != bytes) {
        plan_errorf(h->err, h->n, "%s: tensor '%s': cannot read its %" PRIu64 " bytes", f->path, key,
                    bytes);
        free(raw), free(out);
        if (fp)
            fclose(fp);
        return NULL;
    }
    fclose(fp);
    for (uint64_t i = 0; i < count; i++) {
        const unsigned char *p = raw + i * (uint64_t)sizes[k];
        if (k == 0) {
            memcpy(&out[i], p, 8);
        } else if (k == 1) {
            float v;
            memcpy(&v, p, 4);
            out[i] = v;
        } else {
            uint16_t v = (uint16_t)(p[0] | p[1] << 8);
            if (k == 2) {
                uint32_t w = (uint32_t)v << 16;
                float x;
                memcpy(&x, &w, 4);
                out[i] = x;
            } else {
                out[i] = half_to_double(v);
            }
        }
    }
    free(raw);
    return out;
}

/* config.json's integer KEY, or -1 (with the message) when it is missing. */
static int64_t cfg_int(Hf *h, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(h->config, key);
    uint64_t x;
    if (!json_u64(v, (uint64_t)1 << 53, &x))
        return (int64_t)x;
    plan_errorf(h->err, h->n, "%s/config.json: no integer '%s'", h->dir, key);
    return -1;
}

static int64_t plan_param(const Plan *p, const char *name)
{
    for (int i = 0; p->config && i < p->nconfig; i++)
        if (!strcmp(p->config[i].name, name))
            return p->config[i].value;
    return -1;
}

/* GPT-2's checkpoint name and move for the plan's parameter name (NULL: none). */
static const char *gpt2_name(const char *name, char *out, size_t n, HfMove *move)
{
    static const char *const map[][3] = {
        {"ln1.g", "ln_1.weight", "c"},      {"ln1.b", "ln_1.bias", "c"},
        {"attn.w", "attn.c_attn.weight", "q"}, {"attn.b", "attn.c_attn.bias", "q"},
        {"proj.w", "attn.c_proj.weight", "c"}, {"proj.b", "attn.c_proj.bias", "c"},
        {"ln2.g", "ln_2.weight", "c"},      {"ln2.b", "ln_2.bias", "c"},
        {"fc.w", "mlp.c_fc.weight", "c"},   {"fc.b", "mlp.c_fc.bias", "c"},
        {"mlp.w", "mlp.c_proj.weight", "c"}, {"mlp.b", "mlp.c_proj.bias", "c"},
    };
    int layer, at = 0;
    *move = HF_COPY;
    if (!strcmp(name, "wte"))
        return snprintf(out, n, "wte.weight"), out;
    if (!strcmp(name, "wpe"))
        return *move = HF_ROWS, snprintf(out, n, "wpe.weight"), out;
    if (!strcmp(name, "lnf.g") || !strcmp(name, "lnf.b"))
        return snprintf(out, n, "ln_f.%s", name[4] == 'g' ? "weight" : "bias"), out;
    if (sscanf(name, "h.%d.%n", &layer, &at) != 1 || !at)
        return NULL;
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        if (!strcmp(name + at, map[i][0])) {
            *move = map[i][2][0] == 'q' ? HF_QKV : HF_COPY;
            return snprintf(out, n, "h.%d.%s", layer, map[i][1]), out;
        }
    return NULL;
}

/* The model's GPT-2 shape from the plan alone: every parameter mapped, and
 * V, D, S, L and the heads. */
static int gpt2_shape(const Plan *p, int64_t *v, char *err, size_t n)
{
    int64_t shape[PLAN_MAX_RANK];
    char name[512];
    HfMove m;
    v[0] = v[1] = v[2] = -1, v[3] = 0, v[4] = plan_param(p, "H");
    for (int i = 0; i < p->ntensors; i++) {
        const PlanTensor *t = &p->tensors[i];
        if (t->role != PT_PARAM)
            continue;
        if ((t->dtype != PD_F32 && t->dtype != PD_F64) || !gpt2_name(t->name, name, sizeof name, &m))
            return plan_errorf(err, n, "parameter '%s' has no place in a gpt2 checkpoint",
                               t->name);
        rt_global_shape(p, t, shape);
        if (!strcmp(t->name, "wte"))
            v[0] = shape[0], v[1] = shape[1];
        if (!strcmp(t->name, "wpe"))
            v[2] = shape[0];
        int layer, at = 0;
        if (sscanf(t->name, "h.%d.%n", &layer, &at) == 1 && at && !strcmp(t->name + at, "ln1.g"))
            v[3]++;
    }
    if (v[0] < 0 || v[2] < 0 || v[4] < 1 || v[1] % v[4])
        return plan_errorf(err, n, "the model is not GPT-2 as samples/gpt2.tdl writes it "
                                   "(parameters wte, wpe, h.N.*, and heads H)");
    return 0;
}

/* The model's shape against config.json: every difference named. */
static int check_gpt2(Hf *h, const Plan *p, int64_t *heads)
{
    int64_t dims[5]; /* V, D, S, L, H */
    if (gpt2_shape(p, dims, h->err, h->n))
        return -1;
    int64_t V = dims[0], D = dims[1], S = dims[2], L = dims[3];
    *heads = dims[4];
    struct {
        const char *key, *ours;
        int64_t mine;
    } want[] = {{"n_embd", "D", D}, {"n_layer", "layers", L}, {"n_head", "H", *heads},
                {"vocab_size", "V", V}};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        int64_t v = cfg_int(h, want[i].key);
        if (v < 0)
            return -1;
        if (v != want[i].mine)
            return plan_errorf(h->err, h->n,
                               "%s/config.json: %s = %" PRId64 ", the model's %s is %" PRId64
                               "%s",
                               h->dir, want[i].key, v, want[i].ours, want[i].mine,
                               !strcmp(want[i].key, "vocab_size")
                                   ? " (compile it with -D V=the checkpoint's: a padded "
                                     "vocabulary's logits would count in its cross-entropy)"
                                   : "");
    }
    int64_t pos = cfg_int(h, "n_positions");
    if (pos < 0)
        return -1;
    if (pos < S)
        return plan_errorf(h->err, h->n,
                           "%s/config.json: n_positions = %" PRId64 ", fewer than the model's "
                           "sequence of %" PRId64,
                           h->dir, pos, S);
    const cJSON *act = cJSON_GetObjectItemCaseSensitive(h->config, "activation_function");
    if (act && (!cJSON_IsString(act) || (strcmp(act->valuestring, "gelu_new") &&
                                         strcmp(act->valuestring, "gelu_pytorch_tanh"))))
        return plan_errorf(h->err, h->n,
                           "%s/config.json: activation_function %s: tcc's gelu is the tanh "
                           "approximation (gelu_new)",
                           h->dir, cJSON_IsString(act) ? act->valuestring : "(not a string)");
    const cJSON *eps = cJSON_GetObjectItemCaseSensitive(h->config, "layer_norm_epsilon");
    if (eps && (!cJSON_IsNumber(eps) || fabs(eps->valuedouble - 1e-5) > 1e-12))
        return plan_errorf(h->err, h->n,
                           "%s/config.json: layer_norm_epsilon %g: the model's layernorms use "
                           "1e-5",
                           h->dir, cJSON_IsNumber(eps) ? eps->valuedouble : NAN);
    const cJSON *tie = cJSON_GetObjectItemCaseSensitive(h->config, "tie_word_embeddings");
    if (tie && !cJSON_IsTrue(tie))
        return plan_errorf(h->err, h->n, "%s/config.json: tie_word_embeddings is false: the "
                                          "model's output layer is its embedding (wte)",
                           h->dir);
    return 0;
}

/* The checkpoint's value v (HF shape) as the parameter's global value g;
 * back (export): g from v. */
static void move_into(HfMove m, const double *v, double *g, const int64_t *shape, int rank,
                      int64_t heads, int back)
{
    uint64_t count = 1;
    for (int d = 0; d < rank; d++)
        count *= (uint64_t)shape[d];
    if (m != HF_QKV) {
        memcpy(g, v, sizeof(double) * count); /* HF_ROWS: the first rows, row-major */
        return;
    }
    int64_t w = shape[rank - 1], D = w / 3, dh = D / heads;
    for (uint64_t r = 0; r < count / (uint64_t)w; r++)
        for (int64_t part = 0; part < 3; part++)
            for (int64_t hd = 0; hd < heads; hd++)
                for (int64_t d = 0; d < dh; d++) {
                    uint64_t ours = r * (uint64_t)w + (uint64_t)(hd * 3 * dh + part * dh + d);
                    uint64_t theirs = r * (uint64_t)w + (uint64_t)(part * D + hd * dh + d);
                    if (back)
                        g[theirs] = v[ours];
                    else
                        g[ours] = v[theirs];
                }
}

static void free_hf(Hf *h)
{
    cJSON_Delete(h->config);
    cJSON_Delete(h->index);
    for (int i = 0; i < h->nfiles; i++)
        cJSON_Delete(h->files[i].header);
}

int rt_hf_init(Runtime *rt, const char *dir, char *err, size_t n)
{
    const Plan *p = rt_plan(rt);
    Hf h = {.dir = dir, .err = err, .n = n};
    char path[4096], key[512], name[512];
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (!(h.config = read_json(path, err, n)))
        return -1;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(h.config, "model_type");
    if (!cJSON_IsString(type) || strcmp(type->valuestring, "gpt2")) {
        plan_errorf(err, n, "%s: model_type %s: --init-from reads gpt2 models", path,
                    cJSON_IsString(type) ? type->valuestring : "missing");
        free_hf(&h);
        return -1;
    }
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    FILE *probe = fopen(path, "rb");
    if (probe) {
        fclose(probe);
        cJSON *idx = read_json(path, err, n);
        cJSON *map = idx ? cJSON_DetachItemFromObjectCaseSensitive(idx, "weight_map") : NULL;
        int parsed = idx != NULL;
        cJSON_Delete(idx);
        if (!cJSON_IsObject(map)) {
            cJSON_Delete(map);
            free_hf(&h);
            return parsed ? plan_errorf(err, n, "%s: no weight_map object", path) : -1;
        }
        h.index = map;
    }
    int64_t heads = 1;
    void **vals = calloc((size_t)p->ntensors + 1, sizeof *vals); /* global, the param's dtype */
    int rc = vals ? check_gpt2(&h, p, &heads) : plan_errorf(err, n, "out of memory");
    for (int i = 0; !rc && i < p->ntensors; i++) {
        const PlanTensor *t = &p->tensors[i];
        if (t->role != PT_PARAM)
            continue;
        HfMove m;
        int64_t shape[PLAN_MAX_RANK], want[PLAN_MAX_RANK];
        rt_global_shape(p, t, shape);
        memcpy(want, shape, sizeof(int64_t) * (size_t)t->rank);
        StFile *f = NULL;
        const cJSON *e;
        gpt2_name(t->name, name, sizeof name, &m); /* every one maps (gpt2_shape) */
        if (!(e = find(&h, name, &f, key, sizeof key))) {
            rc = -1;
        } else {
            if (m == HF_ROWS)
                want[0] = cfg_int(&h, "n_positions");
            uint64_t count = 1;
            for (int d = 0; d < t->rank; d++)
                count *= (uint64_t)shape[d];
            int held = rt_holds(rt, i); /* the others are checked, not read */
            double *v = read_tensor(&h, f, key, e, want, t->rank, held), *g = NULL;
            if (v && held && (!(g = malloc(sizeof(double) * (size_t)count + 1)) ||
                              !(vals[i] = malloc((size_t)count * plan_dtype_size(t->dtype) + 1))))
                rc = plan_errorf(err, n, "out of memory");
            else if (!v)
                rc = -1;
            for (uint64_t k = 0; !rc && held && k < count; k++) {
                if (k == 0)
                    move_into(m, v, g, shape, t->rank, heads, 0);
                if (t->dtype == PD_F64)
                    ((double *)vals[i])[k] = g[k];
                else
                    ((float *)vals[i])[k] = (float)g[k];
            }
            if (held)
                free(v);
            free(g);
        }
    }
    /* every tensor read and checked: now each device's blocks (nothing allocated) */
    for (int i = 0; !rc && i < p->ntensors; i++)
        if (vals[i])
            rt_block_copy(rt, &p->tensors[i], vals[i], rt_tensor_data(rt, i), 0);
    for (int i = 0; vals && i < p->ntensors; i++)
        free(vals[i]);
    free(vals);
    free_hf(&h);
    return rc;
}

/* ---- export ---- */

static int write_config(const char *dir, const int64_t *v, char *err, size_t n)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    cJSON *c = cJSON_CreateObject();
    cJSON *arch = c ? cJSON_AddArrayToObject(c, "architectures") : NULL;
    int ok = arch && cJSON_AddItemToArray(arch, cJSON_CreateString("GPT2LMHeadModel")) &&
             cJSON_AddStringToObject(c, "model_type", "gpt2") &&
             cJSON_AddNumberToObject(c, "vocab_size", (double)v[0]) &&
             cJSON_AddNumberToObject(c, "n_embd", (double)v[1]) &&
             cJSON_AddNumberToObject(c, "n_positions", (double)v[2]) &&
             cJSON_AddNumberToObject(c, "n_ctx", (double)v[2]) &&
             cJSON_AddNumberToObject(c, "n_layer", (double)v[3]) &&
             cJSON_AddNumberToObject(c, "n_head", (double)v[4]) &&
             cJSON_AddStringToObject(c, "activation_function", "gelu_new") &&
             cJSON_AddNumberToObject(c, "layer_norm_epsilon", 1e-5) &&
             cJSON_AddBoolToObject(c, "tie_word_embeddings", 1) &&
             cJSON_AddNumberToObject(c, "resid_pdrop", 0) &&
             cJSON_AddNumberToObject(c, "embd_pdrop", 0) &&
             cJSON_AddNumberToObject(c, "attn_pdrop", 0) &&
             cJSON_AddStringToObject(c, "torch_dtype", "float32");
    char *text = ok ? cJSON_Print(c) : NULL;
    cJSON_Delete(c);
    FILE *f = text ? fopen(path, "w") : NULL;
    int rc = !f || fputs(text, f) < 0 || fputc('\n', f) == EOF;
    rc |= f && fclose(f) != 0;
    cJSON_free(text);
    return rc ? plan_errorf(err, n, "%s: cannot write it", path) : 0;
}

/* The safetensors header of the export: "transformer." keys, F32, in plan order. */
static char *export_header(const Plan *p)
{
    cJSON *root = cJSON_CreateObject(), *md = root ? cJSON_AddObjectToObject(root, "__metadata__") : NULL;
    int ok = md && cJSON_AddStringToObject(md, "format", "pt");
    uint64_t off = 0;
    char name[512], key[600];
    HfMove m;
    for (int i = 0; ok && i < p->ntensors; i++) {
        const PlanTensor *t = &p->tensors[i];
        int64_t shape[PLAN_MAX_RANK];
        if (t->role != PT_PARAM || !gpt2_name(t->name, name, sizeof name, &m))
            continue;
        rt_global_shape(p, t, shape);
        uint64_t bytes = 4;
        snprintf(key, sizeof key, "transformer.%s", name);
        cJSON *o = cJSON_AddObjectToObject(root, key);
        cJSON *dims = o ? cJSON_AddArrayToObject(o, "shape") : NULL;
        cJSON *offs = dims ? cJSON_AddArrayToObject(o, "data_offsets") : NULL;
        ok = offs && cJSON_AddStringToObject(o, "dtype", "F32");
        for (int d = 0; ok && d < t->rank; d++) {
            bytes *= (uint64_t)shape[d];
            ok = cJSON_AddItemToArray(dims, cJSON_CreateNumber((double)shape[d]));
        }
        ok = ok && cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)off)) &&
             cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)(off + bytes)));
        off += bytes;
    }
    char *text = ok ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    return text;
}

int rt_hf_export(Runtime *rt, const char *dir, int writer, char *err, size_t n)
{
    const Plan *p = rt_plan(rt);
    int64_t v[5];
    if (gpt2_shape(p, v, err, n))
        return -1; /* every rank finds it: no gather has begun */
    char path[4096], *header = NULL;
    FILE *f = NULL;
    int rc = 0;
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (writer) {
        if (mkdir(dir, 0777) != 0 && errno != EEXIST)
            rc = plan_errorf(err, n, "%s: %s", dir, strerror(errno));
        if (!rc && !(header = export_header(p)))
            rc = plan_errorf(err, n, "out of memory");
        if (!rc && !(f = fopen(path, "wb")))
            rc = plan_errorf(err, n, "%s: %s", path, strerror(errno));
        if (!rc) {
            size_t len = strlen(header), padded = (len + 7) / 8 * 8;
            unsigned char le[8];
            for (int i = 0; i < 8; i++)
                le[i] = (unsigned char)((uint64_t)padded >> (8 * i));
            rc = fwrite(le, 1, 8, f) != 8 || fwrite(header, 1, len, f) != len;
            for (size_t i = len; !rc && i < padded; i++)
                rc = fputc(' ', f) == EOF;
            if (rc)
                rc = plan_errorf(err, n, "%s: cannot write it", path);
        }
    }
    for (int i = 0; i < p->ntensors; i++) { /* every rank takes part in every gather */
        const PlanTensor *t = &p->tensors[i];
        if (t->role != PT_PARAM)
            continue;
        int64_t shape[PLAN_MAX_RANK];
        uint64_t count = 1;
        rt_global_shape(p, t, shape);
        for (int d = 0; d < t->rank; d++)
            count *= (uint64_t)shape[d];
        size_t size = plan_dtype_size(t->dtype);
        char *g = malloc((size_t)count * size + 1), gerr[512];
        double *ours = malloc(sizeof(double) * (size_t)count + 1);
        double *theirs = malloc(sizeof(double) * (size_t)count + 1);
        float *out = malloc(sizeof(float) * (size_t)count + 1);
        if (!g || !ours || !theirs || !out) {
            rc = rc ? rc : plan_errorf(err, n, "out of memory");
        } else if (rt_tensor_global(rt, i, g, gerr, sizeof gerr)) {
            rc = rc ? rc : plan_errorf(err, n, "%s", gerr);
        } else if (writer && !rc) {
            char name[512];
            HfMove m;
            gpt2_name(t->name, name, sizeof name, &m);
            for (uint64_t k = 0; k < count; k++)
                ours[k] = t->dtype == PD_F64 ? ((double *)g)[k] : ((float *)g)[k];
            move_into(m, ours, theirs, shape, t->rank, v[4], 1);
            for (uint64_t k = 0; k < count; k++)
                out[k] = (float)theirs[k];
            if (fwrite(out, sizeof(float), (size_t)count, f) != count)
                rc = plan_errorf(err, n, "%s: cannot write it", path);
        }
        free(g), free(ours), free(theirs), free(out);
    }
    if (f && fclose(f) != 0 && !rc)
        rc = plan_errorf(err, n, "%s: cannot write it", path);
    free(header);
    if (!rc && writer)
        rc = write_config(dir, v, err, n);
    return rc;
}
