/*
** test_cuda_optim.c -- the single-parameter optimizer steps (em_sgd_step_,
** em_adam_step_) on a cuda tensor (the emulated runtime unless EMBER_TEST_REAL_CUDA):
** they run as the list entries' case of one, so they work wherever the list form
** does, and give the CPU's bits. SGD plain, with weight decay, momentum, dampening
** and nesterov; Adam with L2 decay and AdamW; float32 and float64; parameters of
** one element, of a few, and of more than one kernel chunk; three steps each, the
** state tensors compared too.
*/
#include "cuda_check.h"

enum { NSIZES = 3 };
static const int64_t SIZES[NSIZES] = {1, 37, 5000};

/* Values in [-1, 1) from the test's xorshift, the same on both sides. */
static em_status random_pair(em_state *S, em_dtype dt, int64_t n, em_tensor **cpu,
                             em_tensor **dev) {
  double *v = malloc(sizeof(double) * (size_t)n);
  if (!v) return EM_ERR_NOMEM;
  for (int64_t i = 0; i < n; i++) v[i] = (double)(cuda_check_rand() % 20000) / 10000 - 1;
  em_status st = em_from_data(S, &n, 1, dt, v, EM_FLOAT64, cpu);
  free(v);
  if (!st && (st = em_to(S, *cpu, dt, 0, dev))) em_tensor_release(*cpu);
  return st;
}

/* got (cuda) holds want's (cpu) bits, element for element */
static int same_bits(em_state *S, const em_tensor *want, const em_tensor *got) {
  em_tensor *h = NULL;
  if (em_to(S, got, em_tensor_dtype(got), EM_CPU, &h)) return 0;
  size_t nb = (size_t)em_tensor_numel(want) * em_dtype_size(em_tensor_dtype(want));
  int ok = em_tensor_numel(h) == em_tensor_numel(want) &&
           memcmp(em_tensor_data(h), em_tensor_data(want), nb) == 0;
  em_tensor_release(h);
  return ok;
}

typedef struct sgd_opts { double lr, momentum, dampening, wd; int nesterov; } sgd_opts;

static void sgd_case(em_state *S, const char *name, sgd_opts o) {
  static const em_dtype DTS[2] = {EM_FLOAT32, EM_FLOAT64};
  for (int k = 0; k < 2; k++)
    for (int z = 0; z < NSIZES; z++) {
      em_tensor *p[2], *g[2], *buf[2] = {NULL, NULL};
      REQUIRE_OK(S, random_pair(S, DTS[k], SIZES[z], &p[0], &p[1]));
      REQUIRE_OK(S, random_pair(S, DTS[k], SIZES[z], &g[0], &g[1]));
      if (o.momentum != 0) {
        REQUIRE_OK(S, em_full(S, &SIZES[z], 1, 0, DTS[k], EM_CPU, &buf[0]));
        REQUIRE_OK(S, em_full(S, &SIZES[z], 1, 0, DTS[k], 0, &buf[1]));
      }
      for (int step = 0; step < 3; step++)
        for (int side = 0; side < 2; side++)
          CHECK_OK(S, em_sgd_step_(S, p[side], g[side], buf[side], o.lr, o.momentum,
                                   o.dampening, o.wd, o.nesterov, step == 0));
      CHECK(em_tensor_device(p[1]) == 0, "the parameter stays on cuda");
      CHECK(same_bits(S, p[0], p[1]), "%s, %s, %lld elements: the cpu's bits", name,
            em_dtype_name(DTS[k]), (long long)SIZES[z]);
      if (buf[0])
        CHECK(same_bits(S, buf[0], buf[1]), "%s, %s, %lld elements: momentum buffer", name,
              em_dtype_name(DTS[k]), (long long)SIZES[z]);
      for (int side = 0; side < 2; side++) {
        em_tensor_release(p[side]);
        em_tensor_release(g[side]);
        em_tensor_release(buf[side]);
      }
    }
}

static void test_sgd(em_state *S) {
  sgd_case(S, "plain", (sgd_opts){0.1, 0, 0, 0, 0});
  sgd_case(S, "weight decay", (sgd_opts){0.1, 0, 0, 0.01, 0});
  sgd_case(S, "momentum, dampening", (sgd_opts){0.05, 0.9, 0.3, 0, 0});
  sgd_case(S, "nesterov, weight decay", (sgd_opts){0.05, 0.8, 0, 1e-3, 1});
}

static void adam_case(em_state *S, const char *name, double lr, double wd, int decoupled) {
  static const em_dtype DTS[2] = {EM_FLOAT32, EM_FLOAT64};
  for (int k = 0; k < 2; k++)
    for (int z = 0; z < NSIZES; z++) {
      em_tensor *p[2], *g[2], *m[2], *v[2];
      REQUIRE_OK(S, random_pair(S, DTS[k], SIZES[z], &p[0], &p[1]));
      REQUIRE_OK(S, random_pair(S, DTS[k], SIZES[z], &g[0], &g[1]));
      for (int side = 0; side < 2; side++) {
        int dev = side ? 0 : EM_CPU;
        REQUIRE_OK(S, em_full(S, &SIZES[z], 1, 0, DTS[k], dev, &m[side]));
        REQUIRE_OK(S, em_full(S, &SIZES[z], 1, 0, DTS[k], dev, &v[side]));
      }
      for (int64_t step = 1; step <= 3; step++)
        for (int side = 0; side < 2; side++)
          CHECK_OK(S, em_adam_step_(S, p[side], g[side], m[side], v[side], lr, 0.9, 0.999,
                                    1e-8, wd, decoupled, step));
      CHECK(same_bits(S, p[0], p[1]) && same_bits(S, m[0], m[1]) && same_bits(S, v[0], v[1]),
            "%s, %s, %lld elements: parameter and moments hold the cpu's bits", name,
            em_dtype_name(DTS[k]), (long long)SIZES[z]);
      for (int side = 0; side < 2; side++) {
        em_tensor_release(p[side]);
        em_tensor_release(g[side]);
        em_tensor_release(m[side]);
        em_tensor_release(v[side]);
      }
    }
}

static void test_adam(em_state *S) {
  adam_case(S, "Adam", 1e-2, 0, 0);
  adam_case(S, "Adam, L2 decay", 1e-2, 0.1, 0);
  adam_case(S, "AdamW", 2e-2, 0.05, 1);
}

/* The step really moved the parameter: a guard against comparing two no-ops. */
static void test_moves(em_state *S) {
  em_tensor *p, *g;
  REQUIRE_OK(S, em_full(S, SHP(3), 1.0, EM_FLOAT32, 0, &p));
  REQUIRE_OK(S, em_full(S, SHP(3), 0.5, EM_FLOAT32, 0, &g));
  CHECK_OK(S, em_sgd_step_(S, p, g, NULL, 0.2, 0, 0, 0, 0, 1));
  double x = 0;
  em_tensor *h = NULL;
  if (CHECK_OK(S, em_to(S, p, EM_FLOAT32, EM_CPU, &h))) {
    x = t_get(h, 2);
    CHECK(x == 1.0f - 0.2f * 0.5f, "1 - 0.2 * 0.5 = %.9g", x);
  }
  em_tensor_release(h);
  em_tensor_release(p);
  em_tensor_release(g);
}

int main(void) {
  em_state *S;
  if (cuda_check_open(&S, "1")) return 1;
  RUN(test_moves, S);
  RUN(test_sgd, S);
  RUN(test_adam, S);
  em_close(S);
  return check_done();
}
