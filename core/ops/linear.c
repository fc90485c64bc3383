/*
** linear.c -- em_linear: y = x @ w^T + b, the Linear layer as one call.
**
** Why an op of its own: composed from the public ops, a Linear layer makes three
** tensors per call (the transposed view of w, the product, the sum), and for the
** small layers of inference (a batch of 1, a few dozen features) creating and
** collecting them costs more than the arithmetic. Here, when nothing needs
** recording (grad mode off, or no input requires grad), the transpose is a
** handle on the stack (only read during the call), and the bias goes in place
** into the fresh product: one tensor per layer. When autograd must record, the
** layer is the composition itself (transpose, matmul, add), so its gradients are
** exactly those ops' and need no formula of their own.
*/
#include "../autograd/autograd.h"

/* x @ w^T + b through the recording ops. */
static em_status linear_recorded(em_state *S, const em_tensor *x, const em_tensor *w,
                                 const em_tensor *b, em_tensor **out) {
  em_tensor *wt, *y;
  em_status st;
  if (w->ndim == 2) { if ((st = em_transpose(S, w, 0, 1, &wt))) return st; }
  else { wt = (em_tensor *)w; em_tensor_retain(wt); }
  st = em_matmul(S, x, wt, &y);
  em_tensor_release(wt);
  if (st || !b) { if (!st) *out = y; return st; }
  st = em_binary(S, EM_ADD, y, b, out);
  em_tensor_release(y);
  return st;
}

em_status em_linear(em_state *S, const em_tensor *x, const em_tensor *w, const em_tensor *b,
                    em_tensor **out) {
  em_status st = emi_check_tensor(S, "linear", x);
  if (st || (st = emi_check_tensor(S, "linear", w))) return st;
  if (b && (st = emi_check_tensor(S, "linear", b))) return st;
  if (w->ndim > 2)
    return emi_error(S, EM_ERR_SHAPE, "linear: the weight must have 1 or 2 dimensions "
                     "(out_features, in_features), got shape %s", emi_tshape(S, w));
  if (emi_ag_wanted2(S, x, w) || (b && emi_ag_wanted1(S, b)))
    return linear_recorded(S, x, w, b, out);

  /* w^T as a stack handle: sizes and strides of the two dims swapped. */
  em_tensor wt = *w;
  wt.requires_grad = 0;   /* a probe noted w above; it must never keep this handle */
  if (w->ndim == 2) {
    wt.sizes[0] = w->sizes[1]; wt.sizes[1] = w->sizes[0];
    wt.strides[0] = w->strides[1]; wt.strides[1] = w->strides[0];
  }
  em_tensor *y;
  if ((st = em_matmul(S, x, &wt, &y))) return st;
  if (!b) { *out = y; return EM_OK; }
  /* The usual bias (1-D, one per output feature, no wider dtype, same device)
  ** is added in place; anything else takes the broadcasting, promoting sum. */
  if (b->ndim == 1 && y->ndim >= 1 && b->sizes[0] == y->sizes[y->ndim - 1] &&
      b->device == y->device && em_dtype_promote(y->dtype, b->dtype) == y->dtype) {
    if ((st = em_binary_(S, EM_ADD, y, b))) { em_tensor_release(y); return st; }
    *out = y;
    return EM_OK;
  }
  st = em_binary(S, EM_ADD, y, b, out);
  em_tensor_release(y);
  return st;
}
