/* check.c: the meaning of a plan, checked on the struct (plan_check,
 * plan_check_struct): counts, ranges, sizes, offsets in the slab or a frame,
 * names, kernels, instruction operands, the split over the mesh, each
 * stage's tensors, the outputs and a loop plan's table and frames; last the
 * communication (plan_check_comm, comm_match.c).
 * Reads: a Plan in memory, trusting nothing in it (the loader calls this on
 * what a file said; the compiler on what it built). Writes: a one-line message
 * that names the field by its path, e.g. "tensors[3].shape".
 * Key idea: the rules are on the struct, not on the JSON, so a plan built in
 * memory gets the same checks as a loaded one. The order matters: the counts
 * first, then the tensors, then the instructions that index them, so no check
 * follows an index before it is proved in range. A loop plan's pieces are
 * checked here for their structure, their communication once expanded
 * (expand.c). Depends on libc only. */
#include "plan/plan_impl.h"

#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define NPATTERNS 4
#define NPHASES 4

static const char *const init_names[] = {"zeros", "ones", "normal", "uniform", "constant", NULL};

/* The pipeline-role axes in plan order into axes; their count. */
static int pipeline_axes(const Plan *p, int8_t *axes)
{
    int k = 0;
    for (int i = 0; p->axes && i < p->naxes && i < PLAN_MAX_AXES; i++)
        if (plan_is_pipeline(&p->axes[i]))
            axes[k++] = (int8_t)i;
    return k;
}

static int is_init_name(const char *s)
{
    for (int i = 0; init_names[i]; i++)
        if (!strcmp(s, init_names[i]))
            return 1;
    return 0;
}

/* Elements of t, or -1 when its shape is negative or overflows. */
static int64_t numel_of(const PlanTensor *t)
{
    int64_t n = 1;
    for (int d = 0; d < t->rank; d++)
        if (t->shape[d] < 0 || __builtin_mul_overflow(n, t->shape[d], &n))
            return -1;
    return n;
}

static int check_tensor_shape(const Plan *p, int i, char *err, size_t n)
{
    const PlanTensor *t = &p->tensors[i];
    uint64_t want;
    if ((unsigned)t->dtype >= PD_COUNT)
        return plan_errorf(err, n, "tensors[%d].dtype: %d is not a dtype", i, (int)t->dtype);
    if ((unsigned)t->role >= PT_COUNT)
        return plan_errorf(err, n, "tensors[%d].role: %d is not a role", i, (int)t->role);
    if (t->rank < 0 || t->rank > PLAN_MAX_RANK)
        return plan_errorf(err, n, "tensors[%d].rank: %d is outside [0, %d]", i, t->rank, PLAN_MAX_RANK);
    int64_t ne = numel_of(t);
    if (ne < 0 || __builtin_mul_overflow((uint64_t)ne, plan_dtype_size(t->dtype), &want))
        return plan_errorf(err, n, "tensors[%d].shape: negative or too large", i);
    if (t->bytes != want)
        return plan_errorf(err, n,
                   "tensors[%d].bytes: %" PRIu64 ", but %" PRId64 " elements of %s take %" PRIu64,
                   i, t->bytes, ne, plan_dtype_name(t->dtype), want);
    if (t->frame == -1 ? t->offset % plan_dtype_size(t->dtype) : t->offset % PLAN_ALIGN)
        return plan_errorf(err, n, "tensors[%d].offset: %" PRIu64 " is not a multiple of %d", i, t->offset,
                   t->frame == -1 ? (int)plan_dtype_size(t->dtype) : PLAN_ALIGN);
    int everywhere = i == p->loss || i == p->lr || i == p->grad_norm; /* broadcast targets */
    int stage = everywhere || t->stage < -1 || t->stage >= plan_stages(p) ? -1 : t->stage;
    uint64_t slab = plan_stage_slab(p, stage);
    if (t->frame < (p->nsched > 0 ? 0 : -1) || t->frame > (p->frames && p->nsched > 0 ? p->nframes : 0))
        return plan_errorf(err, n, "tensors[%d].frame: %d is not a frame", i, t->frame);
    if (t->frame == -1 && t->role != PT_TEMP)
        return plan_errorf(err, n, "tensors[%d].frame: -1 (an input's rows) on a %s tensor", i,
                           plan_role_names[t->role]);
    if (t->frame > 0) {
        const PlanFrame *f = &p->frames[t->frame - 1];
        if (t->role != PT_TEMP || (plan_stages(p) > 1 && f->stage != t->stage))
            return plan_errorf(err, n, "tensors[%d].frame: only a temporary of the frame's stage "
                                       "lies in a frame", i);
        if (t->offset > f->bytes || t->bytes > f->bytes - t->offset)
            return plan_errorf(err, n,
                               "tensors[%d].offset: bytes [%" PRIu64 ", %" PRIu64
                               ") lie outside its frame (%" PRIu64 " bytes)",
                               i, t->offset, t->offset + t->bytes, f->bytes);
        return 0;
    }
    if (t->offset > slab || t->bytes > slab - t->offset)
        return plan_errorf(err, n,
                           "tensors[%d].offset: bytes [%" PRIu64 ", %" PRIu64
                           ") lie outside the slab (%" PRIu64 " bytes%s)",
                           i, t->offset, t->offset + t->bytes, slab,
                           p->stage_slab_bytes && plan_stages(p) > 1
                               ? stage < 0 ? " on some stage" : " on its stage"
                               : "");
    return 0;
}

