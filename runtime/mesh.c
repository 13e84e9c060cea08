/* mesh.c: the device's place on the mesh: its coordinates, its pipeline stage,
 * its groups, the collectives of the plan (send and recv between stages too),
 * and the blocks of split tensors.
 * Reads: the plan's axes, tensor splits and PI_COLL instructions, and a World.
 * Writes: the device's groups (made at attach), its coord tensors, and the
 * outputs of collectives. Key idea: a device's coordinates are its world
 * rank placed as the plan says (plan_coords: each axis's stride), and its
 * block of a tensor split over axes (a0, a1, ...) along a dim is its block
 * index over them, major to minor; a group along axes orders its members the
 * same way, whatever the placement,
 * so a collective's member r holds block r, and in the group along the
 * pipeline axes member s is the device of stage s. */
#include "runtime/exec.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int64_t block_index(const Plan *p, const int *coord, const int8_t *axes, int naxes)
{
    int64_t b = 0;
    for (int i = 0; i < naxes; i++)
        b = b * p->axes[axes[i]].size + coord[axes[i]];
    return b;
}

int64_t rt_block_index(const Runtime *rt, const int8_t *axes, int naxes)
{
    return block_index(rt->p, rt->coord, axes, naxes);
}

static int64_t split_count(const Plan *p, const PlanTensor *t, int d)
{
    int64_t f = 1;
    for (int i = 0; i < t->nsplit[d]; i++)
        f *= p->axes[t->split[d][i]].size;
    return f;
}

void rt_global_shape(const Plan *p, const PlanTensor *t, int64_t *shape)
{
    for (int d = 0; d < t->rank; d++)
        shape[d] = t->shape[d] * split_count(p, t, d);
}

/* The coordinates of member m of the group over every axis (its members are
 * ordered by their block index over the axes, row-major: rt_comm_split's
 * key), which is not world rank m under a placement. */
static void member_coords(const Plan *p, int64_t m, int *coord)
{
    for (int a = p->naxes - 1; a >= 0; a--) {
        coord[a] = (int)(m % p->axes[a].size);
        m /= p->axes[a].size;
    }
}

/* Copy the block at coord of t between its global value and a local buffer. */
static void block_copy(const Plan *p, const PlanTensor *t, const int *coord, char *global,
                       char *local, int put)
{
    int64_t gshape[PLAN_MAX_RANK], origin[PLAN_MAX_RANK], idx[PLAN_MAX_RANK] = {0};
    size_t elem = plan_dtype_size(t->dtype);
    rt_global_shape(p, t, gshape);
    for (int d = 0; d < t->rank; d++)
        origin[d] = block_index(p, coord, t->split[d], t->nsplit[d]) * t->shape[d];
    if (t->rank == 0) {
        memcpy(put ? global : local, put ? local : global, elem);
        return;
    }
    size_t run = (size_t)t->shape[t->rank - 1] * elem;
    for (uint64_t done = 0; done < t->bytes; done += run) {
        int64_t off = 0;
        for (int d = 0; d < t->rank; d++)
            off = off * gshape[d] + origin[d] + (d == t->rank - 1 ? 0 : idx[d]);
        char *g = global + (size_t)off * elem, *l = local + done;
        memcpy(put ? g : l, put ? l : g, run);
        for (int d = t->rank - 2; d >= 0; d--) { /* the odometer over the outer dims */
            if (++idx[d] < t->shape[d])
                break;
            idx[d] = 0;
        }
    }
}

void rt_block_origin(const Runtime *rt, const PlanTensor *t, int64_t *origin)
{
    for (int d = 0; d < t->rank; d++)
        origin[d] = rt_block_index(rt, t->split[d], t->nsplit[d]) * t->shape[d];
}

void rt_block_copy(const Runtime *rt, const PlanTensor *t, void *global, void *local, int put)
{
    block_copy(rt->p, t, rt->coord, global, local, put);
}

/* ---- groups ---- */

/* Groups are kept by the ordered list of their axes, packed into a key. */
static int group_key(const int8_t *axes, int naxes)
{
    int k = 0;
    for (int i = 0; i < naxes; i++)
        k = k * 9 + axes[i] + 1;
    return k;
}

