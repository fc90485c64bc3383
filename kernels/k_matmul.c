/*
** k_matmul.c -- the CUDA backend's matmul entry (core/backend.h): out (*batch,
** M, N, contiguous) = a (*batch, M, K) @ b (*batch, K, N), strided views whose
** broadcast batch dims have stride 0; out's dtype decides the arithmetic.
**
**  - Operands of another dtype than out's are first converted on the device
**    (emk_cast) into temporaries; a dim of stride 0 (broadcast) is converted
**    once and stays broadcast.
**  - Float results go to the runtime's gemm (cuBLASLt; OpenBLAS on the
**    emulator) with the views' strides as they are: one strided batched call
**    over the last batch dim, one call per index of the batch dims before it.
**    cuBLASLt takes a matrix only with a unit stride in one of its two dims and
**    the other stepping over it (kernels/real/gemm_lt.h): an operand that is not
**    such a matrix (strided both ways, broadcast along a row) is first copied to
**    a contiguous temporary, on either runtime, so both run the same calls.
**  - Integer and bool results: a plain kernel, one thread per output element,
**    accumulating in 64-bit integers that wrap like the CPU's (core/cpu/matmul.c);
**    bool is "any product non-zero".
*/
#include "cuda.h"
#include "k_elementwise.h"
#include "k_matmul_args.h"
#include "real/gemm_lt.h"

/* An operand as out's dtype: its data and element strides. */
typedef struct mm_operand {
  const char *p;
  int64_t st[EM_MAX_DIMS];
  em_tensor *tmp;                 /* the converted copy, or NULL */
} mm_operand;

static em_status operand(emi_device *d, const em_tensor *t, em_dtype dt, mm_operand *o) {
  o->tmp = NULL;
  if (t->dtype == dt) {
    o->p = (const char *)em_tensor_data(t);
    for (int i = 0; i < t->ndim; i++) o->st[i] = t->strides[i];
    return EM_OK;
  }
  em_tensor v = *t;               /* broadcast dims converted once */
  for (int i = 0; i < t->ndim; i++)
    if (t->strides[i] == 0) v.sizes[i] = 1;
  v.numel = emi_shape_numel(v.sizes, v.ndim);
  em_status st = emi_tensor_new(d->S, "matmul", v.sizes, v.ndim, dt, d->index, &o->tmp);
  if (st) return st;
  if ((st = emk_cast(d, o->tmp, &v))) {
    em_tensor_release(o->tmp);
    o->tmp = NULL;
    return st;
  }
  o->p = (const char *)em_tensor_data(o->tmp);
  for (int i = 0; i < t->ndim; i++) o->st[i] = t->strides[i] == 0 ? 0 : o->tmp->strides[i];
  return EM_OK;
}

/* A float operand whose matrix part cuBLASLt cannot take as it is: copied to a
** contiguous temporary (its broadcast batch dims stay broadcast, once). */
static em_status gemm_ready(emi_device *d, const em_tensor *t, em_dtype dt, mm_operand *o) {
  int nd = t->ndim;
  if (emk_lt_operand_ok(t->sizes[nd - 2], t->sizes[nd - 1], o->st[nd - 2], o->st[nd - 1]))
    return EM_OK;
  em_tensor v = o->tmp ? *o->tmp : *t;    /* the operand as it is now */
  for (int i = 0; i < nd; i++) {
    v.sizes[i] = i < nd - 2 && o->st[i] == 0 ? 1 : t->sizes[i];
    v.strides[i] = o->st[i];
  }
  v.numel = emi_shape_numel(v.sizes, nd);
  em_tensor *tmp;
  em_status st = emi_tensor_new(d->S, "matmul", v.sizes, nd, dt, d->index, &tmp);
  if (st) return st;
  if ((st = emk_copy_same_dtype(d, tmp, &v))) {
    em_tensor_release(tmp);
    return st;
  }
  em_tensor_release(o->tmp);
  o->tmp = tmp;
  o->p = (const char *)em_tensor_data(tmp);
  for (int i = 0; i < nd; i++) o->st[i] = i < nd - 2 && o->st[i] == 0 ? 0 : tmp->strides[i];
  return EM_OK;
}

