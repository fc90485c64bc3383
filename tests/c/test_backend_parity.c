/*
** test_backend_parity.c -- every entry of every backend against the CPU, as ggml's
** test-backend-ops does it. Each case runs a few ops through the public API
** (ember.h, so the dispatch point sees and counts every call) on inputs that are
** transposed, sliced or broadcast, once on the CPU and once on each backend of
** BACKENDS; the outputs must agree in shape and dtype and, where the backend has
** data, in value within a tolerance per dtype. At the end every (backend, entry)
** that the dispatch counters (S->dispatch_counts, core/internal.h) show no case
** reached is a failure, listed by name: a new entry or a new backend without a
** case fails here until one is written.
**
** cuda runs on the emulated runtime (one device), or on a real GPU when
** EMBER_TEST_REAL_CUDA is set; meta (no data) is compared by shape and dtype. This test includes internal.h for the counters and
** the entry list (EMI_BACKEND_ENTRIES); everything it runs is public API.
*/
#include "cuda_check.h"
#include "internal.h"

/* -- The backends --------------------------------------------------------------------
** One row per backend compared with the CPU (the CPU is the reference, not a row:
** the CPU against itself would count checks that cannot fail). compare_values 0 is
** for a backend whose tensors have shapes and no data: its outputs are compared by
** shape and dtype only. */
typedef struct backend {
  const char *name;
  int device;               /* EM_CPU, EM_META or the device's ordinal */
  int compare_values;
} backend;

static const backend BACKENDS[] = {
  {"cuda:0", 0, 1},
  {"meta", EM_META, 0},
};
enum { NBACKENDS = (int)(sizeof BACKENDS / sizeof BACKENDS[0]) };
/* Every entry of these must be reached: the reference runs reach the CPU's. */
static const backend COVERED[] = {
  {"cpu", EM_CPU, 1},
  {"cuda:0", 0, 1},
  {"meta", EM_META, 0},
};
enum { NCOVERED = (int)(sizeof COVERED / sizeof COVERED[0]) };

static const char *const ENTRY_NAMES[] = {
#define ENTRY_NAME(e) #e,
  EMI_BACKEND_ENTRIES(ENTRY_NAME)
#undef ENTRY_NAME
};

/* -- A case's context -----------------------------------------------------------------
** A case builds its inputs on c->dev, runs its ops and names its outputs with out().
** Every tensor it makes is held here and released after the comparison, so cases
** never release anything themselves; the first failing call ends the case. */
enum { MAX_HELD = 128, MAX_OUT = 24 };
typedef struct ctx {
  em_state *S;
  int dev;
  em_tensor *held[MAX_HELD];
  int nheld;
  em_tensor *out[MAX_OUT];
  const char *out_name[MAX_OUT];
  int nout;
  char why[400];            /* the failing call and its message; empty when none */
} ctx;

static void hold(ctx *c, em_tensor *t) {
  if (!t) return;
  if (c->nheld < MAX_HELD) c->held[c->nheld++] = t;
  else { em_tensor_release(t); snprintf(c->why, sizeof c->why, "too many tensors in a case"); }
}

static int failed(ctx *c, em_status st, const char *call) {
  if (st == EM_OK && !c->why[0]) return 0;
  if (!c->why[0])
    snprintf(c->why, sizeof c->why, "%s: status %d: %s", call, (int)st, em_errmsg(c->S));
  return 1;
}

static void out(ctx *c, const char *name, em_tensor *t) {
  if (c->nout < MAX_OUT) {
    c->out[c->nout] = t;
    c->out_name[c->nout++] = name;
  }
}

static void ctx_clear(ctx *c) {
  for (int i = 0; i < c->nheld; i++) em_tensor_release(c->held[i]);
  c->nheld = c->nout = 0;
  c->why[0] = 0;
}

