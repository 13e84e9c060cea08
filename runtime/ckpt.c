/* ckpt.c: checkpoints: the trained state of a run as one safetensors file per
 * step (docs/checkpoints.md).
 * Reads: the PT_PARAM and PT_STATE tensors of a Runtime (rt_ckpt_save), or the
 * newest DIR/step-<digits>.safetensors (rt_ckpt_load_latest). Writes:
 * DIR/step-NNNNNNNN.safetensors through DIR/.step-NNNNNNNN.safetensors.tmp, or
 * the tensors of the Runtime; rt_ckpt_prune removes older checkpoints.
 * Key idea: a checkpoint holds every tensor's whole (global) value, so its
 * content does not depend on the mesh: on a mesh every rank takes part in the
 * gathers (a tensor of a pipeline stage comes from that stage's devices) and
 * rank 0 writes; on resume every rank reads the file and keeps its block of
 * each tensor it holds, so a run resumes on another mesh (the train hash). A
 * file gets its final name only once it is complete and on disk (write,
 * fsync, rename, fsync of the folder), so the newest final name is always a
 * whole checkpoint and a corrupt one is an error, never a reason to fall back. The loader trusts nothing in the file: it checks the header
 * against the plan and reads the data into a staging buffer before it
 * overwrites any tensor, so a refused checkpoint leaves the Runtime as it was.
 * Tensors are stored little-endian, as they lie in memory on the hosts we run. */
#include "runtime/exec.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "checkpoints copy tensors as they lie in memory: a big-endian host needs byte swaps"
#endif

#define CKPT_FORMAT "tcc-checkpoint"
#define META_KEY "__metadata__"
#define MAX_HEADER 100000000ULL /* bytes; the limit of the safetensors reference reader */
#define JSON_EXACT (1ULL << 53) /* larger integers are not exact as JSON numbers */
#define PATH_BYTES 4096

static const char *const st_dtypes[PD_COUNT] = {"F32", "F64", "BF16", "F16", "I32"};

static int saved(const PlanTensor *t)
{
    return t->role == PT_PARAM || t->role == PT_STATE;
}

static const char *model_of(const Plan *p)
{
    return p->model ? p->model : "";
}

/* DIR/<prefix>step-<step, 8 digits at least>.safetensors<suffix>. 0, or -1 if too long. */
static int step_path(char *out, const char *dir, const char *prefix, int64_t step,
                     const char *suffix)
{
    int len = snprintf(out, PATH_BYTES, "%s/%sstep-%08" PRId64 ".safetensors%s", dir, prefix, step,
                       suffix);
    return len < 0 || len >= PATH_BYTES ? -1 : 0;
}

/* ---- names: the header is UTF-8 JSON ---- */

/* The length of the UTF-8 sequence at u, or 0 when it is malformed (overlong,
 * a surrogate, beyond U+10FFFF, a stray continuation byte). */
static int utf8_len(const unsigned char *u)
{
    int len = u[0] < 0x80   ? 1
              : u[0] < 0xc2 ? 0
              : u[0] < 0xe0 ? 2
              : u[0] < 0xf0 ? 3
              : u[0] < 0xf5 ? 4
                            : 0;
    unsigned lo = u[0] == 0xe0 ? 0xa0 : u[0] == 0xf0 ? 0x90 : 0x80;
    unsigned hi = u[0] == 0xed ? 0x9f : u[0] == 0xf4 ? 0x8f : 0xbf;
    if (len > 1 && (u[1] < lo || u[1] > hi))
        return 0;
    for (int i = 2; i < len; i++)
        if ((u[i] & 0xc0) != 0x80)
            return 0;
    return len;
}

static int utf8_ok(const char *s)
{
    const unsigned char *u = (const unsigned char *)s;
    for (int len; *u; u += len)
        if (!(len = utf8_len(u)))
            return 0;
    return 1;
}

/* cJSON escapes quotes, backslashes and control characters; what it cannot
 * fix is a name that is not UTF-8 or that collides with the metadata key. */
static int check_names(const Plan *p, char *err, size_t n)
{
    if (!utf8_ok(model_of(p)))
        return plan_errorf(err, n, "checkpoint: the model name is not valid UTF-8");
    for (int i = 0; i < p->ntensors; i++) {
        const char *name = p->tensors[i].name ? p->tensors[i].name : "";
        if (!saved(&p->tensors[i]))
            continue;
        if (!*name || !strcmp(name, META_KEY))
            return plan_errorf(err, n, "checkpoint: tensor %d cannot be saved under the name '%s'",
                               i, name);
        if (!utf8_ok(name))
            return plan_errorf(err, n, "checkpoint: the name of tensor %d is not valid UTF-8", i);
    }
    return 0;
}

