/* cuDNN's fused flash attention through the backend graph API, loaded at run time
 * (cudnn_sdpa.h says what and why). The graphs mirror cudnn-frontend's CompositeSDPANode and
 * CompositeSDPABackwardNode (include/cudnn_frontend/node/scaled_dot_product_flash_attention.h)
 * for our case: causal (its diagonal band mask, top-left, right bound 0), attention scale as a
 * value, statistics out of the forward, deterministic backward, grouped-query heads. cuDNN's
 * fusion engines recognise the pattern, so the op order, types and strides are the frontend's. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "kernels/cuda/cudnn_sdpa.h"

#include <dlfcn.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__has_include)
#if __has_include(<cudnn_graph.h>) && __has_include(<cuda_runtime_api.h>)
#define HAVE_CUDNN 1
#endif
#endif

#ifndef HAVE_CUDNN

struct cudnn_sdpa { int unused; };

int cudnn_sdpa_open(cudnn_sdpa_t **out, char *why, size_t whylen)
{
    *out = NULL;
    snprintf(why, whylen, "built without cuDNN's headers (cudnn_graph.h)");
    return -ENOSYS;
}
void cudnn_sdpa_close(cudnn_sdpa_t **s) { *s = NULL; }
long cudnn_sdpa_version(const cudnn_sdpa_t *s) { (void)s; return 0; }
int cudnn_sdpa_graph_check(cudnn_sdpa_t *s, int bwd, int B, int T, int H, int Hkv, int hd)
{
    (void)s; (void)bwd; (void)B; (void)T; (void)H; (void)Hkv; (void)hd;
    return -ENOSYS;
}
int cudnn_sdpa_fwd(cudnn_sdpa_t *s, uint16_t *out, float *lse, const uint16_t *q, const uint16_t *k,
                   const uint16_t *v, int B, int T, int H, int Hkv, int hd, void *stream)
{
    (void)s; (void)out; (void)lse; (void)q; (void)k; (void)v; (void)B; (void)T; (void)H; (void)Hkv;
    (void)hd; (void)stream;
    return -ENOSYS;
}
int cudnn_sdpa_bwd(cudnn_sdpa_t *s, uint16_t *dq, uint16_t *dk, uint16_t *dv, float *delta,
                   const uint16_t *dout, const uint16_t *q, const uint16_t *k, const uint16_t *v,
                   const uint16_t *out, const float *lse, int B, int T, int H, int Hkv, int hd,
                   void *stream)
{
    (void)s; (void)dq; (void)dk; (void)dv; (void)delta; (void)dout; (void)q; (void)k; (void)v;
    (void)out; (void)lse; (void)B; (void)T; (void)H; (void)Hkv; (void)hd; (void)stream;
    return -ENOSYS;
}
size_t cudnn_sdpa_workspace_bytes(const cudnn_sdpa_t *s) { (void)s; return 0; }
const char *cudnn_sdpa_error(const cudnn_sdpa_t *s) { (void)s; return "built without cuDNN"; }
int cudnn_sdpa_device_json(cudnn_sdpa_t *s, char **json)
{
    (void)s;
    *json = NULL;
    return -ENOSYS;
}
int cudnn_sdpa_plan_for(cudnn_sdpa_t *s, const char *device_json, int bwd, int B, int T, int H, int Hkv, int hd,
                        long long *engine, long long *workspace)
{
    (void)s; (void)device_json; (void)bwd; (void)B; (void)T; (void)H; (void)Hkv; (void)hd; (void)engine;
    (void)workspace;
    return -ENOSYS;
}

#else

#include <cuda_runtime_api.h>
#include <cudnn_graph.h>

/* The backend entry points, from the loaded library. */
typedef struct {
    void *lib;
    size_t (*GetVersion)(void);
    const char *(*GetErrorString)(cudnnStatus_t);
    void (*GetLastErrorString)(char *, size_t);
    cudnnStatus_t (*Create)(cudnnHandle_t *);
    cudnnStatus_t (*Destroy)(cudnnHandle_t);
    cudnnStatus_t (*SetStream)(cudnnHandle_t, cudaStream_t);
    cudnnStatus_t (*CreateDescriptor)(cudnnBackendDescriptorType_t, cudnnBackendDescriptor_t *);
    cudnnStatus_t (*DestroyDescriptor)(cudnnBackendDescriptor_t);
    cudnnStatus_t (*SetAttribute)(cudnnBackendDescriptor_t, cudnnBackendAttributeName_t,
                                  cudnnBackendAttributeType_t, int64_t, const void *);
    cudnnStatus_t (*GetAttribute)(cudnnBackendDescriptor_t const, cudnnBackendAttributeName_t,
                                  cudnnBackendAttributeType_t, int64_t, int64_t *, void *);
    cudnnStatus_t (*Finalize)(cudnnBackendDescriptor_t);
    cudnnStatus_t (*Execute)(cudnnHandle_t, cudnnBackendDescriptor_t, cudnnBackendDescriptor_t);
} api_t;

/* The tensors a caller binds, by unique id; every other tensor of a graph is virtual (ids from
 * FIRST_VIRTUAL) or a value passed by host pointer (SCALE, NEG_INF, ONE). */
enum {
    U_Q = 1, U_K, U_V, U_O, U_STATS, U_DO, U_DQ, U_DK, U_DV, U_SUM, U_SCALE, U_NEG_INF, U_ONE,
    FIRST_VIRTUAL = 100
};

