/* shard.c: sharding propagation. Reads the training-step graph with the TDL
 * annotations, the mesh-axis roles and the train block's zero and
 * sequence_parallel settings; writes a sharding, with its reason, on every
 * value. Key idea: sources are seeded (annotations; the data and fsdp axes
 * split the batch of inputs; fsdp and zero = 3 split parameters, zero >= 1
 * optimizer state and the gradients the update reads, each on its first
 * dimension that divides; zero >= 2 also each microbatch's gradient, so only
 * shards are summed over microbatches), then one sweep in definition order
 * gives every other value the result of its op's rule (shard_rules.c) over its
 * operands. A seeded value keeps its seed: the partition pass reshards into
 * it. ZeRO-3 parameters get one gathered copy per phase (forward, backward),
 * made just before its first use there, so the gathered memory lives only
 * while that phase needs it. In bf16 a parameter the step reads only through
 * bf16 casts is stored as its optimizer state is (the distributed optimizer:
 * the f32 master in shards) and its casts are pinned to the compute
 * sharding, so the bf16 copies are what gets gathered. */
#include "shard.h"

#include <stdio.h>
#include <string.h>

typedef struct SP {
    Ctx *c;
    Graph *g;
    ShardOpts o;
    int zero, sequence_parallel; /* the train settings */
    int bf16;                    /* precision = bf16 */
    char *pinned;    /* by Value.id */
    char *cast_read; /* by Value.id: 1 a parameter the step reads only through
                        bf16 casts, 2 one it also reads otherwise */
    const int *uses; /* by Value.id, before seeding: how many operands read it */
    VEC(struct Gather) gathers; /* the parameters that get gathered copies, in order */
    int errors;
} SP;

static const char *fmt(SP *s, const char *f, const char *a, const char *b)
{
    char buf[256];
    snprintf(buf, sizeof buf, f, a, b ? b : "");
    return intern(s->g->strings, buf);
}


/* Drop the axes of size 1 (they split nothing) and the pipeline axes (their
 * ranks replicate the whole step until pipeline parallelism lands). */
static void normalize(SP *s, Value *v)
{
    const Mesh *m = &s->g->mesh;
    Sharding *sh = &v->shard;
    for (int d = 0; d < v->rank; d++) {
        int k = 0;
        for (int i = 0; i < sh->naxes[d]; i++) {
            const MeshAxis *ax = &m->axes[sh->axes[d][i]];
            if (ax->size > 1 && ax->role != ROLE_PIPELINE)
                sh->axes[d][k++] = sh->axes[d][i];
        }
        sh->naxes[d] = (uint8_t)k;
    }
    for (int ax = 0; ax < m->naxes; ax++)
        if (m->axes[ax].size == 1 || m->axes[ax].role == ROLE_PIPELINE)
            sh->partial &= ~(1u << ax);
    if (ir_shard_is_replicated(sh, v->rank) && sh->why.kind != WHY_ANNOTATION &&
        sh->why.kind != WHY_USER)
        sh->why = (Why){WHY_NONE, LOC_NONE, NULL};
}

static int used_axis(const Sharding *sh, int rank, int ax)
{
    for (int d = 0; d < rank; d++)
        for (int i = 0; i < sh->naxes[d]; i++)
            if (sh->axes[d][i] == ax)
                return 1;
    return 0;
}

/* Append the axes of role r1 or r2 (size > 1, not yet used) to dim 0 of v;
 * the names into names. 0 when none fit. */
static int add_role_axes(SP *s, Sharding *sh, const Value *v, int dim, uint32_t roles,
                         char *names, size_t n)
{
    const Mesh *m = &s->g->mesh;
    int added = 0;
    for (int ax = 0; ax < m->naxes; ax++) {
        if (!(roles >> m->axes[ax].role & 1) || m->axes[ax].size == 1 || used_axis(sh, v->rank, ax))
            continue;
        int64_t f = ir_shard_factor(m, sh, dim) * m->axes[ax].size;
        if (v->shape[dim] % f != 0)
            continue;
        ir_shard_add(sh, dim, ax);
        size_t k = strlen(names);
        snprintf(names + k, n - k, "%s%s", added ? ", " : "", m->axes[ax].name);
        added++;
    }
    return added;
}