/* ---- the header ---- */

/* Integers are written in full (cJSON would print 1e+15), as raw JSON. */
static int add_int(cJSON *array, uint64_t v)
{
    char text[24];
    snprintf(text, sizeof text, "%" PRIu64, v);
    cJSON *item = cJSON_CreateRaw(text);
    if (item && cJSON_AddItemToArray(array, item))
        return 1;
    cJSON_Delete(item);
    return 0;
}

/* The whole (global) shape of t into shape, and its bytes. */
static uint64_t global_of(const Plan *p, const PlanTensor *t, int64_t *shape)
{
    uint64_t bytes = plan_dtype_size(t->dtype);
    rt_global_shape(p, t, shape);
    for (int d = 0; d < t->rank; d++)
        bytes *= (uint64_t)shape[d];
    return bytes;
}

/* NAME: {"dtype": "F32", "shape": [..], "data_offsets": [off, off + bytes]}, the
 * global shape. 1, or 0 (memory). */
static int add_tensor(cJSON *root, const Plan *p, const PlanTensor *t, uint64_t off)
{
    int64_t shape[PLAN_MAX_RANK];
    uint64_t bytes = global_of(p, t, shape);
    cJSON *o = cJSON_AddObjectToObject(root, t->name);
    if (!o || !cJSON_AddStringToObject(o, "dtype", st_dtypes[t->dtype]))
        return 0;
    cJSON *dims = cJSON_AddArrayToObject(o, "shape");
    cJSON *offsets = dims ? cJSON_AddArrayToObject(o, "data_offsets") : NULL;
    int ok = offsets != NULL;
    for (int d = 0; ok && d < t->rank; d++)
        ok = add_int(dims, (uint64_t)shape[d]);
    return ok && add_int(offsets, off) && add_int(offsets, off + bytes);
}

static int add_meta(cJSON *root, const Plan *p, const CkptMeta *m)
{
    char hash[17], step[24], position[24], seed[24];
    plan_hash(p, hash);
    snprintf(step, sizeof step, "%" PRId64, m->step);
    snprintf(position, sizeof position, "%" PRId64, m->data_position);
    snprintf(seed, sizeof seed, "%" PRIu64, m->seed);
    cJSON *md = cJSON_AddObjectToObject(root, META_KEY);
    return md && cJSON_AddStringToObject(md, "format", CKPT_FORMAT) &&
           cJSON_AddStringToObject(md, "model", model_of(p)) &&
           cJSON_AddStringToObject(md, "plan_hash", hash) &&
           (!*p->train_hash || cJSON_AddStringToObject(md, "train_hash", p->train_hash)) &&
           cJSON_AddStringToObject(md, "step", step) &&
           cJSON_AddStringToObject(md, "data_position", position) &&
           cJSON_AddStringToObject(md, "seed", seed);
}

/* The header of p's checkpoint, without padding: the metadata, then every
 * saved tensor in plan order at consecutive offsets. NULL when out of memory. */
static char *header_json(const Plan *p, const CkptMeta *m)
{
    cJSON *root = cJSON_CreateObject();
    int ok = root && add_meta(root, p, m);
    uint64_t off = 0;
    int64_t shape[PLAN_MAX_RANK];
    for (int i = 0; ok && i < p->ntensors; i++)
        if (saved(&p->tensors[i])) {
            ok = add_tensor(root, p, &p->tensors[i], off);
            off += global_of(p, &p->tensors[i], shape);
        }
    char *text = ok ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    return text;
}

/* ---- writing ---- */

/* The writer's temporary file and the first call on it that failed. */
typedef struct Out {
    FILE *f;
    const char *tmp;
    const char *call; /* NULL while all is well */
    int e;            /* its errno */
} Out;

static void out_check(Out *o, int failed, const char *call)
{
    if (failed && !o->call) {
        o->call = call;
        o->e = errno ? errno : EIO;
    }
}

/* The header length (8 bytes, little endian), the header padded with spaces
 * to a multiple of 8. */
static void write_header(Out *o, const char *header)
{
    size_t len = strlen(header), padded = (len + 7) / 8 * 8;
    unsigned char le[8];
    for (int i = 0; i < 8; i++)
        le[i] = (unsigned char)((uint64_t)padded >> (8 * i));
    errno = 0;
    out_check(o, fwrite(le, 1, 8, o->f) != 8 || fwrite(header, 1, len, o->f) != len, "fwrite");
    for (size_t i = len; i < padded && !o->call; i++)
        out_check(o, fputc(' ', o->f) == EOF, "fwrite");
}