#define PLANS 8
typedef struct {
    bool used;
    int bwd, B, T, H, Hkv, hd;
    cudnnBackendDescriptor_t plan;
    int64_t workspace;
    int64_t engine;
} plan_t;

struct cudnn_sdpa {
    api_t a;
    cudnnHandle_t handle;
    plan_t plans[PLANS];
    void *stream;          /* the handle's stream */
    void *ws;              /* device workspace, shared by every plan */
    size_t ws_bytes;
    float scale, neg_inf, one;
    char err[512];
};

static void set_err(cudnn_sdpa_t *s, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->err, sizeof s->err, fmt, ap);
    va_end(ap);
}

/* "CUDNN_STATUS_...: the library's last message" */
static void status_err(cudnn_sdpa_t *s, cudnnStatus_t st, const char *what)
{
    char last[256] = "";
    if (s->a.GetLastErrorString)
        s->a.GetLastErrorString(last, sizeof last);
    set_err(s, "cuDNN %s: %s%s%s", what, s->a.GetErrorString ? s->a.GetErrorString(st) : "error",
            last[0] ? ": " : "", last);
}

#define SYM(field, name)                                                                 \
    do {                                                                                 \
        *(void **)&a->field = dlsym(a->lib, name);                                       \
        if (!a->field) {                                                                 \
            snprintf(why, whylen, "%s has no %s (cuDNN 9 expected)", path, name);       \
            return -ENOSYS;                                                              \
        }                                                                                \
    } while (0)

static int load(api_t *a, char *why, size_t whylen)
{
    const char *env = getenv("CTITAN_CUDNN_LIB");
    const char *path = env && env[0] ? env : "libcudnn.so.9";
    a->lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!a->lib) {
        snprintf(why, whylen, "cannot load %s (%s); CTITAN_CUDNN_LIB names another copy", path,
                 dlerror());
        return -ENOSYS;
    }
    SYM(GetVersion, "cudnnGetVersion");
    SYM(GetErrorString, "cudnnGetErrorString");
    SYM(GetLastErrorString, "cudnnGetLastErrorString");
    SYM(Create, "cudnnCreate");
    SYM(Destroy, "cudnnDestroy");
    SYM(SetStream, "cudnnSetStream");
    SYM(CreateDescriptor, "cudnnBackendCreateDescriptor");
    SYM(DestroyDescriptor, "cudnnBackendDestroyDescriptor");
    SYM(SetAttribute, "cudnnBackendSetAttribute");
    SYM(GetAttribute, "cudnnBackendGetAttribute");
    SYM(Finalize, "cudnnBackendFinalize");
    SYM(Execute, "cudnnBackendExecute");
    size_t v = a->GetVersion();
    /* The graph needs 9.x's fused attention engines; the enum values this file was compiled with
     * are those of CUDNN_MAJOR 9. */
    if (v < 90000 || v >= 100000) {
        snprintf(why, whylen, "%s is cuDNN %zu; 9.x is needed", path, v);
        return -ENOSYS;
    }
    return 0;
}

int cudnn_sdpa_open(cudnn_sdpa_t **out, char *why, size_t whylen)
{
    *out = NULL;
    cudnn_sdpa_t *s = calloc(1, sizeof *s);
    if (!s) {
        snprintf(why, whylen, "out of host memory");
        return -ENOMEM;
    }
    int rc = load(&s->a, why, whylen);
    if (rc) {
        if (s->a.lib)
            dlclose(s->a.lib);
        free(s);
        return rc;
    }
    s->neg_inf = -INFINITY;
    s->one = 1.0f;
    *out = s;
    return 0;
}

void cudnn_sdpa_close(cudnn_sdpa_t **sp)
{
    cudnn_sdpa_t *s = *sp;
    if (!s)
        return;
    for (int i = 0; i < PLANS; i++)
        if (s->plans[i].used)
            s->a.DestroyDescriptor(s->plans[i].plan);
    if (s->ws)
        cudaFree(s->ws);
    if (s->handle)
        s->a.Destroy(s->handle);
    /* The library stays loaded: cuDNN's own libraries keep state a dlclose would cut off. */
    free(s);
    *sp = NULL;
}

long cudnn_sdpa_version(const cudnn_sdpa_t *s) { return s ? (long)s->a.GetVersion() : 0; }
size_t cudnn_sdpa_workspace_bytes(const cudnn_sdpa_t *s) { return s ? s->ws_bytes : 0; }
const char *cudnn_sdpa_error(const cudnn_sdpa_t *s) { return s ? s->err : "no cuDNN"; }

/* ---- graph building: every descriptor made is kept for one destroy at the end ---- */

#define MAX_DESC 160
#define MAX_OPS 48
typedef struct {
    cudnn_sdpa_t *s;
    cudnnBackendDescriptor_t all[MAX_DESC];
    int nall;
    cudnnBackendDescriptor_t ops[MAX_OPS];
    int nops;
    int64_t next_uid;
    bool failed;
} gb_t;

static cudnnBackendDescriptor_t make(gb_t *g, cudnnBackendDescriptorType_t type, const char *what)
{
    if (g->failed)
        return NULL;
    if (g->nall == MAX_DESC) {
        set_err(g->s, "cuDNN graph: more than %d descriptors", MAX_DESC);
        g->failed = true;
        return NULL;
    }
    cudnnBackendDescriptor_t d = NULL;
    cudnnStatus_t st = g->s->a.CreateDescriptor(type, &d);
    if (st != CUDNN_STATUS_SUCCESS) {
        status_err(g->s, st, what);
        g->failed = true;
        return NULL;
    }
    g->all[g->nall++] = d;
    return d;
}

