/*
** test_autograd.c -- the C side of autograd: gradients of a small graph,
** accumulation, gradient hooks (called once per backward, when the leaf's
** gradient is final), grad mode, detach, the error cases, storage versions
** bumped by in-place nn and optimizer ops, and a failing
** allocator over forward + backward (every refusal reported, nothing leaked).
*/
#include "failalloc.h"
#include "grads.h"
#include <pthread.h>

static void test_basic(em_state *S) {
  em_tensor *x = mk(S, SHP(2, 2), V(1, 2, 3, 4), 1), *w = mk(S, SHP(2), V(10, 20), 1);
  em_tensor *a = NULL, *b = NULL, *c = NULL, *ones = NULL;
  REQUIRE(x && w);
  CHECK(em_tensor_is_leaf(x) && em_tensor_requires_grad(x));
  REQUIRE_OK(S, em_binary(S, EM_MUL, x, w, &a));     /* broadcast w */
  REQUIRE_OK(S, em_binary(S, EM_ADD, a, x, &b));
  REQUIRE_OK(S, em_unary(S, EM_SQUARE, b, &c));
  CHECK(!em_tensor_is_leaf(c) && em_tensor_requires_grad(c));
  REQUIRE_OK(S, em_full(S, SHP(2, 2), 1.0, EM_FLOAT64, EM_CPU, &ones));
  CHECK_OK(S, em_backward(S, c, ones));
  /* c = (x (w + 1))^2: dx = 2 x (w+1)^2, dw = sum over rows of 2 x^2 (w+1) */
  CHECK(grad_is(x, V(2 * 1 * 121, 2 * 2 * 441, 2 * 3 * 121, 2 * 4 * 441)));
  CHECK(grad_is(w, V(2 * 11 * (1 + 9), 2 * 21 * (4 + 16))));
  /* a second graph accumulates into the same .grad */
  em_tensor *d = NULL;
  REQUIRE_OK(S, em_binary(S, EM_MUL, x, x, &d));
  CHECK_OK(S, em_backward(S, d, ones));
  CHECK(grad_is(x, V(242 + 2, 1764 + 4, 726 + 6, 3528 + 8)));
  /* the graph is freed: a second backward is an error */
  CHECK_ERR(S, em_backward(S, c, ones), EM_ERR_ARG, "second time");
  em_tensor_release(a); em_tensor_release(b); em_tensor_release(c);
  em_tensor_release(d); em_tensor_release(ones);
  em_tensor_release(x); em_tensor_release(w);
}

/* views by geometry: the gradient lands on the elements the view reads */
static void test_strided_views(em_state *S) {
  em_tensor *x = mk(S, SHP(2, 3), V(1, 2, 3, 4, 5, 6), 1), *v = NULL, *n = NULL, *s = NULL;
  em_tensor *a = NULL, *b = NULL, *ones = NULL;
  REQUIRE(x);
  REQUIRE_OK(S, em_as_strided(S, x, (const int64_t[]){2, 2}, (const int64_t[]){1, 3}, 2, 1, &v));
  REQUIRE_OK(S, em_narrow(S, x, 1, 1, 2, &n));
  REQUIRE_OK(S, em_select(S, x, 0, 1, &s));
  REQUIRE_OK(S, em_full(S, SHP(2, 2), 1.0, EM_FLOAT64, EM_CPU, &ones));
  REQUIRE_OK(S, em_binary(S, EM_ADD, v, n, &a));          /* [2,2] */
  REQUIRE_OK(S, em_binary(S, EM_MUL, a, ones, &b));
  CHECK_OK(S, em_backward(S, b, ones));
  /* as_strided reads flat 1,4,2,5; narrow reads columns 1..2: the same elements */
  CHECK(grad_is(x, V(0, 2, 2, 0, 2, 2)));
  em_tensor *g3 = NULL, *c = NULL;
  REQUIRE_OK(S, em_full(S, SHP(3), 2.0, EM_FLOAT64, EM_CPU, &g3));
  REQUIRE_OK(S, em_unary(S, EM_NEG, s, &c));
  CHECK_OK(S, em_backward(S, c, g3));
  CHECK(grad_is(x, V(0, 2, 2, -2, 0, 0)));
  em_tensor_release(c); em_tensor_release(g3);
  em_tensor_release(v); em_tensor_release(n); em_tensor_release(s);
  em_tensor_release(a); em_tensor_release(b); em_tensor_release(ones); em_tensor_release(x);
}