/* The largest whole value of a saved tensor, in bytes. */
static uint64_t max_global(const Plan *p)
{
    uint64_t most = 0;
    int64_t shape[PLAN_MAX_RANK];
    for (int i = 0; i < p->ntensors; i++)
        if (saved(&p->tensors[i]) && global_of(p, &p->tensors[i], shape) > most)
            most = global_of(p, &p->tensors[i], shape);
    return most;
}

/* Every saved tensor's whole value in plan order: on a mesh every rank gathers
 * it into buf (collective), and the writer (o not NULL) appends it to its file.
 * 0, or -1 when a gather fails (on every rank). */
static int write_tensors(Runtime *rt, Out *o, char *buf, char *err, size_t n)
{
    const Plan *p = rt_plan(rt);
    int64_t shape[PLAN_MAX_RANK];
    for (int i = 0; i < p->ntensors; i++) {
        if (!saved(&p->tensors[i]))
            continue;
        size_t bytes = (size_t)global_of(p, &p->tensors[i], shape);
        /* one device: the tensor is whole; a mesh: blocks from the devices of its stage */
        const char *src = rt_tensor_data(rt, i);
        if (rt->world && rt_tensor_global(rt, i, buf, err, n))
            return -1;
        if (rt->world)
            src = buf;
        if (o && !o->call) {
            errno = 0;
            out_check(o, fwrite(src, 1, bytes, o->f) != bytes, "fwrite");
        }
    }
    return 0;
}

/* Flush, fsync and close the writer's file; on failure remove it. 0, or -1. */
static int finish_tmp(Out *o, char *err, size_t n)
{
    errno = 0;
    if (!o->call)
        out_check(o, fflush(o->f) != 0, "fflush");
    if (!o->call)
        out_check(o, fsync(fileno(o->f)) != 0, "fsync");
    if (fclose(o->f) && !o->call) {
        o->call = "fclose";
        o->e = errno;
    }
    o->f = NULL;
    if (!o->call)
        return 0;
    unlink(o->tmp);
    return plan_errorf(err, n, "%s %s: %s", o->call, o->tmp, strerror(o->e));
}

/* fsync a folder, so that the names created or renamed in it are on disk. */
static int sync_dir(const char *dir, char *err, size_t n)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd < 0)
        return plan_errorf(err, n, "open %s: %s", dir, strerror(errno));
    if (fsync(fd)) {
        int e = errno;
        close(fd);
        return plan_errorf(err, n, "fsync %s: %s", dir, strerror(e));
    }
    if (close(fd))
        return plan_errorf(err, n, "close %s: %s", dir, strerror(errno));
    return 0;
}

/* The folder that holds dir ("." or "/" at the top), into out[PATH_BYTES]. */
static void parent_of(const char *dir, char *out)
{
    snprintf(out, PATH_BYTES, "%s", dir);
    size_t len = strlen(out);
    while (len > 1 && out[len - 1] == '/')
        out[--len] = 0;
    char *slash = strrchr(out, '/');
    if (!slash)
        snprintf(out, PATH_BYTES, ".");
    else
        slash[slash == out] = 0;
}

/* Create dir if it is missing (its parent must exist) and make the new entry durable. */
static int make_dir(const char *dir, char *err, size_t n)
{
    struct stat st;
    if (!mkdir(dir, 0777)) {
        char parent[PATH_BYTES];
        parent_of(dir, parent);
        return sync_dir(parent, err, n);
    }
    if (errno != EEXIST)
        return plan_errorf(err, n, "mkdir %s: %s", dir, strerror(errno));
    if (stat(dir, &st))
        return plan_errorf(err, n, "stat %s: %s", dir, strerror(errno));
    if (!S_ISDIR(st.st_mode))
        return plan_errorf(err, n, "checkpoint folder %s: not a directory", dir);
    return 0;
}

/* The writer's start: the folder, the temporary file and its header. 0, or -1. */
static int begin_tmp(Out *o, Runtime *rt, const char *dir, const CkptMeta *meta, const char *path,
                     char *err, size_t n)
{
    if (make_dir(dir, err, n))
        return -1;
    char *header = header_json(rt_plan(rt), meta);
    if (!header)
        return plan_errorf(err, n, "checkpoint %s: cJSON: out of memory", path);
    if (!(o->f = fopen(o->tmp, "wb"))) {
        cJSON_free(header);
        return plan_errorf(err, n, "fopen %s: %s", o->tmp, strerror(errno));
    }
    write_header(o, header);
    cJSON_free(header);
    return 0;
}