static void set(gb_t *g, cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
                cudnnBackendAttributeType_t type, int64_t n, const void *v, const char *what)
{
    if (g->failed)
        return;
    cudnnStatus_t st = g->s->a.SetAttribute(d, name, type, n, v);
    if (st != CUDNN_STATUS_SUCCESS) {
        char msg[96];
        snprintf(msg, sizeof msg, "%s (attribute %d)", what, (int)name);
        status_err(g->s, st, msg);
        g->failed = true;
    }
}

static void finalize(gb_t *g, cudnnBackendDescriptor_t d, const char *what)
{
    if (g->failed)
        return;
    cudnnStatus_t st = g->s->a.Finalize(d);
    if (st != CUDNN_STATUS_SUCCESS) {
        char msg[96];
        snprintf(msg, sizeof msg, "finalize of %s", what);
        status_err(g->s, st, msg);
        g->failed = true;
    }
}

static void add_op(gb_t *g, cudnnBackendDescriptor_t op, const char *what)
{
    finalize(g, op, what);
    if (g->failed)
        return;
    if (g->nops == MAX_OPS) {
        set_err(g->s, "cuDNN graph: more than %d operations", MAX_OPS);
        g->failed = true;
        return;
    }
    g->ops[g->nops++] = op;
}

typedef struct { int64_t d[4], s[4]; } shape_t;

/* A tensor: uid 0 makes a virtual one with the next free id. */
static cudnnBackendDescriptor_t tensor(gb_t *g, int64_t uid, cudnnDataType_t type, shape_t sh,
                                       bool by_value, const char *what)
{
    cudnnBackendDescriptor_t t = make(g, CUDNN_BACKEND_TENSOR_DESCRIPTOR, what);
    bool virt = uid == 0;
    int64_t id = virt ? g->next_uid++ : uid;
    int64_t align = 16;
    set(g, t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, sh.d, what);
    set(g, t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, sh.s, what);
    set(g, t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &id, what);
    set(g, t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align, what);
    set(g, t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type, what);
    set(g, t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &virt, what);
    set(g, t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value, what);
    finalize(g, t, what);
    return t;
}

/* y = mode(x[, b[, t]]), computed in comp; axis >= 0 for GEN_INDEX. */
static void pointwise(gb_t *g, cudnnPointwiseMode_t mode, cudnnDataType_t comp, int64_t axis,
                      cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b,
                      cudnnBackendDescriptor_t t, cudnnBackendDescriptor_t y, const char *what)
{
    cudnnBackendDescriptor_t pw = make(g, CUDNN_BACKEND_POINTWISE_DESCRIPTOR, what);
    set(g, pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode, what);
    set(g, pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &comp, what);
    if (mode == CUDNN_POINTWISE_GEN_INDEX)
        set(g, pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis, what);
    finalize(g, pw, what);
    cudnnBackendDescriptor_t op = make(g, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, what);
    set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &pw, what);
    set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x, what);
    set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y, what);
    if (b)
        set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b, what);
    if (t)
        set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &t, what);
    float alpha = 1.0f;
    set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, CUDNN_TYPE_FLOAT, 1, &alpha, what);
    set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, CUDNN_TYPE_FLOAT, 1, &alpha, what);
    add_op(g, op, what);
}

/* c = a b (batched over the first two dims; b's heads may be fewer: grouped-query). */
static void matmul(gb_t *g, cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b,
                   cudnnBackendDescriptor_t c, const char *what)
{
    cudnnBackendDescriptor_t mm = make(g, CUDNN_BACKEND_MATMUL_DESCRIPTOR, what);
    cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    set(g, mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp, what);
    finalize(g, mm, what);
    cudnnBackendDescriptor_t op = make(g, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, what);
    set(g, op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &a, what);
    set(g, op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b, what);
    set(g, op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &c, what);
    set(g, op, CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &mm, what);
    add_op(g, op, what);
}

static void reduction(gb_t *g, cudnnReduceTensorOp_t mode, cudnnBackendDescriptor_t x,
                      cudnnBackendDescriptor_t y, const char *what)
{
    cudnnBackendDescriptor_t rd = make(g, CUDNN_BACKEND_REDUCTION_DESCRIPTOR, what);
    cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    bool det = false; /* the frontend's default for these nodes */
    set(g, rd, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp, what);
    set(g, rd, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode, what);
    if (g->s->a.GetVersion() >= 91100) /* the attribute's first version */
        set(g, rd, CUDNN_ATTR_REDUCTION_IS_DETERMINISTIC, CUDNN_TYPE_BOOLEAN, 1, &det, what);
    finalize(g, rd, what);
    cudnnBackendDescriptor_t op = make(g, CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, what);
    set(g, op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &rd, what);
    set(g, op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x, what);
    set(g, op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y, what);
    add_op(g, op, what);
}

static void reshape(gb_t *g, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y, const char *what)
{
    cudnnBackendDescriptor_t op = make(g, CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, what);
    set(g, op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x, what);
    set(g, op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y, what);
    add_op(g, op, what);
}

/* The frontend's causal mask (diagonal_band_mask, top-left, right bound 0): keep column <= row,
 * the rest -inf. */