/* The first dim whose piece the axes of roles divide. */
static int storage_dim(SP *s, const Value *v, uint32_t roles)
{
    const Mesh *m = &s->g->mesh;
    int64_t n = 1;
    for (int ax = 0; ax < m->naxes; ax++)
        if ((roles >> m->axes[ax].role & 1) && m->axes[ax].size > 1 &&
            !used_axis(&v->shard, v->rank, ax))
            n *= m->axes[ax].size;
    for (int d = 0; d < v->rank; d++)
        if ((v->shape[d] / ir_shard_factor(m, &v->shard, d)) % n == 0)
            return d;
    return -1;
}

/* The product of the sizes of the axes of roles (size > 1) not used by v. */
static int64_t role_size(SP *s, const Value *v, uint32_t roles, char *names, size_t n)
{
    const Mesh *m = &s->g->mesh;
    int64_t k = 1;
    for (int ax = 0; ax < m->naxes; ax++)
        if ((roles >> m->axes[ax].role & 1) && m->axes[ax].size > 1 &&
            !used_axis(&v->shard, v->rank, ax)) {
            size_t len = strlen(names);
            snprintf(names + len, n - len, "%s%s=%d", len ? " x " : "", m->axes[ax].name,
                     m->axes[ax].size);
            k *= m->axes[ax].size;
        }
    return k;
}

/* Inputs: the data and fsdp axes split the batch (dim 0). */
static void seed_input(SP *s, Value *v)
{
    char names[128] = "";
    if (v->rank < 1)
        return;
    uint32_t roles = 1u << ROLE_DATA | 1u << ROLE_FSDP;
    int64_t k = role_size(s, v, roles, names, sizeof names);
    if (v->shape[0] % (k * ir_shard_factor(&s->g->mesh, &v->shard, 0)) != 0) {
        diag_error(&s->c->diag, v->loc,
                   "the batch of input '%s' (%lld rows) does not divide over the data-parallel "
                   "axes %s",
                   v->name ? v->name : "?", (long long)v->shape[0], names);
        s->errors++;
        return;
    }
    names[0] = 0;
    Sharding sh = v->shard;
    if (!add_role_axes(s, &sh, v, 0, 1u << ROLE_DATA | 1u << ROLE_FSDP, names, sizeof names))
        return;
    sh.why = (Why){WHY_ROLE, LOC_NONE, fmt(s, "data axes %s split the batch%s", names, NULL)};
    v->shard = sh;
}

/* The sharding a parameter's storage (and its optimizer state) gets over the
 * roles in `roles`; the compute sharding stays in v. */
static Sharding storage(SP *s, const Value *v, uint32_t roles, const char *why, int warn)
{
    Sharding sh = v->shard;
    char names[128] = "";
    int d = storage_dim(s, v, roles);
    if (d >= 0 && add_role_axes(s, &sh, v, d, roles, names, sizeof names))
        sh.why = (Why){WHY_ROLE, LOC_NONE, fmt(s, why, names, NULL)};
    else if (warn && d < 0 && role_size(s, v, roles, names, sizeof names) > 1)
        diag_report(&s->c->diag, SEV_WARNING, v->loc, 0,
                    "'%s' stays whole on every device: no dimension of it divides over %s",
                    v->name ? v->name : "?", names);
    return sh;
}

/* A parameter whose storage is split where its compute is not: it gets one
 * gathered copy per phase that reads it (gather_all). */
typedef struct Gather {
    Value *p;
    Sharding compute;
} Gather;

/* The phase whose gathered copy op reads: 0 forward, 1 backward (recompute
 * ops share the backward's copy: they run in the backward, before it), -1
 * none. */