/* On a mesh (all not NULL): -1 on every rank when rc is -1 on any; a rank
 * that did not fail itself says so. rc as it is on one device. */
static int agree(RtComm *all, int rc, const char *path, char *err, size_t n)
{
    int32_t bad = rc != 0;
    char msg[512];
    if (!all)
        return rc;
    if (rt_comm_all_reduce_max(all, &bad, 1, PD_I32, msg, sizeof msg))
        return rc ? rc : plan_errorf(err, n, "checkpoint %s: %s", path, msg);
    if (bad && !rc)
        return plan_errorf(err, n, "checkpoint %s: not written: another rank failed", path);
    return bad ? -1 : 0;
}

/* The writer (rank 0 of all; the only rank on one device) makes the file,
 * every rank takes part in the gathers, and all agree on the outcome. */
static int save_all(Runtime *rt, RtComm *all, const char *dir, const CkptMeta *meta,
                    const char *tmp, const char *path, char *err, size_t n)
{
    int writer = !all || rt_comm_rank(all) == 0, rc = 0;
    Out o = {NULL, tmp, NULL, 0};
    char *buf = NULL;
    if (all && !(buf = malloc((size_t)max_global(rt_plan(rt)) + 1)))
        rc = plan_errorf(err, n, "checkpoint %s: out of memory", path);
    if (!rc && writer)
        rc = begin_tmp(&o, rt, dir, meta, path, err, n);
    rc = agree(all, rc, path, err, n);
    if (!rc)
        rc = write_tensors(rt, writer ? &o : NULL, buf, err, n);
    if (o.f && rc) { /* a gather failed: the file is incomplete */
        fclose(o.f);
        unlink(tmp);
    } else if (o.f) {
        rc = finish_tmp(&o, err, n);
    }
    if (!rc && writer && rename(tmp, path)) {
        int e = errno;
        unlink(tmp);
        rc = plan_errorf(err, n, "rename %s to %s: %s", tmp, path, strerror(e));
    }
    if (!rc && writer)
        rc = sync_dir(dir, err, n);
    free(buf);
    return agree(all, rc, path, err, n);
}

int rt_ckpt_save(Runtime *rt, const char *dir, const CkptMeta *meta, char *err, size_t n)
{
    char tmp[PATH_BYTES], path[PATH_BYTES];
    const Plan *p = rt_plan(rt);
    if (!meta || meta->step < 0 || meta->data_position < -1)
        return plan_errorf(err, n, "checkpoint: the step must be >= 0 and the data position >= -1");
    if (step_path(tmp, dir, ".", meta->step, ".tmp") || step_path(path, dir, "", meta->step, ""))
        return plan_errorf(err, n, "checkpoint folder %s: path too long", dir);
    if (!rt->world && plan_mesh_size(p) > 1)
        return plan_errorf(err, n,
                           "checkpoint: the plan runs on %" PRId64 " devices, but no mesh was "
                           "attached (rt_attach)",
                           plan_mesh_size(p));
    if (check_names(p, err, n))
        return -1;
    RtComm *all = NULL;
    if (rt->world && !(all = rt_comm_split(rt->world, 0, rt_world_rank(rt->world), err, n)))
        return -1;
    int rc = save_all(rt, all, dir, meta, tmp, path, err, n);
    rt_comm_free(all);
    return rc;
}

/* ---- finding the newest ---- */

/* The step of a file called step-<digits>.safetensors, or -1 for any other name. */
static int64_t step_of(const char *name)
{
    static const char pre[] = "step-", suf[] = ".safetensors";
    size_t len = strlen(name), np = sizeof pre - 1, ns = sizeof suf - 1;
    if (len <= np + ns || strncmp(name, pre, np) || strcmp(name + len - ns, suf))
        return -1;
    int64_t step = 0;
    for (size_t i = np; i < len - ns; i++) {
        if (name[i] < '0' || name[i] > '9' || step > (INT64_MAX - 9) / 10)
            return -1;
        step = step * 10 + (name[i] - '0');
    }
    return step;
}

/* The path of the checkpoint of dir with the largest step (of two names for
 * one step, the larger name), into path[PATH_BYTES]. 1, 0 when there is none
 * (or no dir), or -1. */
