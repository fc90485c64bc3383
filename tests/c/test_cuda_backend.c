/*
** test_cuda_backend.c -- the CUDA backend's devices, memory and copies, on the
** emulated runtime (EMBER_CUDA_EMULATE) or on a real GPU (EMBER_TEST_REAL_CUDA):
** no device without either, and a reason that says how to get one; devices opened
** on first use, tensors whose storage comes from the caching allocator, copies to
** and from the device for every dtype (contiguous, strided and through conversions
** on the CPU side), fills and strided copies run as kernels, queued work read back
** correctly without explicit syncs, memory statistics, out-of-memory on a small
** device with the state usable after it, and a clear error for a device that is
** not there. Every value read back is compared with the CPU's.
*/
#include "cuda_check.h"
#include <stdlib.h>

static em_dtype ALL[] = {EM_BOOL, EM_UINT8, EM_INT32, EM_INT64, EM_FLOAT16, EM_BFLOAT16,
                         EM_FLOAT32, EM_FLOAT64};

static void test_no_devices(void) {
  if (getenv("EMBER_TEST_REAL_CUDA")) {
    check_skip("test_no_devices: a real GPU is there");
    return;
  }
  unsetenv("EMBER_CUDA_EMULATE");
  em_state *S;
  if (em_open(&S, NULL) != EM_OK) { CHECK(0, "em_open"); return; }
  CHECK(em_cuda_device_count(S) == 0, "no devices without emulation");
  CHECK(strstr(em_errmsg(S), "EMBER_CUDA_EMULATE") != NULL, "the reason says how: %s",
        em_errmsg(S));
  em_tensor *t;
  CHECK_ERR(S, em_empty(S, (int64_t[]){2}, 1, EM_FLOAT32, 0, &t), EM_ERR_DEVICE, "cuda:0");
  em_close(S);
  setenv("EMBER_CUDA_EMULATE", "nonsense", 1);
  if (em_open(&S, NULL) != EM_OK) { CHECK(0, "em_open"); return; }
  CHECK(em_cuda_device_count(S) == 0, "bad text: no devices");
  CHECK(strstr(em_errmsg(S), "EMBER_CUDA_EMULATE") && strstr(em_errmsg(S), "nonsense"),
        "the message quotes it: %s", em_errmsg(S));
  em_close(S);
}

/* values 0..n-1 (mod 2 for bool, mod 200 for uint8), shape (3, 5) */
static em_status host_values(em_state *S, em_dtype dt, em_tensor **out) {
  double v[15];
  for (int i = 0; i < 15; i++) v[i] = dt == EM_BOOL ? i % 2 : dt == EM_UINT8 ? (i * 7) % 200 : i - 4;
  return t_make(S, out, dt, (int64_t[]){3, 5}, 2, v, 15);
}

static int same_values(const em_tensor *a, const em_tensor *b) {
  if (em_tensor_numel(a) != em_tensor_numel(b)) return 0;
  for (int64_t i = 0; i < em_tensor_numel(a); i++)
    if (t_get(a, i) != t_get(b, i)) return 0;
  return 1;
}

/* The last device: cuda:1 of the two emulated ones, cuda:0 on a one-GPU machine. */
static int last_dev(em_state *S) { return em_cuda_device_count(S) - 1; }

static void test_round_trips(em_state *S) {
  if (!getenv("EMBER_TEST_REAL_CUDA")) {
    CHECK(em_cuda_device_count(S) == 2, "two emulated devices");
    CHECK(em_cuda_emulated(S) == 1, "emulated");
  }
  int dev = last_dev(S);
  for (size_t k = 0; k < sizeof ALL / sizeof *ALL; k++) {
    em_dtype dt = ALL[k];
    em_tensor *h, *d, *back, *dt_t, *dt_back, *c, *c_back, *hT;
    REQUIRE_OK(S, host_values(S, dt, &h));
    REQUIRE_OK(S, em_to(S, h, dt, dev, &d));
    CHECK(em_tensor_device(d) == dev, "on cuda:%d", dev);
    REQUIRE_OK(S, em_to(S, d, dt, EM_CPU, &back));
    CHECK(same_values(h, back), "%s: round trip", em_dtype_name(dt));
    /* a strided view on the device, read back, and made contiguous by a kernel */
    REQUIRE_OK(S, em_transpose(S, d, 0, 1, &dt_t));
    REQUIRE_OK(S, em_to(S, dt_t, dt, EM_CPU, &dt_back));
    REQUIRE_OK(S, em_transpose(S, h, 0, 1, &hT));
    CHECK(same_values(hT, dt_back), "%s: a transposed device view reads back", em_dtype_name(dt));
    REQUIRE_OK(S, em_contiguous(S, dt_t, &c));
    CHECK(em_tensor_device(c) == dev && em_tensor_is_contiguous(c), "contiguous on the device");
    REQUIRE_OK(S, em_to(S, c, dt, EM_CPU, &c_back));
    CHECK(same_values(hT, c_back), "%s: the strided copy kernel", em_dtype_name(dt));
    em_tensor_release(h); em_tensor_release(d); em_tensor_release(back);
    em_tensor_release(dt_t); em_tensor_release(dt_back); em_tensor_release(c);
    em_tensor_release(c_back); em_tensor_release(hT);
  }
}

