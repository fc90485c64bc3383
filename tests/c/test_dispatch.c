/*
** test_dispatch.c -- the one dispatch point (EMI_DISPATCH in core/internal.h), from
** the inside: a stand-in backend registered for device 0 the way the CUDA backend
** will be, built from the CPU's table with some entries missing. Ops on its tensors
** reach its kernels (its storages come from its own alloc), a missing entry is a
** clear error naming the op, the backend, the entry and the device, an unserved
** device is refused by name, a copy between the host and the device runs on the
** device's side, and the profiler records the device.
**
** This is the one test that includes internal.h: what it checks is internal.
*/
#include "check.h"
#include "internal.h"

static int allocs, frees, copies;

static emi_storage *fake_alloc(emi_device *d, size_t nbytes) {
  allocs++;
  emi_device *cpu = &d->S->cpu;
  return cpu->backend->alloc(cpu, nbytes);
}

static void fake_free(emi_device *d, emi_storage *st) {
  frees++;
  emi_device *cpu = &d->S->cpu;
  cpu->backend->free(cpu, st);
}

static em_status fake_copy(emi_device *d, em_tensor *out, const em_tensor *src) {
  copies++;
  return emi_cpu_backend.copy(&d->S->cpu, out, src);
}

static void test_stand_in_backend(em_state *S) {
  emi_backend fake = emi_cpu_backend;    /* every kernel but the ones taken away */
  fake.name = "stand-in";
  fake.alloc = fake_alloc;
  fake.free = fake_free;
  fake.copy = fake_copy;
  fake.matmul = NULL;
  emi_device dev = {S, 0, &fake, NULL};
  S->devices[0] = &dev;

  em_tensor *h, *a, *b, *c, *back;
  double v[6] = {1, 2, 3, 4, 5, 6};
  REQUIRE_OK(S, t_make(S, &h, EM_FLOAT32, (int64_t[]){2, 3}, 2, v, 6));
  REQUIRE_OK(S, em_to(S, h, EM_FLOAT32, 0, &a));
  CHECK(em_tensor_device(a) == 0, "the copy lives on device 0");
  CHECK(allocs == 1 && copies == 1, "host to device: the device's alloc and copy (%d, %d)",
        allocs, copies);
  REQUIRE_OK(S, em_binary(S, EM_MUL, a, a, &b));
  CHECK(em_tensor_device(b) == 0 && allocs == 2, "the result on the device, its storage "
        "from the device's alloc");
  REQUIRE_OK(S, em_to(S, b, EM_FLOAT32, EM_CPU, &back));
  CHECK(copies == 2, "device to host runs on the device's side too (%d copies)", copies);
  for (int i = 0; i < 6; i++) CHECK(t_get(back, i) == v[i] * v[i], "value %d", i);

  /* operands on two devices: refused, naming both (no kernel is asked to mix them) */
  CHECK(em_binary(S, EM_ADD, h, a, &c) != EM_OK, "cpu + cuda:0 is refused");
  CHECK(strstr(em_errmsg(S), "cpu") && strstr(em_errmsg(S), "cuda:0"), "names both: %s",
        em_errmsg(S));
  /* the same for the other families: nothing mixes devices silently */
  {
    em_tensor *x4, *w4, *idx, *cond, *r = NULL;
    em_tensor *pair[2] = {h, a};
    REQUIRE_OK(S, em_full(S, (int64_t[]){1, 1, 4, 4}, 4, 1.0, EM_FLOAT32, EM_CPU, &x4));
    REQUIRE_OK(S, em_full(S, (int64_t[]){1, 1, 3, 3}, 4, 1.0, EM_FLOAT32, EM_CPU, &w4));
    em_tensor *w4d;
    REQUIRE_OK(S, em_to(S, w4, EM_FLOAT32, 0, &w4d));
    REQUIRE_OK(S, em_full(S, (int64_t[]){2}, 1, 0.0, EM_INT64, EM_CPU, &idx));
    REQUIRE_OK(S, em_full(S, (int64_t[]){2, 3}, 2, 1.0, EM_BOOL, EM_CPU, &cond));
    const int64_t one[2] = {1, 1}, zero[2] = {0, 0};
    CHECK(em_conv2d(S, x4, w4d, NULL, one, zero, one, 1, &r) == EM_ERR_DEVICE &&
          strstr(em_errmsg(S), "cuda:0"), "conv2d: %s", em_errmsg(S));
    CHECK(em_cat(S, pair, 2, 0, &r) == EM_ERR_DEVICE, "cat: %s", em_errmsg(S));
    CHECK(em_where(S, cond, h, a, &r) == EM_ERR_DEVICE, "where: %s", em_errmsg(S));
    CHECK(em_index_select(S, a, 0, idx, 0, &r) == EM_ERR_DEVICE, "index_select: %s",
          em_errmsg(S));
    CHECK(em_sgd_step_(S, a, h, NULL, 0.1, 0, 0, 0, 0, 1) == EM_ERR_DEVICE, "sgd_step: %s",
          em_errmsg(S));
    CHECK(r == NULL, "no output made");
    em_tensor_release(x4); em_tensor_release(w4); em_tensor_release(w4d);
    em_tensor_release(idx); em_tensor_release(cond);
  }
  em_tensor *bt;
  REQUIRE_OK(S, em_transpose(S, a, 0, 1, &bt));
  CHECK_ERR(S, em_matmul(S, a, bt, &c), EM_ERR_DEVICE, "matmul", "stand-in", "'matmul'",
            "cuda:0");
  /* the profiler names the device of what it records */
  REQUIRE_OK(S, em_profile_start(S, NULL));
  REQUIRE_OK(S, em_binary(S, EM_ADD, a, a, &c));
  REQUIRE_OK(S, em_profile_stop(S));
  const em_profile_event *ev;
  int64_t n;
  REQUIRE_OK(S, em_profile_events(S, &ev, &n));
  int seen = 0;
  for (int64_t i = 0; i < n; i++)
    if (ev[i].kind == EM_PROF_OP && strcmp(ev[i].name, "add") == 0 && ev[i].device == 0) seen++;
  CHECK(seen == 1, "the add recorded on device 0");

  em_tensor_release(c); em_tensor_release(bt); em_tensor_release(back);
  em_tensor_release(b); em_tensor_release(a); em_tensor_release(h);
  CHECK(frees == allocs, "every device storage back through the device's free (%d of %d)",
        frees, allocs);
  S->devices[0] = NULL;
}