static int gather_phase(const Op *op)
{
    Phase ph = op->phase == PH_RECOMPUTE ? PH_BWD : op->phase;
    return ph == PH_FWD ? 0 : ph == PH_BWD ? 1 : -1;
}

/* The gathered copy of gathers[j] for phase f: an identity reshape placed like
 * the first op of that phase that reads the parameter (at), pinned to its
 * compute sharding. Appended to the ops; gather_all puts it in its place. */
static Value *gather_copy(SP *s, const Gather *ga, int f, Op *at)
{
    Graph *g = s->g;
    Value *p = ga->p;
    Op *r = ir_op_new(g, OP_RESHAPE, &p, 1, p->loc);
    ir_op_place_like(r, at);
    r->phase = f == 0 ? PH_FWD : PH_BWD;
    ir_op_set_attr(g, r, ir_attr_ints(g->arena, "shape", p->shape, p->rank));
    Value *copy = ir_op_result(g, r, p->dtype, p->rank, p->shape);
    copy->shard = ga->compute;
    copy->shard.why =
        (Why){WHY_ROLE, LOC_NONE,
              fmt(s, "'%s' gathered for the %s pass", p->name, f == 0 ? "forward" : "backward")};
    s->pinned[copy->id] = 1;
    return copy;
}

/* Every gathered copy, each made just before the first op of its phase that
 * reads its parameter, and read by every such op in place of the parameter.
 * One walk finds the first readers, the copies are made in the order of
 * gathers (forward, then backward: the order of their values), and one more
 * walk puts each before its reader (several before one op in that order). */
static void gather_all(SP *s, const Gather *gathers, int n)
{
    Graph *g = s->g;
    int nops = g->ops.len, nv = g->values.len;
    int *of = arena_alloc(g->arena, sizeof(int) * (size_t)(nv + 1));       /* by Value.id */
    int *first = arena_alloc(g->arena, sizeof(int) * (size_t)(2 * n + 1)); /* by 2 j + f */
    int *next = arena_alloc(g->arena, sizeof(int) * (size_t)(2 * n + 1));
    int *before = arena_alloc(g->arena, sizeof(int) * (size_t)(nops + 1)); /* by op index */
    Value **copy = arena_alloc(g->arena, sizeof(Value *) * (size_t)(2 * n + 1));
    for (int i = 0; i < nv; i++)
        of[i] = -1;
    for (int j = 0; j < n; j++) {
        if (of[gathers[j].p->id] >= 0)
            BUG("parameter '%s' is updated twice", gathers[j].p->name);
        of[gathers[j].p->id] = j;
        first[2 * j] = first[2 * j + 1] = -1;
    }
    for (int i = 0; i < nops; i++) {
        Op *op = g->ops.data[i];
        int f = gather_phase(op);
        before[i] = -1;
        for (int a = 0; f >= 0 && a < op->nargs; a++) {
            int j = op->args[a]->id < nv ? of[op->args[a]->id] : -1;
            if (j >= 0 && first[2 * j + f] < 0)
                first[2 * j + f] = i;
        }
    }
    for (int c = 0; c < 2 * n; c++)
        copy[c] =
            first[c] < 0 ? NULL : gather_copy(s, &gathers[c / 2], c % 2, g->ops.data[first[c]]);
    for (int c = 2 * n - 1; c >= 0; c--) /* each op's copies, in the order made */
        if (first[c] >= 0)
            next[c] = before[first[c]], before[first[c]] = c;
    Op **ops = arena_alloc(g->arena, sizeof(Op *) * (size_t)(g->ops.len + 1));
    int k = 0;
    for (int i = 0; i < nops; i++) {
        Op *op = g->ops.data[i];
        for (int c = before[i]; c >= 0; c = next[c])
            ops[k++] = copy[c]->def;
        int f = gather_phase(op);
        for (int a = 0; f >= 0 && a < op->nargs; a++) {
            int j = op->args[a]->id < nv ? of[op->args[a]->id] : -1;
            if (j >= 0)
                op->args[a] = copy[2 * j + f];
        }
        ops[k++] = op;
    }
    g->ops.data = ops, g->ops.len = k, g->ops.cap = g->ops.len + 1;
}

