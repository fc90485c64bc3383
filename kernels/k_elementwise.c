/*
** k_elementwise.c -- the launchers of the element-wise kernels (k_elementwise.cu):
** each entry checks the dtypes, packs an ew_args (size-1 dims dropped, mergeable
** dims merged), picks the vectorised kernel where it applies, launches, and
** reads back the division-by-zero flag where an integer remainder needs it.
*/
#include "k_elementwise.h"
#include "k_elementwise_args.h"
#include <math.h>

enum { THREADS = 256, MAX_BLOCKS = 4096 };

/* Drops size-1 dims and merges neighbours that walk memory as one dim in out
** and every operand (outer stride = inner stride * inner size in each). */
static void merge_dims(ew_args *a) {
  int m = 0;
  for (int d = 0; d < a->ndim; d++) {
    if (a->sizes[d] == 1) continue;
    int join = m > 0;
    for (int j = 0; join && j <= a->nin; j++)
      join = a->st[j][m - 1] == a->st[j][d] * a->sizes[d];
    if (join) {
      a->sizes[m - 1] *= a->sizes[d];
      for (int j = 0; j <= a->nin; j++) a->st[j][m - 1] = a->st[j][d];
      continue;
    }
    a->sizes[m] = a->sizes[d];
    for (int j = 0; j <= a->nin; j++) a->st[j][m] = a->st[j][d];
    m++;
  }
  a->ndim = m;
}

/* t dense in some order of its dims (no gaps, no overlap: channels-last is one)? */
static int dense(const em_tensor *t) {
  int64_t expect = 1;
  int used[EM_MAX_DIMS] = {0};
  for (int n = 0; n < t->ndim; n++) {   /* the dim of the smallest unused stride next */
    int best = -1;
    for (int k = 0; k < t->ndim; k++)
      if (!used[k] && t->sizes[k] > 1 && (best < 0 || t->strides[k] < t->strides[best]))
        best = k;
    if (best < 0) break;
    used[best] = 1;
    if (t->strides[best] != expect) return 0;
    expect *= t->sizes[best];
  }
  return 1;
}

/* Every operand laid out as out, and out dense: element i of each is at offset i in
** memory order, so the flat index serves all of them (channels-last tensors take
** the contiguous kernels instead of unravelling four dims per element). */
static int same_dense_layout(const em_tensor *out, const em_tensor *const *ins, int nin) {
  if (!dense(out)) return 0;
  for (int j = 0; j < nin; j++) {
    if (ins[j]->ndim != out->ndim) return 0;
    for (int k = 0; k < out->ndim; k++)
      if (out->sizes[k] > 1 && ins[j]->strides[k] != out->strides[k]) return 0;
  }
  return 1;
}

static void setup(ew_args *a, int kind, int op, em_tensor *out, const em_tensor *x,
                  const em_tensor *y, const em_tensor *z) {
  memset(a, 0, sizeof *a);
  const em_tensor *ins[3] = {x, y, z};
  a->kind = kind;
  a->op = op;
  a->out = (char *)em_tensor_data(out);
  a->n = out->numel;
  a->ndim = out->ndim;
  a->odt = out->dtype;
  a->dt = x->dtype;
  a->esz[0] = (int)em_dtype_size(out->dtype);
  a->contig = em_tensor_is_contiguous(out);
  for (int k = 0; k < out->ndim; k++) {
    a->sizes[k] = out->sizes[k];
    a->st[0][k] = out->strides[k];
  }
  for (int j = 0; j < 3 && ins[j]; j++) {
    a->nin = j + 1;
    a->in[j] = (const char *)em_tensor_data(ins[j]);
    a->esz[j + 1] = (int)em_dtype_size(ins[j]->dtype);
    if (!em_tensor_is_contiguous(ins[j])) a->contig = 0;
    for (int k = 0; k < out->ndim; k++) a->st[j + 1][k] = ins[j]->strides[k];
  }
  /* 2: flat, but not the float4 kernel, whose arithmetic (contracted) differs from
  ** the strided kernel's in the last bit; channels-last results stay the CPU's */
  if (!a->contig && same_dense_layout(out, ins, a->nin)) a->contig = 2;
  merge_dims(a);
  a->narrow = a->n <= INT32_MAX;
}

