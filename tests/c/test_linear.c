/*
** test_linear.c -- em_linear (y = x @ w^T + b, ember.h) from C: the same values,
** dtype and shape as em_matmul(x, transpose(w)) then em_binary(EM_ADD) with grad mode
** on and off, without bias, with a bias that broadcasts or promotes (the paths that
** can't add in place), the gradients it records, and its errors. The batch-1 shapes
** go through the matmul's short-row kernel; the C tests also run under ASan/UBSan.
*/
#include "check.h"

static em_tensor *randn(em_state *S, const int64_t *shape, int nd, em_dtype dt) {
  em_tensor *t = NULL;
  CHECK_OK(S, em_empty(S, shape, nd, dt, EM_CPU, &t));
  CHECK_OK(S, em_normal_(S, t, 0.0, 1.0));
  return t;
}

/* The reference: x @ w^T (+ b) through the general ops. */
static em_tensor *composed(em_state *S, em_tensor *x, em_tensor *w, em_tensor *b) {
  em_tensor *wt, *y, *z;
  CHECK_OK(S, em_transpose(S, w, 0, 1, &wt));
  CHECK_OK(S, em_matmul(S, x, wt, &y));
  em_tensor_release(wt);
  if (!b) return y;
  CHECK_OK(S, em_binary(S, EM_ADD, y, b, &z));
  em_tensor_release(y);
  return z;
}

/* Same shape and dtype, and values within tol. */
static int same(em_state *S, em_tensor *a, em_tensor *b, double tol) {
  if (em_tensor_ndim(a) != em_tensor_ndim(b) || em_tensor_dtype(a) != em_tensor_dtype(b)) return 0;
  for (int d = 0; d < em_tensor_ndim(a); d++)
    if (em_tensor_size(a, d) != em_tensor_size(b, d)) return 0;
  em_tensor *ad, *bd;
  if (em_to(S, a, EM_FLOAT64, EM_CPU, &ad) || em_to(S, b, EM_FLOAT64, EM_CPU, &bd)) return 0;
  em_tensor *ac, *bc;
  if (em_contiguous(S, ad, &ac) || em_contiguous(S, bd, &bc)) return 0;
  const double *p = em_tensor_data(ac), *q = em_tensor_data(bc);
  int ok = 1;
  for (int64_t i = 0; i < em_tensor_numel(ac); i++)
    if (!chk_close(p[i], q[i], tol)) ok = 0;
  em_tensor_release(ad); em_tensor_release(bd);
  em_tensor_release(ac); em_tensor_release(bc);
  return ok;
}

static void test_values(em_state *S) {
  int64_t ws[2] = {64, 32}, bs[1] = {64};
  em_tensor *w = randn(S, ws, 2, EM_FLOAT32), *b = randn(S, bs, 1, EM_FLOAT32);
  int64_t xshapes[4][3] = {{32}, {1, 32}, {3, 32}, {2, 5, 32}};
  int xnd[4] = {1, 2, 2, 3};
  for (int grad = 0; grad <= 1; grad++) {
    CHECK_OK(S, em_set_grad_enabled(S, grad));
    for (int i = 0; i < 4; i++) {
      em_tensor *x = randn(S, xshapes[i], xnd[i], EM_FLOAT32), *y = NULL, *want;
      CHECK_OK(S, em_linear(S, x, w, b, &y));
      want = composed(S, x, w, b);
      CHECK(y && same(S, y, want, 1e-5), "x of %d dims, grad mode %d", xnd[i], grad);
      em_tensor_release(y); em_tensor_release(want);
      CHECK_OK(S, em_linear(S, x, w, NULL, &y));
      want = composed(S, x, w, NULL);
      CHECK(y && same(S, y, want, 1e-5), "no bias, x of %d dims", xnd[i]);
      em_tensor_release(y); em_tensor_release(want);
      em_tensor_release(x);
    }
  }
  CHECK_OK(S, em_set_grad_enabled(S, 0));
  /* a float64 bias promotes; a (3, 1) bias broadcasts: both out of place */
  int64_t xs[2] = {3, 32}, b2s[2] = {3, 1};
  em_tensor *x = randn(S, xs, 2, EM_FLOAT32), *b64 = randn(S, bs, 1, EM_FLOAT64),
            *b2 = randn(S, b2s, 2, EM_FLOAT32), *y = NULL, *want;
  CHECK_OK(S, em_linear(S, x, w, b64, &y));
  want = composed(S, x, w, b64);
  CHECK(y && em_tensor_dtype(y) == EM_FLOAT64 && same(S, y, want, 1e-5), "promoting bias");
  em_tensor_release(y); em_tensor_release(want);
  CHECK_OK(S, em_linear(S, x, w, b2, &y));
  want = composed(S, x, w, b2);
  CHECK(y && same(S, y, want, 1e-5), "broadcasting bias");
  em_tensor_release(y); em_tensor_release(want);
  CHECK_OK(S, em_set_grad_enabled(S, 1));
  em_tensor_release(x); em_tensor_release(b64); em_tensor_release(b2);
  em_tensor_release(w); em_tensor_release(b);
}