static RtComm **group_slot(Runtime *rt, const int8_t *axes, int naxes)
{
    int key = group_key(axes, naxes);
    for (int i = 0; i < RT_MAX_GROUPS; i++) {
        if (!rt->group[i] || rt->group_key[i] == key) {
            rt->group_key[i] = key;
            return &rt->group[i];
        }
    }
    return NULL;
}

/* The group along axes: the devices that share every other coordinate. */
static int make_group(Runtime *rt, const int8_t *axes, int naxes, char *err, size_t n)
{
    RtComm **slot = group_slot(rt, axes, naxes);
    if (!slot)
        return plan_errorf(err, n, "too many device groups");
    if (*slot)
        return 0;
    int64_t color = 0;
    uint32_t in = 0;
    for (int i = 0; i < naxes; i++)
        in |= 1u << axes[i];
    for (int a = 0; a < rt->p->naxes; a++)
        if (!(in >> a & 1))
            color = color * rt->p->axes[a].size + rt->coord[a];
    *slot = rt_comm_split(rt->world, (int)color, (int)rt_block_index(rt, axes, naxes), err, n);
    if (!*slot)
        return -1;
    char name[32] = "";
    for (int i = 0; i < naxes; i++) /* "dp,tp": for the watchdog's messages */
        snprintf(name + strlen(name), sizeof name - strlen(name), "%s%s", i ? "," : "",
                 rt->p->axes[axes[i]].name);
    rt_comm_name(*slot, name);
    rt_comm_account(*slot, &rt->mem);
    if (!rt->gpu) /* NCCL: the group's communicator, then its pipeline channels */
        return 0;
    if (rt_cuda_group(rt->gpu, (int)(slot - rt->group), *slot, err, n))
        return -1;
    return rt_cuda_channels(rt->gpu, axes, naxes, *slot, err, n);
}

int rt_group_slot(Runtime *rt, const int8_t *axes, int naxes)
{
    RtComm **slot = rt->world ? group_slot(rt, axes, naxes) : NULL;
    return slot && *slot ? (int)(slot - rt->group) : -1;
}

static RtComm *group(Runtime *rt, const int8_t *axes, int naxes)
{
    RtComm **slot = group_slot(rt, axes, naxes);
    return slot ? *slot : NULL;
}

static void fill_coords(Runtime *rt)
{
    const Plan *p = rt->p;
    for (int t = 0; t < p->ntensors; t++) {
        const PlanTensor *pt = &p->tensors[t];
        if (pt->role == PT_COORD)
            *(int32_t *)rt_host(rt, t) =
                (int32_t)(rt_block_index(rt, pt->coord, pt->ncoord) * (int64_t)pt->init_arg);
    }
}

/* This device's stage and, with more than one, its own slab (the stage's: the
 * rest is unmapped) and the pipeline group (for the outputs; send and recv use
 * it too). */
static int attach_stage(Runtime *rt, char *err, size_t n)
{
    const Plan *p = rt->p;
    rt->npipe = 0;
    for (int a = 0; a < p->naxes; a++)
        if (p->axes[a].role && !strcmp(p->axes[a].role, "pipeline"))
            rt->pipe[rt->npipe++] = (int8_t)a;
    rt->stage = (int)rt_block_index(rt, rt->pipe, rt->npipe);
    if (rt->nstages <= 1)
        return 0;
    rt_cpu_fit(&rt->dev, plan_stage_slab(p, rt->stage));
    return make_group(rt, rt->pipe, rt->npipe, err, n);
}