static int newest(const char *dir, char *path, int64_t *step, char *err, size_t n)
{
    DIR *d = opendir(dir);
    if (!d)
        return errno == ENOENT ? 0 : plan_errorf(err, n, "opendir %s: %s", dir, strerror(errno));
    char best[sizeof((struct dirent *)0)->d_name] = "";
    struct dirent *e;
    *step = -1;
    errno = 0;
    while ((e = readdir(d))) {
        int64_t s = step_of(e->d_name);
        if (s >= 0 && (s > *step || (s == *step && strcmp(e->d_name, best) > 0))) {
            *step = s;
            snprintf(best, sizeof best, "%s", e->d_name);
        }
        errno = 0;
    }
    int e_read = errno;
    if (closedir(d) && !e_read)
        return plan_errorf(err, n, "closedir %s: %s", dir, strerror(errno));
    if (e_read)
        return plan_errorf(err, n, "readdir %s: %s", dir, strerror(e_read));
    if (*step < 0)
        return 0;
    int len = snprintf(path, PATH_BYTES, "%s/%s", dir, best);
    return len < 0 || len >= PATH_BYTES ? plan_errorf(err, n, "%s/%s: path too long", dir, best)
                                        : 1;
}

/* ---- keeping the newest ---- */

static int by_step_down(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x < y) - (x > y);
}

/* The steps of dir's checkpoints before step, malloc'ed into *out (newest
 * first). The count, or -1 with a message. */
static long older_steps(DIR *d, const char *dir, int64_t step, int64_t **out, char *err, size_t n)
{
    size_t count = 0, cap = 0;
    int64_t *steps = NULL;
    struct dirent *e;
    errno = 0;
    while ((e = readdir(d))) {
        int64_t s = step_of(e->d_name);
        if (s >= 0 && s < step && count == cap) {
            int64_t *more = realloc(steps, (cap = cap ? 2 * cap : 16) * sizeof *steps);
            if (!more) {
                free(steps);
                return plan_errorf(err, n, "realloc: out of memory");
            }
            steps = more;
        }
        if (s >= 0 && s < step)
            steps[count++] = s;
        errno = 0;
    }
    if (errno) {
        free(steps);
        return plan_errorf(err, n, "readdir %s: %s", dir, strerror(errno));
    }
    qsort(steps, count, sizeof *steps, by_step_down);
    *out = steps;
    return (long)count;
}

/* The newest step to remove: the keep-th distinct one of steps (newest
 * first), or -1 when there are fewer. */
static int64_t cutoff(const int64_t *steps, long count, int64_t keep)
{
    int64_t distinct = 0;
    for (long i = 0; i < count; i++)
        if ((i == 0 || steps[i] != steps[i - 1]) && ++distinct == keep)
            return steps[i];
    return -1;
}

int rt_ckpt_prune(const char *dir, int64_t step, int64_t keep, char *err, size_t n)
{
    char path[PATH_BYTES];
    int64_t *steps = NULL;
    DIR *d = opendir(dir);
    if (!d)
        return plan_errorf(err, n, "opendir %s: %s", dir, strerror(errno));
    long count = older_steps(d, dir, step, &steps, err, n);
    int64_t cut = count > 0 ? cutoff(steps, count, keep) : -1;
    int rc = count < 0 ? -1 : 0;
    free(steps);
    struct dirent *e;
    rewinddir(d);
    while (cut >= 0 && (e = readdir(d))) {
        int64_t s = step_of(e->d_name);
        if (s < 0 || s > cut)
            continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (unlink(path) && !rc)
            rc = plan_errorf(err, n, "unlink %s: %s", path, strerror(errno));
    }
    closedir(d);
    return rc;
}

/* ---- loading ---- */

typedef struct Ckpt {
    FILE *f;
    uint64_t size;       /* of the file */
    uint64_t hlen;       /* of the header */
    cJSON *root;         /* the header */
    uint64_t data_bytes; /* of the buffer: the plan's saved tensors */
    uint64_t *begin;     /* by tensor: its first byte in the buffer */
    char *data;          /* the buffer */
} Ckpt;

/* An integer in [0, 2^53]: 0, or -1. */
static int json_u64(const cJSON *item, uint64_t *v)
{
    if (!cJSON_IsNumber(item) || !(item->valuedouble >= 0) ||
        item->valuedouble > (double)JSON_EXACT)
        return -1;
    *v = (uint64_t)item->valuedouble;
    return (double)*v == item->valuedouble ? 0 : -1;
}

static int open_file(Ckpt *c, const char *path, char *err, size_t n)
{
    struct stat st;
    if (!(c->f = fopen(path, "rb")))
        return plan_errorf(err, n, "fopen: %s", strerror(errno));
    if (fstat(fileno(c->f), &st))
        return plan_errorf(err, n, "fstat: %s", strerror(errno));
    if (!S_ISREG(st.st_mode))
        return plan_errorf(err, n, "not a regular file");
    c->size = (uint64_t)st.st_size;
    return 0;
}

