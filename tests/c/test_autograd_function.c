/*
** test_autograd_function.c -- custom autograd functions (em_function_apply),
** backwards that return gradients (em_backward_capture), backwards nested inside
** a custom function's backward (leaf counts, hooks and end-of-backward callbacks
** as if the outer backward ran alone), and the grad probe.
*/
#include "grads.h"

static em_tensor *sum1(em_state *S, const em_tensor *a) {
  em_tensor *r = NULL;
  em_reduce(S, EM_SUM, a, (const int[]){0}, 1, 0, &r);
  return r;
}

/* -- A custom product: out = a * b, its backward written by hand ---------------------- */

typedef struct prod_ud {
  const em_tensor *a, *b;   /* borrowed: the test keeps them */
  int calls, released;
  int fail, bad_shape;
} prod_ud;

static em_status prod_backward(em_state *S, void *ud, const em_tensor *g, em_tensor **gin) {
  prod_ud *u = ud;
  u->calls++;
  if (u->fail) return em_set_error(S, EM_ERR_ARG, "prod: the host's own failure");
  if (u->bad_shape) return em_full(S, SHP(2), 1.0, EM_FLOAT64, EM_CPU, &gin[0]);
  em_status st = em_binary(S, EM_MUL, g, u->b, &gin[0]);
  if (!st) st = em_binary(S, EM_MUL, g, u->a, &gin[1]);
  return st;
}

static void prod_release(void *ud) { ((prod_ud *)ud)->released++; }

static int hook_calls;
static em_status count_hook(em_state *S, em_tensor *t, void *ud) {
  (void)S; (void)t; (void)ud;
  hook_calls++;
  return EM_OK;
}

static void test_apply(em_state *S) {
  em_tensor *x = mk(S, SHP(3), V(1, 2, 3), 1), *c = mk(S, SHP(3), V(5, 6, 7), 0);
  em_tensor *y = NULL, *v = NULL, *out = NULL, *s = NULL;
  REQUIRE(x && c);
  REQUIRE_OK(S, em_binary_scalar(S, EM_MUL, x, 2.0, 0, &y));   /* y = 2x, not a leaf */
  prod_ud u = {.a = x, .b = y};
  REQUIRE_OK(S, em_set_grad_enabled(S, 0));
  REQUIRE_OK(S, em_binary(S, EM_MUL, x, y, &v));
  REQUIRE_OK(S, em_set_grad_enabled(S, 1));
  CHECK(!em_tensor_requires_grad(v));
  em_tensor *in[3] = {x, y, c};
  REQUIRE_OK(S, em_function_apply(S, "prod", v, in, 3, prod_backward, &u, prod_release, &out));
  CHECK(em_tensor_data(out) == em_tensor_data(v), "out is a view of the value");
  CHECK(em_tensor_requires_grad(out) && !em_tensor_is_leaf(out));
  CHECK(u.released == 0);
  REQUIRE_OK(S, em_tensor_add_grad_hook(S, x, count_hook, NULL));
  hook_calls = 0;
  REQUIRE((s = sum1(S, out)));
  CHECK_OK(S, em_backward(S, s, NULL));
  /* d(x * 2x)/dx = 4x: y's part (2x) flows through y's node back to x */
  CHECK(grad_is(x, V(4, 8, 12)));
  CHECK(u.calls == 1 && hook_calls == 1, "calls %d hooks %d", u.calls, hook_calls);
  CHECK(em_tensor_grad(c) == NULL, "an input not requiring grad gets nothing");
  /* no saved tensors: the node may run again */
  em_tensor_release(s);
  REQUIRE((s = sum1(S, out)));
  CHECK_OK(S, em_backward(S, s, NULL));
  CHECK(grad_is(x, V(8, 16, 24)));
  em_tensor_release(s);
  /* the host's error is the backward's, and leaf counts stay balanced */
  u.fail = 1;
  REQUIRE((s = sum1(S, out)));
  CHECK_ERR(S, em_backward(S, s, NULL), EM_ERR_ARG, "the host's own failure");
  em_tensor_release(s);
  u.fail = 0;
  u.bad_shape = 1;
  REQUIRE((s = sum1(S, out)));
  CHECK_ERR(S, em_backward(S, s, NULL), EM_ERR_SHAPE, "prod", "[2]", "input 0", "[3]");
  em_tensor_release(s);
  u.bad_shape = 0;
  em_tensor_set_grad(S, x, NULL);
  hook_calls = 0;
  REQUIRE((s = sum1(S, out)));
  CHECK_OK(S, em_backward(S, s, NULL));
  CHECK(grad_is(x, V(4, 8, 12)));
  CHECK(hook_calls == 1, "after failed backwards the hook runs once (%d)", hook_calls);
  em_tensor_release(s);
  CHECK(u.released == 0);
  em_tensor_release(out);
  CHECK(u.released == 1, "released once with the node (%d)", u.released);

  /* grad mode off, or no input requiring grad: a plain view, released at once */
  prod_ud u2 = {.a = x, .b = y};
  em_tensor *in2[1] = {c};
  REQUIRE_OK(S, em_function_apply(S, "prod", v, in2, 1, prod_backward, &u2, prod_release, &out));
  CHECK(!em_tensor_requires_grad(out) && u2.released == 1);
  em_tensor_release(out);
  REQUIRE_OK(S, em_set_grad_enabled(S, 0));
  REQUIRE_OK(S, em_function_apply(S, "prod", v, in, 3, prod_backward, &u2, prod_release, &out));
  REQUIRE_OK(S, em_set_grad_enabled(S, 1));
  CHECK(!em_tensor_requires_grad(out) && u2.released == 2);
  em_tensor_release(out);
  CHECK_ERR(S, em_function_apply(S, "prod", v, in, 3, NULL, NULL, NULL, &out), EM_ERR_ARG,
            "prod", "NULL");
  em_tensor_release(v); em_tensor_release(y); em_tensor_release(x); em_tensor_release(c);
}