static cudnnBackendDescriptor_t causal(gb_t *g, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t neg_inf,
                                       shape_t sc)
{
    cudnnBackendDescriptor_t row = tensor(g, 0, CUDNN_DATA_INT32, sc, false, "row index");
    pointwise(g, CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_FLOAT, 2, x, NULL, NULL, row, "gen_row_index");
    cudnnBackendDescriptor_t col = tensor(g, 0, CUDNN_DATA_INT32, sc, false, "column index");
    pointwise(g, CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_FLOAT, 3, x, NULL, NULL, col, "gen_col_index");
    cudnnBackendDescriptor_t keep = tensor(g, 0, CUDNN_DATA_BOOLEAN, sc, false, "causal mask");
    pointwise(g, CUDNN_POINTWISE_CMP_GE, CUDNN_DATA_BOOLEAN, -1, row, col, NULL, keep, "row>=col");
    cudnnBackendDescriptor_t y = tensor(g, 0, CUDNN_DATA_FLOAT, sc, false, "masked scores");
    pointwise(g, CUDNN_POINTWISE_BINARY_SELECT, CUDNN_DATA_FLOAT, -1, x, neg_inf, keep, y, "binary_select");
    return y;
}

static shape_t shape4(int64_t d0, int64_t d1, int64_t d2, int64_t d3, int64_t s0, int64_t s1, int64_t s2,
                      int64_t s3)
{
    shape_t sh = {{d0, d1, d2, d3}, {s0, s1, s2, s3}};
    return sh;
}

/* The operation graph, finalized, in *graph (the caller destroys it; g's descriptors stay with
 * g until gb_free). Our tensors are [B,T,heads,hd] (BSHD), cuDNN's dims [b,h,s,d]. */