typedef struct hook_log { int calls; double first; } hook_log;
static em_status hook(em_state *S, em_tensor *t, void *ud) {
  hook_log *h = ud;
  h->calls++;
  em_tensor *g = em_tensor_grad(t);
  h->first = g ? t_get(g, 0) : -1;
  em_tensor_release(g);
  return EM_OK;
}

static void test_hooks(em_state *S) {
  em_tensor *x = mk(S, SHP(3), V(1, 2, 3), 1), *a = NULL, *b = NULL, *c = NULL, *ones = NULL;
  REQUIRE(x);
  hook_log h = {0, 0};
  REQUIRE_OK(S, em_tensor_add_grad_hook(S, x, hook, &h));
  /* x reaches c through three paths; the hook sees the complete gradient once */
  REQUIRE_OK(S, em_binary_scalar(S, EM_MUL, x, 3, 0, &a));
  REQUIRE_OK(S, em_binary(S, EM_MUL, a, x, &b));            /* 3x^2 */
  REQUIRE_OK(S, em_binary(S, EM_ADD, b, x, &c));            /* 3x^2 + x */
  REQUIRE_OK(S, em_full(S, SHP(3), 1.0, EM_FLOAT64, EM_CPU, &ones));
  CHECK_OK(S, em_backward(S, c, ones));
  CHECK(h.calls == 1, "hook called %d times", h.calls);
  CHECK_CLOSE(h.first, 7, 1e-12);                           /* 6x + 1 at x = 1 */
  CHECK(grad_is(x, V(7, 13, 19)));
  CHECK_ERR(S, em_tensor_add_grad_hook(S, c, hook, &h), EM_ERR_ARG, "leaf");
  em_tensor_release(a); em_tensor_release(b); em_tensor_release(c);
  em_tensor_release(ones); em_tensor_release(x);
}

static void test_modes_and_errors(em_state *S) {
  em_tensor *x = mk(S, SHP(2), V(1, 2), 1), *a = NULL, *b = NULL, *d = NULL, *i = NULL;
  REQUIRE(x);
  /* grad mode off: nothing recorded; in-place on a leaf allowed */
  CHECK_OK(S, em_set_grad_enabled(S, 0));
  CHECK(!em_is_grad_enabled(S));
  REQUIRE_OK(S, em_unary(S, EM_EXP, x, &a));
  CHECK(!em_tensor_requires_grad(a) && em_tensor_is_leaf(a));
  CHECK_OK(S, em_binary_scalar_(S, EM_ADD, x, 1));
  CHECK_OK(S, em_set_grad_enabled(S, 1));
  em_tensor_release(a); a = NULL;
  CHECK_ERR(S, em_binary_scalar_(S, EM_ADD, x, 1), EM_ERR_ARG, "leaf", "in-place");
  /* non-scalar root without a gradient */
  REQUIRE_OK(S, em_unary(S, EM_EXP, x, &a));
  CHECK_ERR(S, em_backward(S, a, NULL), EM_ERR_SHAPE, "scalar outputs");
  /* a saved tensor modified in place */
  REQUIRE_OK(S, em_detach(S, a, &d));
  CHECK(em_tensor_same_storage(a, d) && !em_tensor_requires_grad(d));
  REQUIRE_OK(S, em_unary(S, EM_SIN, a, &b));              /* saves a */
  CHECK_OK(S, em_fill_(S, d, 0));
  em_tensor *ones = NULL;
  REQUIRE_OK(S, em_full(S, SHP(2), 1.0, EM_FLOAT64, EM_CPU, &ones));
  CHECK_ERR(S, em_backward(S, b, ones), EM_ERR_ARG, "modified by an inplace operation");
  /* only floating tensors require grad; a tensor without history can't backward */
  REQUIRE_OK(S, em_full(S, SHP(2), 1.0, EM_INT64, EM_CPU, &i));
  CHECK_ERR(S, em_tensor_set_requires_grad(S, i, 1), EM_ERR_DTYPE, "floating");
  CHECK_ERR(S, em_backward(S, ones, NULL), EM_ERR_ARG, "does not require grad");
  CHECK_ERR(S, em_tensor_set_requires_grad(S, a, 0), EM_ERR_ARG, "leaf");
  em_tensor_release(a); em_tensor_release(b); em_tensor_release(d);
  em_tensor_release(i); em_tensor_release(ones); em_tensor_release(x);
}