/* -- em_backward_capture ------------------------------------------------------------- */

static void test_capture(em_state *S) {
  em_tensor *x = mk(S, SHP(2), V(3, 4), 1), *w = mk(S, SHP(2), V(5, 7), 1);
  em_tensor *p = NULL, *s = NULL, *grads[3] = {0};
  REQUIRE(x && w);
  REQUIRE_OK(S, em_tensor_add_grad_hook(S, x, count_hook, NULL));
  REQUIRE_OK(S, em_binary(S, EM_MUL, x, w, &p));
  REQUIRE((s = sum1(S, p)));
  hook_calls = 0;
  em_tensor *wrt[3] = {x, x, s};
  CHECK_ERR(S, em_backward_capture(S, s, NULL, wrt, 3, grads), EM_ERR_ARG, "not a leaf");
  CHECK_OK(S, em_backward_capture(S, s, NULL, wrt, 2, grads));
  CHECK_VALS(grads[0], 0, V(5, 7));
  CHECK_VALS(grads[1], 0, V(5, 7));
  CHECK(em_tensor_grad(x) == NULL && hook_calls == 0, "x is captured, not accumulated");
  CHECK(grad_is(w, V(3, 4)), "other leaves accumulate");
  em_tensor_release(grads[0]); em_tensor_release(grads[1]);
  em_tensor_release(s); em_tensor_release(p);
  /* a leaf the root does not reach: NULL; a leaf root: its gradient */
  em_tensor *u = mk(S, SHP(2), V(1, 1), 1);
  REQUIRE(u);
  REQUIRE_OK(S, em_binary(S, EM_MUL, w, w, &p));
  REQUIRE((s = sum1(S, p)));
  wrt[0] = u;
  wrt[1] = w;
  CHECK_OK(S, em_backward_capture(S, s, NULL, wrt, 2, grads));
  CHECK(grads[0] == NULL);
  CHECK_VALS(grads[1], 0, V(10, 14));
  CHECK(grad_is(w, V(3, 4)), "w's .grad untouched");
  em_tensor_release(grads[1]);
  em_tensor *g = mk(S, SHP(2), V(2, 9), 0);
  wrt[0] = x;
  CHECK_OK(S, em_backward_capture(S, x, g, wrt, 1, grads));
  CHECK_VALS(grads[0], 0, V(2, 9));
  em_tensor_release(grads[0]);
  em_tensor_release(g); em_tensor_release(s); em_tensor_release(p);
  em_tensor_release(u); em_tensor_release(x); em_tensor_release(w);
}

