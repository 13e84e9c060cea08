/* interp.c: float64 reference semantics of every graph-IR op, in plain loops.
 * Reads a verified Graph and buffers for its sources; writes every other
 * value's buffer. Slow on purpose: each op is written the obvious way. */
#include "interp.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int64_t interp_numel(const Value *v)
{
    int64_t n = 1;
    for (int i = 0; i < v->rank; i++)
        n *= v->shape[i];
    return n;
}

Interp *interp_new(const Graph *g)
{
    Interp *in = calloc(1, sizeof(Interp));
    in->g = g;
    in->step = 1;
    in->buf = calloc((size_t)g->values.len + 1, sizeof(double *));
    for (int i = 0; i < g->values.len; i++)
        in->buf[i] = calloc((size_t)interp_numel(g->values.data[i]) + 1, sizeof(double));
    return in;
}

void interp_free(Interp *in)
{
    if (!in)
        return;
    for (int i = 0; i < in->g->values.len; i++)
        free(in->buf[i]);
    free(in->buf);
    free(in);
}

double interp_uniform(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return (double)(*s >> 11) / 9007199254740992.0;
}

static double normal(uint64_t *s)
{
    double u = interp_uniform(s), v = interp_uniform(s);
    return sqrt(-2.0 * log(u + 1e-300)) * cos(6.283185307179586 * v);
}

static void init_param(const Op *op, double *x, int64_t n, uint64_t *s)
{
    const Attr *a = ir_op_attr(op, "init");
    double arg = a && a->kind == ATTR_CALL && a->nitems ? a->items[0]->f : 0.02;
    for (int64_t i = 0; i < n; i++) {
        if (!a || a->kind == ATTR_CALL) {
            const char *fn = a ? a->s : "normal";
            x[i] = !strcmp(fn, "normal")     ? arg * normal(s)
                   : !strcmp(fn, "uniform")  ? arg * (2 * interp_uniform(s) - 1)
                                             : arg;
        } else {
            x[i] = !strcmp(a->s, "ones") ? 1.0 : 0.0;
        }
    }
}

void interp_init(Interp *in, uint64_t seed, int64_t vocab)
{
    uint64_t s = seed * 2654435761u + 88172645463325252ull;
    for (int i = 0; i < in->g->ops.len; i++) {
        const Op *op = in->g->ops.data[i];
        if (op->kind != OP_PARAM && op->kind != OP_INPUT)
            continue;
        const Value *v = op->res[0];
        double *x = in->buf[v->id];
        int64_t n = interp_numel(v);
        if (op->kind == OP_PARAM)
            init_param(op, x, n, &s);
        else
            for (int64_t j = 0; j < n; j++)
                x[j] = v->dtype == DT_I32 ? (double)(int64_t)(interp_uniform(&s) * (double)vocab)
                                          : normal(&s);
    }
}

/* ---- helpers ---- */

#define ARG(i) (in->buf[op->args[i]->id])
#define OUT (in->buf[op->res[0]->id])
#define RES(i) (in->buf[op->res[i]->id])

static int norm_dim(int d, int rank) { return d < 0 ? d + rank : d; }

/* Split shape around dim: outer * n * inner. */
static void around(const Value *v, int dim, int64_t *outer, int64_t *n, int64_t *inner)
{
    *outer = *inner = 1;
    for (int i = 0; i < dim; i++)
        *outer *= v->shape[i];
    *n = v->shape[dim];
    for (int i = dim + 1; i < v->rank; i++)
        *inner *= v->shape[i];
}

/* Offset into a broadcast operand a for flat output index i of shape out. */
static int64_t bcast_index(const Value *a, const Value *out, int64_t i)
{
    int64_t off = 0, stride = 1;
    for (int d = out->rank - 1, da = a->rank - 1; d >= 0; d--, da--) {
        int64_t idx = i % out->shape[d];
        i /= out->shape[d];
        if (da < 0)
            continue;
        if (a->shape[da] != 1)
            off += idx * stride;
        stride *= a->shape[da];
    }
    return off;
}