/* ZeRO and fsdp over the parameters, their gradients and optimizer state. */
/* The gradient of p: what its optimizer op reads, past clipping; without one
 * (plain SGD), the value autodiff named "<p>.grad". NULL when none. */
static Value *gradient_of(SP *s, Value *p, const Op *op)
{
    if (op) {
        Value *g = op->args[1];
        while (g->def && g->def->kind == OP_MUL && g->def->phase == PH_OPT)
            g = g->def->args[g->def->args[0]->rank == 0 ? 1 : 0];
        return g;
    }
    char name[512];
    snprintf(name, sizeof name, "%s.grad", p->name ? p->name : "");
    const char *id = intern(s->g->strings, name);
    for (int i = 0; i < s->g->values.len; i++)
        if (s->g->values.data[i]->name == id)
            return s->g->values.data[i];
    return NULL;
}

/* ZeRO-2: the sum over microbatches of gradient g (a tree of shared adds of
 * the backward) adds shards: each microbatch's gradient, read by that sum
 * alone, is pinned to sh, so the partition pass reduce-scatters it right
 * after the op that makes it, and no whole gradient outlives its microbatch. */
static void scatter_microbatches(SP *s, Value *g, const Sharding *sh)
{
    const Op *op = g->def;
    if (op && ((op->kind == OP_ADD && op->mb < 0) || op->kind == OP_MB_SUM) &&
        op->phase == PH_BWD) {
        for (int a = 0; a < op->nargs; a++) {
            Value *x = op->args[a];
            if (x->rank == g->rank &&
                !memcmp(x->shape, g->shape, sizeof(int64_t) * (size_t)g->rank))
                scatter_microbatches(s, x, sh);
        }
        return;
    }
    if (s->pinned[g->id] || !op || op->mb < 0 || op->phase != PH_BWD || s->uses[g->id] != 1)
        return;
    g->shard = *sh;
    g->shard.why = (Why){WHY_ROLE, LOC_NONE,
                         "zero-2: a microbatch's gradient reduce-scattered before the sum"};
    s->pinned[g->id] = 1;
}

/* Gradient g is reduced straight into the layout the update reads, `to`: the
 * parameter's storage, or with zero >= 1 the optimizer state's (`split`: the
 * state is split where the parameter is not). ZeRO-1 reduce-scatters the sum
 * over microbatches once; ZeRO-2 each microbatch's gradient. */
static void seed_gradient(SP *s, Value *g, const Sharding *to, int split)
{
    int scattered = s->zero >= 1 && split;
    const char *why = "gradients reduced to the parameter's layout";
    if (scattered)
        why = s->zero == 1 ? "zero-1: the sum over microbatches reduce-scattered to the "
                             "optimizer state's shards"
                           : "zero-2: gradients reduce-scattered to the optimizer state's shards";
    g->shard = *to;
    g->shard.why = (Why){WHY_ROLE, LOC_NONE, why};
    s->pinned[g->id] = 1;
    if (scattered && s->zero >= 2)
        scatter_microbatches(s, g, &g->shard);
}

/* The distributed optimizer (precision = bf16): the f32 master weights of p
 * are stored split as its optimizer state is, and each bf16 cast the step
 * reads p through (one, or one per phase under ZeRO-3 and fsdp) is made from
 * the shard and gathered into the compute sharding right after it (the
 * partition pass reshards a pinned result after its op). So no device holds
 * the whole f32 parameter: only its shard and the step's bf16 copy, and the
 * update writes the shard without gathering it. gather(cast(x)) is
 * cast(gather(x)): the step's numbers are those of the f32 layout. */