static void build(gb_t *g, int bwd, int B, int T, int H, int G, int D, cudnnBackendDescriptor_t *graph)
{
    int64_t b = B, t = T, h = H, k = G, d = D;
    shape_t q_sh = shape4(b, h, t, d, t * h * d, d, h * d, 1);
    shape_t kv_sh = shape4(b, k, t, d, t * k * d, d, k * d, 1);
    shape_t kvT_sh = shape4(b, k, d, t, t * k * d, d, 1, k * d);
    shape_t sc = shape4(b, h, t, t, h * t * t, t * t, t, 1);
    shape_t scT = shape4(b, h, t, t, h * t * t, t * t, 1, t);
    shape_t row = shape4(b, h, t, 1, h * t, t, 1, 1);
    shape_t one = shape4(1, 1, 1, 1, 1, 1, 1, 1);
    const cudnnDataType_t F = CUDNN_DATA_FLOAT, BF = CUDNN_DATA_BFLOAT16;

    cudnnBackendDescriptor_t Q = tensor(g, U_Q, BF, q_sh, false, "Q");
    cudnnBackendDescriptor_t scale = tensor(g, U_SCALE, F, one, true, "attn_scale");
    cudnnBackendDescriptor_t neg_inf = tensor(g, U_NEG_INF, F, one, true, "-inf");
    cudnnBackendDescriptor_t stats = tensor(g, U_STATS, F, row, false, "Stats");
    if (!bwd) {
        cudnnBackendDescriptor_t KT = tensor(g, U_K, BF, kvT_sh, false, "K");
        cudnnBackendDescriptor_t V = tensor(g, U_V, BF, kv_sh, false, "V");
        cudnnBackendDescriptor_t O = tensor(g, U_O, BF, q_sh, false, "O");
        cudnnBackendDescriptor_t s1 = tensor(g, 0, F, sc, false, "bmm1");
        matmul(g, Q, KT, s1, "bmm1");
        cudnnBackendDescriptor_t s2 = tensor(g, 0, F, sc, false, "attn_scale out");
        pointwise(g, CUDNN_POINTWISE_MUL, F, -1, s1, scale, NULL, s2, "attn_scale");
        cudnnBackendDescriptor_t s3 = causal(g, s2, neg_inf, sc);
        /* the frontend's softmax node with statistics */
        cudnnBackendDescriptor_t mx = tensor(g, 0, F, row, false, "Max");
        reduction(g, CUDNN_REDUCE_TENSOR_MAX, s3, mx, "Max");
        cudnnBackendDescriptor_t s4 = tensor(g, 0, F, sc, false, "sub_M");
        pointwise(g, CUDNN_POINTWISE_SUB, F, -1, s3, mx, NULL, s4, "sub");
        cudnnBackendDescriptor_t e = tensor(g, 0, F, sc, false, "exp_sub_M");
        pointwise(g, CUDNN_POINTWISE_EXP, F, -1, s4, NULL, NULL, e, "exp");
        cudnnBackendDescriptor_t z = tensor(g, 0, F, row, false, "SumExp");
        reduction(g, CUDNN_REDUCE_TENSOR_ADD, e, z, "sum");
        cudnnBackendDescriptor_t lz = tensor(g, 0, F, row, false, "log");
        pointwise(g, CUDNN_POINTWISE_LOG, F, -1, z, NULL, NULL, lz, "log");
        pointwise(g, CUDNN_POINTWISE_ADD, F, -1, mx, lz, NULL, stats, "add (Stats)");
        cudnnBackendDescriptor_t p = tensor(g, 0, BF, sc, false, "softmax");
        pointwise(g, CUDNN_POINTWISE_DIV, F, -1, e, z, NULL, p, "div");
        matmul(g, p, V, O, "bmm2");
    } else {
        cudnnBackendDescriptor_t KT = tensor(g, U_K, BF, kvT_sh, false, "K");
        cudnnBackendDescriptor_t VT = tensor(g, U_V, BF, kvT_sh, false, "V");
        cudnnBackendDescriptor_t O = tensor(g, U_O, BF, q_sh, false, "O");
        cudnnBackendDescriptor_t dO = tensor(g, U_DO, BF, q_sh, false, "dO");
        cudnnBackendDescriptor_t dQ = tensor(g, U_DQ, BF, q_sh, false, "dQ");
        cudnnBackendDescriptor_t dK = tensor(g, U_DK, BF, kv_sh, false, "dK");
        cudnnBackendDescriptor_t dV = tensor(g, U_DV, BF, kv_sh, false, "dV");
        cudnnBackendDescriptor_t onev = tensor(g, U_ONE, F, one, true, "one");
        /* softmax_sum = rowsum(dO * O): a real tensor (our delta scratch) */
        cudnnBackendDescriptor_t t1 = tensor(g, 0, F, shape4(b, h, t, d, h * t * d, t * d, h * d, 1), false,
                                             "mul_dO_O");
        pointwise(g, CUDNN_POINTWISE_MUL, F, -1, dO, O, NULL, t1, "mul_dO_O");
        cudnnBackendDescriptor_t t2 = tensor(g, 0, F, row, false, "reduce_dO_o");
        reduction(g, CUDNN_REDUCE_TENSOR_ADD, t1, t2, "reduce_dO_o");
        cudnnBackendDescriptor_t sum = tensor(g, U_SUM, F, row, false, "softmax_sum");
        pointwise(g, CUDNN_POINTWISE_MUL, F, -1, t2, onev, NULL, sum, "scale_dropout_inv");
        /* P = exp(scale * Q K^T - Stats), masked */
        cudnnBackendDescriptor_t s1 = tensor(g, 0, F, sc, false, "matmul_Q_KT");
        matmul(g, Q, KT, s1, "matmul_Q_KT");
        cudnnBackendDescriptor_t s2 = tensor(g, 0, F, sc, false, "mul_s_attn_scale");
        pointwise(g, CUDNN_POINTWISE_MUL, F, -1, s1, scale, NULL, s2, "mul_s_attn_scale");
        cudnnBackendDescriptor_t s3 = tensor(g, 0, F, sc, false, "sub_s_m");
        pointwise(g, CUDNN_POINTWISE_SUB, F, -1, s2, stats, NULL, s3, "sub_s_m");
        cudnnBackendDescriptor_t s4 = causal(g, s3, neg_inf, sc);
        cudnnBackendDescriptor_t es = tensor(g, 0, F, sc, false, "exp_s");
        pointwise(g, CUDNN_POINTWISE_EXP, F, -1, s4, NULL, NULL, es, "exp_s");
        /* dV = P^T dO (summed over a kv head's query heads) */
        cudnnBackendDescriptor_t pT = tensor(g, 0, BF, scT, false, "reshape_p");
        reshape(g, es, pT, "reshape_p");
        shape_t full = shape4(b, h, t, d, h * t * d, t * d, d, 1);
        if (H == G) {
            matmul(g, pT, dO, dV, "matmul_pT_dO");
        } else {
            cudnnBackendDescriptor_t dvf = tensor(g, 0, BF, full, false, "dV_fullhead");
            matmul(g, pT, dO, dvf, "matmul_pT_dO");
            reduction(g, CUDNN_REDUCE_TENSOR_ADD, dvf, dV, "red_dV_head");
        }
        /* dS = P (dO V^T - softmax_sum) * scale */
        cudnnBackendDescriptor_t dp = tensor(g, 0, F, sc, false, "matmul_dO_VT");
        matmul(g, dO, VT, dp, "matmul_dO_VT");
        cudnnBackendDescriptor_t t3 = tensor(g, 0, F, sc, false, "sub_dP_softmax_sum");
        pointwise(g, CUDNN_POINTWISE_SUB, F, -1, dp, sum, NULL, t3, "sub_dP_softmax_sum");
        cudnnBackendDescriptor_t t4 = tensor(g, 0, F, sc, false, "mul_dP_exp_s");
        pointwise(g, CUDNN_POINTWISE_MUL, F, -1, t3, es, NULL, t4, "mul_dP_exp_s");
        cudnnBackendDescriptor_t ds = tensor(g, 0, F, sc, false, "mul_dS_attn_scale");
        pointwise(g, CUDNN_POINTWISE_MUL, F, -1, t4, scale, NULL, ds, "mul_dS_attn_scale");
        /* dK = dS^T Q */
        cudnnBackendDescriptor_t dsT = tensor(g, 0, BF, scT, false, "reshape_dS");
        reshape(g, ds, dsT, "reshape_dS");
        if (H == G) {
            matmul(g, dsT, Q, dK, "matmul_dST_Q");
        } else {
            cudnnBackendDescriptor_t dkf = tensor(g, 0, BF, full, false, "dK_fullhead");
            matmul(g, dsT, Q, dkf, "matmul_dST_Q");
            reduction(g, CUDNN_REDUCE_TENSOR_ADD, dkf, dK, "red_dK_head");
        }
        /* dQ = dS K, written directly (the frontend's deterministic form: no fp32 accumulator) */
        cudnnBackendDescriptor_t kk = tensor(g, 0, F, kv_sh, false, "reshape_k");
        reshape(g, KT, kk, "reshape_k");
        matmul(g, ds, kk, dQ, "matmul_dS_K");
    }
    cudnnBackendDescriptor_t og = NULL;
    if (!g->failed) {
        cudnnStatus_t st = g->s->a.CreateDescriptor(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, &og);
        if (st != CUDNN_STATUS_SUCCESS) {
            status_err(g->s, st, "operation graph");
            g->failed = true;
            og = NULL;
        }
    }
    if (og) {
        set(g, og, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, g->nops, g->ops,
            "operation graph");
        if (g->s->handle)
            set(g, og, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &g->s->handle,
                "operation graph");
        finalize(g, og, bwd ? "the backward's operation graph" : "the forward's operation graph");
        if (g->failed) {
            g->s->a.DestroyDescriptor(og);
            og = NULL;
        }
    }
    *graph = og;
}