static double gelu(double x)
{
    return 0.5 * x * (1 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
}

static double unary(OpKind k, double x)
{
    switch (k) {
    case OP_NEG: return -x;
    case OP_EXP: return exp(x);
    case OP_LOG: return log(x);
    case OP_SQRT: return sqrt(x);
    case OP_RSQRT: return 1 / sqrt(x);
    case OP_TANH: return tanh(x);
    case OP_SIGMOID: return 1 / (1 + exp(-x));
    case OP_RELU: return x > 0 ? x : 0;
    case OP_GELU: return gelu(x);
    case OP_SILU: return x / (1 + exp(-x));
    case OP_ERF: return erf(x);
    case OP_ABS: return fabs(x);
    case OP_FLOOR: return floor(x);
    case OP_CAST: case OP_STOP_GRAD: case OP_MB_SUM: return x;
    default: UNREACHABLE();
    }
}

static double binary(OpKind k, double a, double b)
{
    switch (k) {
    case OP_ADD: return a + b;
    case OP_SUB: return a - b;
    case OP_MUL: return a * b;
    case OP_DIV: return a / b;
    case OP_LT: return a < b;
    case OP_LE: return a <= b;
    case OP_GT: return a > b;
    case OP_GE: return a >= b;
    case OP_EQ: return a == b;
    case OP_NE: return a != b;
    default: UNREACHABLE();
    }
}

static void run_binary(Interp *in, const Op *op)
{
    const Value *o = op->res[0];
    for (int64_t i = 0, n = interp_numel(o); i < n; i++) {
        double a = ARG(0)[bcast_index(op->args[0], o, i)];
        double b = ARG(1)[bcast_index(op->args[1], o, i)];
        OUT[i] = binary(op->kind, a, b);
    }
}

/* where(c, a, b): a where c is nonzero (a NaN included), else b; broadcast. */
static void run_where(Interp *in, const Op *op)
{
    const Value *o = op->res[0];
    for (int64_t i = 0, n = interp_numel(o); i < n; i++) {
        double c = ARG(0)[bcast_index(op->args[0], o, i)];
        OUT[i] = c != 0 ? ARG(1)[bcast_index(op->args[1], o, i)]
                        : ARG(2)[bcast_index(op->args[2], o, i)];
    }
}

/* a[...,M,K] x b[K,N] (b shared) or b[...,K,N] (batched). */
static void run_matmul(Interp *in, const Op *op)
{
    const Value *a = op->args[0], *b = op->args[1];
    int64_t M = a->shape[a->rank - 2], K = a->shape[a->rank - 1], N = b->shape[b->rank - 1];
    int64_t batch = interp_numel(a) / (M * K);
    int shared = b->rank == 2;
    for (int64_t t = 0; t < batch; t++) {
        const double *A = ARG(0) + t * M * K, *B = ARG(1) + (shared ? 0 : t * K * N);
        double *C = OUT + t * M * N;
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++) {
                double s = 0;
                for (int64_t k = 0; k < K; k++)
                    s += A[i * K + k] * B[k * N + j];
                C[i * N + j] = s;
            }
    }
}

static void run_softmax(Interp *in, const Op *op)
{
    const Value *x = op->args[0];
    int64_t outer, n, inner;
    around(x, norm_dim((int)ir_op_attr_int(op, "dim", -1), x->rank), &outer, &n, &inner);
    for (int64_t o = 0; o < outer; o++)
        for (int64_t j = 0; j < inner; j++) {
            const double *p = ARG(0) + o * n * inner + j;
            double *q = OUT + o * n * inner + j, m = -INFINITY, s = 0;
            for (int64_t i = 0; i < n; i++)
                m = fmax(m, p[i * inner]);
            for (int64_t i = 0; i < n; i++)
                s += exp(p[i * inner] - m);
            for (int64_t i = 0; i < n; i++)
                q[i * inner] = exp(p[i * inner] - m) / s;
        }
}

static void run_norm(Interp *in, const Op *op)
{
    const Value *x = op->args[0];
    int64_t C = x->shape[x->rank - 1], R = interp_numel(x) / C;
    double eps = ir_op_attr_float(op, "eps", 1e-5);
    int ln = op->kind == OP_LAYERNORM;
    for (int64_t r = 0; r < R; r++) {
        const double *p = ARG(0) + r * C;
        double mean = 0, var = 0;
        for (int64_t c = 0; c < C && ln; c++)
            mean += p[c] / (double)C;
        for (int64_t c = 0; c < C; c++)
            var += (p[c] - mean) * (p[c] - mean) / (double)C;
        double rs = 1 / sqrt(var + eps);
        for (int64_t c = 0; c < C; c++)
            OUT[r * C + c] = (p[c] - mean) * rs * ARG(1)[c] + (ln ? ARG(2)[c] : 0);
    }
}

static void run_reduce(Interp *in, const Op *op)
{
    const Value *x = op->args[0];
    int64_t outer, n, inner;
    around(x, norm_dim((int)ir_op_attr_int(op, "dim", -1), x->rank), &outer, &n, &inner);
    for (int64_t o = 0; o < outer; o++)
        for (int64_t j = 0; j < inner; j++) {
            const double *p = ARG(0) + o * n * inner + j;
            double s = op->kind == OP_MAX ? -INFINITY : 0;
            for (int64_t i = 0; i < n; i++)
                s = op->kind == OP_MAX ? fmax(s, p[i * inner]) : s + p[i * inner];
            OUT[o * inner + j] = op->kind == OP_MEAN ? s / (double)n : s;
        }
}

/* The index of the first maximum along dim; NaNs are skipped (as fmax does),
 * and a row of NaNs only gives 0. */
static void run_argmax(Interp *in, const Op *op)
{
    const Value *x = op->args[0];
    int64_t outer, n, inner;
    around(x, norm_dim((int)ir_op_attr_int(op, "dim", -1), x->rank), &outer, &n, &inner);
    for (int64_t o = 0; o < outer; o++)
        for (int64_t j = 0; j < inner; j++) {
            const double *p = ARG(0) + o * n * inner + j;
            double m = -INFINITY;
            int64_t first = 0;
            for (int64_t i = 0; i < n; i++)
                m = fmax(m, p[i * inner]);
            for (int64_t i = n - 1; i >= 0; i--)
                first = p[i * inner] == m ? i : first;
            OUT[o * inner + j] = (double)first;
        }
}

