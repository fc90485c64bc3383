/*
** linalg.c -- matmul with numpy/PyTorch semantics: shape checks, 1-D promotion,
** batch broadcasting and type promotion. The backend gets three operands with
** the same batch dims (a (*batch, M, K), b (*batch, K, N) as strided views with
** stride 0 where a batch dim is broadcast, out (*batch, M, N) contiguous), so it
** never has to think about the 1-D cases or broadcasting.
*/
#include "../autograd/autograd.h"

/* Geometry of an operand seen as a stack of matrices. */
typedef struct mm_geom {
  int ndim;
  int64_t sizes[EM_MAX_DIMS], strides[EM_MAX_DIMS];
} mm_geom;

/* a (*batch, M, K) with b's batch all broadcast (stride 0): when a's batch dims
** and its row dim are laid out as one run of rows, the whole product is a single
** (batch*M, K) x (K, N) product -- one big GEMM instead of many small ones (the
** common "3-D activations times a weight matrix" case). */
static bool fold_batch(mm_geom *a, mm_geom *b, mm_geom *o) {
  int nb = o->ndim - 2;
  if (nb == 0) return false;
  for (int d = 0; d < nb; d++)
    if (b->sizes[d] != 1 && b->strides[d] != 0) return false;
  /* Walk [batch..., M] from the inside: every dim of size > 1 must continue the
  ** run of the first one. */
  int64_t run_stride = -1, run_len = 1;
  for (int d = nb; d >= 0; d--) {
    if (a->sizes[d] == 1) continue;
    if (run_stride < 0) run_stride = a->strides[d];
    else if (a->strides[d] != run_stride * run_len) return false;
    run_len *= a->sizes[d];
  }
  if (run_stride < 0) run_stride = a->strides[nb];   /* every dim is 1 */
  int64_t M = run_len, K = a->sizes[nb + 1], N = b->sizes[nb + 1];
  a->ndim = b->ndim = o->ndim = 2;
  a->sizes[0] = M; a->sizes[1] = K;
  a->strides[1] = a->strides[nb + 1]; a->strides[0] = run_stride;
  b->sizes[0] = K; b->sizes[1] = N;
  b->strides[0] = b->strides[nb]; b->strides[1] = b->strides[nb + 1];
  o->sizes[0] = M; o->sizes[1] = N;
  o->strides[0] = N; o->strides[1] = 1;
  return true;
}

/* t seen with geometry g, as a handle on the stack: the backend only reads it
** during the call (no reference is taken, none is needed), and tiny products
** then cost one allocation, the result's. */
static void geom_view(em_tensor *v, const em_tensor *t, const mm_geom *g) {
  *v = *t;
  v->ndim = g->ndim;
  memcpy(v->sizes, g->sizes, sizeof(int64_t) * (size_t)g->ndim);
  memcpy(v->strides, g->strides, sizeof(int64_t) * (size_t)g->ndim);
  v->numel = emi_shape_numel(g->sizes, g->ndim);
}