static void test_conversions_and_strided_targets(em_state *S) {
  em_tensor *h, *d, *back, *hT, *dst, *view, *dst_back;
  REQUIRE_OK(S, host_values(S, EM_INT32, &h));
  /* int32 on the host to float64 on the device: converted on the host side */
  REQUIRE_OK(S, em_to(S, h, EM_FLOAT64, 0, &d));
  CHECK(em_tensor_dtype(d) == EM_FLOAT64, "float64 on the device");
  REQUIRE_OK(S, em_to(S, d, EM_FLOAT16, EM_CPU, &back));
  CHECK(same_values(h, back), "to float16 on the way back");
  /* a strided host source into a strided device target (staged) */
  REQUIRE_OK(S, em_transpose(S, h, 0, 1, &hT));               /* (5, 3) */
  REQUIRE_OK(S, em_full(S, (int64_t[]){3, 5}, 2, -1.0, EM_INT32, 0, &dst));
  REQUIRE_OK(S, em_transpose(S, dst, 0, 1, &view));           /* (5, 3) view of dst */
  REQUIRE_OK(S, em_copy_(S, view, hT));
  REQUIRE_OK(S, em_to(S, dst, EM_INT32, EM_CPU, &dst_back));
  CHECK(same_values(h, dst_back), "copy_ into a transposed device view");
  /* conversions on the device run as kernels (k_elementwise.c, tested in
  ** test_cuda_elementwise.c); copies between devices in test_cuda_transfer.c */
  em_tensor *x, *xb;
  REQUIRE_OK(S, em_to(S, d, EM_FLOAT32, 0, &x));
  REQUIRE_OK(S, em_to(S, x, EM_FLOAT32, EM_CPU, &xb));
  CHECK(same_values(h, xb), "float64 -> float32 on the device");
  em_tensor_release(x); em_tensor_release(xb);
  /* an op on tensors of two devices names both (conv2d's values on the device
  ** are test_cuda_dnn.c's) */
  em_tensor *d4, *h4;
  int64_t one[2] = {1, 1}, zero[2] = {0, 0}, s4[4] = {1, 1, 2, 2};
  REQUIRE_OK(S, em_full(S, s4, 4, 1, EM_FLOAT32, 0, &d4));
  REQUIRE_OK(S, em_full(S, s4, 4, 1, EM_FLOAT32, EM_CPU, &h4));
  CHECK_ERR(S, em_conv2d(S, d4, h4, NULL, one, zero, one, 1, &x), EM_ERR_DEVICE, "conv2d",
            "cuda:0", "cpu");
  em_tensor_release(d4); em_tensor_release(h4);
  em_tensor_release(h); em_tensor_release(d); em_tensor_release(back);
  em_tensor_release(hT); em_tensor_release(dst); em_tensor_release(view);
  em_tensor_release(dst_back);
}

static void test_fill_and_queued_work(em_state *S) {
  enum { N = 1 << 20 };                  /* 4096 blocks of 256 threads */
  em_tensor *d, *back, *step, *h;
  REQUIRE_OK(S, em_full(S, (int64_t[]){N}, 1, 2.5, EM_FLOAT32, 0, &d));
  /* every other element: a strided fill */
  REQUIRE_OK(S, em_as_strided(S, d, (int64_t[]){N / 2}, (int64_t[]){2}, 1, 0, &step));
  REQUIRE_OK(S, em_fill_(S, step, -1));
  REQUIRE_OK(S, em_to(S, d, EM_FLOAT32, EM_CPU, &back));
  const float *p = em_tensor_data(back);
  int ok = 1;
  for (int i = 0; i < N && ok; i++) ok = p[i] == (i % 2 ? 2.5f : -1.0f);
  CHECK(ok, "a million elements filled, every other one again, read without a sync");
  /* many queued pieces of work, then one read */
  REQUIRE_OK(S, em_full(S, (int64_t[]){64}, 1, 0, EM_INT64, 0, &h));
  em_tensor *acc;
  REQUIRE_OK(S, em_to(S, h, EM_INT64, 0, &acc));
  em_status st = EM_OK;
  for (int i = 1; i <= 200 && !st; i++) st = em_fill_(S, acc, i);
  REQUIRE_OK(S, st);
  em_tensor *acc_back;
  REQUIRE_OK(S, em_to(S, acc, EM_INT64, EM_CPU, &acc_back));
  CHECK(t_get(acc_back, 0) == 200 && t_get(acc_back, 63) == 200, "the last of 200 fills");
  REQUIRE_OK(S, em_cuda_synchronize(S, -1));
  em_tensor_release(d); em_tensor_release(back); em_tensor_release(step);
  em_tensor_release(h); em_tensor_release(acc); em_tensor_release(acc_back);
}