static void master_in_shard(SP *s, Value *p, const Sharding *state, const Sharding *compute,
                            const Sharding *store)
{
    for (int i = 0; i < s->g->ops.len; i++) {
        Op *op = s->g->ops.data[i];
        if (op->kind != OP_CAST || op->args[0] != p || op->phase == PH_OPT)
            continue;
        Value *c = op->res[0];
        c->shard = *compute;
        c->shard.why = (Why){WHY_ROLE, LOC_NONE,
                             fmt(s, "'%s' cast to bf16 in its shards and gathered for the %s pass",
                                 p->name ? p->name : "?",
                                 op->phase == PH_FWD ? "forward" : "backward")};
        s->pinned[c->id] = 1;
    }
    p->shard = *state;
    if (shard_same(store, state, p->rank)) /* ZeRO-3, fsdp: the parameter's own storage */
        p->shard.why = store->why;
    else
        p->shard.why = (Why){WHY_ROLE, LOC_NONE,
                             fmt(s, "distributed optimizer: the f32 master weights in the "
                                    "optimizer state's shards (%s)",
                                 state->why.detail ? state->why.detail : "", NULL)};
    s->pinned[p->id] = 1;
}

/* Parameter p updated by op (SGD, AdamW; NULL: plain SGD without state). */
static void seed_optimizer(SP *s, Value *p, const Op *op)
{
    Value *g = gradient_of(s, p, op);
    int nstate = !op ? 0 : op->kind == OP_ADAMW ? 2 : 1;
    uint32_t data = 1u << ROLE_DATA, fsdp = 1u << ROLE_FSDP;
    uint32_t pr = fsdp | (s->zero >= 3 ? data : 0);
    Sharding compute = p->shard;
    Sharding store = storage(s, p, pr, s->zero >= 3 ? "zero-3 shards the parameter over %s"
                                                     : "fsdp axes %s shard the parameter", 0);
    Sharding state = storage(s, p, pr | (s->zero >= 1 ? data : 0),
                             s->zero >= 1 ? "zero shards optimizer state over %s"
                                          : "fsdp axes %s shard optimizer state", 1);
    int in_shard = s->bf16 && s->cast_read[p->id] == 1 && !shard_same(&state, &compute, p->rank);
    if (in_shard)
        master_in_shard(s, p, &state, &compute, &store);
    for (int i = 0; i < nstate; i++) {
        Value *st = op->args[2 + i];
        if (st->def && st->def->kind == OP_STATE && !shard_pinned(&st->shard))
            st->shard = state, s->pinned[st->id] = 1;
    }
    if (g && !s->pinned[g->id] && g->def && g->def->phase != PH_OPT)
        seed_gradient(s, g, s->zero >= 1 ? &state : &store, !shard_same(&state, &compute, p->rank));
    if (!in_shard && !shard_same(&store, &compute, p->rank)) {
        p->shard = store;
        s->pinned[p->id] = 1;
        VEC_PUSH(s->g->arena, s->gathers, ((Gather){p, compute}));
    }
}