static void gb_free(gb_t *g)
{
    for (int i = g->nall - 1; i >= 0; i--)
        g->s->a.DestroyDescriptor(g->all[i]);
    g->nall = 0;
}

/* The shapes cuDNN's SDPA takes, and the frontend's refusals of known-bad versions. */
static int check_args(cudnn_sdpa_t *s, int bwd, int B, int T, int H, int Hkv, int hd)
{
    if (B < 1 || T < 2 || H < 1 || Hkv < 1 || H % Hkv || hd < 8 || hd > 256 || hd % 8) {
        set_err(s, "cuDNN attention: unsupported shape B %d T %d heads %d kv heads %d head dim %d", B, T,
                H, Hkv, hd);
        return -EINVAL;
    }
    size_t v = s->a.GetVersion();
    if (bwd && (v == 91000 || v == 91001)) {
        set_err(s, "cuDNN attention backward: cuDNN %zu has known bugs there (9.10.2 or newer)", v);
        return -ENOTSUP;
    }
    if (bwd && v <= 91500 && T % 128) {
        /* the frontend adds a padding mask there as a workaround; this file does not */
        set_err(s, "cuDNN attention backward: cuDNN %zu needs T a multiple of 128 here (T %d)", v, T);
        return -ENOTSUP;
    }
    return 0;
}

int cudnn_sdpa_graph_check(cudnn_sdpa_t *s, int bwd, int B, int T, int H, int Hkv, int hd)
{
    int rc = check_args(s, bwd, B, T, H, Hkv, hd);
    if (rc)
        return rc;
    gb_t g = {.s = s, .next_uid = FIRST_VIRTUAL};
    cudnnBackendDescriptor_t og = NULL;
    build(&g, bwd, B, T, H, Hkv, hd, &og);
    bool failed = g.failed;
    if (og)
        s->a.DestroyDescriptor(og);
    gb_free(&g);
    return failed ? -ENOTSUP : 0;
}

/* ---- planning and running on the device ---- */

static int plan_shape(cudnn_sdpa_t *s, plan_t *p, cudnnBackendDescriptor_t dp);

int cudnn_sdpa_plan_for(cudnn_sdpa_t *s, const char *device_json, int bwd, int B, int T, int H, int Hkv, int hd,
                        long long *engine, long long *workspace)
{
    int rc = check_args(s, bwd, B, T, H, Hkv, hd);
    if (rc)
        return rc;
    cudnnBackendDescriptor_t dp = NULL;
    cudnnStatus_t st = s->a.CreateDescriptor(CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR, &dp);
    if (st == CUDNN_STATUS_SUCCESS)
        st = s->a.SetAttribute(dp, CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION, CUDNN_TYPE_CHAR,
                               (int64_t)strlen(device_json), device_json);
    if (st == CUDNN_STATUS_SUCCESS)
        st = s->a.Finalize(dp);
    if (st != CUDNN_STATUS_SUCCESS) {
        status_err(s, st, "device properties from JSON");
        if (dp)
            s->a.DestroyDescriptor(dp);
        return -EINVAL;
    }
    plan_t p = {.used = true, .bwd = bwd, .B = B, .T = T, .H = H, .Hkv = Hkv, .hd = hd};
    rc = plan_shape(s, &p, dp);
    if (!rc) {
        *engine = p.engine;
        *workspace = p.workspace;
        s->a.DestroyDescriptor(p.plan);
    }
    s->a.DestroyDescriptor(dp);
    return rc;
}

int cudnn_sdpa_device_json(cudnn_sdpa_t *s, char **json)
{
    *json = NULL;
    int dev = 0;
    cudaError_t ce = cudaGetDevice(&dev);
    if (ce != cudaSuccess) {
        set_err(s, "cudaGetDevice: %s", cudaGetErrorString(ce));
        return -ENODEV;
    }
    cudnnBackendDescriptor_t dp = NULL;
    int64_t n = 0;
    cudnnStatus_t st = s->a.CreateDescriptor(CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR, &dp);
    if (st == CUDNN_STATUS_SUCCESS)
        st = s->a.SetAttribute(dp, CUDNN_ATTR_DEVICEPROP_DEVICE_ID, CUDNN_TYPE_INT32, 1, &dev);
    if (st == CUDNN_STATUS_SUCCESS)
        st = s->a.Finalize(dp);
    if (st == CUDNN_STATUS_SUCCESS)
        st = s->a.GetAttribute(dp, CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION, CUDNN_TYPE_CHAR, 0, &n, NULL);
    char *buf = st == CUDNN_STATUS_SUCCESS ? calloc((size_t)n + 1, 1) : NULL;
    if (buf)
        st = s->a.GetAttribute(dp, CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION, CUDNN_TYPE_CHAR, n, &n, buf);
    if (dp)
        s->a.DestroyDescriptor(dp);
    if (st != CUDNN_STATUS_SUCCESS || !buf) {
        free(buf);
        if (st == CUDNN_STATUS_SUCCESS) {
            set_err(s, "out of host memory");
            return -ENOMEM;
        }
        status_err(s, st, "device properties");
        return -EIO;
    }
    *json = buf;
    return 0;
}

/* An engine configuration's engine: its global index (-1 when it cannot be read) and whether
 * its numerical notes say nondeterministic (also when they cannot be read). */