em_status em_matmul(em_state *S, const em_tensor *a, const em_tensor *b, em_tensor **out) {
  em_status st = emi_check_tensor(S, "matmul", a);
  if (st || (st = emi_check_tensor(S, "matmul", b))) return st;
  if (a->ndim == 0 || b->ndim == 0)
    return emi_error(S, EM_ERR_SHAPE, "matmul: both arguments need at least 1 dimension, "
                     "got shapes %s and %s", emi_tshape(S, a), emi_tshape(S, b));
  if (a->device != b->device) {
    char da[16], db[16];
    return emi_error(S, EM_ERR_DEVICE, "matmul: tensors on different devices (%s and %s)",
                     emi_device_name(da, a->device), emi_device_name(db, b->device));
  }
  int a1 = a->ndim == 1, b1 = b->ndim == 1;
  int64_t K = a->sizes[a->ndim - 1], Kb = b1 ? b->sizes[0] : b->sizes[b->ndim - 2];
  if (K != Kb)
    return emi_error(S, EM_ERR_SHAPE, "matmul: shapes %s and %s don't match (%lld vs %lld)",
                     emi_tshape(S, a), emi_tshape(S, b), (long long)K, (long long)Kb);

  /* Matrix views: a 1-D a is a (1, K) row, a 1-D b a (K, 1) column. */
  int64_t M = a1 ? 1 : a->sizes[a->ndim - 2], N = b1 ? 1 : b->sizes[b->ndim - 1];
  int64_t am_st = a1 ? 0 : a->strides[a->ndim - 2], ak_st = a->strides[a->ndim - 1];
  int64_t bk_st = b1 ? b->strides[0] : b->strides[b->ndim - 2];
  int64_t bn_st = b1 ? 0 : b->strides[b->ndim - 1];
  int nba = a1 ? 0 : a->ndim - 2, nbb = b1 ? 0 : b->ndim - 2;
  int nb = nba > nbb ? nba : nbb;

  mm_geom ga, gb, go;
  ga.ndim = gb.ndim = go.ndim = nb + 2;
  for (int i = 0; i < nb; i++) {
    int ia = nba - nb + i, ib = nbb - nb + i;
    int64_t x = ia >= 0 ? a->sizes[ia] : 1, y = ib >= 0 ? b->sizes[ib] : 1;
    if (x != y && x != 1 && y != 1)
      return emi_error(S, EM_ERR_SHAPE, "matmul: batch dimensions of shapes %s and %s "
                       "can't be broadcast (%lld vs %lld)", emi_tshape(S, a),
                       emi_tshape(S, b), (long long)x, (long long)y);
    int64_t n = x == 1 ? y : x;
    ga.sizes[i] = gb.sizes[i] = go.sizes[i] = n;
    ga.strides[i] = ia >= 0 && x == n ? a->strides[ia] : 0;
    gb.strides[i] = ib >= 0 && y == n ? b->strides[ib] : 0;
  }
  ga.sizes[nb] = M; ga.sizes[nb + 1] = K; ga.strides[nb] = am_st; ga.strides[nb + 1] = ak_st;
  gb.sizes[nb] = K; gb.sizes[nb + 1] = N; gb.strides[nb] = bk_st; gb.strides[nb + 1] = bn_st;
  go.sizes[nb] = M; go.sizes[nb + 1] = N;
  emi_contiguous_strides(go.sizes, nb + 2, go.strides);

  /* The result drops the dims that 1-D operands added. */
  int64_t osizes[EM_MAX_DIMS];
  int ond = nb;
  memcpy(osizes, go.sizes, sizeof(int64_t) * (size_t)nb);
  if (!a1) osizes[ond++] = M;
  if (!b1) osizes[ond++] = N;
  em_dtype dt = em_dtype_promote(a->dtype, b->dtype);
  em_tensor *o;
  if ((st = emi_tensor_new(S, "matmul", osizes, ond, dt, a->device, &o))) return st;
  if (o->numel == 0) goto done;

  fold_batch(&ga, &gb, &go);
  em_tensor av, bv, ov;
  geom_view(&av, a, &ga);
  geom_view(&bv, b, &gb);
  geom_view(&ov, o, &go);
  if ((st = EMI_DISPATCH(S, "matmul", a, matmul, &ov, &av, &bv))) {
    em_tensor_release(o);
    return st;
  }
done:
  *out = o;
  if (emi_ag_wanted2(S, a, b)) return emi_ag_record_matmul(S, a, b, out);
  return EM_OK;
}

/* a (M, K) @ b (K, N) written into out (M, N, rows contiguous, of the product's
** dtype, on the operands' device): autograd writes a weight's gradient straight
** into the memory it is to live in (a gradient destination, engine.c). */
em_status emi_matmul_into(em_state *S, const em_tensor *a, const em_tensor *b, em_tensor *out) {
  if (a->ndim != 2 || b->ndim != 2 || out->ndim != 2 || a->sizes[1] != b->sizes[0] ||
      out->sizes[0] != a->sizes[0] || out->sizes[1] != b->sizes[1] ||
      (out->sizes[0] > 1 && out->strides[0] != out->sizes[1]) ||
      (out->sizes[1] > 1 && out->strides[1] != 1) ||
      out->dtype != em_dtype_promote(a->dtype, b->dtype) || a->device != b->device ||
      out->device != a->device)
    return emi_error(S, EM_ERR_INTERNAL, "matmul: %s @ %s does not fit the output %s",
                     emi_tshape(S, a), emi_tshape(S, b), emi_tshape(S, out));
  if (out->numel == 0) return EM_OK;
  return EMI_DISPATCH(S, "matmul", a, matmul, out, a, b);
}