static void seed(SP *s)
{
    for (int i = 0; i < s->g->values.len; i++) {
        Value *v = s->g->values.data[i];
        normalize(s, v);
        s->pinned[v->id] = shard_pinned(&v->shard);
        if (v->def && v->def->kind == OP_INPUT)
            seed_input(s, v), s->pinned[v->id] = 1;
    }
    for (int i = 0; s->bf16 && i < s->g->ops.len; i++) {
        const Op *op = s->g->ops.data[i];
        if (op->phase == PH_OPT)
            continue;
        int cast = op->kind == OP_CAST && op->res[0]->dtype == DT_BF16;
        for (int a = 0; a < op->nargs; a++) {
            const Value *v = op->args[a];
            if (v->def && v->def->kind == OP_PARAM)
                s->cast_read[v->id] = cast && s->cast_read[v->id] != 2 ? 1 : 2;
        }
    }
    ShardOpts before;
    shard_opts(s->g, s->sequence_parallel, &before);
    s->uses = before.uses;
    int n = s->g->ops.len; /* seeding inserts ops: walk a copy */
    Op **ops = arena_alloc(s->g->arena, sizeof(Op *) * (size_t)(n + 1));
    memcpy(ops, s->g->ops.data, sizeof(Op *) * (size_t)n);
    for (int i = 0; i < n; i++) { /* each parameter's update */
        if (ops[i]->kind != OP_UPDATE || !ops[i]->args[0]->def ||
            ops[i]->args[0]->def->kind != OP_PARAM)
            continue;
        const Op *opt = ops[i]->args[1]->def;
        int has = opt && (opt->kind == OP_SGD || opt->kind == OP_ADAMW);
        seed_optimizer(s, ops[i]->args[0], has ? opt : NULL);
    }
    if (s->gathers.len)
        gather_all(s, s->gathers.data, s->gathers.len);
}

static void sweep(SP *s)
{
    for (int i = 0; i < s->g->ops.len; i++) {
        Op *op = s->g->ops.data[i];
        if (!op->nres || op->nargs == 0)
            continue; /* sources keep their seeds */
        Strategy st;
        shard_strategy(s->g, op, &s->o, &st);
        for (int r = 0; r < op->nres && r < SH_MAXRES; r++) {
            Value *v = op->res[r];
            if (s->pinned[v->id])
                continue;
            v->shard = st.out[r];
            if (ir_shard_is_replicated(&v->shard, v->rank)) {
                v->shard.why = (Why){WHY_NONE, LOC_NONE, NULL};
                continue;
            }
            const char *name = ir_ops[op->kind].name;
            if (st.choice) {
                char buf[128];
                snprintf(buf, sizeof buf, "%s: moves %.0f bytes, the next best way %.0f", name,
                         st.comm, st.alt_comm);
                v->shard.why = (Why){WHY_COST, LOC_NONE, intern(s->g->strings, buf)};
            } else if (st.own >> r & 1) { /* no operand is split so: a hint */
                v->shard.why = (Why){WHY_RULE, LOC_NONE, fmt(s, "%s, split as its readers read it",
                                                             name, NULL)};
            } else {
                v->shard.why = (Why){WHY_RULE, LOC_NONE, name};
            }
        }
    }
}

/* A result all of whose readers want it split further (they would slice it)
 * is worth making split: after the first sweep, such a value takes what its
 * readers want as a hint, and the second sweep offers it to its op as one
 * more candidate (shard_rules.c), taken when it costs less. An embedding
 * gradient added to a vocabulary-split one is thus made split, not whole. A
 * pin is such a wish from the start: the op making a pinned gradient is
 * offered its split, and the hints carry it back through the sum over
 * microbatches to each microbatch's embed_grad or matmul. */
static int hint(SP *s)
{
    int changed = 0;
    Graph *g = s->g;
    int n = g->values.len;
    Sharding *want = arena_alloc(g->arena, sizeof(Sharding) * (size_t)(n + 1));
    char *state = arena_alloc(g->arena, (size_t)n + 1); /* 0 none, 1 one wish, 2 mixed */
    memset(state, 0, (size_t)n + 1);
    for (int i = 0; i < g->outputs.len; i++)
        state[g->outputs.data[i]->id] = 2;
    for (int i = 0; i < g->ops.len; i++) {
        Op *op = g->ops.data[i];
        Strategy st;
        if (op->nargs == 0)
            continue;
        if (op->kind == OP_UPDATE)
            st.req[1] = op->args[0]->shard;
        else
            shard_strategy(g, op, &s->o, &st);
        for (int a = 0; a < op->nargs && a < SH_MAXARGS; a++) {
            Value *v = op->args[a];
            if (op->kind == OP_UPDATE && a == 0)
                continue;
            if (state[v->id] == 0)
                want[v->id] = st.req[a], state[v->id] = 1;
            else if (!shard_same(&want[v->id], &st.req[a], v->rank))
                state[v->id] = 2;
        }
    }
    for (int id = 0; id < n; id++) {
        Value *v = g->values.data[id];
        if (state[id] != 1 || s->pinned[id] || !v->def || !v->def->nargs ||
            shard_same(&want[id], &v->shard, v->rank) || want[id].partial != v->shard.partial)
            continue;
        ReStep steps[SH_MAXSTEPS];
        int k = shard_reshard_plan(&g->mesh, v, &v->shard, &want[id], steps), slices = 1;
        for (int j = 0; j < k; j++)
            slices &= steps[j].kind == OP_SHARD_SLICE;
        if (slices)
            v->shard = want[id], v->shard.why = (Why){WHY_RULE, LOC_NONE, "hint"}, changed++;
    }
    return changed;
}