/* fread exactly bytes; a short read is a truncated (or shrinking) file. */
static int read_exact(Ckpt *c, void *buf, uint64_t bytes, const char *what, char *err, size_t n)
{
    errno = 0;
    if (fread(buf, 1, (size_t)bytes, c->f) == bytes)
        return 0;
    if (ferror(c->f))
        return plan_errorf(err, n, "fread: %s", strerror(errno ? errno : EIO));
    return plan_errorf(err, n, "truncated: the file ends inside the %s", what);
}

/* The header length, then the header as a JSON object (padding: whitespace). */
static int read_header(Ckpt *c, char *err, size_t n)
{
    unsigned char le[8];
    if (c->size < 8)
        return plan_errorf(err, n, "truncated: %" PRIu64 " bytes, less than the header length",
                           c->size);
    if (read_exact(c, le, 8, "header length", err, n))
        return -1;
    for (int i = 7; i >= 0; i--)
        c->hlen = c->hlen << 8 | le[i];
    if (c->hlen >= MAX_HEADER)
        return plan_errorf(err, n, "corrupt: a header length of %" PRIu64 " bytes", c->hlen);
    if (c->hlen > c->size - 8)
        return plan_errorf(err, n,
                           "truncated: the header needs %" PRIu64 " bytes, %" PRIu64 " follow",
                           c->hlen, c->size - 8);
    char *text = malloc(c->hlen + 1);
    if (!text)
        return plan_errorf(err, n, "malloc: out of memory");
    if (read_exact(c, text, c->hlen, "header", err, n)) {
        free(text);
        return -1;
    }
    text[c->hlen] = 0;
    if (memchr(text, 0, c->hlen) || !utf8_ok(text)) {
        free(text);
        return plan_errorf(err, n, "corrupt: the header is not UTF-8 text");
    }
    const char *end = NULL;
    c->root = cJSON_ParseWithLengthOpts(text, c->hlen, &end, 0);
    int ok = cJSON_IsObject(c->root) && end + strspn(end, " \t\r\n") == text + c->hlen;
    free(text);
    return ok ? 0 : plan_errorf(err, n, "corrupt: the header is not a JSON object");
}

static const char *meta_str(const cJSON *md, const char *key)
{
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(md, key);
    return cJSON_IsString(item) ? item->valuestring : NULL;
}

/* Metadata key as a decimal integer in [min, max] (as two's complement bits). */
static int meta_int(const cJSON *md, const char *key, int64_t min, uint64_t max, uint64_t *out,
                    char *err, size_t n)
{
    const char *s = meta_str(md, key), *c = s ? s + (*s == '-') : NULL;
    uint64_t v = 0;
    int ok = c && *c;
    for (; ok && *c; c++) {
        ok = *c >= '0' && *c <= '9' && v <= (UINT64_MAX - (uint64_t)(*c - '0')) / 10;
        v = v * 10 + (uint64_t)(*c - '0');
    }
    if (ok && *s == '-')
        ok = min < 0 && v <= 0 - (uint64_t)min;
    else if (ok)
        ok = v <= max;
    if (!ok)
        return plan_errorf(err, n, "metadata '%s' is %s%s%s, expected an integer >= %" PRId64, key,
                           s ? "'" : "", s ? s : "missing", s ? "'" : "", min);
    *out = *s == '-' ? (uint64_t)0 - v : v;
    return 0;
}

/* The same training run: the same train hash when both the file and the plan
 * have one (any mesh: 1x1x2 resumes 1x1x4's), else the same plan hash. */
static int same_run(const cJSON *md, const Plan *p, const char *hash, const char *mine)
{
    const char *train = meta_str(md, "train_hash");
    if (train && *p->train_hash)
        return !strcmp(train, p->train_hash);
    return hash && !strcmp(hash, mine);
}

/* The metadata: a tcc checkpoint of this model and run, of the step its name says. */
static int check_meta(const cJSON *root, const Plan *p, int64_t step, CkptMeta *m, char *err,
                      size_t n)
{
    const cJSON *md = cJSON_GetObjectItemCaseSensitive(root, META_KEY);
    const char *format = meta_str(md, "format"), *model = meta_str(md, "model");
    const char *hash = meta_str(md, "plan_hash");
    char mine[17];
    uint64_t s = 0, pos = 0;
    if (!format || strcmp(format, CKPT_FORMAT))
        return plan_errorf(err, n, "not a tcc checkpoint: metadata 'format' is not '%s'",
                           CKPT_FORMAT);
    if (!model || strcmp(model, model_of(p)))
        return plan_errorf(err, n, "checkpoint of model '%s', this plan is '%s'",
                           model ? model : "", model_of(p));
    plan_hash(p, mine);
    if (!same_run(md, p, hash, mine))
        return plan_errorf(err, n, "checkpoint from another plan (hash %s, this plan %s)",
                           hash ? hash : "missing", mine);
    if (meta_int(md, "step", 0, INT64_MAX, &s, err, n) ||
        meta_int(md, "data_position", -1, INT64_MAX, &pos, err, n) ||
        meta_int(md, "seed", 0, UINT64_MAX, &m->seed, err, n))
        return -1;
    if ((int64_t)s != step)
        return plan_errorf(err, n,
                           "corrupt: metadata 'step' is %" PRIu64 ", the file name says %" PRId64,
                           s, step);
    m->step = (int64_t)s;
    m->data_position = (int64_t)pos;
    return 0;
}