int rt_attach(Runtime *rt, RtWorld *w, char *err, size_t n)
{
    const Plan *p = rt->p;
    if (rt_world_size(w) != plan_mesh_size(p))
        return plan_errorf(err, n, "the plan's mesh has %" PRId64 " devices, but %d ranks run it",
                           plan_mesh_size(p), rt_world_size(w));
    if (rt->gpu && strcmp(rt_world_backend(w), "mpi"))
        return plan_errorf(err, n, "the cuda device runs one process per GPU under mpirun or "
                                   "srun (comm mpi); the %s backend is CPU-only",
                           rt_world_backend(w));
    rt->world = w;
    plan_coords(p, rt_world_rank(w), rt->coord); /* the plan's placement */
    int8_t all[PLAN_MAX_AXES];
    for (int a = 0; a < p->naxes; a++)
        all[a] = (int8_t)a;
    if (make_group(rt, all, p->naxes, err, n) || attach_stage(rt, err, n))
        return -1;
    for (int i = 0; i < p->ninstrs; i++)
        if (p->instrs[i].kind == PI_COLL &&
            make_group(rt, p->instrs[i].coll.axes, p->instrs[i].coll.naxes, err, n))
            return -1;
    size_t scratch = (size_t)plan_scratch_bytes(p, 0);
    if (scratch && !(rt->scratch = malloc(scratch)))
        return plan_errorf(err, n, "malloc of %zu bytes failed", scratch);
    rt->scratch_bytes = scratch;
    rt_account(&rt->mem, (int64_t)scratch);
    fill_coords(rt);
    return 0;
}

void rt_mesh_close(Runtime *rt)
{
    for (int i = 0; i < RT_MAX_GROUPS; i++)
        rt_comm_free(rt->group[i]);
    rt_account(&rt->mem, -(int64_t)rt->scratch_bytes);
    free(rt->scratch);
}

/* ---- collectives ---- */

/* part (contiguous, shape of full but k along dim) to or from full at start. */
static void along(const PlanTensor *part, int dim, int64_t full_dim, int64_t start, char *full,
                  char *pbuf, int put)
{
    size_t elem = plan_dtype_size(part->dtype), pre = 1, post = elem;
    for (int d = 0; d < dim; d++)
        pre *= (size_t)part->shape[d];
    for (int d = dim + 1; d < part->rank; d++)
        post *= (size_t)part->shape[d];
    size_t run = (size_t)part->shape[dim] * post;
    for (size_t i = 0; i < pre; i++) {
        char *f = full + (i * (size_t)full_dim + (size_t)start) * post, *q = pbuf + i * run;
        memcpy(put ? f : q, put ? q : f, run);
    }
}

static void geometry(const PlanTensor *t, int dim, size_t *pre, size_t *post)
{
    *pre = *post = 1;
    for (int d = 0; d < dim; d++)
        *pre *= (size_t)t->shape[d];
    for (int d = dim + 1; d < t->rank; d++)
        *post *= (size_t)t->shape[d];
}

static int all_to_all(Runtime *rt, RtComm *c, const PlanColl *co, const PlanTensor *a,
                      const PlanTensor *b, char *in, char *out, char *err, size_t n)
{
    int k = rt_comm_size(c);
    size_t block = a->bytes / (size_t)k;
    PlanTensor piece = *a; /* one block: a's shape with dim2 cut k ways */
    piece.shape[co->dim2] /= k;
    char *send = rt->scratch, *recv = rt->scratch + a->bytes;
    for (int j = 0; j < k; j++)
        along(&piece, co->dim2, a->shape[co->dim2], j * piece.shape[co->dim2], in,
              send + (size_t)j * block, 0);
    if (rt_comm_all_to_all(c, send, recv, block, err, n))
        return -1;
    for (int j = 0; j < k; j++)
        along(&piece, co->dim, b->shape[co->dim], j * piece.shape[co->dim], out,
              recv + (size_t)j * block, 1);
    return 0;
}

/* An all-reduce bucket: the inputs packed, one sum, the outputs unpacked. */
static int bucket(Runtime *rt, RtComm *c, int i, char *err, size_t n)
{
    const Plan *p = rt->p;
    const PlanInstr *in = &p->instrs[i];
    size_t off = 0, elem = plan_dtype_size(p->tensors[in->args[0]].dtype);
    for (int a = 0; a < in->nargs; a += 2) {
        memcpy(rt->scratch + off, rt->args[i][a], p->tensors[in->args[a]].bytes);
        off += p->tensors[in->args[a]].bytes;
    }
    if (rt_comm_all_reduce(c, rt->scratch, off / elem, p->tensors[in->args[0]].dtype, err, n))
        return -1;
    off = 0;
    for (int a = 0; a < in->nargs; a += 2) {
        memcpy(rt->args[i][a + 1], rt->scratch + off, p->tensors[in->args[a + 1]].bytes);
        off += p->tensors[in->args[a + 1]].bytes;
    }
    return 0;
}