static int run_embed(Interp *in, const Op *op)
{
    const Value *t = op->args[0];
    int64_t V = t->shape[0], D = t->shape[1], n = interp_numel(op->args[1]);
    for (int64_t i = 0; i < n; i++) {
        double id = ARG(1)[i];
        if (id < 0 || id >= (double)V) {
            snprintf(in->err, sizeof in->err, "embed: id %g out of range 0..%lld", id,
                     (long long)V - 1);
            return -1;
        }
        memcpy(OUT + i * D, ARG(0) + (int64_t)id * D, sizeof(double) * (size_t)D);
    }
    return 0;
}

/* Whether element a (at index i) comes before b (at j) in topk's order:
 * larger first, NaNs last, ties by index. */
static int topk_before(double a, int64_t i, double b, int64_t j)
{
    if (isnan(a) || isnan(b))
        return isnan(a) ? isnan(b) && i < j : 1;
    return a > b || (a == b && i < j);
}

/* topk: each row's k first elements in that order (values, indices); its
 * gradient dy at the indices. */
static void run_topk(Interp *in, const Op *op, int grad)
{
    const Value *x = grad ? op->res[0] : op->args[0];
    int64_t V = x->shape[x->rank - 1], rows = interp_numel(x) / V;
    int64_t K = grad ? op->args[0]->shape[op->args[0]->rank - 1] : ir_op_attr_int(op, "k", 1);
    if (grad) {
        memset(OUT, 0, sizeof(double) * (size_t)(rows * V));
        for (int64_t r = 0; r < rows; r++)
            for (int64_t j = 0; j < K; j++) {
                double id = ARG(0)[r * K + j];
                if (id >= 0 && id < (double)V)
                    OUT[r * V + (int64_t)id] += ARG(1)[r * K + j];
            }
        return;
    }
    for (int64_t r = 0; r < rows; r++) {
        const double *row = ARG(0) + r * V;
        for (int64_t j = 0; j < K; j++) { /* the j-th: the element that exactly j precede */
            for (int64_t c = 0; c < V; c++) {
                int64_t ahead = 0;
                for (int64_t d = 0; d < V; d++)
                    ahead += d != c && topk_before(row[d], d, row[c], c);
                if (ahead == j) {
                    RES(0)[r * K + j] = row[c];
                    RES(1)[r * K + j] = (double)c;
                }
            }
        }
    }
}

/* gather: x[r, index[r]] along the last dim, 0 outside [0, V) (with k
 * indices per row, x[r, index[r, j]]); its gradient dy[r] at that column. */
static void run_gather(Interp *in, const Op *op, int grad)
{
    const Value *ix = op->args[grad ? 0 : 1];
    int64_t n = interp_numel(ix);
    int64_t V = grad ? op->res[0]->shape[op->res[0]->rank - 1] : op->args[0]->shape[op->args[0]->rank - 1];
    int64_t K = !grad && ix->rank == op->args[0]->rank ? ix->shape[ix->rank - 1] : 1;
    if (grad)
        memset(OUT, 0, sizeof(double) * (size_t)(n * V));
    for (int64_t r = 0; r < n; r++) {
        double id = ARG(grad ? 0 : 1)[r];
        int inside = id >= 0 && id < (double)V;
        if (grad && inside)
            OUT[r * V + (int64_t)id] = ARG(1)[r];
        else if (!grad)
            OUT[r] = inside ? ARG(0)[r / K * V + (int64_t)id] : 0;
    }
}

/* splitmix64's finalizer of a times the golden ratio xor b, in [0, 2^63):
 * the kernels' tcc_hash, written again. */
static int64_t dropout_hash(int64_t a, int64_t b)
{
    uint64_t z = (uint64_t)a * 0x9E3779B97F4A7C15u ^ (uint64_t)b;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9u;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBu;
    return (int64_t)((z ^ (z >> 31)) >> 1);
}

/* dropout: element (r, c) of x (r its row along dim 0, c its index within the
 * row) is kept when hash(hash(hash(key[r], step), stream), c) mod 2^24 is at
 * least round(p 2^24), then scaled by 1 / (1 - p); at step 0 all are kept. */
static void run_dropout(Interp *in, const Op *op)
{
    const Value *x = op->args[0];
    int64_t n = interp_numel(x), inner = n / x->shape[0];
    double p = ir_op_attr_float(op, "p", 0);
    int64_t step = (int64_t)ARG(2)[0], cut = llround(p * 16777216.0);
    for (int64_t i = 0; i < n; i++) {
        int64_t h = dropout_hash((int64_t)ARG(1)[i / inner], step);
        h = dropout_hash(h, ir_op_attr_int(op, "stream", 0));
        h = dropout_hash(h, i % inner);
        OUT[i] = step == 0 ? ARG(0)[i] : h % 16777216 >= cut ? ARG(0)[i] / (1 - p) : 0;
    }
}