static int64_t engine_of(cudnn_sdpa_t *s, cudnnBackendDescriptor_t cfg, bool *nondeterministic)
{
    cudnnBackendDescriptor_t eng = NULL;
    int64_t n = 0, id = -1;
    cudnnBackendNumericalNote_t notes[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
    *nondeterministic = true;
    if (s->a.CreateDescriptor(CUDNN_BACKEND_ENGINE_DESCRIPTOR, &eng) != CUDNN_STATUS_SUCCESS)
        return -1;
    if (s->a.GetAttribute(cfg, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, &eng) ==
        CUDNN_STATUS_SUCCESS) {
        s->a.GetAttribute(eng, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &n, &id);
        if (s->a.GetAttribute(eng, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                              CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &n, notes) == CUDNN_STATUS_SUCCESS) {
            *nondeterministic = false;
            for (int64_t i = 0; i < n; i++)
                *nondeterministic = *nondeterministic || notes[i] == CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC;
        }
    }
    s->a.DestroyDescriptor(eng);
    return id;
}

/* Heuristics' configurations in order; the first deterministic one that finalizes is the plan.
 * For the device of the handle, or (dp not NULL) for the device a DEVICEPROP descriptor
 * describes, with no device here: cuDNN's ahead-of-time planning. */
static int plan_shape(cudnn_sdpa_t *s, plan_t *p, cudnnBackendDescriptor_t dp)
{
    gb_t g = {.s = s, .next_uid = FIRST_VIRTUAL};
    cudnnBackendDescriptor_t og = NULL, heur = NULL;
    cudnnBackendDescriptor_t cfgs[32] = {0};
    int64_t ncfg = 0;
    int rc = -ENOTSUP;
    build(&g, p->bwd, p->B, p->T, p->H, p->Hkv, p->hd, &og);
    if (!og)
        goto out;
    cudnnStatus_t st = s->a.CreateDescriptor(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, &heur);
    cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
    if (st == CUDNN_STATUS_SUCCESS)
        st = s->a.SetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &og);
    if (st == CUDNN_STATUS_SUCCESS)
        st = s->a.SetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
    if (st == CUDNN_STATUS_SUCCESS && dp)
        st = s->a.SetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_DEVICEPROP, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &dp);
    if (st == CUDNN_STATUS_SUCCESS)
        st = s->a.Finalize(heur);
    if (st == CUDNN_STATUS_SUCCESS)
        st = s->a.GetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &ncfg, NULL);
    if (st != CUDNN_STATUS_SUCCESS) {
        status_err(s, st, "heuristics");
        goto out;
    }
    if (ncfg > 32)
        ncfg = 32;
    for (int64_t i = 0; i < ncfg; i++)
        if (s->a.CreateDescriptor(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, &cfgs[i]) != CUDNN_STATUS_SUCCESS) {
            ncfg = i;
            break;
        }
    int64_t got = 0;
    st = s->a.GetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, ncfg, &got, cfgs);
    if (st != CUDNN_STATUS_SUCCESS) {
        status_err(s, st, "heuristics' results");
        goto out;
    }
    /* why the last one failed: cuDNN's message (a configuration it could not hand out, or a plan
     * that did not finalize) */
    char last[320] = "";
    if (got < ncfg && s->a.GetLastErrorString)
        s->a.GetLastErrorString(last, sizeof last);
    for (int64_t i = 0; i < got && rc; i++) {
        bool nondet;
        int64_t engine = engine_of(s, cfgs[i], &nondet);
        if (nondet) {
            snprintf(last, sizeof last, "engine %lld: nondeterministic", (long long)engine);
            continue;
        }
        cudnnBackendDescriptor_t plan = NULL;
        if (s->a.CreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &plan) != CUDNN_STATUS_SUCCESS)
            continue;
        st = dp ? s->a.SetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_DEVICEPROP, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &dp)
                : s->a.SetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &s->handle);
        if (st == CUDNN_STATUS_SUCCESS)
            st = s->a.SetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                                   &cfgs[i]);
        if (st == CUDNN_STATUS_SUCCESS)
            st = s->a.Finalize(plan);
        int64_t ws = 0, n = 0;
        if (st == CUDNN_STATUS_SUCCESS)
            st = s->a.GetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &n, &ws);
        if (st != CUDNN_STATUS_SUCCESS) {
            char msg[256] = "";
            s->a.GetLastErrorString(msg, sizeof msg);
            snprintf(last, sizeof last, "engine %lld: %s: %s", (long long)engine, s->a.GetErrorString(st), msg);
            s->a.DestroyDescriptor(plan);
            continue;
        }
        p->plan = plan;
        p->workspace = ws;
        p->engine = engine;
        rc = 0;
    }
    if (rc)
        set_err(s, "cuDNN %s: none of the heuristics' %lld engine configurations (of %lld) plans B %d T %d heads "
                   "%d/%d head dim %d deterministically%s%s",
                p->bwd ? "attention backward" : "attention forward", (long long)got, (long long)ncfg, p->B, p->T,
                p->H, p->Hkv, p->hd, last[0] ? "; the last: " : "", last);
out:
    for (int64_t i = 0; i < 32; i++)
        if (cfgs[i])
            s->a.DestroyDescriptor(cfgs[i]);
    if (heur)
        s->a.DestroyDescriptor(heur);
    if (og)
        s->a.DestroyDescriptor(og);
    gb_free(&g);
    return rc;
}