/* -- In-place writes outside the element-wise ops bump the storage version ----------------
** Each case saves t for backward (b = x * t saves t; t itself needs no grad), writes t in
** place through the op under test, checks the values written, and then backward must
** refuse with the version message. A control first shows the same graph works untouched. */
typedef em_status (*inplace_fn)(em_state *S, em_tensor *t, em_tensor **aux);

static void version_case(em_state *S, const char *name, inplace_fn fn, const double *want,
                         int64_t n) {
  em_tensor *x = mk(S, SHP(2), V(1, 2), 1), *t = mk(S, SHP(2), V(1, 2), 0);
  em_tensor *b = NULL, *ones = NULL, *aux[4] = {0};
  REQUIRE(x && t);
  REQUIRE_OK(S, em_full(S, SHP(2), 1.0, EM_FLOAT64, EM_CPU, &ones));
  REQUIRE_OK(S, em_binary(S, EM_MUL, x, t, &b));            /* saves t */
  CHECK_OK(S, em_backward(S, b, ones));                      /* control: t untouched */
  em_tensor_release(b); b = NULL;
  REQUIRE_OK(S, em_binary(S, EM_MUL, x, t, &b));
  CHECK_OK(S, fn(S, t, aux));
  char why[128];
  CHECK(t_values(t, want, n, 1e-12, why, sizeof why), "%s wrote: %s", name, why);
  CHECK_ERR(S, em_backward(S, b, ones), EM_ERR_ARG, "modified by an inplace operation",
            "version");
  for (int i = 0; i < 4; i++) em_tensor_release(aux[i]);
  em_tensor_release(b); em_tensor_release(ones); em_tensor_release(t); em_tensor_release(x);
}