static int aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

/* k_ew_f32x4's conditions: float32 in and out, contiguous, 16-byte aligned. */
static int vectorisable(const ew_args *a) {
  if (a->contig != 1 || a->dt != EM_FLOAT32 || a->odt != EM_FLOAT32 || a->n < 4) return 0;
  if (a->kind != K_UNARY && a->kind != K_BINARY && a->kind != K_SCALAR &&
      a->kind != K_ADDS && a->kind != K_CLAMP)
    return 0;
  if (!aligned16(a->out)) return 0;
  for (int j = 0; j < a->nin; j++)
    if (!aligned16(a->in[j]) || a->esz[j + 1] != 4) return 0;
  return 1;
}

/* Launches k_ew (or k_ew_f32x4 where it can); with check_div, an integer remainder's division-by-zero flag is
** read back (a sync) and reported as the CPU reports it. */
static em_status run(emi_device *d, const char *name, ew_args *a, int check_div) {
  if (a->n == 0) return EM_OK;
  em_state *S = d->S;
  emk_cuda_device *cd = emk_dev(d);
  emk_runtime *rt = cd->cuda->rt;
  em_tensor *flag = NULL;
  em_status st;
  const emk_kernel *kern = vectorisable(a) ? &k_ew_f32x4 : &k_ew;
  int64_t per_thread = kern == &k_ew ? 1 : 8, one = 1;
  int64_t blocks = (a->n + THREADS * per_thread - 1) / (THREADS * per_thread);
  if (blocks > MAX_BLOCKS) blocks = MAX_BLOCKS;
  emk_dim3 grid = {(unsigned)blocks, 1, 1}, block = {THREADS, 1, 1};
  if (check_div) {
    if ((st = emi_tensor_new(S, name, &one, 1, EM_INT32, d->index, &flag))) return st;
    if ((st = emk_fill(d, flag, 0))) goto done;
    a->err = (int *)em_tensor_data(flag);
  }
  if ((st = rt->ops->launch(rt, kern, grid, block, 0, cd->compute, a, sizeof *a))) {
    st = emk_error(d, name, st);
    goto done;
  }
  if (flag) {
    int32_t h = 0;   /* the flag's value, read back (a sync) */
    if ((st = rt->ops->memcpy_async(rt, &h, a->err, sizeof h, EMK_DEVICE_TO_HOST,
                                    cd->compute)) ||
        (st = rt->ops->stream_sync(rt, cd->compute))) {
      st = emk_error(d, name, st);
      goto done;
    }
    if (h) st = emi_error(S, EM_ERR_ARG, "%s: integer division by zero (ZeroDivisionError)",
                          name);
  }
done:
  em_tensor_release(flag);
  return st;
}

static int is_float(em_dtype dt) {
  return dt == EM_FLOAT32 || dt == EM_FLOAT64 || dt == EM_FLOAT16 || dt == EM_BFLOAT16;
}

static int unary_ok(em_unop op, em_dtype dt) {
  if ((unsigned)op >= EM_NUM_UNOPS) return 0;
  if (is_float(dt)) return op != EM_LOGICAL_NOT;
  switch (op) {
  case EM_ABS: case EM_RELU: case EM_FLOOR: case EM_CEIL: case EM_ROUND: case EM_TRUNC:
  case EM_SIGN:
    return 1;
  case EM_NEG: case EM_SQUARE: return dt != EM_BOOL;
  case EM_LOGICAL_NOT: return dt == EM_BOOL;
  default: return 0;
  }
}

static int binary_ok(em_binop op, em_dtype dt) {
  if ((unsigned)op >= EM_NUM_BINOPS || (unsigned)dt >= EM_NUM_DTYPES) return 0;
  if (is_float(dt)) return 1;
  if (op == EM_DIV || op == EM_ATAN2) return 0;
  if (dt != EM_BOOL) return 1;
  return !(op == EM_SUB || op == EM_POW || op == EM_REMAINDER);
}

static em_status unsupported(emi_device *d, const char *what, const char *op, em_dtype dt) {
  return emi_error(d->S, EM_ERR_DTYPE, "%s: %s is not supported for %s tensors on cuda",
                   what, op, em_dtype_name(dt));
}