/* -- Nested backward: a custom node recomputes its forward and captures ---------------- */

typedef struct recompute_ud {
  em_tensor *x, *p, *other;   /* borrowed */
  int fail_inner;
} recompute_ud;

/* out = x * p, recomputed with grad on from a detached x; also an unrelated
** backward into `other` (a plain em_backward, nested) */
static em_status recompute_backward(em_state *S, void *ud, const em_tensor *g, em_tensor **gin) {
  recompute_ud *r = ud;
  em_tensor *xd = NULL, *h = NULL, *q = NULL, *qs = NULL, *grads[2] = {0};
  em_status st = em_detach(S, r->x, &xd);
  if (!st) st = em_tensor_set_requires_grad(S, xd, 1);
  if (!st) st = em_set_grad_enabled(S, 1);
  if (!st) st = em_binary(S, EM_MUL, xd, r->p, &h);
  if (!st) st = em_binary_scalar(S, EM_MUL, r->other, 3.0, 0, &q);
  if (!st) st = em_reduce(S, EM_SUM, q, (const int[]){0}, 1, 0, &qs);
  em_set_grad_enabled(S, 0);
  if (!st) st = em_backward(S, qs, NULL);
  if (!st && r->fail_inner) st = em_set_error(S, EM_ERR_ARG, "inner failure");
  em_tensor *wrt[2] = {xd, r->p};
  if (!st) st = em_backward_capture(S, h, g, wrt, 2, grads);
  if (!st) { gin[0] = grads[0]; gin[1] = grads[1]; }
  em_tensor_release(xd); em_tensor_release(h); em_tensor_release(q); em_tensor_release(qs);
  return st;
}

static em_status reenter_backward(em_state *S, void *ud, const em_tensor *g, em_tensor **gin) {
  (void)gin;
  return em_backward(S, ud, g);   /* ud: the input, whose node is in the outer walk */
}

static int callback_calls, callback_failed;
static em_status count_callback(em_state *S, int failed, void *ud) {
  (void)S; (void)ud;
  callback_calls++;
  callback_failed += failed;
  return EM_OK;
}

static void test_nested(em_state *S) {
  em_tensor *x = mk(S, SHP(2), V(1, 2), 1), *p = mk(S, SHP(2), V(3, 5), 1);
  em_tensor *o = mk(S, SHP(2), V(1, 1), 1);
  em_tensor *v = NULL, *out = NULL, *m = NULL, *t = NULL, *s = NULL;
  REQUIRE(x && p && o);
  REQUIRE_OK(S, em_tensor_add_grad_hook(S, p, count_hook, NULL));
  REQUIRE_OK(S, em_backward_add_callback(S, count_callback, NULL));
  recompute_ud r = {.x = x, .p = p, .other = o};
  for (int round = 0; round < 2; round++) {
    r.fail_inner = round == 0;
    REQUIRE_OK(S, em_set_grad_enabled(S, 0));
    REQUIRE_OK(S, em_binary(S, EM_MUL, x, p, &v));
    REQUIRE_OK(S, em_set_grad_enabled(S, 1));
    em_tensor *in[2] = {x, p};
    REQUIRE_OK(S, em_function_apply(S, "recompute", v, in, 2, recompute_backward, &r, NULL, &out));
    /* p is used outside the custom node too: two edges in the outer graph */
    REQUIRE_OK(S, em_binary(S, EM_MUL, out, p, &m));
    REQUIRE((s = sum1(S, m)));
    hook_calls = callback_calls = callback_failed = 0;
    em_tensor_set_grad(S, x, NULL); em_tensor_set_grad(S, p, NULL); em_tensor_set_grad(S, o, NULL);
    if (round == 0) {
      CHECK_ERR(S, em_backward(S, s, NULL), EM_ERR_ARG, "inner failure");
      CHECK(callback_calls == 1 && callback_failed == 1, "calls %d", callback_calls);
    } else {
      CHECK_OK(S, em_backward(S, s, NULL));
      /* s = sum(x p^2): dx = p^2, dp = 2 x p; o gets 3 from the inner backward */
      CHECK(grad_is(x, V(9, 25)));
      CHECK(grad_is(p, V(6, 20)));
      CHECK(grad_is(o, V(3, 3)));
      CHECK(hook_calls == 1, "p's hook runs once, when its gradient is final (%d)", hook_calls);
      CHECK(callback_calls == 1 && callback_failed == 0, "callbacks %d (outermost only)",
            callback_calls);
    }
    em_tensor_release(s); em_tensor_release(m); em_tensor_release(out); em_tensor_release(v);
  }
  em_backward_remove_callback(S, count_callback, NULL);
  /* an inner backward reaching a node of the outer backward is refused */
  REQUIRE_OK(S, em_binary_scalar(S, EM_MUL, x, 2.0, 0, &t));
  em_tensor *in[1] = {t};
  REQUIRE_OK(S, em_function_apply(S, "reentrant", t, in, 1, reenter_backward, t, NULL, &out));
  REQUIRE((s = sum1(S, out)));
  CHECK_ERR(S, em_backward(S, s, NULL), EM_ERR_UNSUPPORTED, "inside another", "graph of its own");
  em_tensor_release(s); em_tensor_release(out); em_tensor_release(t);
  em_tensor_release(x); em_tensor_release(p); em_tensor_release(o);
}