static int check_tensor_role(const Plan *p, int i, char *err, size_t n)
{
    const PlanTensor *t = &p->tensors[i];
    const char *init = plan_str_or_empty(t->init);
    char q[PLAN_SHOWN];
    if (t->role != PT_TEMP && !*plan_str_or_empty(t->name))
        return plan_errorf(err, n, "tensors[%d].name: a %s tensor needs a name", i, plan_role_names[t->role]);
    if (t->role == PT_PARAM ? !is_init_name(init) : *init != 0 && !plan_is_keys(t))
        return plan_errorf(err, n, "tensors[%d].init: \"%s\" is not %s", i, plan_shown(q, init),
                   t->role == PT_PARAM ? "zeros, ones, normal, uniform or constant"
                                       : "\"\" (only params have an init)");
    if (!isfinite(t->init_arg) ||
        (t->init_arg < 0 && (!strcmp(init, "normal") || !strcmp(init, "uniform"))))
        return plan_errorf(err, n, "tensors[%d].init_arg: %g is out of range", i, t->init_arg);
    if (t->limit < 0 || (t->limit > 0 && (t->role != PT_INPUT || t->dtype != PD_I32)))
        return plan_errorf(err, n, "tensors[%d].limit: %" PRId64 " (only i32 inputs have a limit > 0)", i,
                   t->limit);
    if (t->role == PT_STEP && (t->dtype != PD_F32 || t->rank != 0))
        return plan_errorf(err, n, "tensors[%d]: a step tensor must be f32[]", i);
    if (t->role == PT_HYPER && ((t->dtype != PD_F32 && t->dtype != PD_F64) || t->rank != 0))
        return plan_errorf(err, n, "tensors[%d]: a hyper tensor must be f32[] or f64[]", i);
    if (t->layer < -1 || t->value < -1)
        return plan_errorf(err, n, "tensors[%d].%s: must be >= -1", i, t->layer < -1 ? "layer" : "value");
    return 0;
}

typedef struct Named {
    const char *name;
    int index;
} Named;

static int named_cmp(const void *a, const void *b)
{
    const Named *x = a, *y = b;
    int c = strcmp(x->name, y->name);
    return c ? c : (x->index > y->index) - (x->index < y->index);
}

/* Sorts v[0..m) by name; the first name used twice: 1 with its two indices. */
static int find_duplicate(Named *v, int m, int *first, int *second)
{
    qsort(v, (size_t)m, sizeof *v, named_cmp);
    for (int j = 1; j < m; j++)
        if (!strcmp(v[j].name, v[j - 1].name)) {
            *first = v[j - 1].index;
            *second = v[j].index;
            return 1;
        }
    return 0;
}

/* Parameters, state, inputs and step tensors are found by name: names are unique.
 * Kernel names are symbols: unique too. */
static int check_names(const Plan *p, char *err, size_t n)
{
    int m = 0, a, b, rc = 0;
    char q[PLAN_SHOWN];
    Named *v = malloc(sizeof(Named) * ((size_t)p->ntensors + (size_t)p->nkernels + 1));
    if (!v)
        return plan_errorf(err, n, "malloc: out of memory");
    for (int i = 0; i < p->ntensors; i++)
        if (p->tensors[i].role != PT_TEMP)
            v[m++] = (Named){plan_str_or_empty(p->tensors[i].name), i};
    if (find_duplicate(v, m, &a, &b))
        rc = plan_errorf(err, n, "tensors[%d].name: \"%s\" is also the name of tensors[%d]", b,
                 plan_shown(q, p->tensors[b].name), a);
    m = 0;
    for (int i = 0; i < p->nkernels; i++)
        v[m++] = (Named){plan_str_or_empty(p->kernels[i].name), i};
    if (!rc && find_duplicate(v, m, &a, &b))
        rc = plan_errorf(err, n, "kernels[%d].name: \"%s\" is also the name of kernels[%d]", b,
                 plan_shown(q, p->kernels[b].name), a);
    free(v);
    return rc;
}

