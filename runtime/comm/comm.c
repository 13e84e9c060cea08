/* comm.c: the calls of comm.h that every backend shares.
 * Reads: the arguments of each call. Writes: nothing but the comm's scratch
 * buffer; the work is done by the backend (threads.c, mpi.c) through the
 * table of operations at the start of every World and Comm (comm_impl.h).
 * Key idea: arguments are checked here, once, before any backend sees them, so
 * the backends can trust that dtypes reduce, sizes do not overflow, and ranks
 * and tags lie in range. A call refused here returns before it communicates;
 * the members of a group refuse together when they pass the same arguments.
 * bf16 reductions are done here for the threads and MPI backends: the values
 * are widened to f32, the backend reduces f32, and the result is rounded once
 * to bf16 (round to nearest even), so no sum is rounded per hop. (The cuda
 * device's NCCL collectives do not come through here: NCCL sums bf16 itself.) */
#include "runtime/comm/comm_impl.h"
#include "runtime/runtime.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Tags go up to MPI's smallest guaranteed MPI_TAG_UB, on every backend. */
#define COMM_MAX_TAG 32767

/* "rank R: what: message" into err; -1. */
__attribute__((format(printf, 5, 6))) static int refuse(const RtComm *c, const char *what,
                                                        char *err, size_t n, const char *fmt, ...)
{
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return plan_errorf(err, n, "rank %d: %s: %s", c->world_rank, what, msg);
}

static int reducible(PlanDType dt)
{
    return dt == PD_F32 || dt == PD_F64 || dt == PD_I32 || dt == PD_BF16;
}

static int check_dtype(const RtComm *c, const char *what, PlanDType dt, char *err, size_t n)
{
    if (reducible(dt))
        return 0;
    return refuse(c, what, err, n, "dtype %s does not reduce (f32, f64, bf16 or i32)",
                  plan_dtype_name(dt));
}

/* a * b * c * d into *out; -1 on overflow. */
static int product(size_t a, size_t b, size_t c, size_t d, size_t *out)
{
    size_t ab, abc;
    if (__builtin_mul_overflow(a, b, &ab) || __builtin_mul_overflow(ab, c, &abc) ||
        __builtin_mul_overflow(abc, d, out))
        return -1;
    return 0;
}

/* The bytes every member holds (bytes = total of the largest buffer) fit size_t, and the
 * buffers are there when they hold anything. */
static int check_buffers(const RtComm *c, const char *what, size_t pre, size_t mid, size_t post,
                         size_t elem, const void *a, const void *b, char *err, size_t n)
{
    size_t bytes;
    if (product(pre, mid, post, elem, &bytes) || product(bytes, (size_t)c->size, 1, 1, &bytes))
        return refuse(c, what, err, n, "the buffer size overflows");
    if (bytes && (!a || !b))
        return refuse(c, what, err, n, "a buffer is NULL");
    return 0;
}

static int check_member(const RtComm *c, const char *what, const char *role, int r, char *err,
                        size_t n)
{
    if (r < 0 || r >= c->size)
        return refuse(c, what, err, n, "%s %d is not a member (the group has %d)", role, r,
                      c->size);
    return 0;
}

static int check_peer(const RtComm *c, const char *what, int peer, int tag, char *err, size_t n)
{
    if (check_member(c, what, "peer", peer, err, n))
        return -1;
    if (peer == c->rank)
        return refuse(c, what, err, n, "peer %d is this member itself", peer);
    if (tag < 0 || tag > COMM_MAX_TAG)
        return refuse(c, what, err, n, "tag %d is not in [0, %d]", tag, COMM_MAX_TAG);
    return 0;
}

void rt_account(RtAccount *a, int64_t delta)
{
    if (!a)
        return;
    uint64_t now = __atomic_add_fetch(&a->now, (uint64_t)delta, __ATOMIC_RELAXED);
    uint64_t peak = __atomic_load_n(&a->peak, __ATOMIC_RELAXED);
    while (now > peak && !__atomic_compare_exchange_n(&a->peak, &peak, now, 1, __ATOMIC_RELAXED,
                                                      __ATOMIC_RELAXED))
        ;
}

void rt_comm_account(RtComm *c, RtAccount *a)
{
    c->account = a;
    rt_account(a, (int64_t)(c->scratch_bytes + sizeof(float) * c->wide_len));
}

