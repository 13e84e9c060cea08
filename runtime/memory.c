/* memory.c: what a device really holds: its slab's touched bytes and the
 * buffers it allocated besides (--report-memory).
 * Reads: a Runtime (its slab through rt_cpu_touched, its buffer account).
 * Writes: one line per rank, on the stream of world rank 0.
 * Key idea: the slab is anonymous memory the kernel maps in page by page on
 * first write, so the pages written are the memory the plan's tensors really
 * used; every other buffer of a device (BLAS widening copies, collective
 * staging and scratch, messages in flight) goes through rt_account, whose
 * peak is their high-water mark. The runtime's own tables (instruction
 * argument pointers, kernel pointers) and the buffers of checkpoints and
 * --verify, which run outside the step, are not counted. */
#include "runtime/exec.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

int rt_memory(Runtime *rt, RtMemory *m, char *err, size_t n)
{
    memset(m, 0, sizeof *m);
    m->rank = rt->world ? rt_world_rank(rt->world) : 0;
    m->stage = rt->stage < 0 ? 0 : rt->stage;
    m->slab = rt->dev.slab_bytes;
    if (rt_cpu_touched(&rt->dev, &m->touched, err, n))
        return -1;
    m->buffers = __atomic_load_n(&rt->mem.peak, __ATOMIC_RELAXED);
    m->peak = m->touched + m->buffers;
    return 0;
}

void rt_memory_print(FILE *f, const RtMemory *m)
{
    fprintf(f,
            "memory: rank %" PRId64 " stage %" PRId64 ": slab %" PRIu64 " bytes (touched %" PRIu64
            "), buffers %" PRIu64 " bytes, peak %" PRIu64 " bytes\n",
            m->rank, m->stage, m->slab, m->touched, m->buffers, m->peak);
}

int rt_memory_report(Runtime *rt, FILE *out, char *err, size_t n)
{
    RtMemory mine;
    if (rt_memory(rt, &mine, err, n))
        return -1;
    int8_t all[PLAN_MAX_AXES];
    for (int a = 0; a < rt->p->naxes; a++)
        all[a] = (int8_t)a;
    int slot = rt_group_slot(rt, all, rt->p->naxes);
    if (slot < 0) { /* one device */
        if (out)
            rt_memory_print(out, &mine);
        return 0;
    }
    int size = rt_comm_size(rt->group[slot]);
    RtMemory *each = calloc((size_t)size, sizeof *each);
    if (!each)
        return plan_errorf(err, n, "calloc: out of memory");
    int rc = rt_comm_all_gather(rt->group[slot], &mine, each, 1, sizeof mine, 1, 1, err, n);
    for (int r = 0; !rc && out && r < size; r++)
        rt_memory_print(out, &each[r]);
    free(each);
    return rc;
}