static em_status w_index_add(em_state *S, em_tensor *t, em_tensor **aux) {
  em_status st = t_make(S, &aux[0], EM_INT64, SHP(1), V(1));
  if (!st) st = t_make(S, &aux[1], EM_FLOAT64, SHP(1), V(10));
  return st ? st : em_index_add_(S, t, 0, aux[0], aux[1], 0);
}
static em_status w_scatter_add(em_state *S, em_tensor *t, em_tensor **aux) {
  em_status st = t_make(S, &aux[0], EM_INT64, SHP(2), V(0, 0));
  if (!st) st = t_make(S, &aux[1], EM_FLOAT64, SHP(2), V(3, 4));
  return st ? st : em_scatter_add_(S, t, 0, aux[0], aux[1], 0);
}
/* t is batch norm's running_var, then (second variant) its running_mean: input (2, 2)
** columns {1, 3} and {2, 6}: batch means 2, 4, unbiased variances 2, 8. */
static em_status w_bn_var(em_state *S, em_tensor *t, em_tensor **aux) {
  em_status st = t_make(S, &aux[0], EM_FLOAT64, SHP(2, 2), V(1, 2, 3, 6));
  return st ? st : em_batch_norm(S, aux[0], NULL, NULL, NULL, t, 1, 0.1, 1e-5, &aux[1],
                                 NULL, NULL);
}
static em_status w_bn_mean(em_state *S, em_tensor *t, em_tensor **aux) {
  em_status st = t_make(S, &aux[0], EM_FLOAT64, SHP(2, 2), V(1, 2, 3, 6));
  return st ? st : em_batch_norm(S, aux[0], NULL, NULL, t, NULL, 1, 0.5, 1e-5, &aux[1],
                                 NULL, NULL);
}
/* t is the parameter; grad 0.5, -0.5 */
static em_status w_sgd(em_state *S, em_tensor *t, em_tensor **aux) {
  em_status st = t_make(S, &aux[0], EM_FLOAT64, SHP(2), V(0.5, -0.5));
  return st ? st : em_sgd_step_(S, t, aux[0], NULL, 0.1, 0, 0, 0, 0, 1);
}
static em_status w_sgd_buf(em_state *S, em_tensor *t, em_tensor **aux) {
  /* t is the momentum buffer this time: the parameter is aux[1] */
  em_status st = t_make(S, &aux[0], EM_FLOAT64, SHP(2), V(0.5, -0.5));
  if (!st) st = t_make(S, &aux[1], EM_FLOAT64, SHP(2), V(0, 0));
  return st ? st : em_sgd_step_(S, aux[1], aux[0], t, 0.1, 0.9, 0, 0, 0, 0);
}
static em_status w_adam(em_state *S, em_tensor *t, em_tensor **aux) {
  em_status st = t_make(S, &aux[0], EM_FLOAT64, SHP(2), V(0.5, -0.5));
  if (!st) st = em_full(S, SHP(2), 0.0, EM_FLOAT64, EM_CPU, &aux[1]);
  if (!st) st = em_full(S, SHP(2), 0.0, EM_FLOAT64, EM_CPU, &aux[2]);
  return st ? st : em_adam_step_(S, t, aux[0], aux[1], aux[2], 0.1, 0.9, 0.999, 1e-8, 0, 0, 1);
}

static void test_inplace_versions(em_state *S) {
  version_case(S, "index_add_", w_index_add, V(1, 12));
  version_case(S, "scatter_add_", w_scatter_add, V(8, 2));
  version_case(S, "batch_norm running_var", w_bn_var, V(0.9 + 0.2, 1.8 + 0.8));
  version_case(S, "batch_norm running_mean", w_bn_mean, V(1.5, 3));
  version_case(S, "sgd_step_", w_sgd, V(0.95, 2.05));
  /* buf = 0.9*buf + g = (1.4, 1.3): then the parameter moves by -0.1*buf */
  version_case(S, "sgd_step_ momentum_buf", w_sgd_buf, V(1.4, 1.3));
  /* Adam's first step moves each element by lr against its gradient's sign */
  version_case(S, "adam_step_", w_adam, V(1 - 0.1 * 0.5 / (0.5 + 1e-8),
                                          2 + 0.1 * 0.5 / (0.5 + 1e-8)));
  /* eval-mode batch norm reads the running statistics and leaves them alone */
  em_tensor *x = mk(S, SHP(2), V(1, 2), 1), *rm = mk(S, SHP(2), V(0, 0), 0);
  em_tensor *rv = mk(S, SHP(2), V(1, 1), 0), *in = NULL, *y = NULL, *b = NULL, *ones = NULL;
  REQUIRE(x && rm && rv);
  REQUIRE_OK(S, t_make(S, &in, EM_FLOAT64, SHP(2, 2), V(1, 2, 3, 6)));
  REQUIRE_OK(S, em_full(S, SHP(2), 1.0, EM_FLOAT64, EM_CPU, &ones));
  REQUIRE_OK(S, em_binary(S, EM_MUL, x, rm, &b));
  CHECK_OK(S, em_batch_norm(S, in, NULL, NULL, rm, rv, 0, 0.1, 1e-5, &y, NULL, NULL));
  CHECK_CLOSE(t_get(y, 3), 6 / sqrt(1 + 1e-5), 1e-12);
  CHECK_OK(S, em_backward(S, b, ones));
  em_tensor *all[7] = {x, rm, rv, in, y, b, ones};
  for (int i = 0; i < 7; i++) em_tensor_release(all[i]);
}