static em_status int_matmul(emi_device *d, em_tensor *out, const mm_operand *A,
                            const mm_operand *B, int64_t K) {
  emk_cuda_device *cd = emk_dev(d);
  emk_runtime *rt = cd->cuda->rt;
  imm_args a;
  memset(&a, 0, sizeof a);
  int nb = out->ndim - 2;
  a.out = (char *)em_tensor_data(out);
  a.a = A->p;
  a.b = B->p;
  a.dtype = (int)out->dtype;
  a.nb = nb;
  a.total = out->numel;
  a.M = out->sizes[nb];
  a.N = out->sizes[nb + 1];
  a.K = K;
  for (int i = 0; i < nb; i++) {
    a.bsizes[i] = out->sizes[i];
    a.abs_[i] = A->st[i];
    a.bbs[i] = B->st[i];
  }
  a.ars = A->st[nb]; a.acs = A->st[nb + 1];
  a.brs = B->st[nb]; a.bcs = B->st[nb + 1];
  int64_t blocks = (a.total + THREADS - 1) / THREADS;
  if (blocks > MAX_BLOCKS) blocks = MAX_BLOCKS;
  emk_dim3 grid = {(unsigned)blocks, 1, 1}, block = {THREADS, 1, 1};
  em_status st = rt->ops->launch(rt, &k_matmul_int, grid, block, 0, cd->compute, &a, sizeof a);
  return st ? emk_error(d, "matmul", st) : EM_OK;
}

static em_status float_matmul(emi_device *d, em_tensor *out, const mm_operand *A,
                              const mm_operand *B, int64_t K) {
  emk_cuda_device *cd = emk_dev(d);
  emk_runtime *rt = cd->cuda->rt;
  if (!rt->ops->gemm)
    return emi_error(d->S, EM_ERR_UNSUPPORTED, "matmul: the %s runtime has no gemm",
                     rt->ops->name);
  int nb = out->ndim - 2;
  int64_t M = out->sizes[nb], N = out->sizes[nb + 1];
  size_t es = em_dtype_size(out->dtype);
  /* the last batch dim is the gemm's batch; those before it are looped here */
  int64_t batch = nb ? out->sizes[nb - 1] : 1;
  int64_t abs_ = nb ? A->st[nb - 1] : 0, bbs = nb ? B->st[nb - 1] : 0;
  int64_t cbs = nb ? out->strides[nb - 1] : 0;
  int64_t outer = 1;
  for (int i = 0; i + 1 < nb; i++) outer *= out->sizes[i];
  char *c0 = (char *)em_tensor_data(out);
  for (int64_t o = 0; o < outer; o++) {
    int64_t rest = o, ao = 0, bo = 0, co = 0;
    for (int i = nb - 2; i >= 0; i--) {
      int64_t q = rest % out->sizes[i];
      rest /= out->sizes[i];
      ao += q * A->st[i];
      bo += q * B->st[i];
      co += q * out->strides[i];
    }
    em_status st = rt->ops->gemm(rt, cd->compute, out->dtype, M, N, K, batch,
                                 A->p + ao * (int64_t)es, A->st[nb], A->st[nb + 1], abs_,
                                 B->p + bo * (int64_t)es, B->st[nb], B->st[nb + 1], bbs,
                                 c0 + co * (int64_t)es, out->strides[nb], out->strides[nb + 1],
                                 cbs, emi_allow_tf32(d->S));
    if (st) return emk_error(d, "matmul", st);
  }
  return EM_OK;
}

em_status emk_matmul(emi_device *d, em_tensor *out, const em_tensor *a, const em_tensor *b) {
  if (out->numel == 0) return EM_OK;
  if (out->ndim < 2 || a->ndim != out->ndim || b->ndim != out->ndim)
    return emi_error(d->S, EM_ERR_SHAPE, "matmul: the backend wants (*batch, M, K) @ "
                     "(*batch, K, N) views");
  int64_t K = a->sizes[a->ndim - 1];
  mm_operand A, B;
  em_status st = operand(d, a, out->dtype, &A);
  if (st) return st;
  if ((st = operand(d, b, out->dtype, &B))) {
    em_tensor_release(A.tmp);
    return st;
  }
  if (em_dtype_is_floating(out->dtype)) {
    if (K > 0 && !(st = gemm_ready(d, a, out->dtype, &A))) st = gemm_ready(d, b, out->dtype, &B);
    if (!st) st = float_matmul(d, out, &A, &B, K);
  } else {
    st = int_matmul(d, out, &A, &B, K);
  }
  /* the temporaries' memory is reused only by later work on the stream */
  em_tensor_release(A.tmp);
  em_tensor_release(B.tmp);
  return st;
}