/* Rotary embedding: in each head, pair (2i, 2i+1) turns by pos * theta^(-2i/Dh). */
static void run_rope(Interp *in, const Op *op)
{
    const Value *x = op->args[0];
    int64_t C = x->shape[x->rank - 1], S = x->shape[x->rank - 2], H = ir_op_attr_int(op, "heads", 1);
    int64_t Dh = C / H, rows = interp_numel(x) / C;
    double theta = ir_op_attr_float(op, "theta", 10000);
    double sign = ir_op_attr_int(op, "inverse", 0) ? -1 : 1;
    int half = (int)ir_op_attr_int(op, "rotate_half", 0); /* pairs (i, i + Dh/2), not (2i, 2i+1) */
    int64_t apart = half ? Dh / 2 : 1;
    for (int64_t r = 0; r < rows; r++) {
        double pos = (double)(r % S);
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < Dh / 2; i++) {
                double ang = sign * pos * pow(theta, -2.0 * (double)i / (double)Dh);
                int64_t at = r * C + h * Dh + (half ? i : 2 * i);
                double a = ARG(0)[at], b = ARG(0)[at + apart];
                OUT[at] = a * cos(ang) - b * sin(ang);
                OUT[at + apart] = a * sin(ang) + b * cos(ang);
            }
    }
}

/* Whether query i of row b sees key j: causal, the window, the mask (Sk
 * keys a row). */
static int sees(Interp *in, const Op *op, int64_t Sk, int64_t b, int64_t i, int64_t j)
{
    int64_t w = ir_op_attr_int(op, "window", 0);
    int m = ir_attention_arg(op, 2);
    if (ir_op_attr_int(op, "causal", 0) && j > i)
        return 0;
    if (w > 0 && (i - j >= w || j - i >= w))
        return 0;
    return m < 0 || ARG(m)[b * Sk + j] != 0;
}

/* The score bias of head h, query i, key j (the bias [H or 1, S, Sk]); 0 without one. */
static double score_bias(Interp *in, const Op *op, int64_t h, int64_t i, int64_t j)
{
    int a = ir_attention_arg(op, 3);
    if (a < 0)
        return 0;
    const Value *b = op->args[a];
    return ARG(a)[((b->shape[0] == 1 ? 0 : h) * b->shape[1] + i) * b->shape[2] + j];
}

/* ALiBi's slope of head g of n: 2^(-8 (g + 1) / p) for the first p (the
 * largest power of 2 <= n), then 2^(-4 (2 (g - p) + 1) / p) (the odd ones
 * of the sequence for 2p); the bias of query i and key j is -slope |i - j|. */
static double alibi_bias(const Op *op, int64_t h, int64_t i, int64_t j)
{
    if (!ir_op_attr_int(op, "alibi", 0))
        return 0;
    int64_t n = ir_op_attr_int(op, "heads", 1), p = 1;
    while (p * 2 <= n)
        p *= 2;
    double slope = h < p ? exp2(-8.0 * (double)(h + 1) / (double)p)
                         : exp2(-4.0 * (double)(2 * (h - p) + 1) / (double)p);
    return -slope * (double)(i > j ? i - j : j - i);
}

/* A scaled score s soft-capped (attr softcap c: c tanh(s / c)); as it is without. */
static double softcap(const Op *op, double s)
{
    double c = ir_op_attr_float(op, "softcap", 0);
    return c > 0 ? c * tanh(s / c) : s;
}

/* softmax(q k^T / sqrt(Dh)) v per head over the keys the query sees (a row
 * that sees none gives 0); query head h reads kv head h / (H/KV); the keys
 * and values have Sk positions (S but in cross-attention), the values a
 * head size Dv of their own (Dh but in latent attention). The scores:
 * scaled, soft-capped, then ALiBi's bias and the score bias added. */
static void run_attention(Interp *in, const Op *op)
{
    const Value *q = op->args[0], *k = op->args[1];
    int64_t B = q->shape[0], S = q->shape[1], H = ir_op_attr_int(op, "heads", 1);
    int64_t KV = ir_op_attr_int(op, "kv_heads", H), Dh = q->shape[2] / H;
    int causal = (int)ir_op_attr_int(op, "causal", 0);
    int64_t qc = q->shape[2], kc = k->shape[2], Sk = k->shape[1];
    int64_t vc = op->args[2]->shape[2], Dv = vc / KV;
    double *p = malloc(sizeof(double) * (size_t)Sk), scale = ir_op_attr_float(op, "scale", 1 / sqrt((double)Dh));
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < S; i++) {
                const double *qi = ARG(0) + (b * S + i) * qc + h * Dh;
                int64_t kh = h / (H / KV), last = causal ? i : Sk - 1;
                double m = -INFINITY, s = 0;
                for (int64_t j = 0; j <= last; j++) {
                    const double *kj = ARG(1) + (b * Sk + j) * kc + kh * Dh;
                    p[j] = 0;
                    for (int64_t d = 0; d < Dh; d++)
                        p[j] += qi[d] * kj[d] * scale;
                    p[j] = softcap(op, p[j]) + alibi_bias(op, h, i, j) + score_bias(in, op, h, i, j);
                    if (!sees(in, op, Sk, b, i, j))
                        p[j] = -INFINITY;
                    m = fmax(m, p[j]);
                }
                for (int64_t j = 0; j <= last; j++)
                    s += (p[j] = p[j] == -INFINITY ? 0 : exp(p[j] - m));
                double *o = OUT + (b * S + i) * H * Dv + h * Dv;
                for (int64_t d = 0; d < Dv; d++) {
                    double acc = 0;
                    for (int64_t j = 0; j <= last && s > 0; j++)
                        acc += p[j] / s * ARG(2)[(b * Sk + j) * vc + kh * Dv + d];
                    o[d] = acc;
                }
            }
    free(p);
}

