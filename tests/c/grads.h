/*
** grads.h -- the autograd tests' leaves and gradient checks (test_autograd.c,
** test_autograd_function.c): a float64 tensor from literal values that may
** require grad, and a leaf's gradient compared with literal values.
**
**     em_tensor *x = mk(S, SHP(2, 2), V(1, 2, 3, 4), 1);      (requires grad)
**     ... em_backward(S, y, NULL) ...
**     CHECK(grad_is(x, V(2, 4, 6, 8)));
*/
#ifndef EMBER_TEST_GRADS_H
#define EMBER_TEST_GRADS_H

#include "check.h"

/* A float64 tensor of the given values, requiring grad when rg; NULL when it
** cannot be made (the REQUIRE on it reports that). */
static inline em_tensor *mk(em_state *S, const int64_t *shape, int nd, const double *v,
                            int64_t n, int rg) {
  em_tensor *t = NULL;
  if (t_make(S, &t, EM_FLOAT64, shape, nd, v, n) == EM_OK && rg)
    em_tensor_set_requires_grad(S, t, 1);
  return t;
}

/* t's gradient equals want[0..n) to 1e-12 (float64 sums of a few terms); the
** first difference is printed under the failing check. */
static inline int grad_is(em_tensor *t, const double *want, int64_t n) {
  char why[128];
  em_tensor *g = em_tensor_grad(t);
  int ok = t_values(g, want, n, 1e-12, why, sizeof why);
  if (!ok) printf("     grad: %s\n", why);
  em_tensor_release(g);
  return ok;
}

#endif