void *rt_comm_scratch(RtComm *c, size_t bytes, char *err, size_t n)
{
    if (bytes == 0)
        bytes = 1;
    if (bytes <= c->scratch_bytes)
        return c->scratch;
    void *p = realloc(c->scratch, bytes);
    if (!p) {
        refuse(c, "scratch", err, n, "out of memory for %zu bytes", bytes);
        return NULL;
    }
    rt_account(c->account, (int64_t)bytes - (int64_t)c->scratch_bytes);
    c->scratch = p;
    c->scratch_bytes = bytes;
    return p;
}

void rt_comm_release(RtComm *c)
{
    rt_account(c->account, -(int64_t)(c->scratch_bytes + sizeof(float) * c->wide_len));
    free(c->scratch);
    free(c->wide);
    free(c->members);
    c->scratch = NULL;
    c->scratch_bytes = 0;
    c->wide = NULL;
    c->wide_len = 0;
    c->members = NULL;
}

int rt_comm_member(const RtComm *c, int r)
{
    return c->members ? c->members[r] : r;
}

void rt_comm_describe(const RtComm *c, char *out, size_t n)
{
    int len = c->name[0]
                  ? snprintf(out, n, "group %s (rank%s", c->name, c->size > 1 ? "s" : "")
                  : snprintf(out, n, "a group of %d (rank%s", c->size, c->size > 1 ? "s" : "");
    for (int r = 0; r < c->size && r < 8 && len >= 0 && (size_t)len < n; r++)
        len += snprintf(out + len, n - (size_t)len, " %d", rt_comm_member(c, r));
    if (len >= 0 && (size_t)len < n)
        snprintf(out + len, n - (size_t)len, "%s)", c->size > 8 ? " ..." : "");
}

void rt_comm_name(RtComm *c, const char *name)
{
    snprintf(c->name, sizeof c->name, "%s", name);
}

/* s as a number of seconds > 0 (at most 1e9, which is forever here): 0, or -1. */
static int seconds_of(const char *s, double *out)
{
    char *end;
    double v = strtod(s, &end);
    if (*end || end == s || !(v > 0) || v > 1e9)
        return -1;
    *out = v;
    return 0;
}

int rt_comm_timeout(double *seconds, char *err, size_t n)
{
    const char *v = getenv("TCC_COMM_TIMEOUT");
    *seconds = 300;
    if (v && *v && seconds_of(v, seconds))
        return plan_errorf(err, n, "TCC_COMM_TIMEOUT=%s: expected a number of seconds > 0", v);
    return 0;
}

int rt_comm_set_timeout(const char *seconds)
{
    double v;
    return seconds_of(seconds, &v) || setenv("TCC_COMM_TIMEOUT", seconds, 1) ? -1 : 0;
}

/* Room for len floats in the comm's f32 buffer (kept until rt_comm_release). */
static float *wide_buffer(RtComm *c, size_t len, char *err, size_t n)
{
    if (len <= c->wide_len && c->wide)
        return c->wide;
    if (len > SIZE_MAX / sizeof(float))
        return refuse(c, "bf16 reduction", err, n, "the buffer size overflows"), NULL;
    float *p = realloc(c->wide, sizeof(float) * (len ? len : 1));
    if (!p) {
        refuse(c, "bf16 reduction", err, n, "out of memory for %zu floats", len);
        return NULL;
    }
    rt_account(c->account, (int64_t)(sizeof(float) * ((len ? len : 1) - c->wide_len)));
    c->wide = p;
    c->wide_len = len ? len : 1;
    return p;
}

static void widen(float *dst, const void *src, size_t count)
{
    for (size_t i = 0; i < count; i++)
        dst[i] = rt_bf16_to_f32(((const uint16_t *)src)[i]);
}

static void narrow(void *dst, const float *src, size_t count)
{
    for (size_t i = 0; i < count; i++)
        ((uint16_t *)dst)[i] = rt_f32_to_bf16(src[i]);
}

int rt_world_rank(const RtWorld *w)
{
    return w->rank;
}

int rt_world_size(const RtWorld *w)
{
    return w->size;
}

const char *rt_world_backend(const RtWorld *w)
{
    return w->ops->name;
}

int rt_world_broken(const RtWorld *w)
{
    return w->ops->world_broken(w);
}

void rt_world_close(RtWorld *w)
{
    if (w)
        w->ops->world_close(w);
}

RtComm *rt_comm_split(RtWorld *w, int color, int key, char *err, size_t n)
{
    if (color < 0) { /* MPI_UNDEFINED is negative */
        plan_errorf(err, n, "rank %d: comm_split: color %d is negative", w->rank, color);
        return NULL;
    }
    return w->ops->split(w, color, key, err, n);
}