static int run_cross_entropy(Interp *in, const Op *op)
{
    const Value *x = op->args[0];
    int64_t V = x->shape[x->rank - 1], R = interp_numel(x) / V;
    double loss = 0;
    for (int64_t r = 0; r < R; r++) {
        const double *p = ARG(0) + r * V;
        double t = ARG(1)[r], m = -INFINITY, s = 0;
        if (t < 0 || t >= (double)V) {
            snprintf(in->err, sizeof in->err, "cross_entropy: target %g out of range", t);
            return -1;
        }
        for (int64_t c = 0; c < V; c++)
            m = fmax(m, p[c]);
        for (int64_t c = 0; c < V; c++)
            s += exp(p[c] - m);
        loss += m + log(s) - p[(int64_t)t];
    }
    OUT[0] = loss / (double)R;
    return 0;
}

static void run_transpose(Interp *in, const Op *op)
{
    const Value *x = op->args[0], *o = op->res[0];
    int64_t perm[IR_MAX_RANK], xs[IR_MAX_RANK];
    ir_transpose_perm(op, perm);
    xs[x->rank - 1] = 1;
    for (int d = x->rank - 2; d >= 0; d--)
        xs[d] = xs[d + 1] * x->shape[d + 1];
    for (int64_t i = 0, n = interp_numel(o); i < n; i++) {
        int64_t r = i, off = 0;
        for (int d = o->rank - 1; d >= 0; d--) {
            off += (r % o->shape[d]) * xs[perm[d]];
            r /= o->shape[d];
        }
        OUT[i] = ARG(0)[off];
    }
}

static void run_slice(Interp *in, const Op *op)
{
    const Value *x = op->args[0];
    int64_t outer, n, inner;
    around(x, norm_dim((int)ir_op_attr_int(op, "dim", -1), x->rank), &outer, &n, &inner);
    int64_t start = ir_op_attr_int(op, "start", 0), end = ir_op_attr_int(op, "end", n);
    int64_t w = (end - start) * inner;
    for (int64_t o = 0; o < outer; o++)
        memcpy(OUT + o * w, ARG(0) + o * n * inner + start * inner, sizeof(double) * (size_t)w);
}

static void run_concat(Interp *in, const Op *op)
{
    const Value *o = op->res[0];
    int64_t outer, n, inner, at = 0;
    around(o, norm_dim((int)ir_op_attr_int(op, "dim", -1), o->rank), &outer, &n, &inner);
    for (int a = 0; a < op->nargs; a++) {
        int64_t w = op->args[a]->shape[norm_dim((int)ir_op_attr_int(op, "dim", -1), o->rank)] * inner;
        for (int64_t r = 0; r < outer; r++)
            memcpy(OUT + r * n * inner + at, ARG(a) + r * w, sizeof(double) * (size_t)w);
        at += w;
    }
}

/* ---- backward ops ---- */


static void run_sum_to(Interp *in, const Op *op)
{
    const Value *x = op->args[0], *o = op->res[0];
    memset(OUT, 0, sizeof(double) * (size_t)interp_numel(o));
    for (int64_t i = 0, n = interp_numel(x); i < n; i++)
        OUT[bcast_index(o, x, i)] += ARG(0)[i];
}

static void run_expand(Interp *in, const Op *op)
{
    const Value *o = op->res[0];
    for (int64_t i = 0, n = interp_numel(o); i < n; i++)
        OUT[i] = ARG(0)[bcast_index(op->args[0], o, i)];
}

static void run_pad(Interp *in, const Op *op)
{
    const Value *x = op->args[0], *o = op->res[0];
    int dim = norm_dim((int)ir_op_attr_int(op, "dim", -1), x->rank);
    int64_t outer, n, inner, before = ir_op_attr_int(op, "before", 0);
    around(x, dim, &outer, &n, &inner);
    int64_t m = o->shape[dim];
    memset(OUT, 0, sizeof(double) * (size_t)interp_numel(o));
    for (int64_t r = 0; r < outer; r++)
        memcpy(OUT + r * m * inner + before * inner, ARG(0) + r * n * inner,
               sizeof(double) * (size_t)(n * inner));
}

static double pointwise_grad(OpKind k, double x, double dy)
{
    const double c = 0.7978845608028654;
    double t, s;
    switch (k) {
    case OP_RELU_GRAD: return x > 0 ? dy : 0;
    case OP_SILU_GRAD:
        s = 1 / (1 + exp(-x));
        return dy * (s + x * s * (1 - s));
    case OP_GELU_GRAD:
        t = tanh(c * (x + 0.044715 * x * x * x));
        return dy * (0.5 * (1 + t) + 0.5 * x * (1 - t * t) * c * (1 + 3 * 0.044715 * x * x));
    default: UNREACHABLE();
    }
}

static void run_softmax_grad(Interp *in, const Op *op)
{
    const Value *y = op->args[0];
    int64_t outer, n, inner;
    around(y, norm_dim((int)ir_op_attr_int(op, "dim", -1), y->rank), &outer, &n, &inner);
    for (int64_t o = 0; o < outer; o++)
        for (int64_t j = 0; j < inner; j++) {
            int64_t base = o * n * inner + j;
            double dot = 0;
            for (int64_t i = 0; i < n; i++)
                dot += ARG(0)[base + i * inner] * ARG(1)[base + i * inner];
            for (int64_t i = 0; i < n; i++)
                OUT[base + i * inner] = ARG(0)[base + i * inner] * (ARG(1)[base + i * inner] - dot);
        }
}

