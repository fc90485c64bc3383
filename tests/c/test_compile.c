/*
** test_compile.c -- compiled steps from C (core/compile/, ember.h "Compiled
** steps"): a step y = relu(x @ w) * mask(dropout-like uniform draw), loss = sum(y),
** backward, recorded once; each replay, after new data is copied into the
** captured input, gives w.grad and the loss an eager step gives on that data
** (bit for bit), draws new random numbers, keeps its own buffers in the arena
** (fewer bytes than the step allocated), names its fused call (ReLU's backward),
** and leaves every tensor released at
** the end. An element-wise chain (y = relu(x * 2 + b) * x) replays as one call, tile
** by tile on two threads, with the eager step's bits. A leaf with a gradient the
** capture did not have is refused; a second
** capture, an end without a capture and a bad call index are errors. Runs under
** the sanitizers in CI (the recorder's references and the arena's slices).
*/
#include "check.h"

static em_tensor *randn(em_state *S, const int64_t *shape, int nd) {
  em_tensor *t = NULL;
  CHECK_OK(S, em_empty(S, shape, nd, EM_FLOAT32, EM_CPU, &t));
  CHECK_OK(S, em_normal_(S, t, 0.0, 1.0));
  return t;
}

/* The step on x with leaf w: returns the loss; w's .grad holds the gradient. */
static em_tensor *step(em_state *S, em_tensor *x, em_tensor *w) {
  em_tensor *xw = NULL, *r = NULL, *mask = NULL, *y = NULL, *loss = NULL;
  CHECK_OK(S, em_tensor_set_grad(S, w, NULL));   /* zero_grad (set to none) */
  CHECK_OK(S, em_matmul(S, x, w, &xw));
  CHECK_OK(S, em_unary(S, EM_RELU, xw, &r));
  CHECK_OK(S, em_empty(S, (const int64_t[]){4, 3}, 2, EM_FLOAT32, EM_CPU, &mask));
  CHECK_OK(S, em_uniform_(S, mask, 0.5, 1.5));
  CHECK_OK(S, em_binary(S, EM_MUL, r, mask, &y));
  CHECK_OK(S, em_reduce(S, EM_SUM, y, NULL, 0, 0, &loss));
  CHECK_OK(S, em_backward(S, loss, NULL));
  em_tensor_release(xw);
  em_tensor_release(r);
  em_tensor_release(mask);
  em_tensor_release(y);
  return loss;
}

static double item(em_state *S, const em_tensor *t) {
  double v = 0;
  CHECK_OK(S, em_tensor_item(S, t, &v));
  return v;
}

static int same_values(const em_tensor *a, const em_tensor *b) {
  return em_tensor_numel(a) == em_tensor_numel(b) &&
         memcmp(em_tensor_data(a), em_tensor_data(b),
                (size_t)em_tensor_numel(a) * sizeof(float)) == 0;
}

static void test_replay(em_state *S) {
  em_manual_seed(S, 5);
  em_tensor *w = randn(S, (const int64_t[]){5, 3}, 2), *x = randn(S, (const int64_t[]){4, 5}, 2);
  em_tensor *w2 = NULL;
  CHECK_OK(S, em_clone(S, w, &w2));
  CHECK_OK(S, em_tensor_set_requires_grad(S, w, 1));
  CHECK_OK(S, em_tensor_set_requires_grad(S, w2, 1));
  /* capture */
  uint64_t seed;
  CHECK_OK(S, em_compile_begin(S));
  CHECK(em_compile_capturing(S) == 1, "capturing");
  em_tensor *loss = step(S, x, w);
  em_program *p = NULL;
  char why[256];
  CHECK_OK(S, em_compile_end(S, &p, why, sizeof why));
  REQUIRE(p != NULL, "a program");
  CHECK(why[0] == 0, "replayable: %s", why);
  em_program_info info;
  em_program_stats(p, &info);
  CHECK(info.kernels >= 5 && info.calls > info.kernels, "calls %d, kernels %d", info.calls,
        info.kernels);
  /* ReLU's backward (x > 0, widened, times g) is one fused call */
  CHECK(info.fused == 1, "fused %d", info.fused);
  const char *kind = em_program_fused(p, 0);
  CHECK(kind && !strcmp(kind, "relu_backward"), "the fused call: %s", kind ? kind : "none");
  CHECK(em_program_fused(p, info.fused) == NULL, "no fused call past the last");
  const char *ops = em_program_fused_ops(p, 0);
  CHECK(ops && !strcmp(ops, "gt, copy, mul"), "the ops inside: %s", ops ? ops : "none");
  CHECK(em_program_fused_ops(p, 1) == NULL, "no ops past the last");
  em_tensor_release(loss);
  /* replays on new data, against eager steps on the same data from the same
  ** random state */
  for (int k = 0; k < 3; k++) {
    em_tensor *fresh = randn(S, (const int64_t[]){4, 5}, 2);
    memcpy(em_tensor_data(x), em_tensor_data(fresh), 20 * sizeof(float));
    uint64_t off;
    em_rng_get_state(S, &seed, &off);
    em_tensor *want = step(S, fresh, w2);
    em_rng_set_state(S, seed, off);
    CHECK(em_program_ready(p) == 1, "ready: the step drops the gradient first");
    CHECK_OK(S, em_program_run(S, p));
    em_tensor *g = em_tensor_grad(w), *g2 = em_tensor_grad(w2);
    REQUIRE(g && g2, "gradients after the replay");
    CHECK(same_values(g, g2), "replay %d: w.grad equals the eager step's", k + 1);
    uint64_t after;
    em_rng_get_state(S, &seed, &after);
    CHECK(after > off, "the replay drew from the generator");
    CHECK(item(S, want) != 0, "a loss");
    em_tensor_release(g);
    em_tensor_release(g2);
    em_tensor_release(want);
    em_tensor_release(fresh);
  }
  em_program_stats(p, &info);
  CHECK(info.replays == 3, "replays %lld", (long long)info.replays);
  CHECK(info.held_bytes > 0, "held bytes %lld", (long long)info.held_bytes);
  /* a gradient the capture did not have: the eager step would accumulate */
  em_tensor *g = em_tensor_grad(w);
  CHECK(em_program_ready(p) == 1, "the step sets the gradient to none first");
  em_tensor_release(g);
  em_program_free(S, p);
  em_tensor_release(w);
  em_tensor_release(w2);
  em_tensor_release(x);
}