static int is_identifier(const char *s)
{
    if (!s || !(*s == '_' || (*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z')))
        return 0;
    for (s++; *s; s++)
        if (!(*s == '_' || (*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') ||
              (*s >= '0' && *s <= '9')))
            return 0;
    return 1;
}

static int check_kernels(const Plan *p, char *err, size_t n)
{
    char q[PLAN_SHOWN];
    for (int i = 0; i < p->nkernels; i++) {
        const PlanKernel *k = &p->kernels[i];
        if (!is_identifier(k->name))
            return plan_errorf(err, n, "kernels[%d].name: \"%s\" is not a C identifier", i,
                       plan_shown(q, k->name));
        if (k->nargs < 0 || k->pattern < 0 || k->pattern >= NPATTERNS)
            return plan_errorf(err, n, "kernels[%d].%s: out of range", i,
                       k->nargs < 0 ? "nargs" : "pattern");
        if (k->grid < 0 || k->grid > INT32_MAX || k->block < 0 || k->block > 1024 ||
            (k->grid == 0) != (k->block == 0))
            return plan_errorf(err, n, "kernels[%d]: grid %" PRId64 " of block %d is not a launch "
                               "(grid in [1, 2^31), block in [1, 1024], or both 0)", i, k->grid,
                               k->block);
    }
    return 0;
}

static int check_tensor_index(const Plan *p, int t, const char *what, int i, char *err, size_t n)
{
    if (t < 0 || t >= p->ntensors)
        return plan_errorf(err, n, "instrs[%d].%s: tensor %d out of range (%d tensors)", i, what, t,
                   p->ntensors);
    return 0;
}

/* The operand X of a GEMM spans rows x cols with leading dimension ld, batch
 * times stride apart: its last element touched must lie inside the tensor. */
static int check_operand(const Plan *p, int i, char name, int t, int64_t rows, int64_t cols,
                         int64_t ld, int64_t stride, int64_t batch, char *err, size_t n)
{
    int64_t last = 0, a = 0, b = 0;
    const PlanTensor *pt = &p->tensors[t];
    if (ld < cols)
        return plan_errorf(err, n, "instrs[%d].gemm.ld%c: %" PRId64 " is less than %" PRId64, i,
                   name + 'a' - 'A', ld, cols);
    if (stride < 0)
        return plan_errorf(err, n, "instrs[%d].gemm.stride_%c: %" PRId64 " is negative", i,
                   name + 'a' - 'A', stride);
    int ovf = __builtin_mul_overflow(batch - 1, stride, &a) ||
              __builtin_mul_overflow(rows - 1, ld, &b) || __builtin_add_overflow(a, b, &last) ||
              __builtin_add_overflow(last, cols - 1, &last);
    if (ovf || last >= numel_of(pt))
        return plan_errorf(err, n,
                   "instrs[%d].gemm: %c (tensors[%d], %" PRId64
                   " elements) is too small: the gemm touches element %s%" PRId64,
                   i, name, t, numel_of(pt), ovf ? "beyond " : "", ovf ? INT64_MAX : last);
    return 0;
}

static int check_gemm(const Plan *p, int i, char *err, size_t n)
{
    const PlanGemm *g = &p->instrs[i].gemm;
    if (check_tensor_index(p, g->a, "gemm.a", i, err, n) ||
        check_tensor_index(p, g->b, "gemm.b", i, err, n) ||
        check_tensor_index(p, g->c, "gemm.c", i, err, n))
        return -1;
    PlanDType ta = p->tensors[g->a].dtype, tb = p->tensors[g->b].dtype, tc = p->tensors[g->c].dtype;
    if (ta != tb || (ta != tc && !(ta == PD_BF16 && tc == PD_F32)) || ta == PD_I32)
        return plan_errorf(err, n,
                   "instrs[%d].gemm: operands are %s, %s and %s; A and B must share one float "
                   "dtype, and C be that dtype (or f32 when A and B are bf16)",
                   i, plan_dtype_name(ta), plan_dtype_name(tb), plan_dtype_name(tc));
    if (g->epilogue != PE_NONE && g->epilogue != PE_BIAS)
        return plan_errorf(err, n, "instrs[%d].gemm.epilogue: %d is not an epilogue", i,
                           g->epilogue);
    if (g->epilogue == PE_BIAS) {
        if (check_tensor_index(p, g->bias, "gemm.bias", i, err, n))
            return -1;
        const PlanTensor *b = &p->tensors[g->bias];
        if (b->dtype != tc || numel_of(b) != g->n || g->beta != 0)
            return plan_errorf(err, n, "instrs[%d].gemm.bias: tensors[%d] must be %" PRId64
                               " elements of %s, with beta 0", i, g->bias, g->n,
                               plan_dtype_name(tc));
    }
    if ((g->trans_a != 0 && g->trans_a != 1) || (g->trans_b != 0 && g->trans_b != 1))
        return plan_errorf(err, n, "instrs[%d].gemm.trans_%c: must be 0 or 1", i,
                   g->trans_a != 0 && g->trans_a != 1 ? 'a' : 'b');
    if (g->m < 1 || g->n < 1 || g->k < 1 || g->batch < 1)
        return plan_errorf(err, n, "instrs[%d].gemm: m, n, k and batch must be >= 1", i);
    if (!isfinite(g->alpha) || !isfinite(g->beta))
        return plan_errorf(err, n, "instrs[%d].gemm: alpha and beta must be finite", i);
    if (check_operand(p, i, 'A', g->a, g->trans_a ? g->k : g->m, g->trans_a ? g->m : g->k, g->lda,
                      g->stride_a, g->batch, err, n) ||
        check_operand(p, i, 'B', g->b, g->trans_b ? g->n : g->k, g->trans_b ? g->k : g->n, g->ldb,
                      g->stride_b, g->batch, err, n))
        return -1;
    return check_operand(p, i, 'C', g->c, g->m, g->n, g->ldc, g->stride_c, g->batch, err, n);
}

static int check_coll(const Plan *p, int i, char *err, size_t n);

static int check_instr(const Plan *p, int i, char *err, size_t n)
{
    const PlanInstr *in = &p->instrs[i];
    if ((unsigned)in->kind >= PI_COUNT)
        return plan_errorf(err, n, "instrs[%d].kind: %d is not an instruction kind", i, (int)in->kind);
    if (in->phase < 0 || in->phase >= NPHASES || in->layer < -1)
        return plan_errorf(err, n, "instrs[%d].%s: out of range", i, in->layer < -1 ? "layer" : "phase");
    if (in->stage < 0 || in->stage >= plan_stages(p))
        return plan_errorf(err, n, "instrs[%d].stage: %d is outside [0, %d)", i, in->stage,
                           plan_stages(p));
    if (in->nargs < 0 || (in->nargs > 0 && !in->args))
        return plan_errorf(err, n, "instrs[%d].args: %d arguments but no array", i, in->nargs);
    for (int j = 0; j < in->nargs; j++) {
        if (check_tensor_index(p, in->args[j], "args", i, err, n))
            return -1;
        if (p->tensors[in->args[j]].frame == -1 && (in->kind != PI_COPY || j != 1))
            return plan_errorf(err, n, "instrs[%d].args[%d]: an input's rows are only a copy's "
                                       "source", i, j);
    }
    if (in->kind == PI_GEMM) {
        const PlanGemm *g = &in->gemm;
        int gt[4] = {g->a, g->b, g->c, g->epilogue == PE_BIAS ? g->bias : g->a};
        for (int j = 0; j < 4; j++)
            if (gt[j] >= 0 && gt[j] < p->ntensors && p->tensors[gt[j]].frame == -1)
                return plan_errorf(err, n, "instrs[%d].gemm: an input's rows are only a copy's "
                                           "source", i);
        return check_gemm(p, i, err, n);
    }
    if (in->kind == PI_COLL)
        return check_coll(p, i, err, n);
    if (in->kind == PI_COPY) {
        if (in->nargs != 2)
            return plan_errorf(err, n, "instrs[%d].args: a copy takes 2 tensors, not %d", i, in->nargs);
        if (in->rows && p->nsched > 0) /* one microbatch's rows: check_loop */
            return 0;
        if (p->tensors[in->args[0]].bytes != p->tensors[in->args[1]].bytes)
            return plan_errorf(err, n, "instrs[%d]: copy of %" PRIu64 " bytes into a tensor of %" PRIu64, i,
                       p->tensors[in->args[1]].bytes, p->tensors[in->args[0]].bytes);
        return 0;
    }
    if (in->kernel < 0 || in->kernel >= p->nkernels)
        return plan_errorf(err, n, "instrs[%d].kernel: %d out of range (%d kernels)", i, in->kernel,
                   p->nkernels);
    if (in->nargs != p->kernels[in->kernel].nargs)
        return plan_errorf(err, n, "instrs[%d].args: %d arguments, but kernel \"%s\" takes %d", i,
                   in->nargs, p->kernels[in->kernel].name, p->kernels[in->kernel].nargs);
    if (in->group == 1 || in->group < 0 || in->group > p->ninstrs - i)
        return plan_errorf(err, n, "instrs[%d].group: %d is not a group of the instructions that "
                                   "follow", i, in->group);
    for (int j = i; j < i + in->group; j++) {
        const PlanInstr *m = &p->instrs[j];
        if (m->kind != PI_KERNEL || m->stage != in->stage || m->piece != in->piece)
            return plan_errorf(err, n, "instrs[%d].group: instrs[%d] is not a kernel of its %s", i,
                               j, m->kind == PI_KERNEL && m->stage == in->stage ? "piece" : "stage");
        if (p->nsched > 0 && (m->when != in->when || m->acc))
            return plan_errorf(err, n, "instrs[%d].group: instrs[%d] does not run with the "
                                       "group's first", i, j);
    }
    return 0;
}

/* loss, lr and grad_norm: -1, or a rank-0 float tensor. */
static int check_output(const Plan *p, const char *what, int t, char *err, size_t n)
{
    if (t == -1)
        return 0;
    if (t < 0 || t >= p->ntensors)
        return plan_errorf(err, n, "%s: tensor %d out of range (%d tensors)", what, t, p->ntensors);
    const PlanTensor *pt = &p->tensors[t];
    if (pt->rank != 0 || (pt->dtype != PD_F32 && pt->dtype != PD_F64))
        return plan_errorf(err, n, "%s: tensors[%d] must be a rank-0 f32 or f64 tensor", what, t);
    return 0;
}

/* Each stage's slab within slab_bytes, the largest equal to it. */
static int check_stage_slabs(const Plan *p, char *err, size_t n)
{
    uint64_t most = 0;
    for (int s = 0; p->stage_slab_bytes && s < plan_stages(p); s++) {
        if (p->stage_slab_bytes[s] > p->slab_bytes)
            return plan_errorf(err, n,
                               "stage_slab_bytes[%d]: %" PRIu64 " is more than slab_bytes %" PRIu64,
                               s, p->stage_slab_bytes[s], p->slab_bytes);
        most = p->stage_slab_bytes[s] > most ? p->stage_slab_bytes[s] : most;
    }
    if (p->stage_slab_bytes && most != p->slab_bytes)
        return plan_errorf(err, n,
                           "slab_bytes: %" PRIu64 ", but the largest stage slab is %" PRIu64,
                           p->slab_bytes, most);
    return 0;
}

/* An instruction of stage s touches only tensors that its devices hold. */
static int check_instr_stage(const Plan *p, int i, char *err, size_t n)
{
    const PlanInstr *in = &p->instrs[i];
    int t[4] = {in->gemm.a, in->gemm.b, in->gemm.c, in->gemm.bias}, nt = 0;
    if (in->kind == PI_GEMM)
        nt = in->gemm.epilogue == PE_BIAS ? 4 : 3;
    for (int j = 0; j < in->nargs + nt; j++) {
        int k = j < in->nargs ? in->args[j] : t[j - in->nargs];
        if (!plan_stage_holds(p, in->stage, k))
            return plan_errorf(err, n,
                               "instrs[%d]: an instruction of stage %d touches "
                               "tensors[%d] of stage %d",
                               i, in->stage, k, p->tensors[k].stage);
    }
    return 0;
}

/* The axes' strides: none (row-major), or a placement: taken from the
 * smallest, each the product of the sizes of the axes inside it (1 first),
 * so every rank has one coordinate each. */
static int check_placement(const Plan *p, char *err, size_t n)
{
    int placed = 0, order[PLAN_MAX_AXES];
    for (int i = 0; i < p->naxes; i++)
        placed += p->axes[i].stride != 0;
    if (!placed)
        return 0;
    if (placed != p->naxes || p->naxes > PLAN_MAX_AXES)
        return plan_errorf(err, n, "axes: a stride on %d of %d axes (all or none)", placed, p->naxes);
    plan_axes_by_stride(p, order);
    int64_t want = 1;
    for (int k = 0; k < p->naxes; k++) {
        const PlanAxis *a = &p->axes[order[k]];
        if (a->stride != want)
            return plan_errorf(err, n, "axes[%d] (%s): stride %" PRId64 " where the axes inside it "
                                       "make %" PRId64 " (not a placement of the mesh)",
                               order[k], plan_str_or_empty(a->name), a->stride, want);
        if (want > ((int64_t)1 << 62) / a->size)
            return plan_errorf(err, n, "axes: more than 2^62 devices");
        want *= a->size;
    }
    return 0;
}


static int check_counts(const Plan *p, char *err, size_t n)
{
    if (p->version != PLAN_VERSION)
        return plan_errorf(err, n,
                           "version: %d, expected %d (a plan of format version %d is not read "
                           "by this runtime: compile it again)",
                           p->version, PLAN_VERSION, p->version);
    if (p->naxes < 0 || (p->naxes > 0 && !p->axes))
        return plan_errorf(err, n, "axes: bad count %d", p->naxes);
    if (p->ntensors < 0 || (p->ntensors > 0 && !p->tensors))
        return plan_errorf(err, n, "tensors: bad count %d", p->ntensors);
    if (p->ninstrs < 0 || (p->ninstrs > 0 && !p->instrs))
        return plan_errorf(err, n, "instrs: bad count %d", p->ninstrs);
    if (p->nkernels < 0 || (p->nkernels > 0 && !p->kernels))
        return plan_errorf(err, n, "kernels: bad count %d", p->nkernels);
    if (!isfinite(p->flops) || p->flops < 0)
        return plan_errorf(err, n, "flops: %g is out of range", p->flops);
    for (int i = 0; i < p->naxes; i++)
        if (!*plan_str_or_empty(p->axes[i].name) || p->axes[i].size < 1)
            return plan_errorf(err, n, "axes[%d]: needs a name and a size >= 1", i);
    if (check_placement(p, err, n))
        return -1;
    if (*p->train_hash && strspn(p->train_hash, "0123456789abcdef") != 16)
        return plan_errorf(err, n, "train_hash: expected 16 lowercase hex digits or \"\"");
    return check_stage_slabs(p, err, n);
}

/* Axes in range and each used once (used: a mask carried across calls). */
static int check_axes(const Plan *p, const int8_t *axes, int na, uint32_t *used, const char *at,
                      int i, char *err, size_t n)
{
    if (na < 0 || na > PLAN_MAX_AXES)
        return plan_errorf(err, n, "%s[%d]: %d axes", at, i, na);
    for (int j = 0; j < na; j++) {
        if (axes[j] < 0 || axes[j] >= p->naxes)
            return plan_errorf(err, n, "%s[%d]: axis %d out of range (%d axes)", at, i, axes[j],
                               p->naxes);
        if (*used >> axes[j] & 1)
            return plan_errorf(err, n, "%s[%d]: axis %d used twice", at, i, axes[j]);
        *used |= 1u << axes[j];
    }
    return 0;
}

static int check_tensor_split(const Plan *p, int i, char *err, size_t n)
{
    const PlanTensor *t = &p->tensors[i];
    uint32_t used = 0;
    for (int d = 0; d < t->rank; d++)
        if (check_axes(p, t->split[d], t->nsplit[d], &used, "tensors", i, err, n))
            return -1;
    used = 0;
    if (check_axes(p, t->coord, t->ncoord, &used, "tensors", i, err, n))
        return -1;
    if (t->role == PT_COORD && (t->dtype != PD_I32 || t->rank != 0))
        return plan_errorf(err, n, "tensors[%d]: a coord tensor must be i32[]", i);
    if (t->stage < -1 || t->stage >= plan_stages(p))
        return plan_errorf(err, n, "tensors[%d].stage: %d is outside [-1, %d)", i, t->stage,
                           plan_stages(p));
    for (int d = 0; t->stage >= 0 && d < t->rank; d++) /* its blocks all live on one stage */
        for (int j = 0; j < t->nsplit[d]; j++)
            if (plan_is_pipeline(&p->axes[t->split[d][j]]))
                return plan_errorf(err, n,
                                   "tensors[%d].split: a tensor of stage %d is split over "
                                   "the pipeline axis %d",
                                   i, t->stage, t->split[d][j]);
    return 0;
}

/* A send or recv: one tensor, over exactly the pipeline axes, to another stage. */
static int check_p2p(const Plan *p, int i, char *err, size_t n)
{
    const PlanInstr *in = &p->instrs[i];
    const PlanColl *c = &in->coll;
    const char *what = plan_coll_names[c->op];
    int8_t pipe[PLAN_MAX_AXES];
    int np = pipeline_axes(p, pipe), stages = plan_stages(p);
    if (in->nargs != 1)
        return plan_errorf(err, n, "instrs[%d].args: a %s takes 1 tensor, not %d", i, what,
                           in->nargs);
    if (c->naxes != np || memcmp(c->axes, pipe, (size_t)np))
        return plan_errorf(err, n,
                           "instrs[%d].coll.axes: a %s runs over the pipeline axes (those "
                           "of role \"pipeline\", in order)",
                           i, what);
    if (c->peer < 0 || c->peer >= stages)
        return plan_errorf(err, n, "instrs[%d].coll.peer: %d is outside [0, %d)", i, c->peer,
                           stages);
    if (c->peer == in->stage)
        return plan_errorf(err, n, "instrs[%d].coll.peer: %d is the instruction's own stage", i,
                           c->peer);
    if (c->tag < 0 || c->tag > 32767)
        return plan_errorf(err, n, "instrs[%d].coll.tag: %d is outside [0, 32767]", i, c->tag);
    return 0;
}

/* A collective's two tensors agree with its kind, dims and group size. */
static int check_coll(const Plan *p, int i, char *err, size_t n)
{
    const PlanInstr *in = &p->instrs[i];
    const PlanColl *c = &in->coll;
    uint32_t used = 0;
    if ((unsigned)c->op >= PC_COUNT)
        return plan_errorf(err, n, "instrs[%d].op: %d is not a collective", i, (int)c->op);
    if (plan_is_p2p(c->op))
        return check_p2p(p, i, err, n);
    if (in->nargs < 2 || in->nargs % 2 || (in->nargs > 2 && c->op != PC_ALL_REDUCE))
        return plan_errorf(err, n, "instrs[%d].args: a collective takes 2 tensors (an all_reduce "
                                   "bucket: pairs), not %d", i, in->nargs);
    if (check_axes(p, c->axes, c->naxes, &used, "instrs", i, err, n))
        return -1;
    for (int j = 2; j < in->nargs; j += 2) { /* the pairs of a bucket: equal, one dtype */
        const PlanTensor *x = &p->tensors[in->args[j]], *y = &p->tensors[in->args[j + 1]];
        if (x->bytes != y->bytes || x->dtype != y->dtype ||
            x->dtype != p->tensors[in->args[0]].dtype)
            return plan_errorf(err, n, "instrs[%d].args: bucket pair %d differs in size or dtype",
                               i, j / 2);
    }
    const PlanTensor *a = &p->tensors[in->args[0]], *b = &p->tensors[in->args[1]];
    int64_t k = plan_axes_size(p, c->axes, c->naxes);
    if (a->dtype != b->dtype || a->rank != b->rank)
        return plan_errorf(err, n, "instrs[%d]: %s between tensors of another dtype or rank", i,
                           plan_coll_names[c->op]);
    int whole = c->op == PC_ALL_REDUCE || c->op == PC_ALL_REDUCE_MAX;
    int d1 = whole ? -1 : c->dim, d2 = c->op == PC_ALL_TO_ALL ? c->dim2 : -1;
    if ((!whole && (d1 < 0 || d1 >= a->rank)) ||
        (c->op == PC_ALL_TO_ALL && (d2 < 0 || d2 >= a->rank || d2 == d1)))
        return plan_errorf(err, n, "instrs[%d].dim: out of range", i);
    for (int d = 0; d < a->rank; d++) {
        int64_t x = a->shape[d], y = b->shape[d];
        int ok = x == y;
        if (d == d1)
            ok = c->op == PC_ALL_GATHER || c->op == PC_ALL_TO_ALL ? y == x * k : x == y * k;
        if (d == d2)
            ok = x == y * k;
        if (!ok)
            return plan_errorf(err, n, "instrs[%d]: %s over %lld devices cannot take %s[%d] of "
                                       "size %lld to size %lld",
                               i, plan_coll_names[c->op], (long long)k, "dim", d, (long long)x,
                               (long long)y);
    }
    if ((whole || c->op == PC_REDUCE_SCATTER) && a->dtype != PD_F32 &&
        a->dtype != PD_F64 && a->dtype != PD_I32 && a->dtype != PD_BF16)
        return plan_errorf(err, n, "instrs[%d]: %s of %s", i, plan_coll_names[c->op],
                           plan_dtype_names[a->dtype]);
    return 0;
}

static int by_sched(const void *x, const void *y)
{
    const PlanSched *a = x, *b = y;
    if (a->stage != b->stage)
        return a->stage - b->stage;
    if (a->piece != b->piece)
        return a->piece < b->piece ? -1 : 1;
    return a->mb - b->mb;
}

/* A loop plan's table, frames and pieces (expand.c): every piece
 * of a stage's table runs once per microbatch; every instruction is in the
 * prologue (0), the epilogue (-1) or a piece of its stage's table, runs for
 * every microbatch only in a piece, and a microbatch_sum's add takes two
 * tensors of one size; tags stay within the backends' [0, 32767]. */
static int check_loop(const Plan *p, char *err, size_t n)
{
    int k = p->microbatches, ns = plan_stages(p);
    if (p->nsched < 0 || (p->nsched > 0 && !p->sched) || p->nframes < 0 ||
        (p->nframes > 0 && !p->frames))
        return plan_errorf(err, n, "sched, frames: bad count");
    if (!p->nsched) {
        if (p->nframes)
            return plan_errorf(err, n, "frames: a plan without a schedule table has no frames");
        for (int i = 0; i < p->ninstrs; i++)
            if (p->instrs[i].piece || p->instrs[i].when || p->instrs[i].acc || p->instrs[i].rows)
                return plan_errorf(err, n, "instrs[%d]: piece, when, acc and rows belong to a "
                                           "plan with a schedule table", i);
        return 0;
    }
    if (k < 2 || p->nsched % k || p->ntags < 0 || p->ntags > 32768)
        return plan_errorf(err, n, "microbatches: %d with %d table entries and %d tags per "
                                   "microbatch (at most 32768)",
                           k, p->nsched, p->ntags);
    PlanSched *sorted = malloc(sizeof(PlanSched) * (size_t)p->nsched);
    if (!sorted)
        return plan_errorf(err, n, "out of memory");
    for (int e = 0; e < p->nsched; e++) {
        const PlanSched *t = &p->sched[e];
        sorted[e] = *t;
        if (t->stage < 0 || t->stage >= ns || t->piece < 1 || t->mb < 0 || t->mb >= k) {
            free(sorted);
            return plan_errorf(err, n, "sched[%d]: stage %d, piece %d, microbatch %d out of range",
                               e, t->stage, t->piece, t->mb);
        }
    }
    qsort(sorted, (size_t)p->nsched, sizeof(PlanSched), by_sched);
    for (int e = 0; e < p->nsched; e++) { /* each (stage, piece) runs for microbatches 0..k-1 */
        const PlanSched *t = &sorted[e], *g = &sorted[e - e % k];
        if (t->stage != g->stage || t->piece != g->piece || t->mb != e % k) {
            int stage = t->stage, piece = t->piece;
            free(sorted);
            return plan_errorf(err, n, "sched: piece %d of stage %d does not run once for each of "
                                       "the %d microbatches",
                               piece, stage, k);
        }
    }
    for (int f = 0; f < p->nframes; f++) {
        const PlanFrame *fr = &p->frames[f];
        if (fr->stage < 0 || fr->stage >= ns || !fr->base || fr->bytes % PLAN_ALIGN)
            return free(sorted), plan_errorf(err, n, "frames[%d]: bad stage, bytes or bases", f);
        uint64_t slab = plan_stage_slab(p, fr->stage);
        for (int j = 0; j < k; j++)
            if (fr->base[j] % PLAN_ALIGN || fr->base[j] > slab || fr->bytes > slab - fr->base[j])
                return free(sorted), plan_errorf(err, n, "frames[%d].base[%d]: %" PRIu64 " bytes from %" PRIu64
                                           " lie outside the slab of stage %d",
                                   f, j, fr->bytes, fr->base[j], fr->stage);
    }
    for (int i = 0; i < p->ninstrs; i++) {
        const PlanInstr *in = &p->instrs[i];
        PlanSched key = {in->stage, in->piece, 0};
        int found = in->piece == 0 || in->piece == -1 ||
                    bsearch(&key, sorted, (size_t)p->nsched, sizeof(PlanSched), by_sched);
        const char *bad = NULL;
        if (!found || (unsigned)in->when >= PW_COUNT ||
            (in->when == PW_EVERY && (in->piece == 0 || in->piece == -1)))
            bad = "piece, when: not a piece of its stage's table, or a per-microbatch "
                  "instruction outside one";
        else if ((in->acc && in->kind == PI_GEMM)
                     ? in->when != PW_EVERY || in->gemm.beta != 1 || in->gemm.c == in->gemm.a ||
                           in->gemm.c == in->gemm.b
                 : in->acc && (in->kind != PI_KERNEL || in->nargs != 2 || in->when != PW_EVERY ||
                               p->tensors[in->args[0]].bytes != p->tensors[in->args[1]].bytes))
            bad = "acc: a microbatch_sum adds one tensor into another of its size (a kernel) or "
                  "a product into its C (a gemm, beta 1), for every microbatch";
        else if (in->rows &&
                 (in->kind != PI_COPY || in->when != PW_EVERY ||
                  p->tensors[in->args[1]].role != PT_INPUT ||
                  p->tensors[in->args[1]].bytes != (uint64_t)k * p->tensors[in->args[0]].bytes))
            bad = "rows: a copy of one microbatch's rows of an input, for every microbatch";
        else if (in->kind == PI_COLL && plan_is_p2p(in->coll.op) && in->coll.tag >= p->ntags)
            bad = "tag: beyond the tags of one microbatch (ntags)";
        if (bad) {
            free(sorted);
            return plan_errorf(err, n, "instrs[%d].%s", i, bad);
        }
    }
    free(sorted);
    return 0;
}

int plan_check_struct(const Plan *p, char *err, size_t n)
{
    if (check_counts(p, err, n))
        return -1;
    if (p->microbatches < 0)
        return plan_errorf(err, n, "microbatches: %d is negative", p->microbatches);
    for (int i = 0; i < p->ntensors; i++)
        if (check_tensor_shape(p, i, err, n) || check_tensor_role(p, i, err, n) ||
            check_tensor_split(p, i, err, n))
            return -1;
    if (check_kernels(p, err, n) || check_names(p, err, n))
        return -1;
    for (int i = 0; i < p->ninstrs; i++)
        if (check_instr(p, i, err, n))
            return -1;
    for (int i = 0; plan_stages(p) > 1 && i < p->ninstrs; i++)
        if (check_instr_stage(p, i, err, n))
            return -1;
    if (check_output(p, "loss", p->loss, err, n) || check_output(p, "lr", p->lr, err, n) ||
        check_output(p, "grad_norm", p->grad_norm, err, n) || check_loop(p, err, n))
        return -1;
    return 0;
}

int plan_check(const Plan *p, char *err, size_t n)
{
    if (plan_check_struct(p, err, n))
        return -1;
    if (p->nsched > 0) /* one microbatch's pieces: plan_expand checks the program they make */
        return 0;
    return plan_check_comm(p, NULL, err, n);
}