/* -- Failing allocator (failalloc.h) ------------------------------------------------ */

/* forward + backward of a small graph touching each formula family */
static em_status graph_run(fa_state *f, double *out) {
  em_state *S = NULL;
  em_config cfg;
  em_config_init(&cfg);
  cfg.alloc = fa_alloc;
  cfg.alloc_ud = f;
  cfg.num_threads = 1;
  em_tensor *t[16] = {0};
  em_status st;
  static const int d1[1] = {1};
  static const double xv[6] = {1, -2, 3, 0.5, 2, -1}, wv[3] = {0.5, 1, -1};
  if ((st = em_open(&S, &cfg))) return st;
  if ((st = em_from_data(S, (const int64_t[]){2, 3}, 2, EM_FLOAT64, xv, EM_FLOAT64, &t[0])) ||
      (st = em_from_data(S, (const int64_t[]){3}, 1, EM_FLOAT64, wv, EM_FLOAT64, &t[1])) ||
      (st = em_tensor_set_requires_grad(S, t[0], 1)) ||
      (st = em_tensor_set_requires_grad(S, t[1], 1)) ||
      (st = em_binary(S, EM_MUL, t[0], t[1], &t[2])) ||
      (st = em_unary(S, EM_TANH, t[2], &t[3])) ||
      (st = em_transpose(S, t[3], 0, 1, &t[4])) ||
      (st = em_matmul(S, t[4], t[0], &t[5])) ||
      (st = em_softmax(S, t[5], 1, 0, &t[6])) ||
      (st = em_reduce(S, EM_SUM, t[6], d1, 1, 0, &t[7])) ||
      (st = em_binary(S, EM_MUL, t[7], t[7], &t[8])) ||
      (st = em_reduce(S, EM_MEAN, t[8], NULL, 0, 0, &t[9])) ||
      (st = em_binary_scalar(S, EM_ADD, t[9], 1, 0, &t[10])) ||
      (st = em_backward(S, t[10], NULL)))
    goto done;
  *out = 0;
  for (int k = 0; k < 2; k++) {
    em_tensor *g = em_tensor_grad(t[k]);
    for (int64_t i = 0; g && i < em_tensor_numel(g); i++) *out += t_get(g, i) * (i + 1);
    em_tensor_release(g);
  }
done:
  for (int k = 0; k < 16; k++) em_tensor_release(t[k]);
  em_close(S);
  return st;
}

static void test_failalloc(void) {
  fa_state f = FA_STATE_INIT;
  double want = 0, got = 0;
  REQUIRE(graph_run(&f, &want) == EM_OK);
  CHECK(f.live_bytes == 0 && f.live_blocks == 0);
  long n;
  int bad = 0;
  for (n = 1; n < 5000; n++) {
    fa_reset(&f, n);
    em_status st = graph_run(&f, &got);
    if (f.live_bytes || f.live_blocks) {
      if (!bad++) printf("     N=%ld: %lld bytes in %ld blocks leaked\n", n,
                         (long long)f.live_bytes, f.live_blocks);
    }
    if (!f.injected) {
      CHECK(st == EM_OK && got == want, "N=%ld: status %d, %.17g vs %.17g", n, (int)st, got, want);
      break;
    }
    if (st != EM_ERR_NOMEM && !bad++) printf("     N=%ld: status %d\n", n, (int)st);
  }
  CHECK(bad == 0, "%d runs leaked or did not report NOMEM", bad);
  CHECK(n < 5000);
}

int main(void) {
  em_state *S;
  if (em_open(&S, NULL) != EM_OK) return 1;
  RUN(test_basic, S);
  RUN(test_strided_views, S);
  RUN(test_hooks, S);
  RUN(test_modes_and_errors, S);
  RUN(test_inplace_versions, S);
  em_close(S);
  RUN(test_failalloc);
  return check_done();
}