static void run_max_grad(Interp *in, const Op *op)
{
    const Value *x = op->args[0];
    int64_t outer, n, inner;
    around(x, norm_dim((int)ir_op_attr_int(op, "dim", -1), x->rank), &outer, &n, &inner);
    memset(OUT, 0, sizeof(double) * (size_t)interp_numel(x));
    for (int64_t o = 0; o < outer; o++)
        for (int64_t j = 0; j < inner; j++) {
            int64_t base = o * n * inner + j, best = 0;
            for (int64_t i = 1; i < n; i++)
                if (ARG(0)[base + i * inner] > ARG(0)[base + best * inner])
                    best = i;
            OUT[base + best * inner] = ARG(1)[o * inner + j];
        }
}

/* dx = rs (dxh - mean(dxh) - xh mean(dxh xh)), dxh = dy g; rmsnorm drops the means of x. */
static void run_norm_grad(Interp *in, const Op *op)
{
    const Value *x = op->args[0];
    int64_t C = x->shape[x->rank - 1], R = interp_numel(x) / C;
    double eps = ir_op_attr_float(op, "eps", 1e-5);
    int ln = op->kind == OP_LAYERNORM_GRAD;
    memset(RES(1), 0, sizeof(double) * (size_t)C);
    if (ln)
        memset(RES(2), 0, sizeof(double) * (size_t)C);
    for (int64_t r = 0; r < R; r++) {
        const double *p = ARG(0) + r * C, *dy = ARG(2) + r * C;
        double mean = 0, var = 0, m1 = 0, m2 = 0;
        for (int64_t c = 0; c < C && ln; c++)
            mean += p[c] / (double)C;
        for (int64_t c = 0; c < C; c++)
            var += (p[c] - mean) * (p[c] - mean) / (double)C;
        double rs = 1 / sqrt(var + eps);
        for (int64_t c = 0; c < C; c++) {
            double xh = (p[c] - mean) * rs, dxh = dy[c] * ARG(1)[c];
            m1 += dxh / (double)C;
            m2 += dxh * xh / (double)C;
            RES(1)[c] += dy[c] * xh;
            if (ln)
                RES(2)[c] += dy[c];
        }
        for (int64_t c = 0; c < C; c++) {
            double xh = (p[c] - mean) * rs;
            RES(0)[r * C + c] = rs * (dy[c] * ARG(1)[c] - (ln ? m1 : 0) - xh * m2);
        }
    }
}

static void run_embed_grad(Interp *in, const Op *op)
{
    const Value *o = op->res[0];
    int64_t D = o->shape[1], n = interp_numel(op->args[0]);
    memset(OUT, 0, sizeof(double) * (size_t)interp_numel(o));
    for (int64_t i = 0; i < n; i++)
        for (int64_t d = 0; d < D; d++)
            OUT[(int64_t)ARG(0)[i] * D + d] += ARG(1)[i * D + d];
}

/* Recompute the attention probabilities row by row, then push dout back
 * (dout and the values over Dv, the scores' products over Dh); the soft
 * cap's derivative 1 - tanh(s / c)^2 = 1 - (capped / c)^2 (kept in dc)
 * scales each score's gradient. The bias's gradient (a fourth result) is
 * the biased score's, p (dp - dot), summed over the batch (and the heads
 * for a bias of one head). */