/* -- The grad probe ---------------------------------------------------------------- */

static void test_probe(em_state *S) {
  em_tensor *x = mk(S, SHP(2, 2), V(1, 2, 3, 4), 1), *w = mk(S, SHP(2, 2), V(1, 0, 0, 1), 1);
  em_tensor *b = mk(S, SHP(2), V(1, 1), 1), *c = mk(S, SHP(2, 2), V(1, 1, 1, 1), 0);
  em_tensor *y = NULL, *z = NULL, *k = NULL, *list[4] = {0}, *e = NULL;
  REQUIRE(x && w && b && c);
  REQUIRE_OK(S, em_binary_scalar(S, EM_MUL, x, 1.0, 0, &e));   /* a non-leaf */
  CHECK(em_grad_probe_count(S) == -1);
  REQUIRE_OK(S, em_set_grad_enabled(S, 0));
  REQUIRE_OK(S, em_grad_probe_begin(S));
  REQUIRE_OK(S, em_linear(S, c, w, b, &y));
  CHECK(!em_tensor_requires_grad(y), "nothing is recorded");
  CHECK(em_grad_probe_count(S) == 2, "count %d", em_grad_probe_count(S));
  REQUIRE_OK(S, em_grad_probe_begin(S));          /* nested: counts for both */
  em_tensor *cl[2] = {c, e};
  REQUIRE_OK(S, em_cat(S, cl, 2, 0, &z));
  REQUIRE_OK(S, em_binary(S, EM_MUL, w, c, &k));  /* w again: once */
  CHECK(em_grad_probe_count(S) == 2, "inner count %d", em_grad_probe_count(S));
  REQUIRE_OK(S, em_grad_probe_end(S, list, 4));
  CHECK(list[0] == e && list[1] == w, "inner list in order of use");
  em_tensor_release(list[0]); em_tensor_release(list[1]);
  list[0] = list[1] = NULL;
  CHECK(em_grad_probe_count(S) == 3, "outer count %d", em_grad_probe_count(S));
  REQUIRE_OK(S, em_grad_probe_end(S, list, 2));   /* only two of three wanted */
  CHECK(list[0] == w && list[1] == b && list[2] == NULL, "outer list");
  em_tensor_release(list[0]); em_tensor_release(list[1]);
  CHECK_ERR(S, em_grad_probe_end(S, NULL, 0), EM_ERR_ARG, "no probe");
  REQUIRE_OK(S, em_set_grad_enabled(S, 1));
  /* with grad mode on, ops record as usual and x's backward works */
  em_tensor_release(k);
  REQUIRE_OK(S, em_binary(S, EM_MUL, w, c, &k));
  CHECK(em_tensor_requires_grad(k));
  em_tensor_release(x); em_tensor_release(w); em_tensor_release(b); em_tensor_release(c);
  em_tensor_release(y); em_tensor_release(z); em_tensor_release(k); em_tensor_release(e);
}

int main(void) {
  em_state *S;
  if (em_open(&S, NULL) != EM_OK) return 1;
  RUN(test_apply, S);
  RUN(test_capture, S);
  RUN(test_nested, S);
  RUN(test_probe, S);
  em_close(S);
  return check_done();
}