static void test_grads(em_state *S) {
  int64_t xs[2] = {2, 5}, ws[2] = {3, 5}, bs[1] = {3};
  em_tensor *x = randn(S, xs, 2, EM_FLOAT64), *w = randn(S, ws, 2, EM_FLOAT64),
            *b = randn(S, bs, 1, EM_FLOAT64), *y = NULL, *s = NULL;
  CHECK_OK(S, em_tensor_set_requires_grad(S, w, 1));
  CHECK_OK(S, em_tensor_set_requires_grad(S, b, 1));
  CHECK_OK(S, em_linear(S, x, w, b, &y));
  CHECK(y && em_tensor_requires_grad(y) && !em_tensor_is_leaf(y), "recorded");
  CHECK_OK(S, em_reduce(S, EM_SUM, y, NULL, 0, 0, &s));
  CHECK_OK(S, em_backward(S, s, NULL));
  /* d sum(x w^T + b) / dw[o, i] = sum over rows of x[:, i]; / db[o] = rows */
  em_tensor *gw = em_tensor_grad(w), *gb = em_tensor_grad(b);
  const double *xd = em_tensor_data(x);
  int ok = gw && gb;
  for (int o = 0; ok && o < 3; o++) {
    for (int i = 0; i < 5; i++)
      if (!chk_close(((const double *)em_tensor_data(gw))[o * 5 + i], xd[i] + xd[5 + i], 1e-12)) ok = 0;
    if (!chk_close(((const double *)em_tensor_data(gb))[o], 2.0, 1e-12)) ok = 0;
  }
  CHECK(ok, "dw and db");
  em_tensor_release(gw); em_tensor_release(gb);
  em_tensor_release(s); em_tensor_release(y);
  /* under grad mode off nothing is recorded */
  CHECK_OK(S, em_set_grad_enabled(S, 0));
  CHECK_OK(S, em_linear(S, x, w, b, &y));
  CHECK(y && !em_tensor_requires_grad(y), "no history with grad mode off");
  em_tensor_release(y);
  CHECK_OK(S, em_set_grad_enabled(S, 1));
  em_tensor_release(x); em_tensor_release(w); em_tensor_release(b);
}

static void test_errors(em_state *S) {
  int64_t xs[2] = {2, 5}, w3s[3] = {2, 3, 5}, ws[2] = {3, 4};
  em_tensor *x = randn(S, xs, 2, EM_FLOAT32), *w3 = randn(S, w3s, 3, EM_FLOAT32),
            *w = randn(S, ws, 2, EM_FLOAT32), *y = NULL;
  CHECK(em_linear(S, x, w3, NULL, &y) == EM_ERR_SHAPE && y == NULL, "3-D weight refused");
  CHECK(chk_msg_has(em_errmsg(S), "linear", "[2,3,5]", NULL), "message: %s", em_errmsg(S));
  CHECK(em_linear(S, x, w, NULL, &y) == EM_ERR_SHAPE && y == NULL, "in_features mismatch");
  CHECK(chk_msg_has(em_errmsg(S), "matmul", NULL), "message: %s", em_errmsg(S));
  em_tensor_release(x); em_tensor_release(w3); em_tensor_release(w);
}

int main(void) {
  em_state *S;
  if (em_open(&S, NULL) != EM_OK) return 1;
  em_manual_seed(S, 3);
  RUN(test_values, S);
  RUN(test_grads, S);
  RUN(test_errors, S);
  CHECK(em_memory_allocated(S) == 0, "every tensor released (%lld bytes left)",
        (long long)em_memory_allocated(S));
  em_close(S);
  return check_done();
}