static void run_attention_grad(Interp *in, const Op *op)
{
    const Value *q = op->args[0], *k = op->args[1];
    int64_t B = q->shape[0], S = q->shape[1], H = ir_op_attr_int(op, "heads", 1);
    int64_t KV = ir_op_attr_int(op, "kv_heads", H), Dh = q->shape[2] / H;
    int64_t qc = q->shape[2], kc = k->shape[2], Sk = k->shape[1];
    int64_t vc = op->args[2]->shape[2], Dv = vc / KV;
    int causal = (int)ir_op_attr_int(op, "causal", 0);
    double scale = ir_op_attr_float(op, "scale", 1 / sqrt((double)Dh)), *p = malloc(sizeof(double) * (size_t)(3 * Sk));
    double *dp = p + Sk, *dc = p + 2 * Sk, cap = ir_op_attr_float(op, "softcap", 0);
    const Value *bias = op->nres == 4 ? op->args[ir_attention_arg(op, 3)] : NULL;
    for (int i = 0; i < op->nres; i++)
        memset(RES(i), 0, sizeof(double) * (size_t)interp_numel(op->res[i]));
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < S; i++) {
                int64_t kh = h / (H / KV), last = causal ? i : Sk - 1;
                int64_t qo = (b * S + i) * qc + h * Dh;
                double m = -INFINITY, s = 0, dot = 0;
                for (int64_t j = 0; j <= last; j++) {
                    p[j] = 0;
                    for (int64_t d = 0; d < Dh; d++)
                        p[j] += ARG(0)[qo + d] * ARG(1)[(b * Sk + j) * kc + kh * Dh + d] * scale;
                    p[j] = softcap(op, p[j]);
                    dc[j] = cap > 0 ? 1 - (p[j] / cap) * (p[j] / cap) : 1;
                    p[j] += alibi_bias(op, h, i, j) + score_bias(in, op, h, i, j);
                    if (!sees(in, op, Sk, b, i, j))
                        p[j] = -INFINITY;
                    m = fmax(m, p[j]);
                }
                for (int64_t j = 0; j <= last; j++)
                    s += (p[j] = p[j] == -INFINITY ? 0 : exp(p[j] - m));
                if (s == 0) /* a row that sees no key: its output is 0, so are its gradients */
                    continue;
                for (int64_t j = 0; j <= last; j++) {
                    int64_t vo = (b * Sk + j) * vc + kh * Dv, oo = (b * S + i) * H * Dv + h * Dv;
                    p[j] /= s;
                    dp[j] = 0;
                    for (int64_t d = 0; d < Dv; d++) {
                        dp[j] += ARG(3)[oo + d] * ARG(2)[vo + d];
                        RES(2)[vo + d] += p[j] * ARG(3)[oo + d];
                    }
                    dot += p[j] * dp[j];
                }
                for (int64_t j = 0; j <= last; j++) {
                    int64_t ko = (b * Sk + j) * kc + kh * Dh;
                    double ds = p[j] * (dp[j] - dot) * dc[j] * scale;
                    if (bias) /* the bias's gradient: the score's, before the cap and the scale */
                        RES(3)[((bias->shape[0] == 1 ? 0 : h) * S + i) * Sk + j] += p[j] * (dp[j] - dot);
                    for (int64_t d = 0; d < Dh; d++) {
                        RES(0)[qo + d] += ds * ARG(1)[ko + d];
                        RES(1)[ko + d] += ds * ARG(0)[qo + d];
                    }
                }
            }
    free(p);
}

static void run_cross_entropy_grad(Interp *in, const Op *op)
{
    const Value *x = op->args[0];
    int64_t V = x->shape[x->rank - 1], R = interp_numel(x) / V;
    double dl = ARG(2)[0] / (double)R;
    for (int64_t r = 0; r < R; r++) {
        const double *p = ARG(0) + r * V;
        double m = -INFINITY, s = 0;
        for (int64_t c = 0; c < V; c++)
            m = fmax(m, p[c]);
        for (int64_t c = 0; c < V; c++)
            s += exp(p[c] - m);
        for (int64_t c = 0; c < V; c++)
            OUT[r * V + c] = (exp(p[c] - m) / s - (c == (int64_t)ARG(1)[r])) * dl;
    }
}

/* ---- optimizer ops ---- */

static double lr_at(const Op *op, double t)
{
    double lr = ir_op_attr_float(op, "lr", 0.01), min_lr = ir_op_attr_float(op, "min_lr", 0);
    double warm = (double)ir_op_attr_int(op, "warmup", 0), total = (double)ir_op_attr_int(op, "total", 0);
    const Attr *s = ir_op_attr(op, "schedule");
    if (warm > 0 && t <= warm)
        return lr * t / warm;
    if (!s || !strcmp(s->s, "constant"))
        return lr;
    double span = total - warm - 1, p = span > 0 ? (t - warm - 1) / span : 1;
    p = p < 0 ? 0 : p > 1 ? 1 : p;
    if (!strcmp(s->s, "linear"))
        return lr + (min_lr - lr) * p;
    return min_lr + 0.5 * (1 + cos(3.141592653589793 * p)) * (lr - min_lr);
}

static void run_sgd(Interp *in, const Op *op, int64_t n)
{
    double mu = ir_op_attr_float(op, "momentum", 0), wd = ir_op_attr_float(op, "weight_decay", 0);
    double lr = ARG(3)[0];
    for (int64_t i = 0; i < n; i++) {
        double m = mu * ARG(2)[i] + ARG(1)[i] + wd * ARG(0)[i];
        RES(1)[i] = m;
        RES(0)[i] = ARG(0)[i] - lr * m;
    }
}

static void run_adamw(Interp *in, const Op *op, int64_t n)
{
    double b1 = ir_op_attr_float(op, "beta1", 0.9), b2 = ir_op_attr_float(op, "beta2", 0.999);
    double eps = ir_op_attr_float(op, "eps", 1e-8), wd = ir_op_attr_float(op, "weight_decay", 0);
    double lr = ARG(4)[0], t = ARG(5)[0];
    for (int64_t i = 0; i < n; i++) {
        double g = ARG(1)[i], m = b1 * ARG(2)[i] + (1 - b1) * g, v = b2 * ARG(3)[i] + (1 - b2) * g * g;
        double mh = m / (1 - pow(b1, t)), vh = v / (1 - pow(b2, t));
        RES(1)[i] = m;
        RES(2)[i] = v;
        RES(0)[i] = ARG(0)[i] * (1 - lr * wd) - lr * mh / (sqrt(vh) + eps);
    }
}