static void test_unserved_devices(em_state *S) {
  em_tensor *t;
  CHECK_ERR(S, em_empty(S, (int64_t[]){2}, 1, EM_FLOAT32, 1, &t), EM_ERR_DEVICE, "empty",
            "cuda:1", "not available");
  CHECK_ERR(S, em_empty(S, (int64_t[]){2}, 1, EM_FLOAT32, -5, &t), EM_ERR_DEVICE, "empty",
            "invalid device -5");
  CHECK_ERR(S, em_empty(S, (int64_t[]){2}, 1, EM_FLOAT32, EMI_MAX_DEVICES + 3, &t),
            EM_ERR_DEVICE, "empty", "not available");
  em_tensor *h;
  REQUIRE_OK(S, em_full(S, (int64_t[]){2}, 1, 1.0, EM_FLOAT32, EM_CPU, &h));
  CHECK_ERR(S, em_to(S, h, EM_FLOAT32, 2, &t), EM_ERR_DEVICE, "to", "cuda:2", "no backend");
  em_tensor_release(h);
}

int main(void) {
  em_state *S;
  if (em_open(&S, NULL) != EM_OK) return 1;
  RUN(test_stand_in_backend, S);
  RUN(test_unserved_devices, S);
  em_close(S);
  return check_done();
}