/* A copy to the device takes the host values at the call: changing the host
** tensor right after does not reach the device, however late the stream runs. */
static void test_upload_snapshot(em_state *S) {
  em_tensor *h, *d, *back;
  REQUIRE_OK(S, em_full(S, (int64_t[]){4096}, 1, 1.0, EM_FLOAT32, EM_CPU, &h));
  REQUIRE_OK(S, em_to(S, h, EM_FLOAT32, 0, &d));
  REQUIRE_OK(S, em_fill_(S, h, 5.0));
  REQUIRE_OK(S, em_to(S, d, EM_FLOAT32, EM_CPU, &back));
  CHECK(t_get(back, 0) == 1 && t_get(back, 4095) == 1, "the device got the values of the "
        "call: %g", t_get(back, 0));
  em_tensor_release(h); em_tensor_release(d); em_tensor_release(back);
}

static void test_memory(em_state *S) {
  em_cuda_memory m0, m1, m2;
  REQUIRE_OK(S, em_cuda_memory_stats(S, 0, &m0));
  em_tensor *d;
  REQUIRE_OK(S, em_full(S, (int64_t[]){1000}, 1, 1.0, EM_FLOAT64, 0, &d));
  REQUIRE_OK(S, em_cuda_memory_stats(S, 0, &m1));
  CHECK(m1.allocated >= m0.allocated + 8000, "8000 bytes more allocated");
  CHECK(m1.num_allocs == m0.num_allocs + 1, "one allocation");
  em_tensor_release(d);
  REQUIRE_OK(S, em_cuda_memory_stats(S, 0, &m2));
  CHECK(m2.allocated == m0.allocated && m2.num_frees == m1.num_frees + 1, "given back");
  if (!getenv("EMBER_TEST_REAL_CUDA"))   /* cuda_check_open's 2:64 devices */
    CHECK(m2.capacity == 64 << 20, "the device's 64 MB: %lld", (long long)m2.capacity);
  else
    CHECK(m2.capacity > 0, "the GPU's capacity: %lld", (long long)m2.capacity);
  REQUIRE_OK(S, em_cuda_empty_cache(S, -1));
  REQUIRE_OK(S, em_cuda_memory_stats(S, 0, &m2));
  CHECK(m2.reserved == 0, "the cache emptied: %lld reserved", (long long)m2.reserved);
  /* out of memory (more than the device has), and the state goes on */
  em_tensor *big;
  CHECK_ERR(S, em_empty(S, (int64_t[]){m2.capacity + (64 << 20)}, 1, EM_UINT8, 0, &big),
            EM_ERR_NOMEM, "empty", "out of memory");
  REQUIRE_OK(S, em_full(S, (int64_t[]){4}, 1, 3.0, EM_FLOAT32, 0, &d));
  em_tensor *back;
  REQUIRE_OK(S, em_to(S, d, EM_FLOAT32, EM_CPU, &back));
  CHECK(t_get(back, 3) == 3, "usable after the failure");
  em_tensor_release(d); em_tensor_release(back);
  char ndev[16];
  snprintf(ndev, sizeof ndev, "%d", em_cuda_device_count(S));
  CHECK_ERR(S, em_cuda_memory_stats(S, 7, &m2), EM_ERR_DEVICE, "cuda:7", ndev);
}

int main(void) {
  RUN(test_no_devices);
  em_state *S;
  if (cuda_check_open(&S, "2:64")) return 1;
  RUN(test_round_trips, S);
  RUN(test_conversions_and_strided_targets, S);
  RUN(test_fill_and_queued_work, S);
  RUN(test_upload_snapshot, S);
  RUN(test_memory, S);
  em_close(S);
  return check_done();
}