/* The shape's plan on the handle, the handle on the stream: found (every call of a training step,
 * so nothing but a lookup), else made (the shape's first call). */
static int get_plan(cudnn_sdpa_t *s, int bwd, int B, int T, int H, int Hkv, int hd, void *stream, plan_t **out)
{
    if (!s->handle) {
        cudnnStatus_t st = s->a.Create(&s->handle);
        if (st != CUDNN_STATUS_SUCCESS) {
            s->handle = NULL;
            status_err(s, st, "handle (cudnnCreate)");
            return -ENODEV;
        }
        s->stream = NULL; /* a new handle is on the default stream */
    }
    if (stream != s->stream) {
        cudnnStatus_t st = s->a.SetStream(s->handle, (cudaStream_t)stream);
        if (st != CUDNN_STATUS_SUCCESS) {
            status_err(s, st, "cudnnSetStream");
            return -EIO;
        }
        s->stream = stream;
    }
    plan_t *free_slot = NULL;
    for (int i = 0; i < PLANS; i++) {
        plan_t *p = &s->plans[i];
        if (!p->used) {
            if (!free_slot)
                free_slot = p;
            continue;
        }
        if (p->bwd == bwd && p->B == B && p->T == T && p->H == H && p->Hkv == Hkv && p->hd == hd) {
            *out = p;
            return 0;
        }
    }
    if (!free_slot) {
        set_err(s, "cuDNN attention: more than %d shapes planned", PLANS);
        return -ENOTSUP;
    }
    int rc = check_args(s, bwd, B, T, H, Hkv, hd);
    if (rc)
        return rc;
    plan_t p = {.used = true, .bwd = bwd, .B = B, .T = T, .H = H, .Hkv = Hkv, .hd = hd};
    rc = plan_shape(s, &p, NULL);
    if (rc)
        return rc;
    if ((size_t)p.workspace > s->ws_bytes) {
        /* Grown once per larger plan: the stream's earlier work may still read the old one. */
        void *ws = NULL;
        cudaError_t ce = cudaStreamSynchronize((cudaStream_t)stream);
        if (ce == cudaSuccess)
            ce = cudaMalloc(&ws, (size_t)p.workspace);
        if (ce != cudaSuccess) {
            set_err(s, "cuDNN attention: workspace of %lld bytes: %s", (long long)p.workspace,
                    cudaGetErrorString(ce));
            s->a.DestroyDescriptor(p.plan);
            return ce == cudaErrorMemoryAllocation ? -ENOMEM : -EIO;
        }
        if (s->ws)
            cudaFree(s->ws);
        s->ws = ws;
        s->ws_bytes = (size_t)p.workspace;
    }
    *free_slot = p;
    *out = free_slot;
    return 0;
}

static int run(cudnn_sdpa_t *s, plan_t *p, int n, const int64_t *uids, void **ptrs)
{
    cudnnBackendDescriptor_t vp = NULL;
    cudnnStatus_t st = s->a.CreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &vp);
    if (st == CUDNN_STATUS_SUCCESS)
        st = s->a.SetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n, uids);
    if (st == CUDNN_STATUS_SUCCESS)
        st = s->a.SetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, n, ptrs);
    if (st == CUDNN_STATUS_SUCCESS)
        st = s->a.SetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &s->ws);
    if (st == CUDNN_STATUS_SUCCESS)
        st = s->a.Finalize(vp);
    if (st == CUDNN_STATUS_SUCCESS)
        st = s->a.Execute(s->handle, p->plan, vp);
    if (vp)
        s->a.DestroyDescriptor(vp);
    if (st != CUDNN_STATUS_SUCCESS) {
        status_err(s, st, p->bwd ? "attention backward" : "attention forward");
        return -EIO;
    }
    return 0;
}

int cudnn_sdpa_fwd(cudnn_sdpa_t *s, uint16_t *out, float *lse, const uint16_t *q, const uint16_t *k,
                   const uint16_t *v, int B, int T, int H, int Hkv, int hd, void *stream)
{
    plan_t *p = NULL;
    int rc = get_plan(s, 0, B, T, H, Hkv, hd, stream, &p);
    if (rc)
        return rc;
    s->scale = 1.0f / sqrtf((float)hd);
    int64_t uids[] = {U_Q, U_K, U_V, U_O, U_STATS, U_SCALE, U_NEG_INF};
    void *ptrs[] = {(void *)q, (void *)k, (void *)v, out, lse, &s->scale, &s->neg_inf};
    return run(s, p, 7, uids, ptrs);
}

int cudnn_sdpa_bwd(cudnn_sdpa_t *s, uint16_t *dq, uint16_t *dk, uint16_t *dv, float *delta,
                   const uint16_t *dout, const uint16_t *q, const uint16_t *k, const uint16_t *v,
                   const uint16_t *out, const float *lse, int B, int T, int H, int Hkv, int hd,
                   void *stream)
{
    plan_t *p = NULL;
    int rc = get_plan(s, 1, B, T, H, Hkv, hd, stream, &p);
    if (rc)
        return rc;
    s->scale = 1.0f / sqrtf((float)hd);
    int64_t uids[] = {U_Q, U_K, U_V, U_O, U_DO, U_STATS, U_DQ, U_DK, U_DV, U_SUM, U_SCALE, U_NEG_INF, U_ONE};
    void *ptrs[] = {(void *)q, (void *)k, (void *)v, (void *)out, (void *)dout, (void *)lse, dq, dk, dv,
                    delta, &s->scale, &s->neg_inf, &s->one};
    return run(s, p, 13, uids, ptrs);
}

#endif