/* Without the set-to-none, the captured step gives w its first gradient: a
** replay needs w.grad empty, and refuses otherwise. */
static void test_not_ready(em_state *S) {
  em_tensor *w = randn(S, (const int64_t[]){3}, 1), *s = NULL;
  CHECK_OK(S, em_tensor_set_requires_grad(S, w, 1));
  CHECK_OK(S, em_compile_begin(S));
  CHECK_OK(S, em_reduce(S, EM_SUM, w, NULL, 0, 0, &s));
  CHECK_OK(S, em_backward(S, s, NULL));
  em_program *p = NULL;
  CHECK_OK(S, em_compile_end(S, &p, NULL, 0));
  CHECK(em_program_ready(p) == 0, "w has the capture's gradient now");
  CHECK_ERR(S, em_program_run(S, p), EM_ERR_ARG, "compile", ".grad");
  CHECK_OK(S, em_tensor_set_grad(S, w, NULL));
  CHECK_OK(S, em_program_run(S, p));
  em_tensor *g = em_tensor_grad(w);
  CHECK(g && ((const float *)em_tensor_data(g))[2] == 1.0f, "the replayed gradient");
  em_tensor_release(g);
  em_program_free(S, p);
  em_tensor_release(s);
  em_tensor_release(w);
}

/* y = relu(x * 2 + b) * x over 96 x 128 floats, b broadcast: one element-wise
** chain, run tile by tile on two threads; each replay on new data gives the
** eager step's bits. */
static em_tensor *chain_step(em_state *S, em_tensor *x, em_tensor *b) {
  em_tensor *t = NULL, *u = NULL, *r = NULL, *y = NULL;
  CHECK_OK(S, em_binary_scalar(S, EM_MUL, x, 2.0, 0, &t));
  CHECK_OK(S, em_binary(S, EM_ADD, t, b, &u));
  CHECK_OK(S, em_unary(S, EM_RELU, u, &r));
  CHECK_OK(S, em_binary(S, EM_MUL, r, x, &y));
  em_tensor_release(t);
  em_tensor_release(u);
  em_tensor_release(r);
  return y;
}

static void test_chain(em_state *S) {
  CHECK_OK(S, em_set_num_threads(S, 2));
  em_tensor *x = randn(S, (const int64_t[]){96, 128}, 2), *b = randn(S, (const int64_t[]){128}, 1);
  CHECK_OK(S, em_compile_begin(S));
  em_tensor *y = chain_step(S, x, b);
  em_program *p = NULL;
  CHECK_OK(S, em_compile_end(S, &p, NULL, 0));
  REQUIRE(p != NULL, "a program");
  em_program_info info;
  em_program_stats(p, &info);
  const char *kind = em_program_fused(p, 0);
  CHECK(info.kernels == 1 && kind && !strcmp(kind, "elementwise_chain"),
        "one chain of the four calls: %d kernels, %s", info.kernels, kind ? kind : "none");
  const char *ops = em_program_fused_ops(p, 0);
  CHECK(ops && !strcmp(ops, "mul, add, relu, mul"), "the chain's ops: %s", ops ? ops : "none");
  for (int k = 0; k < 3; k++) {
    em_tensor *fresh = randn(S, (const int64_t[]){96, 128}, 2);
    memcpy(em_tensor_data(x), em_tensor_data(fresh), 96 * 128 * sizeof(float));
    CHECK_OK(S, em_program_run(S, p));
    em_tensor *want = chain_step(S, fresh, b);
    CHECK(same_values(y, want), "replay %d: the eager step's bits", k + 1);
    em_tensor_release(want);
    em_tensor_release(fresh);
  }
  em_program_free(S, p);
  em_tensor_release(y);
  em_tensor_release(b);
  em_tensor_release(x);
}

static void test_errors(em_state *S) {
  CHECK_ERR(S, em_compile_end(S, NULL, NULL, 0), EM_ERR_ARG, "no capture");
  CHECK_OK(S, em_compile_begin(S));
  CHECK_ERR(S, em_compile_begin(S), EM_ERR_ARG, "already");
  em_program *p = NULL;
  CHECK_OK(S, em_compile_end(S, &p, NULL, 0));
  CHECK(p != NULL && em_compile_capturing(S) == 0, "ended");
  CHECK_ERR(S, em_program_patch_sgd(S, p, 0, 0.1), EM_ERR_ARG, "no SGD step");
  CHECK_OK(S, em_program_run(S, p));   /* an empty step */
  em_program_free(S, p);
}

int main(void) {
  em_state *S;
  if (em_open(&S, NULL) != EM_OK) return 1;
  RUN(test_replay, S);
  RUN(test_not_ready, S);
  RUN(test_chain, S);
  RUN(test_errors, S);
  CHECK(em_memory_allocated(S) == 0, "every tensor released (%lld bytes left)",
        (long long)em_memory_allocated(S));
  em_close(S);
  return check_done();
}