/* Propagation ran already (an IR file read back): nothing to do. */
static int sharded(const Graph *g)
{
    for (int i = 0; i < g->values.len; i++) {
        WhyKind k = g->values.data[i]->shard.why.kind;
        if (k == WHY_RULE || k == WHY_COST)
            return 1;
    }
    return 0;
}

/* sequence_parallel must split something: some activation [B, S, ...] with
 * its sequence (dim 1) over the tensor axis; else it is refused, at the
 * tensor axis's declaration, with the reason (nothing of rank 3, or an S
 * that does not divide). */
static int seq_split_something(SP *s)
{
    int ax = s->o.seq_axis;
    const Value *big = NULL;
    if (ax < 0)
        return 0;
    for (int i = 0; i < s->g->values.len; i++) {
        const Value *v = s->g->values.data[i];
        if (v->rank < 3 || !v->def || v->def->phase != PH_FWD)
            continue;
        for (int k = 0; k < v->shard.naxes[1]; k++)
            if (v->shard.axes[1][k] == ax)
                return 0;
        big = big ? big : v;
    }
    const MeshAxis *m = &s->g->mesh.axes[ax];
    if (big)
        diag_error(&s->c->diag, m->loc,
                   "sequence_parallel splits nothing: the sequence (dim 1, %lld) of the "
                   "activations does not divide over tensor axis '%s' (%d)",
                   (long long)big->shape[1], m->name, m->size);
    else
        diag_error(&s->c->diag, m->loc,
                   "sequence_parallel splits nothing: the model has no activation of rank 3 "
                   "or more ([B, S, ...]) whose sequence the tensor axis '%s' could split",
                   m->name);
    return -1;
}

int pass_shard(Ctx *c, Graph *g, const Settings *set)
{
    SP s = {c, g, {-1, NULL, 0, NULL}, 0, 0, 0, NULL, NULL, NULL, {0}, 0};
    s.zero = (int)set->train.zero;
    s.sequence_parallel = (int)set->train.sequence_parallel;
    s.bf16 = set->train.precision && !strcmp(set->train.precision, "bf16");
    if (sharded(g))
        return 0;
    s.cast_read = arena_alloc(g->arena, (size_t)g->values.len + 1);
    memset(s.cast_read, 0, (size_t)g->values.len + 1);
    /* seeding adds at most two values (gathered copies) per parameter */
    s.pinned = arena_alloc(g->arena, (size_t)g->values.len * 3 + 64);
    memset(s.pinned, 0, (size_t)g->values.len * 3 + 64);
    seed(&s);
    if (s.errors)
        return -1;
    shard_opts(g, s.sequence_parallel, &s.o); /* after seeding: the use counts the partition pass will see */
    for (int i = 0; i < g->ops.len; i++)
        g->ops.data[i]->id = i;
    sweep(&s);
    for (int round = 0; round < 16 && hint(&s); round++) /* hints travel back a step a round */
        sweep(&s);
    return seq_split_something(&s);
}