em_status emk_unary(emi_device *d, em_unop op, em_tensor *out, const em_tensor *a) {
  if (!unary_ok(op, a->dtype)) return unsupported(d, "unary", em_unop_name(op), a->dtype);
  ew_args k;
  setup(&k, K_UNARY, op, out, a, NULL, NULL);
  return run(d, em_unop_name(op), &k, 0);
}

em_status emk_binary(emi_device *d, em_binop op, em_tensor *out, const em_tensor *a,
                     const em_tensor *b) {
  if (!binary_ok(op, a->dtype)) return unsupported(d, "binary", em_binop_name(op), a->dtype);
  ew_args k;
  setup(&k, K_BINARY, op, out, a, b, NULL);
  return run(d, em_binop_name(op), &k, op == EM_REMAINDER && !is_float(a->dtype));
}

static int64_t bound_i64(double v) {
  if (v != v) return 0;
  if (v >= 9.2233720368547758e18) return INT64_MAX;
  if (v <= -9.2233720368547758e18) return INT64_MIN;
  return (int64_t)v;
}

em_status emk_binary_scalar(emi_device *d, em_binop op, em_tensor *out, const em_tensor *a,
                            double s, int reverse) {
  em_dtype dt = a->dtype;
  if (!binary_ok(op, dt)) return unsupported(d, "binary", em_binop_name(op), dt);
  ew_args k;
  setup(&k, K_SCALAR, op, out, a, NULL, NULL);
  k.reverse = reverse;
  switch (dt) {
  case EM_FLOAT16: k.f0 = emi_half_to_float(emi_float_to_half((float)s)); break;
  case EM_BFLOAT16: k.f0 = emi_bf16_to_float(emi_float_to_bf16((float)s)); break;
  case EM_FLOAT32: k.f0 = (float)s; break;
  case EM_FLOAT64: k.d0 = s; break;
  case EM_INT32: k.i0 = (int32_t)bound_i64(s); break;
  case EM_INT64: k.i0 = bound_i64(s); break;
  case EM_UINT8: k.i0 = (uint8_t)bound_i64(s); break;
  default: k.i0 = s != 0; break;
  }
  /* as the CPU (PyTorch 1.13): not for float16, whose pow is pow itself */
  if (op == EM_POW && !reverse && is_float(dt) && dt != EM_FLOAT16)
    k.pspec = s == 2 ? 1 : s == 0.5 ? 2 : s == -1 ? 3 : s == -0.5 ? 4 : s == 3 ? 5
              : s == -2 ? 6 : 0;
  return run(d, em_binop_name(op), &k, op == EM_REMAINDER && !is_float(dt));
}

em_status emk_add_scaled(emi_device *d, em_tensor *out, const em_tensor *a,
                         const em_tensor *b, double alpha) {
  ew_args k;
  setup(&k, K_ADDS, EM_ADD, out, a, b, NULL);
  k.f0 = (float)alpha;
  k.d0 = alpha;
  k.i0 = bound_i64(alpha);
  return run(d, "add", &k, 0);
}

em_status emk_clamp(emi_device *d, em_tensor *out, const em_tensor *a, double lo,
                    double hi) {
  ew_args k;
  setup(&k, K_CLAMP, 0, out, a, NULL, NULL);
  k.f0 = (float)lo;
  k.f1 = (float)hi;
  k.d0 = lo;
  k.d1 = hi;
  k.i0 = bound_i64(ceil(lo));
  k.i1 = bound_i64(floor(hi));
  return run(d, "clamp", &k, 0);
}

em_status emk_where(emi_device *d, em_tensor *out, const em_tensor *cond,
                    const em_tensor *a, const em_tensor *b) {
  ew_args k;
  setup(&k, K_WHERE, 0, out, cond, a, b);
  return run(d, "where", &k, 0);
}

em_status emk_cast(emi_device *d, em_tensor *out, const em_tensor *src) {
  ew_args k;
  setup(&k, K_CAST, 0, out, src, NULL, NULL);
  return run(d, "copy", &k, 0);
}
