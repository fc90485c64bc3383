/*
** test_memlimit.c -- em_set_memory_limit: a CPU tensor past the cap fails with
** EM_ERR_NOMEM and a message naming the device, the size asked, what is
** allocated and the limit; the state works afterwards; freed (cached) blocks do
** not count; em_device_memory reports the cap as capacity; bad arguments are
** clear errors.
*/
#include "check.h"

enum { MiB = 1 << 20 };

static int64_t cpu_allocated(em_state *S) {
  em_device_memory_stats m;
  return em_device_memory(S, EM_CPU, &m) == EM_OK ? m.allocated : -1;
}

static void test_cap(em_state *S) {
  em_device_memory_stats m;
  REQUIRE_OK(S, em_device_memory(S, EM_CPU, &m));
  CHECK(m.capacity == 0, "no cap: capacity %lld", (long long)m.capacity);
  int64_t base = cpu_allocated(S);
  REQUIRE_OK(S, em_set_memory_limit(S, EM_CPU, base + 4 * MiB));
  REQUIRE_OK(S, em_device_memory(S, EM_CPU, &m));
  CHECK(m.capacity == base + 4 * MiB, "capacity %lld", (long long)m.capacity);

  /* 3 MiB fits; 2 MiB more does not: 3 + 2 > 4 */
  em_tensor *a = NULL, *b = NULL, *c = NULL;
  REQUIRE_OK(S, em_full(S, SHP(3 * MiB / 4), 1.5, EM_FLOAT32, EM_CPU, &a));
  CHECK_ERR(S, em_full(S, SHP(2 * MiB / 4), 2.0, EM_FLOAT32, EM_CPU, &b), EM_ERR_NOMEM,
            "full", "cpu: out of memory allocating 2.00 MiB", "3.00 MiB allocated",
            "limit", "float32", "[524288]");
  CHECK(b == NULL, "no tensor on failure");
  CHECK(cpu_allocated(S) == base + 3 * MiB, "allocated %lld after the failure",
        (long long)cpu_allocated(S));
  int *flag = em_memory_pressure_flag(S);
  CHECK(*flag == 1, "the pressure flag is raised (%d)", *flag);
  *flag = 0;

  /* an op whose output passes the cap fails the same way and leaves a intact */
  CHECK_ERR(S, em_binary_scalar(S, EM_ADD, a, 1.0, 0, &c), EM_ERR_NOMEM, "out of memory",
            "limit");
  double v = 0;
  em_tensor *one = NULL;
  REQUIRE_OK(S, em_full(S, SHP(1), 0.0, EM_FLOAT32, EM_CPU, &one));   /* small ones still fit */
  em_tensor_release(one);
  CHECK_OK(S, em_binary_scalar_(S, EM_ADD, a, 1.0));                   /* in place: no new memory */
  v = ((const float *)em_tensor_data(a))[3 * MiB / 4 - 1];
  CHECK(v == 2.5, "a after the failed op and the in-place add: %g", v);

  /* released memory is room again, though its block is cached */
  em_tensor_release(a);
  CHECK(cpu_allocated(S) == base, "allocated %lld after release", (long long)cpu_allocated(S));
  REQUIRE_OK(S, em_full(S, SHP(2 * MiB / 4), 2.0, EM_FLOAT32, EM_CPU, &b));
  REQUIRE_OK(S, em_full(S, SHP(2 * MiB / 4 - 64), 3.0, EM_FLOAT32, EM_CPU, &c));
  v = ((const float *)em_tensor_data(c))[2 * MiB / 4 - 65];
  CHECK(v == 3.0, "value %g", v);
  REQUIRE_OK(S, em_device_memory(S, EM_CPU, &m));
  CHECK(m.reserved <= base + 4 * MiB + MiB, "reserved %lld stays near the cap",
        (long long)m.reserved);
  em_tensor_release(b);
  em_tensor_release(c);

  /* no cap again: the large tensor fits */
  REQUIRE_OK(S, em_set_memory_limit(S, EM_CPU, 0));
  REQUIRE_OK(S, em_full(S, SHP(8 * MiB / 4), 1.0, EM_FLOAT32, EM_CPU, &a));
  REQUIRE_OK(S, em_device_memory(S, EM_CPU, &m));
  CHECK(m.capacity == 0, "capacity %lld", (long long)m.capacity);

  /* a cap below what is allocated refuses new tensors until memory is released */
  REQUIRE_OK(S, em_set_memory_limit(S, EM_CPU, base + MiB));
  CHECK_ERR(S, em_full(S, SHP(1), 0.0, EM_FLOAT32, EM_CPU, &b), EM_ERR_NOMEM, "limit");
  em_tensor_release(a);
  CHECK_OK(S, em_full(S, SHP(1), 0.0, EM_FLOAT32, EM_CPU, &b));
  em_tensor_release(b);
  REQUIRE_OK(S, em_set_memory_limit(S, EM_CPU, 0));
}

static void test_meta_and_errors(em_state *S) {
  em_tensor *t = NULL;
  REQUIRE_OK(S, em_set_memory_limit(S, EM_CPU, 1024));
  /* the meta device holds no data: the CPU cap does not apply to it */
  REQUIRE_OK(S, em_empty(S, SHP(1 << 20), EM_FLOAT32, EM_META, &t));
  em_tensor_release(t);
  REQUIRE_OK(S, em_set_memory_limit(S, EM_CPU, 0));
  CHECK_ERR(S, em_set_memory_limit(S, EM_CPU, -5), EM_ERR_ARG, "set_memory_limit", "-5");
  CHECK_ERR(S, em_set_memory_limit(S, EM_META, 100), EM_ERR_DEVICE, "set_memory_limit",
            "meta");
  CHECK_ERR(S, em_set_memory_limit(S, 0, 100), EM_ERR_DEVICE, "cuda:0");
}

int main(void) {
  em_state *S;
  em_config cfg;
  em_config_init(&cfg);
  cfg.num_threads = 1;
  if (em_open(&S, &cfg) != EM_OK) { printf("em_open failed\n"); return 1; }
  RUN(test_cap, S);
  RUN(test_meta_and_errors, S);
  em_close(S);
  return check_done();
}