/* The header entry called name. Files are written in plan order, so it is
 * usually the one after *cur: loading stays linear in the number of tensors. */
static const cJSON *find_entry(const cJSON *root, const cJSON **cur, const char *name)
{
    const cJSON *e = *cur ? (*cur)->next : root->child;
    if (e && e->string && !strcmp(e->string, META_KEY))
        e = e->next;
    if (!e || !e->string || strcmp(e->string, name))
        e = cJSON_GetObjectItemCaseSensitive(root, name);
    if (e)
        *cur = e;
    return e;
}

/* "[4,12]" */
static void shape_text(const PlanTensor *t, char *out, size_t size)
{
    size_t len = (size_t)snprintf(out, size, "[");
    for (int d = 0; d < t->rank && len < size; d++)
        len += (size_t)snprintf(out + len, size - len, "%s%" PRId64, d ? "," : "", t->shape[d]);
    if (len < size)
        snprintf(out + len, size - len, "]");
}

static int check_shape(const cJSON *shape, const PlanTensor *t, char *err, size_t n)
{
    int ok = cJSON_IsArray(shape) && cJSON_GetArraySize(shape) == t->rank;
    const cJSON *dim = ok ? shape->child : NULL;
    for (int d = 0; ok && d < t->rank; d++, dim = dim->next) {
        uint64_t v;
        ok = !json_u64(dim, &v) && v == (uint64_t)t->shape[d];
    }
    if (ok)
        return 0;
    char mine[PLAN_MAX_RANK * 21 + 3];
    char *theirs = shape ? cJSON_PrintUnformatted(shape) : NULL;
    shape_text(t, mine, sizeof mine);
    plan_errorf(err, n, "tensor '%s' has shape %s in the checkpoint, %s in the plan", t->name,
                theirs ? theirs : "(none)", mine);
    cJSON_free(theirs);
    return -1;
}

/* data_offsets: a range of the buffer of exactly the tensor's size; its start into *begin. */
static int check_offsets(const cJSON *o, const PlanTensor *t, uint64_t data_bytes, uint64_t *begin,
                         char *err, size_t n)
{
    uint64_t b, e;
    if (!cJSON_IsArray(o) || cJSON_GetArraySize(o) != 2 || json_u64(o->child, &b) ||
        json_u64(o->child->next, &e))
        return plan_errorf(err, n, "corrupt: tensor '%s': 'data_offsets' is not two integers",
                           t->name);
    if (b > e || e > data_bytes)
        return plan_errorf(err, n,
                           "corrupt: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64
                           "] outside the %" PRIu64 " bytes of data",
                           t->name, b, e, data_bytes);
    if (e - b != t->bytes)
        return plan_errorf(err, n,
                           "corrupt: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64
                           "] hold %" PRIu64 " bytes, the tensor has %" PRIu64,
                           t->name, b, e, e - b, t->bytes);
    *begin = b;
    return 0;
}

static int check_entry(const cJSON *e, const PlanTensor *t, uint64_t data_bytes, uint64_t *begin,
                       char *err, size_t n)
{
    const cJSON *dtype = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    if (!e)
        return plan_errorf(err, n, "tensor '%s' of the plan is missing from the checkpoint",
                           t->name);
    if (!cJSON_IsObject(e) || !cJSON_IsString(dtype))
        return plan_errorf(err, n, "corrupt: tensor '%s' has no dtype", t->name);
    if (strcmp(dtype->valuestring, st_dtypes[t->dtype]))
        return plan_errorf(err, n, "tensor '%s' has dtype %s in the checkpoint, %s in the plan",
                           t->name, dtype->valuestring, st_dtypes[t->dtype]);
    if (check_shape(cJSON_GetObjectItemCaseSensitive(e, "shape"), t, err, n))
        return -1;
    return check_offsets(cJSON_GetObjectItemCaseSensitive(e, "data_offsets"), t, data_bytes, begin,
                         err, n);
}