static int run_op(Interp *in, const Op *op)
{
    int64_t n = op->nres ? interp_numel(op->res[0]) : 0;
    switch (op->kind) {
    case OP_INPUT:
    case OP_PARAM:
    case OP_STATE:
    case OP_UPDATE: return 0;
    case OP_STEP: OUT[0] = in->step; return 0;
    case OP_ALL_REDUCE: case OP_ALL_GATHER: case OP_REDUCE_SCATTER: case OP_ALL_TO_ALL:
    case OP_SHARD_SLICE: /* the global value is unchanged */
        memcpy(OUT, ARG(0), sizeof(double) * (size_t)n);
        return 0;
    case OP_LR: OUT[0] = lr_at(op, ARG(0)[0]); return 0;
    case OP_CLIP_SCALE:
        OUT[0] = fmin(1.0, ir_op_attr_float(op, "max_norm", 1) / (ARG(0)[0] + 1e-6));
        return 0;
    case OP_SGD: run_sgd(in, op, interp_numel(op->args[0])); return 0;
    case OP_ADAMW: run_adamw(in, op, interp_numel(op->args[0])); return 0;
    case OP_CONSTANT:
        for (int64_t i = 0; i < n; i++)
            OUT[i] = ir_op_attr_float(op, "value", 0);
        return 0;
    case OP_ARANGE:
        for (int64_t i = 0; i < n; i++)
            OUT[i] = (double)i;
        return 0;
    case OP_ADD: case OP_SUB: case OP_MUL: case OP_DIV: case OP_LT: case OP_LE: case OP_GT:
    case OP_GE: case OP_EQ: case OP_NE:
        run_binary(in, op);
        return 0;
    case OP_WHERE: run_where(in, op); return 0;
    case OP_NEG: case OP_EXP: case OP_LOG: case OP_SQRT: case OP_RSQRT: case OP_TANH:
    case OP_SIGMOID: case OP_RELU: case OP_GELU: case OP_SILU: case OP_CAST: case OP_STOP_GRAD:
    case OP_ERF: case OP_ABS: case OP_FLOOR:
    case OP_MB_SUM: /* a graph of one microbatch: the interpreter runs that one */
        for (int64_t i = 0; i < n; i++)
            OUT[i] = unary(op->kind, ARG(0)[i]);
        if (op->kind == OP_CAST && op->res[0]->dtype == DT_I32)
            for (int64_t i = 0; i < n; i++)
                OUT[i] = trunc(OUT[i]);
        return 0;
    case OP_MATMUL: run_matmul(in, op); return 0;
    case OP_SOFTMAX: run_softmax(in, op); return 0;
    case OP_LAYERNORM: case OP_RMSNORM: run_norm(in, op); return 0;
    case OP_SUM: case OP_MEAN: case OP_MAX: run_reduce(in, op); return 0;
    case OP_ARGMAX: run_argmax(in, op); return 0;
    case OP_EMBED: return run_embed(in, op);
    case OP_GATHER: run_gather(in, op, 0); return 0;
    case OP_DROPOUT: run_dropout(in, op); return 0;
    case OP_TOPK: run_topk(in, op, 0); return 0;
    case OP_ROPE: run_rope(in, op); return 0;
    case OP_ATTENTION: run_attention(in, op); return 0;
    case OP_CROSS_ENTROPY: return run_cross_entropy(in, op);
    case OP_RESHAPE: memcpy(OUT, ARG(0), sizeof(double) * (size_t)n); return 0;
    case OP_TRANSPOSE: run_transpose(in, op); return 0;
    case OP_SLICE: run_slice(in, op); return 0;
    case OP_CONCAT: run_concat(in, op); return 0;
    case OP_SUM_TO: run_sum_to(in, op); return 0;
    case OP_EXPAND: run_expand(in, op); return 0;
    case OP_PAD: run_pad(in, op); return 0;
    case OP_GELU_GRAD: case OP_SILU_GRAD: case OP_RELU_GRAD:
        for (int64_t i = 0; i < n; i++)
            OUT[i] = pointwise_grad(op->kind, ARG(0)[i], ARG(1)[i]);
        return 0;
    case OP_SOFTMAX_GRAD: run_softmax_grad(in, op); return 0;
    case OP_MAX_GRAD: run_max_grad(in, op); return 0;
    case OP_LAYERNORM_GRAD: case OP_RMSNORM_GRAD: run_norm_grad(in, op); return 0;
    case OP_EMBED_GRAD: run_embed_grad(in, op); return 0;
    case OP_GATHER_GRAD: run_gather(in, op, 1); return 0;
    case OP_SCATTER_ADD: run_topk(in, op, 1); return 0;
    case OP_ATTENTION_GRAD: run_attention_grad(in, op); return 0;
    case OP_CROSS_ENTROPY_GRAD: run_cross_entropy_grad(in, op); return 0;
    default:
        snprintf(in->err, sizeof in->err, "no reference for op '%s'", ir_ops[op->kind].name);
        return -1;
    }
}

int interp_run(Interp *in)
{
    for (int i = 0; i < in->g->ops.len; i++)
        if (run_op(in, in->g->ops.data[i]) != 0)
            return -1;
    for (int i = 0; i < in->g->ops.len; i++) {
        const Op *op = in->g->ops.data[i];
        if (op->kind == OP_UPDATE)
            memcpy(in->buf[op->args[0]->id], in->buf[op->args[1]->id],
                   sizeof(double) * (size_t)interp_numel(op->args[0]));
    }
    in->step += 1;
    return 0;
}