int rt_mesh_coll(Runtime *rt, int i, char *err, size_t n)
{
    const Plan *p = rt->p;
    const PlanInstr *in = &p->instrs[i];
    const PlanColl *co = &in->coll;
    const PlanTensor *a = &p->tensors[in->args[0]];
    RtComm *c = rt->world ? group(rt, co->axes, co->naxes) : NULL;
    if (!c && co->op != PC_SLICE)
        return plan_errorf(err, n, "%s: the plan runs on %" PRId64 " devices, but no mesh was "
                                   "attached (rt_attach)",
                           plan_coll_name(co->op), plan_mesh_size(p));
    if (rt->gpu) /* NCCL on the device's communication stream */
        return rt_cuda_coll(rt->gpu, i, rt_group_slot(rt, co->axes, co->naxes),
                            rt_block_index(rt, co->axes, co->naxes), err, n);
    if (co->op == PC_SEND) /* one tensor: no args[1] */
        return rt_comm_send(c, rt->args[i][0], a->bytes, co->peer, co->tag, err, n);
    if (co->op == PC_RECV)
        return rt_comm_recv(c, rt->args[i][0], a->bytes, co->peer, co->tag, err, n);
    const PlanTensor *b = &p->tensors[in->args[1]];
    char *x = rt->args[i][0], *y = rt->args[i][1];
    size_t pre, post, elem = plan_dtype_size(a->dtype);
    switch (co->op) {
    case PC_ALL_REDUCE:
        if (in->nargs > 2)
            return bucket(rt, c, i, err, n);
        memmove(y, x, a->bytes);
        return rt_comm_all_reduce(c, y, a->bytes / elem, a->dtype, err, n);
    case PC_ALL_REDUCE_MAX:
        memmove(y, x, a->bytes);
        return rt_comm_all_reduce_max(c, y, a->bytes / elem, a->dtype, err, n);
    case PC_ALL_GATHER:
        geometry(a, co->dim, &pre, &post);
        return rt_comm_all_gather(c, x, y, pre, (size_t)a->shape[co->dim], post, elem, err, n);
    case PC_REDUCE_SCATTER:
        geometry(b, co->dim, &pre, &post);
        return rt_comm_reduce_scatter(c, x, y, pre, (size_t)b->shape[co->dim], post, a->dtype,
                                      err, n);
    case PC_SLICE: {
        int64_t blk = rt_block_index(rt, co->axes, co->naxes);
        along(b, co->dim, a->shape[co->dim], blk * b->shape[co->dim], x, y, 0);
        return 0;
    }
    case PC_ALL_TO_ALL:
        return all_to_all(rt, c, co, a, b, x, y, err, n);
    default:
        return plan_errorf(err, n, "unknown collective %d", (int)co->op);
    }
}

int rt_mesh_outputs(Runtime *rt, char *err, size_t n)
{
    const Plan *p = rt->p;
    int outs[] = {p->loss, p->lr, p->grad_norm};
    if (rt->nstages <= 1)
        return 0;
    RtComm *c = group(rt, rt->pipe, rt->npipe);
    for (int j = 0; j < 3; j++) {
        const PlanTensor *t = outs[j] >= 0 ? &p->tensors[outs[j]] : NULL;
        if (t && t->stage >= 0 &&
            rt_comm_broadcast(c, rt_host(rt, outs[j]), t->bytes, t->stage, err, n))
            return -1;
    }
    return 0;
}

int rt_mesh_agree(Runtime *rt, int32_t *v, size_t count, char *err, size_t n)
{
    int8_t all[PLAN_MAX_AXES];
    if (!rt->world)
        return 0;
    for (int a = 0; a < rt->p->naxes; a++)
        all[a] = (int8_t)a;
    return rt_comm_all_reduce_max(group(rt, all, rt->p->naxes), v, count, PD_I32, err, n);
}

/* ---- whole tensors ---- */