/* Called when every tensor of the plan is in the header but the counts differ:
 * name an entry that the plan does not save (or one given twice). */
static int extra_entry(const cJSON *root, const Plan *p, char *err, size_t n)
{
    int metas = 0;
    for (const cJSON *e = root->child; e; e = e->next) {
        int t = rt_find_tensor(p, e->string);
        if (!strcmp(e->string, META_KEY))
            metas++;
        else if (t < 0 || !saved(&p->tensors[t]))
            return plan_errorf(err, n, "tensor '%s' of the checkpoint is not saved by this plan",
                               e->string);
    }
    if (metas != 1)
        return plan_errorf(err, n, "corrupt: '%s' appears %d times in the header", META_KEY, metas);
    return plan_errorf(err, n, "corrupt: the header names a tensor twice");
}

/* Every saved tensor of the plan in the header, with its dtype, global shape
 * and a range of the buffer; nothing else in the header; the file size exact. */
static int check_tensors(Ckpt *c, const Plan *p, char *err, size_t n)
{
    const cJSON *cur = NULL;
    int want = 1, have = cJSON_GetArraySize(c->root);
    int64_t shape[PLAN_MAX_RANK];
    for (int i = 0; i < p->ntensors; i++)
        if (saved(&p->tensors[i])) {
            c->data_bytes += global_of(p, &p->tensors[i], shape);
            want++;
        }
    for (int i = 0; i < p->ntensors; i++) {
        PlanTensor whole = p->tensors[i]; /* the file holds the global shape */
        whole.bytes = global_of(p, &p->tensors[i], whole.shape);
        if (saved(&whole) && check_entry(find_entry(c->root, &cur, whole.name), &whole,
                                         c->data_bytes, &c->begin[i], err, n))
            return -1;
    }
    if (have != want)
        return extra_entry(c->root, p, err, n);
    uint64_t size = 8 + c->hlen + c->data_bytes;
    if (c->size != size)
        return plan_errorf(err, n, "%s: the file has %" PRIu64 " bytes, %" PRIu64 " expected",
                           c->size < size ? "truncated" : "corrupt", c->size, size);
    return 0;
}

/* Read and check the whole file into c; nothing of rt is touched. */
static int read_ckpt(Ckpt *c, const char *path, int64_t step, const Plan *p, CkptMeta *m, char *err,
                     size_t n)
{
    if (open_file(c, path, err, n) || read_header(c, err, n) ||
        check_meta(c->root, p, step, m, err, n))
        return -1;
    if (!(c->begin = calloc((size_t)p->ntensors + 1, sizeof *c->begin)))
        return plan_errorf(err, n, "calloc: out of memory");
    if (check_tensors(c, p, err, n))
        return -1;
    if (!(c->data = malloc((size_t)c->data_bytes + 1)))
        return plan_errorf(err, n, "malloc: out of memory");
    if (read_exact(c, c->data, c->data_bytes, "data", err, n))
        return -1;
    int rc = fclose(c->f);
    c->f = NULL;
    return rc ? plan_errorf(err, n, "fclose: %s", strerror(errno)) : 0;
}

static void free_ckpt(Ckpt *c)
{
    if (c->f)
        fclose(c->f); /* a read-only stream being abandoned after an error */
    cJSON_Delete(c->root);
    free(c->begin);
    free(c->data);
}

int rt_ckpt_load_latest(Runtime *rt, const char *dir, CkptMeta *meta, char *err, size_t n)
{
    char path[PATH_BYTES], msg[1024] = "";
    int64_t step = -1;
    int found = newest(dir, path, &step, err, n);
    if (found <= 0)
        return found;
    const Plan *p = rt_plan(rt);
    if (!rt->world && plan_mesh_size(p) > 1)
        return plan_errorf(err, n,
                           "checkpoint: the plan runs on %" PRId64 " devices, but no mesh was "
                           "attached (rt_attach)",
                           plan_mesh_size(p));
    Ckpt c = {0};
    CkptMeta m;
    int rc = read_ckpt(&c, path, step, p, &m, msg, sizeof msg);
    for (int i = 0; !rc && i < p->ntensors; i++) /* this device's block of each it holds */
        if (saved(&p->tensors[i]) && rt_holds(rt, i))
            rt_block_copy(rt, &p->tensors[i], c.data + c.begin[i], rt_tensor_data(rt, i), 0);
    free_ckpt(&c);
    if (rc)
        return plan_errorf(err, n, "%s: %s", path, msg);
    if (meta)
        *meta = m;
    return 1;
}