/* GET(t, call): run call, which writes t, and keep t; DO(call): run call. Either
** leaves the case when the call fails. */
#define GET(t, call) do { (t) = NULL; em_status st_ = (call); hold(c, (t));          \
    if (failed(c, st_, #call)) return; } while (0)
#define GET2(t, u, call) do { (t) = (u) = NULL; em_status st_ = (call); hold(c, (t)); \
    hold(c, (u)); if (failed(c, st_, #call)) return; } while (0)
#define DO(call) do { if (failed(c, (call), #call)) return; } while (0)

/* -- Inputs ---------------------------------------------------------------------------
** Deterministic values from (seed, position): floats in [-2, 2] in steps of 1/1000,
** signed ints in [-4, 4], uint8 in [0, 200), bool 0/1; indices in [0, hi). Layouts:
** CONTIG; TRANS, the last two dims swapped in memory (a transposed view); SLICE, a
** narrow of a base whose last dim is 3 longer, from offset 1. */
enum { CONTIG, TRANS, SLICE };

static uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

static double value_of(em_dtype dt, uint64_t seed, int64_t i, int64_t hi) {
  uint64_t h = mix(seed * 1000003u + (uint64_t)i);
  if (hi > 0) return (double)(h % (uint64_t)hi);
  switch (dt) {
  case EM_BOOL: return (double)(h & 1);
  case EM_UINT8: return (double)(h % 200);
  case EM_INT32: case EM_INT64: return (double)(int)(h % 9) - 4;
  default: return ((double)(h % 4001) - 2000) / 1000;
  }
}

/* A tensor on c->dev of logical shape (shape, nd) in the given layout (TRANS needs
** nd >= 2); hi > 0 makes indices in [0, hi). NULL (and c->why set) on failure. */
static em_tensor *input_on(ctx *c, em_dtype dt, const int64_t *shape, int nd, int layout,
                           uint64_t seed, int64_t hi) {
  em_state *S = c->S;
  int64_t base[EM_MAX_DIMS];
  if (nd < 1 || nd > EM_MAX_DIMS || (layout == TRANS && nd < 2)) {
    snprintf(c->why, sizeof c->why, "input_on: layout %d for %d dims", layout, nd);
    return NULL;
  }
  for (int d = 0; d < nd; d++) base[d] = shape[d];
  if (layout == TRANS) { base[nd - 2] = shape[nd - 1]; base[nd - 1] = shape[nd - 2]; }
  if (layout == SLICE) base[nd - 1] += 3;
  int64_t n = 1;
  for (int d = 0; d < nd; d++) n *= base[d];
  double *v = malloc(sizeof(double) * (size_t)(n > 0 ? n : 1));
  if (!v) { snprintf(c->why, sizeof c->why, "out of memory"); return NULL; }
  for (int64_t i = 0; i < n; i++) v[i] = value_of(dt, seed, i, hi);
  em_tensor *h = NULL, *d = NULL, *view = NULL;
  em_status st = em_from_data(S, base, nd, dt, v, EM_FLOAT64, &h);
  free(v);
  hold(c, h);
  if (failed(c, st, "em_from_data")) return NULL;
  st = em_to(S, h, dt, c->dev, &d);
  hold(c, d);
  if (failed(c, st, "em_to (an input to the device)")) return NULL;
  if (layout == CONTIG) return d;
  st = layout == TRANS ? em_transpose(S, d, nd - 2, nd - 1, &view)
                       : em_narrow(S, d, nd - 1, 1, shape[nd - 1], &view);
  hold(c, view);
  return failed(c, st, "the input's view") ? NULL : view;
}

#define IN(t, dt, layout, seed, ...) do {                                                \
    (t) = input_on(c, (dt), SHP(__VA_ARGS__), (layout), (seed), 0);                      \
    if (!(t)) return; } while (0)
#define IDX(t, dt, hi, layout, seed, ...) do {                                           \
    (t) = input_on(c, (dt), SHP(__VA_ARGS__), (layout), (seed), (hi));                   \
    if (!(t)) return; } while (0)

/* -- The cases -------------------------------------------------------------------------
** Each names in its comment the entries it is there for; the counters decide. */

/* alloc, free, copy (same dtype and converting, strided both sides), fill */
static void case_copy_fill(ctx *c) {
  em_state *S = c->S;
  em_tensor *a, *i32, *f64, *cont, *f16, *conv, *full, *base, *win, *row, *tv;
  IN(a, EM_FLOAT32, TRANS, 1, 3, 5);
  IN(i32, EM_INT32, SLICE, 2, 4, 3);
  GET(f64, em_to(S, a, EM_FLOAT64, c->dev, &f64));
  GET(cont, em_contiguous(S, a, &cont));
  GET(f16, em_to(S, a, EM_FLOAT16, c->dev, &f16));
  GET(conv, em_to(S, i32, EM_FLOAT32, c->dev, &conv));
  GET(full, em_full(S, SHP(2, 3), 1.5, EM_FLOAT64, c->dev, &full));
  /* a broadcast row copied into a window of a larger tensor */
  GET(base, em_full(S, SHP(4, 6), -1, EM_FLOAT32, c->dev, &base));
  GET(win, em_narrow(S, base, 1, 2, 3, &win));
  IN(row, EM_FLOAT64, CONTIG, 3, 1, 3);
  DO(em_copy_(S, win, row));
  /* a fill through a transposed window */
  GET(tv, em_transpose(S, win, 0, 1, &tv));
  DO(em_fill_(S, tv, 0.25));
  out(c, "to float64", f64);
  out(c, "contiguous", cont);
  out(c, "to float16", f16);
  out(c, "int32 to float32", conv);
  out(c, "full", full);
  out(c, "window copy and fill", base);
}

/* unary over float32 (transposed), float64 (sliced), float16 and int32 */
static void case_unary(ctx *c) {
  em_state *S = c->S;
  static const em_unop ops[] = {EM_EXP, EM_TANH, EM_SIGMOID, EM_RELU, EM_GELU, EM_NEG,
                                EM_ABS, EM_SIN, EM_FLOOR, EM_SIGN};
  static const char *const names[] = {"exp", "tanh", "sigmoid", "relu", "gelu", "neg",
                                      "abs", "sin", "floor", "sign"};
  em_tensor *a, *b, *h, *i, *t, *abs_b;
  IN(a, EM_FLOAT32, TRANS, 10, 4, 6);
  IN(b, EM_FLOAT64, SLICE, 11, 3, 5);
  IN(h, EM_FLOAT16, TRANS, 12, 3, 4);
  IN(i, EM_INT32, TRANS, 13, 3, 4);
  for (int k = 0; k < (int)(sizeof ops / sizeof ops[0]); k++) {
    GET(t, em_unary(S, ops[k], a, &t));
    out(c, names[k], t);
  }
  GET(abs_b, em_unary(S, EM_ABS, b, &abs_b));
  GET(t, em_unary(S, EM_SQRT, abs_b, &t));
  out(c, "sqrt float64", t);
  GET(t, em_unary(S, EM_LOG1P, abs_b, &t));
  out(c, "log1p float64", t);
  GET(t, em_unary(S, EM_TANH, h, &t));
  out(c, "tanh float16", t);
  GET(t, em_unary(S, EM_NEG, i, &t));
  out(c, "neg int32", t);
}

/* binary with broadcasting and strides, comparisons (bool out), mixed dtypes */
static void case_binary(ctx *c) {
  em_state *S = c->S;
  em_tensor *a, *s, *row, *col, *d, *e, *i, *j, *t;
  IN(a, EM_FLOAT32, TRANS, 20, 4, 6);
  IN(s, EM_FLOAT32, SLICE, 21, 4, 6);
  IN(row, EM_FLOAT32, CONTIG, 22, 6);
  IN(col, EM_FLOAT32, SLICE, 23, 4, 1);
  IN(d, EM_FLOAT64, TRANS, 24, 3, 5);
  IN(e, EM_FLOAT64, CONTIG, 25, 1, 5);
  IN(i, EM_INT64, TRANS, 26, 3, 4);
  IN(j, EM_INT32, CONTIG, 27, 4);
  GET(t, em_binary(S, EM_ADD, a, row, &t)); out(c, "add broadcast row", t);
  GET(t, em_binary(S, EM_MUL, a, s, &t)); out(c, "mul transposed x sliced", t);
  GET(t, em_binary(S, EM_SUB, col, row, &t)); out(c, "sub outer", t);
  GET(t, em_binary(S, EM_MAXIMUM, a, col, &t)); out(c, "maximum", t);
  GET(t, em_binary(S, EM_LT, a, s, &t)); out(c, "lt (bool)", t);
  GET(t, em_binary(S, EM_DIV, d, e, &t)); out(c, "div float64", t);
  GET(t, em_binary(S, EM_ATAN2, d, e, &t)); out(c, "atan2 float64", t);
  GET(t, em_binary(S, EM_ADD, i, j, &t)); out(c, "add int64 + int32", t);
  GET(t, em_binary(S, EM_MUL, a, a, &t)); out(c, "square by mul", t);
}

/* binary_scalar, add_scaled, clamp, where */
static void case_scalar_ops(ctx *c) {
  em_state *S = c->S;
  em_tensor *a, *b, *row, *i, *cond, *t;
  IN(a, EM_FLOAT32, TRANS, 30, 4, 6);
  IN(b, EM_FLOAT32, SLICE, 31, 4, 6);
  IN(row, EM_FLOAT32, CONTIG, 32, 6);
  IN(i, EM_INT32, TRANS, 33, 3, 4);
  GET(t, em_binary_scalar(S, EM_MUL, a, 2.5, 0, &t)); out(c, "a * 2.5", t);
  GET(t, em_binary_scalar(S, EM_SUB, a, 1, 1, &t)); out(c, "1 - a", t);
  GET(t, em_binary_scalar(S, EM_POW, a, 2, 0, &t)); out(c, "a ^ 2", t);
  GET(t, em_binary_scalar(S, EM_ADD, i, 3, 0, &t)); out(c, "int32 + 3", t);
  GET(t, em_add_scaled(S, a, row, 0.5, &t)); out(c, "a + 0.5 row", t);
  GET(t, em_add_scaled(S, a, b, -2, &t)); out(c, "a - 2 b", t);
  GET(t, em_clamp(S, a, -0.5, 0.7, &t)); out(c, "clamp", t);
  GET(t, em_clamp(S, i, -1, 2, &t)); out(c, "clamp int32", t);
  GET(cond, em_binary_scalar(S, EM_GT, b, 0, 0, &cond));
  GET(t, em_where(S, cond, a, row, &t)); out(c, "where", t);
}

/* reduce, var, norm, arg_reduce, softmax */
static void case_reductions(ctx *c) {
  em_state *S = c->S;
  em_tensor *a, *d, *i, *t, *u;
  IN(a, EM_FLOAT32, TRANS, 40, 5, 7);
  IN(d, EM_FLOAT64, SLICE, 41, 2, 3, 4);
  IN(i, EM_INT64, TRANS, 42, 4, 3);
  const int d0[] = {0}, d1[] = {1}, d02[] = {0, 2};
  GET(t, em_reduce(S, EM_SUM, a, d0, 1, 0, &t)); out(c, "sum dim 0", t);
  GET(t, em_reduce(S, EM_MEAN, a, d1, 1, 1, &t)); out(c, "mean dim 1 keepdim", t);
  GET(t, em_reduce(S, EM_AMAX, a, NULL, 0, 0, &t)); out(c, "amax all", t);
  GET(t, em_reduce(S, EM_LOGSUMEXP, d, d02, 2, 0, &t)); out(c, "logsumexp dims 0, 2", t);
  GET(t, em_reduce(S, EM_PROD, d, d1, 1, 0, &t)); out(c, "prod float64", t);
  GET(t, em_reduce(S, EM_SUM, i, d1, 1, 0, &t)); out(c, "sum int64", t);
  GET(t, em_var(S, a, d1, 1, 1, 0, 0, &t)); out(c, "var dim 1", t);
  GET(t, em_var(S, d, NULL, 0, 0, 0, 1, &t)); out(c, "std all, biased", t);
  GET(t, em_norm(S, a, 2, d0, 1, 0, &t)); out(c, "2-norm dim 0", t);
  GET(t, em_norm(S, d, 1, NULL, 0, 0, &t)); out(c, "1-norm all", t);
  GET(t, em_norm(S, a, 3, d1, 1, 1, &t)); out(c, "3-norm dim 1", t);
  GET2(t, u, em_max_dim(S, a, 1, 0, 0, &t, &u)); out(c, "max values", t); out(c, "max indices", u);
  GET2(t, u, em_min_dim(S, d, 2, 1, 1, &t, &u)); out(c, "min values", t); out(c, "min indices", u);
  GET(t, em_argmax(S, a, 0, 1, 0, 0, &t)); out(c, "argmax all", t);
  GET(t, em_softmax(S, a, 1, 0, &t)); out(c, "softmax dim 1", t);
  GET(t, em_softmax(S, d, 0, 1, &t)); out(c, "log_softmax dim 0", t);
}

/* matmul: transposed and sliced operands, a broadcast batch, float64 */
static void case_matmul(ctx *c) {
  em_state *S = c->S;
  em_tensor *a, *b, *a3, *d, *e, *t;
  IN(a, EM_FLOAT32, TRANS, 50, 5, 7);
  IN(b, EM_FLOAT32, SLICE, 51, 7, 3);
  IN(a3, EM_FLOAT32, TRANS, 52, 2, 5, 7);
  IN(d, EM_FLOAT64, SLICE, 53, 4, 6);
  IN(e, EM_FLOAT64, TRANS, 54, 6, 2);
  GET(t, em_matmul(S, a, b, &t)); out(c, "matmul", t);
  GET(t, em_matmul(S, a3, b, &t)); out(c, "batched, b broadcast", t);
  GET(t, em_matmul(S, d, e, &t)); out(c, "matmul float64", t);
}

/* index_select, gather (strided operands and indices), index_add, scatter_add */
static void case_indexing(ctx *c) {
  em_state *S = c->S;
  em_tensor *a, *idx, *gidx, *t, *acc, *src, *sidx, *ssrc, *sacc;
  IN(a, EM_FLOAT32, TRANS, 60, 5, 6);
  IDX(idx, EM_INT64, 5, SLICE, 61, 4);
  IDX(gidx, EM_INT32, 6, TRANS, 62, 5, 3);
  GET(t, em_index_select(S, a, 0, idx, 0, &t)); out(c, "index_select dim 0", t);
  GET(t, em_index_select(S, a, 1, idx, 0, &t)); out(c, "index_select dim 1", t);
  GET(t, em_gather(S, a, 1, gidx, 0, &t)); out(c, "gather dim 1", t);
  /* in place: repeated indices add up */
  IN(acc, EM_FLOAT32, CONTIG, 63, 5, 6);
  IN(src, EM_FLOAT32, TRANS, 64, 4, 6);
  DO(em_index_add_(S, acc, 0, idx, src, 0));
  out(c, "index_add", acc);
  IN(sacc, EM_FLOAT64, TRANS, 65, 5, 6);
  IDX(sidx, EM_INT64, 6, SLICE, 66, 4, 3);
  IN(ssrc, EM_FLOAT64, CONTIG, 67, 4, 3);
  DO(em_scatter_add_(S, sacc, 1, sidx, ssrc, 0));
  out(c, "scatter_add", sacc);
}

/* uniform, normal, randint into strided views; arange. The same seed and offset
** give the same draws on every device (Philox, philox.h). */
static void case_random(ctx *c) {
  em_state *S = c->S;
  em_tensor *u, *ut, *n, *ns, *r, *rt, *t;
  em_rng_set_state(S, 1234, 0);
  GET(u, em_full(S, SHP(4, 6), 0, EM_FLOAT32, c->dev, &u));
  GET(ut, em_transpose(S, u, 0, 1, &ut));
  DO(em_uniform_(S, ut, -1, 2));
  GET(n, em_full(S, SHP(3, 8), 0, EM_FLOAT64, c->dev, &n));
  GET(ns, em_narrow(S, n, 1, 2, 5, &ns));
  DO(em_normal_(S, ns, 0.5, 2));
  GET(r, em_full(S, SHP(5, 3), 0, EM_INT64, c->dev, &r));
  GET(rt, em_transpose(S, r, 0, 1, &rt));
  DO(em_randint_(S, rt, -3, 10));
  out(c, "uniform (transposed)", u);
  out(c, "normal (sliced)", n);
  out(c, "randint (transposed)", r);
  GET(t, em_arange(S, 0, 5, 0.5, EM_FLOAT32, c->dev, &t)); out(c, "arange float32", t);
  GET(t, em_arange(S, -3, 9, 2, EM_INT64, c->dev, &t)); out(c, "arange int64", t);
}

/* conv2d and conv2d_backward: strided input and gradient, groups, stride,
** padding, dilation */
static void case_conv(ctx *c) {
  em_state *S = c->S;
  em_tensor *x, *w, *b, *y, *gy, *gx, *gw, *gb;
  IN(x, EM_FLOAT32, TRANS, 70, 2, 4, 7, 6);
  IN(w, EM_FLOAT32, CONTIG, 71, 6, 2, 3, 3);
  IN(b, EM_FLOAT32, SLICE, 72, 6);
  const int64_t stride[2] = {2, 1}, pad[2] = {1, 1}, dil[2] = {1, 2};
  GET(y, em_conv2d(S, x, w, b, stride, pad, dil, 2, &y));
  const int64_t *ys = em_tensor_sizes(y);
  gy = input_on(c, EM_FLOAT32, ys, 4, TRANS, 73, 0);
  if (!gy) return;
  gx = gw = gb = NULL;
  em_status st = em_conv2d_backward(S, gy, x, w, stride, pad, dil, 2, &gx, &gw, &gb);
  hold(c, gx); hold(c, gw); hold(c, gb);
  if (failed(c, st, "em_conv2d_backward")) return;
  out(c, "conv2d", y);
  out(c, "grad input", gx);
  out(c, "grad weight", gw);
  out(c, "grad bias", gb);
}

/* max, avg and adaptive-avg pooling, forward and backward */
static void case_pool(ctx *c) {
  em_state *S = c->S;
  em_tensor *x, *y, *ind, *gy, *gx;
  IN(x, EM_FLOAT32, TRANS, 80, 2, 3, 7, 8);
  const int64_t k[2] = {3, 3}, s[2] = {2, 2}, p[2] = {1, 1}, d[2] = {1, 1};
  GET2(y, ind, em_max_pool2d(S, x, k, s, p, d, 0, 0, &y, &ind));
  gy = input_on(c, EM_FLOAT32, em_tensor_sizes(y), 4, TRANS, 81, 0);
  if (!gy) return;
  GET(gx, em_max_pool2d_backward(S, gy, x, ind, 0, &gx));
  out(c, "max_pool2d", y); out(c, "max_pool2d indices", ind); out(c, "max_pool2d grad", gx);
  const int64_t ka[2] = {3, 2}, sa[2] = {2, 2}, pa[2] = {1, 0};
  GET(y, em_avg_pool2d(S, x, ka, sa, pa, 1, 0, &y));
  gy = input_on(c, EM_FLOAT32, em_tensor_sizes(y), 4, SLICE, 82, 0);
  if (!gy) return;
  GET(gx, em_avg_pool2d_backward(S, gy, x, ka, sa, pa, 1, 0, &gx));
  out(c, "avg_pool2d", y); out(c, "avg_pool2d grad", gx);
  const int64_t os[2] = {3, 5};
  GET(y, em_adaptive_avg_pool2d(S, x, os, &y));
  gy = input_on(c, EM_FLOAT32, em_tensor_sizes(y), 4, TRANS, 83, 0);
  if (!gy) return;
  GET(gx, em_adaptive_avg_pool2d_backward(S, gy, x, &gx));
  out(c, "adaptive_avg_pool2d", y); out(c, "adaptive_avg_pool2d grad", gx);
}

/* batch_norm (training with running statistics, then eval) and layer_norm, with
** their backwards */
static void case_norms(ctx *c) {
  em_state *S = c->S;
  em_tensor *x, *w, *b, *rm, *rv, *y, *mean, *invstd, *gy, *gx, *gw, *gb, *ye;
  IN(x, EM_FLOAT32, TRANS, 90, 4, 3, 5, 2);
  IN(w, EM_FLOAT32, CONTIG, 91, 3);
  IN(b, EM_FLOAT32, SLICE, 92, 3);
  GET(rm, em_full(S, SHP(3), 0, EM_FLOAT32, c->dev, &rm));
  GET(rv, em_full(S, SHP(3), 1, EM_FLOAT32, c->dev, &rv));
  mean = invstd = NULL;
  em_status st = em_batch_norm(S, x, w, b, rm, rv, 1, 0.1, 1e-5, &y, &mean, &invstd);
  hold(c, y); hold(c, mean); hold(c, invstd);
  if (failed(c, st, "em_batch_norm")) return;
  IN(gy, EM_FLOAT32, SLICE, 93, 4, 3, 5, 2);
  gx = gw = gb = NULL;
  st = em_batch_norm_backward(S, gy, x, w, mean, invstd, 1, &gx, &gw, &gb);
  hold(c, gx); hold(c, gw); hold(c, gb);
  if (failed(c, st, "em_batch_norm_backward")) return;
  em_tensor *m2 = NULL, *i2 = NULL;
  st = em_batch_norm(S, x, w, b, rm, rv, 0, 0.1, 1e-5, &ye, &m2, &i2);
  hold(c, ye); hold(c, m2); hold(c, i2);
  if (failed(c, st, "em_batch_norm (eval)")) return;
  out(c, "batch_norm", y); out(c, "batch mean", mean); out(c, "batch invstd", invstd);
  out(c, "running mean", rm); out(c, "running var", rv);
  out(c, "batch_norm grad input", gx); out(c, "grad weight", gw); out(c, "grad bias", gb);
  out(c, "batch_norm eval", ye);

  em_tensor *lx, *lw, *lb, *ly, *lm, *lr, *lgy, *lgx, *lgw, *lgb;
  IN(lx, EM_FLOAT64, TRANS, 94, 4, 5, 6);
  IN(lw, EM_FLOAT64, SLICE, 95, 6);
  IN(lb, EM_FLOAT64, CONTIG, 96, 6);
  ly = lm = lr = NULL;
  st = em_layer_norm(S, lx, 1, lw, lb, 1e-5, &ly, &lm, &lr);
  hold(c, ly); hold(c, lm); hold(c, lr);
  if (failed(c, st, "em_layer_norm")) return;
  IN(lgy, EM_FLOAT64, TRANS, 97, 4, 5, 6);
  lgx = lgw = lgb = NULL;
  st = em_layer_norm_backward(S, lgy, lx, 1, lm, lr, lw, &lgx, &lgw, &lgb);
  hold(c, lgx); hold(c, lgw); hold(c, lgb);
  if (failed(c, st, "em_layer_norm_backward")) return;
  out(c, "layer_norm", ly); out(c, "layer_norm mean", lm); out(c, "layer_norm rstd", lr);
  out(c, "layer_norm grad input", lgx); out(c, "grad weight", lgw); out(c, "grad bias", lgb);
}

/* cross_entropy, nll_loss, mse and bce-with-logits (pointwise_loss), with their
** backwards, mean and per-sample */
static void case_losses(ctx *c) {
  em_state *S = c->S;
  em_tensor *x, *tgt, *loss, *lse, *g1, *gx, *lossn, *lsen, *gn, *logp, *t;
  IN(x, EM_FLOAT32, TRANS, 100, 6, 5);
  IDX(tgt, EM_INT64, 5, SLICE, 101, 6);
  GET(g1, em_full(S, NULL, 0, 1.0, EM_FLOAT32, c->dev, &g1));
  GET2(loss, lse, em_cross_entropy(S, x, tgt, 0, 2, 0.1, EM_REDUCE_MEAN, &loss, &lse));
  GET(gx, em_cross_entropy_backward(S, g1, x, tgt, lse, 0, 2, 0.1, EM_REDUCE_MEAN, &gx));
  out(c, "cross_entropy mean", loss); out(c, "logsumexp", lse); out(c, "its grad", gx);
  GET2(lossn, lsen, em_cross_entropy(S, x, tgt, 0, -100, 0, EM_REDUCE_NONE, &lossn, &lsen));
  IN(gn, EM_FLOAT32, SLICE, 102, 6);
  GET(gx, em_cross_entropy_backward(S, gn, x, tgt, lsen, 0, -100, 0, EM_REDUCE_NONE, &gx));
  out(c, "cross_entropy none", lossn); out(c, "its grad", gx);
  GET(logp, em_softmax(S, x, 1, 1, &logp));
  GET(t, em_nll_loss(S, logp, tgt, 0, 3, EM_REDUCE_SUM, &t)); out(c, "nll_loss sum", t);
  GET(gx, em_nll_loss_backward(S, g1, logp, tgt, 0, 3, EM_REDUCE_SUM, &gx));
  out(c, "its grad", gx);
  em_tensor *a, *y, *gl;
  IN(a, EM_FLOAT64, TRANS, 103, 3, 4);
  IN(y, EM_FLOAT64, SLICE, 104, 3, 4);
  IN(gl, EM_FLOAT64, TRANS, 105, 3, 4);
  GET(t, em_mse_loss(S, a, y, EM_REDUCE_NONE, &t)); out(c, "mse none", t);
  GET(gx, em_mse_loss_backward(S, gl, a, y, EM_REDUCE_NONE, &gx)); out(c, "its grad", gx);
  GET(t, em_bce_with_logits(S, a, y, EM_REDUCE_MEAN, &t)); out(c, "bce mean", t);
  GET(g1, em_full(S, NULL, 0, 0.5, EM_FLOAT64, c->dev, &g1));
  GET(gx, em_bce_with_logits_backward(S, g1, a, y, EM_REDUCE_MEAN, &gx));
  out(c, "its grad", gx);
}

/* The optimizer entries: SGD and Adam(W) over lists and single parameters (the
** list of one), then clip_grad_norm (norm_multi, scale_multi). Parameters are
** contiguous copies of strided inputs. */
static void case_optim(ctx *c) {
  em_state *S = c->S;
  em_tensor *v[8], *p[2], *g[2], *buf[2], *m[2], *s2[2], *q, *qg, *qm, *qv;
  IN(v[0], EM_FLOAT32, TRANS, 110, 3, 4);
  IN(v[1], EM_FLOAT32, SLICE, 111, 7);
  IN(v[2], EM_FLOAT32, TRANS, 112, 3, 4);
  IN(v[3], EM_FLOAT32, SLICE, 113, 7);
  for (int i = 0; i < 2; i++) {
    GET(p[i], em_contiguous(S, v[i], &p[i]));
    GET(g[i], em_contiguous(S, v[i + 2], &g[i]));
    GET(buf[i], em_full(S, em_tensor_sizes(p[i]), em_tensor_ndim(p[i]), 0, EM_FLOAT32,
                        c->dev, &buf[i]));
    GET(m[i], em_full(S, em_tensor_sizes(p[i]), em_tensor_ndim(p[i]), 0, EM_FLOAT32,
                      c->dev, &m[i]));
    GET(s2[i], em_full(S, em_tensor_sizes(p[i]), em_tensor_ndim(p[i]), 0, EM_FLOAT32,
                       c->dev, &s2[i]));
  }
  const int first[2] = {1, 1}, later[2] = {0, 0};
  const int64_t step1[2] = {1, 1}, step2[2] = {2, 2};
  DO(em_sgd_step_multi_(S, 2, p, (const em_tensor *const *)g, buf, first, 0.1, 0.9, 0, 0.01, 1));
  DO(em_sgd_step_multi_(S, 2, p, (const em_tensor *const *)g, buf, later, 0.1, 0.9, 0, 0.01, 1));
  DO(em_adam_step_multi_(S, 2, p, (const em_tensor *const *)g, m, s2, step1, 0.01, 0.9, 0.999,
                         1e-8, 0.1, 1));
  DO(em_adam_step_multi_(S, 2, p, (const em_tensor *const *)g, m, s2, step2, 0.01, 0.9, 0.999,
                         1e-8, 0.1, 1));
  out(c, "sgd+adamw list, parameter 1", p[0]); out(c, "parameter 2", p[1]);
  out(c, "momentum 1", buf[0]); out(c, "exp_avg 2", m[1]); out(c, "exp_avg_sq 1", s2[0]);
  /* single parameters, float64 */
  IN(v[4], EM_FLOAT64, TRANS, 114, 4, 5);
  IN(v[5], EM_FLOAT64, SLICE, 115, 4, 5);
  GET(q, em_contiguous(S, v[4], &q));
  GET(qg, em_contiguous(S, v[5], &qg));
  GET(qm, em_full(S, SHP(4, 5), 0, EM_FLOAT64, c->dev, &qm));
  GET(qv, em_full(S, SHP(4, 5), 0, EM_FLOAT64, c->dev, &qv));
  DO(em_sgd_step_(S, q, qg, NULL, 0.05, 0, 0, 0.1, 0, 1));
  DO(em_adam_step_(S, q, qg, qm, qv, 0.01, 0.8, 0.99, 1e-6, 0.05, 0, 1));
  DO(em_adam_step_(S, q, qg, qm, qv, 0.01, 0.8, 0.99, 1e-6, 0.05, 0, 2));
  out(c, "sgd+adam single", q); out(c, "exp_avg", qm); out(c, "exp_avg_sq", qv);
  /* clip_grad_norm: the total comes back as a number, kept as a CPU tensor */
  double total = 0, total_inf = 0;
  em_tensor *tt;
  DO(em_clip_grad_norm_(S, 2, g, 0.5, 2, &total));
  DO(em_clip_grad_norm_(S, 2, g, 1e9, INFINITY, &total_inf));
  GET(tt, em_full(S, SHP(2), 0, EM_FLOAT64, EM_CPU, &tt));
  ((double *)em_tensor_data(tt))[0] = total;
  ((double *)em_tensor_data(tt))[1] = total_inf;
  out(c, "clip_grad_norm totals", tt); out(c, "clipped grad 1", g[0]); out(c, "grad 2", g[1]);
}

typedef struct pcase {
  const char *name;
  void (*run)(ctx *c);
} pcase;

/* sort (stable, ties from the small-integer inputs; ascending and descending, on
** transposed float32, sliced float64 and int64) and scan (cumsum, cumprod, int64 too) */
static void case_sort_scan(ctx *c) {
  em_state *S = c->S;
  em_tensor *a, *b, *i, *ix, *v, *vd, *idd, *tk, *tki, *cs, *cp, *ci, *cpi;
  IN(a, EM_FLOAT32, TRANS, 41, 5, 7);
  IN(b, EM_FLOAT64, SLICE, 42, 3, 6);
  IN(i, EM_INT64, TRANS, 43, 4, 5);
  GET(ix, em_argsort(S, a, 1, 0, 0, &ix));
  GET2(v, idd, em_sort(S, b, 0, 1, 0, &v, &idd));
  GET2(vd, tki, em_sort(S, i, 1, 1, 1, &vd, &tki));
  em_tensor *tv;
  GET2(tk, tv, em_topk(S, a, 2, 0, 0, 0, &tk, &tv));
  GET(cs, em_cumsum(S, a, 1, &cs));
  GET(cp, em_cumprod(S, b, 0, &cp));
  GET(ci, em_cumsum(S, i, 0, &ci));
  GET(cpi, em_cumprod(S, i, 1, &cpi));
  out(c, "argsort float32 (transposed)", ix);
  out(c, "sort float64 descending (sliced)", v);
  out(c, "sort float64 indices", idd);
  out(c, "sort int64 descending", vd);
  out(c, "sort int64 indices", tki);
  out(c, "topk smallest", tk);
  out(c, "topk indices", tv);
  out(c, "cumsum float32 (transposed)", cs);
  out(c, "cumprod float64 (sliced)", cp);
  out(c, "cumsum int64", ci);
  out(c, "cumprod int64", cpi);
}

static const pcase CASES[] = {
  {"copy_fill", case_copy_fill}, {"unary", case_unary}, {"binary", case_binary},
  {"scalar_ops", case_scalar_ops}, {"reductions", case_reductions},
  {"matmul", case_matmul}, {"indexing", case_indexing}, {"random", case_random},
  {"conv", case_conv}, {"pool", case_pool}, {"norms", case_norms},
  {"losses", case_losses}, {"optim", case_optim},
  {"sort_scan", case_sort_scan},
};
enum { NCASES = (int)(sizeof CASES / sizeof CASES[0]) };

/* -- Comparing -------------------------------------------------------------------------
** |got - want| <= tol * (1 + |want|), tol by dtype; integers and bools exactly. */
static double tol_of(em_dtype dt) {
  switch (dt) {
  case EM_FLOAT64: return 1e-9;
  case EM_FLOAT32: return 1e-4;
  case EM_FLOAT16: return 4e-3;
  case EM_BFLOAT16: return 3e-2;
  default: return 0;
  }
}

/* Output k of the device run against the CPU's. */
static void compare(em_state *S, const backend *be, const char *cname, const char *oname,
                    const em_tensor *want, const em_tensor *got) {
  int nd = em_tensor_ndim(want);
  int same_shape = nd == em_tensor_ndim(got) &&
                   memcmp(em_tensor_sizes(want), em_tensor_sizes(got), sizeof(int64_t) * (size_t)nd) == 0;
  if (!CHECK(same_shape && em_tensor_dtype(want) == em_tensor_dtype(got),
             "%s %s, %s: shape or dtype differs from the cpu's (%s vs %s)", be->name, cname,
             oname, em_dtype_name(em_tensor_dtype(got)), em_dtype_name(em_tensor_dtype(want))))
    return;
  if (!be->compare_values) return;
  em_tensor *h = NULL;
  if (!CHECK_OK(S, em_to(S, got, em_tensor_dtype(got), EM_CPU, &h))) return;
  double tol = tol_of(em_tensor_dtype(want));
  int64_t bad = -1, n = em_tensor_numel(want);
  for (int64_t i = 0; i < n && bad < 0; i++) {
    double w = t_get(want, i), g = t_get(h, i);
    if (!(tol == 0 ? (g == w || (isnan(g) && isnan(w))) : chk_close(g, w, tol))) bad = i;
  }
  CHECK(bad < 0, "%s %s, %s: element %lld is %.9g, the cpu's %.9g", be->name, cname, oname,
        (long long)bad, bad < 0 ? 0 : t_get(h, bad), bad < 0 ? 0 : t_get(want, bad));
  em_tensor_release(h);
}

/* Every case on backend be against the same case on the CPU (reference: ref). */
static void run_backend(em_state *S, const backend *be) {
  for (int k = 0; k < NCASES; k++) {
    ctx *ref = calloc(1, sizeof *ref), *dev = calloc(1, sizeof *dev);
    if (!CHECK(ref && dev, "out of memory")) { free(ref); free(dev); return; }
    ref->S = dev->S = S;
    ref->dev = EM_CPU;
    dev->dev = be->device;
    em_rng_set_state(S, 99, 0);
    CASES[k].run(ref);
    em_rng_set_state(S, 99, 0);
    CASES[k].run(dev);
    if (CHECK(!ref->why[0] && !dev->why[0], "%s %s: %s", be->name, CASES[k].name,
              ref->why[0] ? ref->why : dev->why) &&
        CHECK(ref->nout == dev->nout && ref->nout > 0, "%s %s: %d outputs, the cpu %d",
              be->name, CASES[k].name, dev->nout, ref->nout))
      for (int i = 0; i < ref->nout; i++)
        compare(S, be, CASES[k].name, ref->out_name[i], ref->out[i], dev->out[i]);
    ctx_clear(ref);
    ctx_clear(dev);
    free(ref);
    free(dev);
  }
}

/* -- The groups ------------------------------------------------------------------------ */

/* The counters count at the dispatch point: one op, one call of its entry on the
** backend of its device; storages count at alloc and free; a single-parameter
** optimizer step is one call of the list entry. */
static void test_counting(em_state *S) {
  uint64_t(*n)[EMI_NENTRIES] = S->dispatch_counts;
  em_tensor *a, *b, *p;
  REQUIRE_OK(S, em_full(S, SHP(2, 3), 1, EM_FLOAT32, EM_CPU, &a));
  uint64_t bin = n[EMI_BACKEND_CPU][EMI_ENTRY_binary];
  uint64_t al = n[EMI_BACKEND_CPU][EMI_ENTRY_alloc], fr = n[EMI_BACKEND_CPU][EMI_ENTRY_free];
  REQUIRE_OK(S, em_binary(S, EM_ADD, a, a, &b));
  CHECK(n[EMI_BACKEND_CPU][EMI_ENTRY_binary] == bin + 1, "one binary call counted");
  CHECK(n[EMI_BACKEND_CPU][EMI_ENTRY_alloc] == al + 1, "one storage allocated");
  em_tensor_release(b);
  CHECK(n[EMI_BACKEND_CPU][EMI_ENTRY_free] == fr + 1, "and freed");
  REQUIRE_OK(S, em_to(S, a, EM_FLOAT32, 0, &p));
  int id = emi_device_of(S, 0)->backend->id;
  CHECK(id != EMI_BACKEND_CPU, "cuda has its own row of counters (id %d)", id);
  uint64_t multi = n[id][EMI_ENTRY_sgd_step_multi];
  uint64_t cpu_multi = n[EMI_BACKEND_CPU][EMI_ENTRY_sgd_step_multi];
  CHECK_OK(S, em_sgd_step_(S, p, p, NULL, 0.1, 0, 0, 0, 0, 1));
  CHECK(n[id][EMI_ENTRY_sgd_step_multi] == multi + 1, "sgd_step_ on cuda: one list call");
  CHECK(n[EMI_BACKEND_CPU][EMI_ENTRY_sgd_step_multi] == cpu_multi, "none on the cpu");
  em_tensor_release(p);
  em_tensor_release(a);
}

/* Every backend against the CPU, then the entries no case reached. */
static void test_parity(em_state *S) {
  for (int b = 0; b < NBACKENDS; b++) run_backend(S, &BACKENDS[b]);
  for (int b = 0; b < NCOVERED; b++) {
    const backend *be = &COVERED[b];
    emi_device *d = emi_device_of(S, be->device);
    if (!CHECK(d != NULL, "%s: no backend serves it", be->name)) continue;
    for (int e = 0; e < EMI_NENTRIES; e++) {
      void (*fn)(void);
      memcpy(&fn, (const char *)d->backend + offsetof(emi_backend, alloc) +
                      (size_t)e * sizeof fn, sizeof fn);
      CHECK(fn != NULL, "(%s, %s): the backend has no such entry", be->name, ENTRY_NAMES[e]);
      CHECK(S->dispatch_counts[d->backend->id][e] > 0, "(%s, %s): no case reached it",
            be->name, ENTRY_NAMES[e]);
    }
  }
}

int main(void) {
  em_state *S;
  if (cuda_check_open(&S, "1")) return 1;
  RUN(test_counting, S);
  RUN(test_parity, S);
  em_close(S);
  return check_done();
}