int rt_tensor_global(Runtime *rt, int t, void *global, char *err, size_t n)
{
    const Plan *p = rt->p;
    const PlanTensor *pt = &p->tensors[t];
    if (!rt->world) {
        memcpy(global, rt_tensor_data(rt, t), pt->bytes);
        return 0;
    }
    int8_t all[PLAN_MAX_AXES];
    for (int a = 0; a < p->naxes; a++)
        all[a] = (int8_t)a;
    RtComm *c = group(rt, all, p->naxes);
    int size = rt_world_size(rt->world);
    char *blocks = calloc(pt->bytes * ((size_t)size + 1) + 1, 1);
    if (!blocks)
        return plan_errorf(err, n, "calloc of %" PRIu64 " bytes failed",
                           pt->bytes * ((uint64_t)size + 1));
    /* a device of another stage does not hold t: it sends zeros, ignored below */
    const char *mine = rt_holds(rt, t) ? rt_tensor_data(rt, t) : blocks + pt->bytes * (size_t)size;
    if (rt_comm_all_gather(c, mine, blocks, 1, pt->bytes, 1, 1, err, n)) {
        free(blocks);
        return -1;
    }
    for (int r = 0; r < size; r++) { /* a tensor of one stage: the copies of the others are stale */
        int coord[PLAN_MAX_AXES];
        member_coords(p, r, coord);
        if (pt->stage < 0 || rt->nstages <= 1 ||
            block_index(p, coord, rt->pipe, rt->npipe) == pt->stage)
            block_copy(p, pt, coord, global, blocks + (size_t)r * pt->bytes, 1);
    }
    free(blocks);
    return 0;
}

int rt_data_split(const Runtime *rt, const char *input, int *rank, int *ranks)
{
    const Plan *p = rt->p;
    int t = rt_find_tensor(p, input);
    *rank = 0, *ranks = 1;
    if (t < 0 || !rt->world || p->tensors[t].rank == 0)
        return 0;
    const PlanTensor *pt = &p->tensors[t];
    *rank = (int)rt_block_index(rt, pt->split[0], pt->nsplit[0]);
    *ranks = (int)split_count(p, pt, 0);
    return 0;
}

/* ---- the threads backend's runner ---- */

typedef struct Rank {
    RtThreadsHub *hub;
    int rank, rc;
    int (*fn)(RtWorld *w, void *arg, char *err, size_t n);
    void *arg;
    char err[512];
} Rank;

static void *rank_main(void *p)
{
    Rank *r = p;
    RtWorld *w = rt_world_threads(r->hub, r->rank);
    r->rc = w ? r->fn(w, r->arg, r->err, sizeof r->err) : -1;
    if (!w)
        snprintf(r->err, sizeof r->err, "rank %d: no world", r->rank);
    if (r->rc) /* the others stop waiting for this rank */
        rt_threads_fail(r->hub, r->rank);
    rt_world_close(w);
    return NULL;
}

int rt_run_threads(int nranks, int (*fn)(RtWorld *w, void *arg, char *err, size_t n), void *arg,
                   char *err, size_t n)
{
    RtThreadsHub *hub = rt_threads_hub_new(nranks);
    Rank *ranks = calloc((size_t)nranks, sizeof *ranks);
    pthread_t *th = calloc((size_t)nranks, sizeof *th);
    int rc = 0, started = 0;
    double timeout = 0; /* the watchdog, in seconds */
    if (!hub || !ranks || !th)
        rc = plan_errorf(err, n, "out of memory starting %d ranks", nranks);
    else
        rc = rt_comm_timeout(&timeout, err, n);
    rt_threads_hub_timeout(hub, timeout);
    for (int r = 0; !rc && r < nranks; r++, started++) {
        ranks[r] = (Rank){hub, r, 0, fn, arg, ""};
        if (pthread_create(&th[r], NULL, rank_main, &ranks[r]) != 0)
            rc = plan_errorf(err, n, "pthread_create for rank %d failed", r);
    }
    for (int r = 0; r < started; r++)
        pthread_join(th[r], NULL);
    int first = rt_threads_failed(hub); /* the rank that failed first, not those it stopped */
    if (!rc && first >= 0 && first < started && ranks[first].rc)
        rc = plan_errorf(err, n, "%s", ranks[first].err);
    for (int r = 0; !rc && r < nranks; r++)
        if (ranks[r].rc)
            rc = plan_errorf(err, n, "%s", ranks[r].err);
    free(th);
    free(ranks);
    rt_threads_hub_free(hub);
    return rc;
}