void rt_comm_free(RtComm *c)
{
    if (c)
        c->ops->comm_free(c);
}

int rt_comm_rank(const RtComm *c)
{
    return c->rank;
}

int rt_comm_size(const RtComm *c)
{
    return c->size;
}

static int all_reduce(RtComm *c, const char *what, void *buf, size_t count, PlanDType dt, int max,
                      char *err, size_t n)
{
    if (check_dtype(c, what, dt, err, n) ||
        check_buffers(c, what, 1, count, 1, plan_dtype_size(dt), buf, buf, err, n))
        return -1;
    if (dt != PD_BF16)
        return c->ops->all_reduce(c, buf, count, dt, max, err, n);
    float *w = wide_buffer(c, count, err, n);
    if (!w)
        return -1;
    widen(w, buf, count);
    if (c->ops->all_reduce(c, w, count, PD_F32, max, err, n))
        return -1;
    narrow(buf, w, count);
    return 0;
}

int rt_comm_all_reduce(RtComm *c, void *buf, size_t count, PlanDType dt, char *err, size_t n)
{
    return all_reduce(c, "all_reduce", buf, count, dt, 0, err, n);
}

int rt_comm_all_reduce_max(RtComm *c, void *buf, size_t count, PlanDType dt, char *err, size_t n)
{
    return all_reduce(c, "all_reduce_max", buf, count, dt, 1, err, n);
}

int rt_comm_all_gather(RtComm *c, const void *in, void *out, size_t pre, size_t chunk, size_t post,
                       size_t elem, char *err, size_t n)
{
    if (elem == 0)
        return refuse(c, "all_gather", err, n, "elements of 0 bytes");
    if (check_buffers(c, "all_gather", pre, chunk, post, elem, in, out, err, n))
        return -1;
    return c->ops->all_gather(c, in, out, pre, chunk, post, elem, err, n);
}

int rt_comm_reduce_scatter(RtComm *c, const void *in, void *out, size_t pre, size_t chunk,
                           size_t post, PlanDType dt, char *err, size_t n)
{
    const char *what = "reduce_scatter";
    if (check_dtype(c, what, dt, err, n) ||
        check_buffers(c, what, pre, chunk, post, plan_dtype_size(dt), in, out, err, n))
        return -1;
    if (dt != PD_BF16)
        return c->ops->reduce_scatter(c, in, out, pre, chunk, post, dt, err, n);
    /* check_buffers has bounded these products */
    size_t nin = pre * chunk * post * (size_t)c->size, nout = pre * chunk * post;
    float *w = wide_buffer(c, nin + nout, err, n);
    if (!w)
        return -1;
    widen(w, in, nin);
    if (c->ops->reduce_scatter(c, w, w + nin, pre, chunk, post, PD_F32, err, n))
        return -1;
    narrow(out, w + nin, nout);
    return 0;
}

int rt_comm_all_to_all(RtComm *c, const void *in, void *out, size_t block_bytes, char *err,
                       size_t n)
{
    if (check_buffers(c, "all_to_all", 1, block_bytes, 1, 1, in, out, err, n))
        return -1;
    return c->ops->all_to_all(c, in, out, block_bytes, err, n);
}

int rt_comm_broadcast(RtComm *c, void *buf, size_t bytes, int root, char *err, size_t n)
{
    if (check_member(c, "broadcast", "root", root, err, n) ||
        check_buffers(c, "broadcast", 1, bytes, 1, 1, buf, buf, err, n))
        return -1;
    return c->ops->broadcast(c, buf, bytes, root, err, n);
}

int rt_comm_barrier(RtComm *c, char *err, size_t n)
{
    return c->ops->barrier(c, err, n);
}

int rt_comm_send(RtComm *c, const void *buf, size_t bytes, int peer, int tag, char *err, size_t n)
{
    if (check_peer(c, "send", peer, tag, err, n) ||
        check_buffers(c, "send", 1, bytes, 1, 1, buf, buf, err, n))
        return -1;
    return c->ops->send(c, buf, bytes, peer, tag, err, n);
}

int rt_comm_recv(RtComm *c, void *buf, size_t bytes, int peer, int tag, char *err, size_t n)
{
    if (check_peer(c, "recv", peer, tag, err, n) ||
        check_buffers(c, "recv", 1, bytes, 1, 1, buf, buf, err, n))
        return -1;
    return c->ops->recv(c, buf, bytes, peer, tag, err, n);
}
