/*
** test_cuda_libs.c -- the real CUDA libraries (kernels/real/libs.c), loaded with
** dlopen and run for real on a machine without a GPU: versions, cuDNN's tensor,
** filter and convolution descriptors and its output dims (against the formula
** computed here and ember's own conv2d), cuBLASLt's matmul descriptor and matrix
** layouts read back, NCCL's unique ids; the device count without a driver; the
** search ($EMBER_CUDA_HOME, /usr/local/cuda/lib64, the system path) and its
** messages. A library not found skips its groups, each a counted skip saying why;
** a build without the CUDA headers skips the whole program.
*/
#include "check.h"
#include "../../kernels/real/libs.h"
#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h>
/* cublasLtCreate leaks 192 bytes of its own when it fails (no driver): not
** ember's to free, so LeakSanitizer looks away during that one call. */
#define LIBRARY_LEAKS_BEGIN() __lsan_disable()
#define LIBRARY_LEAKS_END() __lsan_enable()
#else
#define LIBRARY_LEAKS_BEGIN() ((void)0)
#define LIBRARY_LEAKS_END() ((void)0)
#endif

static char why[2048];

/* The call returns EM_OK; otherwise the check fails with the message in why. */
#define LIB_OK(call) CHECK((call) == EM_OK, "%s", why)

/* Library id is there; otherwise one counted skip saying why. */
static int have(emk_libs *L, emk_lib_id id) {
  if (emk_libs_load(L, id, why, sizeof why) == EM_OK) return 1;
  check_skip(why);
  return 0;
}

static emk_libs *open_libs(void) {
  emk_libs *L = NULL;
  if (emk_libs_open(&L, why, sizeof why) != EM_OK) {
    printf("  emk_libs_open: %s\n", why);
    return NULL;
  }
  return L;
}

/* -- Versions ---------------------------------------------------------------------- */

static void test_versions(emk_libs *L) {
  /* The major version each library must have, whatever the headers say. */
  static const int want_major[EMK_LIB_COUNT] = {13, 13, 9, 2};
  for (int id = 0; id < EMK_LIB_COUNT; id++) {
    emk_lib_version v;
    if (!have(L, (emk_lib_id)id)) continue;
    LIB_OK(emk_libs_version(L, (emk_lib_id)id, &v, why, sizeof why));
    const char *path = emk_libs_path(L, (emk_lib_id)id);
    printf("     %s %d.%d.%d (code %d) from %s\n", emk_lib_name((emk_lib_id)id), v.major,
           v.minor, v.patch, v.code, path ? path : "?");
    CHECK(v.major == want_major[id] && v.major == v.built_major,
          "%s major %d, built for %d", emk_lib_name((emk_lib_id)id), v.major, v.built_major);
    CHECK(v.minor >= 0 && v.minor < 100 && v.patch >= 0 && v.patch < 100, "%d.%d.%d", v.major,
          v.minor, v.patch);
    /* The code re-assembles from the parts, in each library's own encoding. */
    int code = id == EMK_LIB_CUDART ? v.major * 1000 + v.minor * 10
                                    : v.major * 10000 + v.minor * 100 + v.patch;
    CHECK(code == v.code, "%s: code %d, parts give %d", emk_lib_name((emk_lib_id)id), v.code,
          code);
    CHECK(path && access(path, R_OK) == 0, "loaded from %s", path ? path : "(null)");
  }
}

/* Without a driver the runtime still answers its version; the device count is a
** clean error, never a crash, and zero. */
static void test_driver_and_devices(emk_libs *L) {
  if (!have(L, EMK_LIB_CUDART)) return;
  int drv = -1, n = -1;
  LIB_OK(emk_libs_driver_version(L, &drv, why, sizeof why));
  CHECK(drv >= 0, "driver version %d", drv);
  em_status st = emk_libs_device_count(L, &n, why, sizeof why);
  printf("     driver %d; device count: %s%d%s%s\n", drv, st ? "error, " : "", n,
         st ? ": " : "", st ? why : "");
  CHECK(n >= 0, "count %d", n);
  if (drv == 0) {
    CHECK(st == EM_ERR_DEVICE && n == 0, "status %d, count %d", (int)st, n);
    CHECK(chk_msg_has(why, "no CUDA driver", "cudaGetDeviceCount", (char *)NULL), "%s", why);
  } else {
    CHECK(st == EM_OK || (st == EM_ERR_DEVICE && n == 0), "status %d: %s", (int)st, why);
  }
  /* Asking twice gives the same answer (no sticky state broken by the error). */
  int n2 = -1;
  em_status st2 = emk_libs_device_count(L, &n2, why, sizeof why);
  CHECK(st2 == st && n2 == n, "second call: status %d count %d", (int)st2, n2);
}

/* -- cuDNN ---------------------------------------------------------------------------- */

/* out = floor((in + 2 pad - dil (k - 1) - 1) / stride) + 1, as PyTorch documents it. */
static int conv_out(int in, int k, int pad, int stride, int dil) {
  return (in + 2 * pad - dil * (k - 1) - 1) / stride + 1;
}

/* ember's own conv2d (CPU) on zeros: the output shape it makes. */
static int ember_conv_shape(em_state *S, const emk_conv2d_shape *sh, int64_t out[4]) {
  em_tensor *x = NULL, *w = NULL, *y = NULL;
  int ok = 0;
  int64_t xs[4] = {sh->n, sh->c, sh->h, sh->w}, ws[4] = {sh->k, sh->c, sh->r, sh->s};
  int64_t stride[2] = {sh->stride_h, sh->stride_w}, pad[2] = {sh->pad_h, sh->pad_w},
          dil[2] = {sh->dil_h, sh->dil_w};
  if (em_full(S, xs, 4, 0, EM_FLOAT32, EM_CPU, &x) == EM_OK &&
      em_full(S, ws, 4, 0, EM_FLOAT32, EM_CPU, &w) == EM_OK &&
      em_conv2d(S, x, w, NULL, stride, pad, dil, 1, &y) == EM_OK && em_tensor_ndim(y) == 4) {
    memcpy(out, em_tensor_sizes(y), 4 * sizeof(int64_t));
    ok = 1;
  } else {
    printf("  em_conv2d: %s\n", em_errmsg(S));
  }
  if (y) em_tensor_release(y);
  if (w) em_tensor_release(w);
  if (x) em_tensor_release(x);
  return ok;
}

static void test_cudnn_descriptors(emk_libs *L, em_state *S) {
  if (!have(L, EMK_LIB_CUDNN)) return;
  static const emk_conv2d_shape shapes[] = {
    /* n  c   h   w   k  r  s  pad   stride dil */
    {2, 3, 32, 32, 8, 3, 3, 1, 1, 2, 2, 1, 1},     /* the brief's: 2x8x16x16 */
    {1, 1, 5, 5, 1, 3, 3, 0, 0, 1, 1, 1, 1},
    {4, 16, 28, 20, 32, 5, 3, 2, 1, 1, 2, 1, 1},   /* rectangular everything */
    {3, 8, 17, 13, 4, 3, 3, 2, 2, 3, 2, 2, 2},     /* dilated, strides not dividing */
    {1, 2, 7, 9, 6, 1, 1, 0, 0, 2, 3, 1, 1},       /* 1x1 */
    {2, 4, 10, 10, 5, 4, 2, 3, 0, 1, 1, 3, 1},     /* even filter, dilation 3 */
  };
  for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
    const emk_conv2d_shape *sh = &shapes[i];
    emk_conv2d_check c;
    if (!LIB_OK(emk_cudnn_conv2d_check(L, sh, &c, why, sizeof why))) {
      printf("    %s\n", why);
      continue;
    }
    int p = conv_out(sh->h, sh->r, sh->pad_h, sh->stride_h, sh->dil_h);
    int q = conv_out(sh->w, sh->s, sh->pad_w, sh->stride_w, sh->dil_w);
    CHECK(c.out[0] == sh->n && c.out[1] == sh->k && c.out[2] == p && c.out[3] == q,
          "shape %zu: cuDNN says %dx%dx%dx%d, the formula %dx%dx%dx%d", i, c.out[0], c.out[1],
          c.out[2], c.out[3], sh->n, sh->k, p, q);
    if (i == 0)
      CHECK(c.out[0] == 2 && c.out[1] == 8 && c.out[2] == 16 && c.out[3] == 16,
            "%dx%dx%dx%d", c.out[0], c.out[1], c.out[2], c.out[3]);
    int64_t mine[4];
    if (CHECK(ember_conv_shape(S, sh, mine), "ember's conv2d on shape %zu", i))
      CHECK(mine[0] == c.out[0] && mine[1] == c.out[1] && mine[2] == c.out[2] &&
            mine[3] == c.out[3], "shape %zu: ember %lldx%lldx%lldx%lld, cuDNN %dx%dx%dx%d", i,
            (long long)mine[0], (long long)mine[1], (long long)mine[2], (long long)mine[3],
            c.out[0], c.out[1], c.out[2], c.out[3]);
    /* What the descriptors hold, read back: packed NCHW strides. */
    const int *in = c.input;
    CHECK(in[0] == sh->n && in[1] == sh->c && in[2] == sh->h && in[3] == sh->w,
          "tensor %dx%dx%dx%d", in[0], in[1], in[2], in[3]);
    CHECK(in[4] == sh->c * sh->h * sh->w && in[5] == sh->h * sh->w && in[6] == sh->w &&
          in[7] == 1, "strides %d %d %d %d", in[4], in[5], in[6], in[7]);
    CHECK(c.filter[0] == sh->k && c.filter[1] == sh->c && c.filter[2] == sh->r &&
          c.filter[3] == sh->s, "filter %dx%dx%dx%d", c.filter[0], c.filter[1], c.filter[2],
          c.filter[3]);
    CHECK(c.conv[0] == sh->pad_h && c.conv[1] == sh->pad_w && c.conv[2] == sh->stride_h &&
          c.conv[3] == sh->stride_w && c.conv[4] == sh->dil_h && c.conv[5] == sh->dil_w,
          "conv pad %d,%d stride %d,%d dilation %d,%d", c.conv[0], c.conv[1], c.conv[2],
          c.conv[3], c.conv[4], c.conv[5]);
  }
  /* Shapes cuDNN refuses: its own words come back, naming the call. */
  emk_conv2d_check c;
  emk_conv2d_shape big = {1, 1, 2, 2, 1, 5, 5, 0, 0, 1, 1, 1, 1};   /* filter > input */
  em_status st = emk_cudnn_conv2d_check(L, &big, &c, why, sizeof why);
  printf("     5x5 filter on 2x2: %s\n", st ? why : "accepted");
  CHECK(st == EM_ERR_SHAPE &&
        chk_msg_has(why, "cuDNN", "cudnnGetConvolution2dForwardOutputDim", "CUDNN_STATUS_BAD_PARAM",
                    (char *)NULL), "status %d: %s", (int)st, why);
  emk_conv2d_shape zero_stride = {1, 1, 8, 8, 1, 3, 3, 1, 1, 0, 1, 1, 1};
  st = emk_cudnn_conv2d_check(L, &zero_stride, &c, why, sizeof why);
  CHECK(st == EM_ERR_SHAPE &&
        chk_msg_has(why, "cudnnSetConvolution2dDescriptor", "stride 0x1", "CUDNN_STATUS_BAD_PARAM",
                    (char *)NULL), "status %d: %s", (int)st, why);
  emk_conv2d_shape neg = {1, -3, 8, 8, 1, 3, 3, 1, 1, 1, 1, 1, 1};
  st = emk_cudnn_conv2d_check(L, &neg, &c, why, sizeof why);
  printf("     c = -3: %s\n", st ? why : "accepted");
  CHECK(st == EM_ERR_SHAPE && chk_msg_has(why, "cudnnSetTensor4dDescriptor", "1x-3x8x8",
                                          (char *)NULL), "status %d: %s", (int)st, why);
}

/* A handle needs a device: it works, or says why naming the call. */
static void test_handles(emk_libs *L) {
  if (emk_libs_load(L, EMK_LIB_CUDNN, why, sizeof why) == EM_OK) {
    em_status st = emk_cudnn_check_handle(L, why, sizeof why);
    printf("     cudnnCreate: %s\n", st ? why : "ok");
    CHECK(st == EM_OK || (st == EM_ERR_DEVICE && chk_msg_has(why, "cuDNN", "cudnnCreate",
                                                             "CUDNN_STATUS_", (char *)NULL)),
          "status %d: %s", (int)st, why);
  } else {
    check_skip(why);
  }
  if (emk_libs_load(L, EMK_LIB_CUBLASLT, why, sizeof why) == EM_OK) {
    LIBRARY_LEAKS_BEGIN();
    em_status st = emk_cublaslt_check_handle(L, why, sizeof why);
    LIBRARY_LEAKS_END();
    printf("     cublasLtCreate: %s\n", st ? why : "ok");
    CHECK(st == EM_OK || (st == EM_ERR_DEVICE && chk_msg_has(why, "cuBLASLt", "cublasLtCreate",
                                                             "CUBLAS_STATUS_", (char *)NULL)),
          "status %d: %s", (int)st, why);
  } else {
    check_skip(why);
  }
}

/* -- cuBLASLt ----------------------------------------------------------------------------- */

static void test_cublaslt_descriptors(emk_libs *L) {
  if (!have(L, EMK_LIB_CUBLASLT)) return;
  static const emk_gemm_shape shapes[] = {
    /* m    n    k  ta tb row-major */
    {64, 48, 32, 0, 0, 1},
    {64, 48, 32, 0, 0, 0},
    {64, 48, 32, 1, 0, 1},
    {64, 48, 32, 0, 1, 0},
    {7, 1000, 3, 1, 1, 1},
    {1, 1, 4096, 1, 1, 0},
  };
  for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
    const emk_gemm_shape *sh = &shapes[i];
    emk_gemm_check g;
    if (!LIB_OK(emk_cublaslt_gemm_check(L, sh, &g, why, sizeof why))) {
      printf("    %s\n", why);
      continue;
    }
    CHECK(g.trans_a == sh->trans_a && g.trans_b == sh->trans_b, "shape %zu: trans %d %d", i,
          g.trans_a, g.trans_b);
    CHECK(g.compute_type == 68 && g.scale_type == 0, "compute %d (CUBLAS_COMPUTE_32F = 68), "
          "scale %d (CUDA_R_32F = 0)", g.compute_type, g.scale_type);
    /* Stored shapes, computed here: A is m x k, B k x n, C m x n, each stored
    ** transposed when its op is T; ld is the stored row length in row-major
    ** order, the stored column length in column-major. */
    int64_t rows[3] = {sh->trans_a ? sh->k : sh->m, sh->trans_b ? sh->n : sh->k, sh->m};
    int64_t cols[3] = {sh->trans_a ? sh->m : sh->k, sh->trans_b ? sh->k : sh->n, sh->n};
    const emk_gemm_layout *lay[3] = {&g.a, &g.b, &g.c};
    for (int j = 0; j < 3; j++) {
      int64_t ld = sh->row_major ? cols[j] : rows[j];
      CHECK((int64_t)lay[j]->rows == rows[j] && (int64_t)lay[j]->cols == cols[j] &&
            lay[j]->ld == ld, "shape %zu matrix %c: %llux%llu ld %lld, want %lldx%lld ld %lld",
            i, "ABC"[j], (unsigned long long)lay[j]->rows, (unsigned long long)lay[j]->cols,
            (long long)lay[j]->ld, (long long)rows[j], (long long)cols[j], (long long)ld);
      CHECK(lay[j]->order == (sh->row_major ? 1 : 0) && lay[j]->type == 0,
            "order %d type %u", (int)lay[j]->order, (unsigned)lay[j]->type);
    }
  }
  /* cuBLASLt would take m = -1 as 2^64 - 1 rows: refused before it is asked. */
  emk_gemm_shape neg = {-1, 4, 4, 0, 0, 0};
  emk_gemm_check g;
  em_status st = emk_cublaslt_gemm_check(L, &neg, &g, why, sizeof why);
  CHECK(st == EM_ERR_SHAPE && chk_msg_has(why, "cuBLASLt", "m -1", (char *)NULL),
        "status %d: %s", (int)st, why);
}

/* -- NCCL ------------------------------------------------------------------------------- */

static void test_nccl_ids(emk_libs *L) {
  if (!have(L, EMK_LIB_NCCL)) return;
  unsigned char a[EMK_NCCL_ID_BYTES], b[EMK_NCCL_ID_BYTES];
  REQUIRE(emk_nccl_unique_id(L, a, why, sizeof why) == EM_OK, "%s", why);
  REQUIRE(emk_nccl_unique_id(L, b, why, sizeof why) == EM_OK, "%s", why);
  int nonzero_a = 0, nonzero_b = 0;
  for (int i = 0; i < EMK_NCCL_ID_BYTES; i++) nonzero_a += a[i] != 0, nonzero_b += b[i] != 0;
  CHECK(nonzero_a > 0 && nonzero_b > 0, "non-zero bytes: %d, %d", nonzero_a, nonzero_b);
  CHECK(memcmp(a, b, sizeof a) != 0, "two ids are the same");
  printf("     id: ");
  for (int i = 0; i < 16; i++) printf("%02x", a[i]);
  printf("...\n");
}

/* -- Describe and the --info text ----------------------------------------------------------- */

static void test_describe(emk_libs *L) {
  char buf[4096];
  LIB_OK(emk_libs_describe(L, buf, sizeof buf));
  int lines = 0;
  for (const char *p = buf; *p; p++) lines += *p == '\n';
  CHECK(lines == EMK_LIB_COUNT && buf[strlen(buf) - 1] == '\n', "%d lines:\n%s", lines, buf);
  printf("%s", buf);
  for (int id = 0; id < EMK_LIB_COUNT; id++) {
    char head[64];
    emk_lib_version v;
    if (emk_libs_version(L, (emk_lib_id)id, &v, why, sizeof why) == EM_OK) {
      snprintf(head, sizeof head, "%s %d.%d", emk_lib_name((emk_lib_id)id), v.major, v.minor);
      const char *path = emk_libs_path(L, (emk_lib_id)id), *slash = strrchr(path, '/');
      CHECK(strstr(buf, head) && (!slash || strstr(buf, slash + 1)), "no \"%s\" in:\n%s", head,
            buf);
    } else {
      CHECK(strstr(buf, why) != NULL, "no \"%s\" in:\n%s", why, buf);
    }
  }
  if (emk_libs_load(L, EMK_LIB_CUDART, why, sizeof why) == EM_OK) {
    int drv = 0;
    emk_libs_driver_version(L, &drv, why, sizeof why);
    CHECK(drv ? strstr(buf, "; driver ") != NULL : strstr(buf, "driver: none (no GPU)") != NULL,
          "%s", buf);
  }
  /* Too small a buffer: truncated, still a line. */
  char small[24];
  LIB_OK(emk_libs_describe(L, small, sizeof small));
  CHECK(strlen(small) == sizeof small - 1 && small[sizeof small - 2] == '\n', "\"%s\"", small);
  CHECK(emk_libs_describe(L, small, 0) == EM_ERR_ARG, "len 0");

  /* The public call, as `ember --info` makes it. */
  char info[4096];
  LIB_OK(em_cuda_libs_info(info, sizeof info));
  CHECK(strcmp(info, buf) == 0, "em_cuda_libs_info:\n%s\nemk_libs_describe:\n%s", info, buf);
  CHECK(em_cuda_libs_info(NULL, 10) == EM_ERR_ARG, "NULL buffer");
}

/* -- Laziness, and loading from several threads at once ------------------------------------ */

static void test_lazy(void) {
  emk_libs *L = open_libs();
  REQUIRE(L != NULL, "open");
  for (int id = 0; id < EMK_LIB_COUNT; id++)
    CHECK(emk_libs_path(L, (emk_lib_id)id) == NULL, "%s loaded before use",
          emk_lib_name((emk_lib_id)id));
  if (emk_libs_load(L, EMK_LIB_NCCL, why, sizeof why) == EM_OK) {
    CHECK(emk_libs_path(L, EMK_LIB_NCCL) != NULL, "NCCL path");
    CHECK(emk_libs_path(L, EMK_LIB_CUDNN) == NULL && emk_libs_path(L, EMK_LIB_CUBLASLT) == NULL,
          "loading NCCL loaded others");
  }
  CHECK(emk_libs_load(L, EMK_LIB_COUNT, why, sizeof why) == EM_ERR_ARG, "no such library");
  emk_libs_close(L);
  emk_libs_close(NULL);
}

typedef struct race_arg {
  emk_libs *L;
  const emk_cudnn_fns *fns;
  em_status st;
} race_arg;

static void *race_load(void *p) {
  race_arg *a = p;
  char err[512];
  a->st = emk_libs_cudnn(a->L, &a->fns, err, sizeof err);
  return NULL;
}

static void test_threads(void) {
  emk_libs *L = open_libs();
  REQUIRE(L != NULL, "open");
  enum { T = 6 };
  pthread_t th[T];
  race_arg args[T];
  for (int i = 0; i < T; i++) {
    args[i] = (race_arg){L, NULL, EM_ERR_INTERNAL};
    CHECK(pthread_create(&th[i], NULL, race_load, &args[i]) == 0, "pthread_create");
  }
  for (int i = 0; i < T; i++) pthread_join(th[i], NULL);
  for (int i = 1; i < T; i++)
    CHECK(args[i].st == args[0].st && args[i].fns == args[0].fns, "thread %d: %d %p", i,
          (int)args[i].st, (const void *)args[i].fns);
  CHECK((args[0].st == EM_OK) == (args[0].fns != NULL), "table iff loaded");
  emk_libs_close(L);
}

/* -- The search: EMBER_CUDA_HOME, the messages -------------------------------------------- */

static char scratch[64];

static void test_bad_home(void) {
  setenv("EMBER_CUDA_HOME", "/nonexistent/ember-cuda", 1);
  emk_libs *L = open_libs();
  unsetenv("EMBER_CUDA_HOME");
  REQUIRE(L != NULL, "open");
  /* The default places still serve. */
  emk_libs *D = open_libs();
  REQUIRE(D != NULL, "open");
  for (int id = 0; id < EMK_LIB_COUNT; id++) {
    char dwhy[1024];
    em_status want = emk_libs_load(D, (emk_lib_id)id, dwhy, sizeof dwhy);
    em_status got = emk_libs_load(L, (emk_lib_id)id, why, sizeof why);
    CHECK(got == want, "%s: %d with a bad EMBER_CUDA_HOME, %d without: %s",
          emk_lib_name((emk_lib_id)id), (int)got, (int)want, why);
    if (!got && !want)
      CHECK(strcmp(emk_libs_path(L, (emk_lib_id)id), emk_libs_path(D, (emk_lib_id)id)) == 0,
            "%s vs %s", emk_libs_path(L, (emk_lib_id)id), emk_libs_path(D, (emk_lib_id)id));
  }
  /* A library that is nowhere: every place tried is named. */
  const char *names[] = {"libember_nosuch.so.1", "libember_nosuch.so", NULL};
  void *dl = (void *)1;
  char path[256] = "untouched";
  em_status st = emk_libs_find(L, names, &dl, path, sizeof path, why, sizeof why);
  printf("     %s\n", why);
  CHECK(st == EM_ERR_UNSUPPORTED && dl == NULL, "status %d", (int)st);
  CHECK(chk_msg_has(why, "libember_nosuch.so.1 or libember_nosuch.so", "not found",
                    "/nonexistent/ember-cuda/lib64 (EMBER_CUDA_HOME: no such directory)",
                    "/usr/local/cuda/lib64", "system search path", (char *)NULL), "%s", why);
  st = emk_libs_find(D, names, &dl, path, sizeof path, why, sizeof why);
  CHECK(st == EM_ERR_UNSUPPORTED && !strstr(why, "EMBER_CUDA_HOME") &&
        strstr(why, "/usr/local/cuda/lib64"), "without EMBER_CUDA_HOME: %s", why);
  emk_libs_close(D);
  emk_libs_close(L);
}

/* An EMBER_CUDA_HOME whose files are wrong: a file that is no library is passed
** over (and named); a library that lacks the functions is refused, naming them,
** and fails only its own users. */
static void test_wrong_files(void) {
  snprintf(scratch, sizeof scratch, "/tmp/ember-cuda-XXXXXX");
  REQUIRE(mkdtemp(scratch) != NULL, "mkdtemp");
  char dir[128], file[192];
  snprintf(dir, sizeof dir, "%s/lib64", scratch);
  REQUIRE(mkdir(dir, 0755) == 0, "mkdir %s", dir);
  snprintf(file, sizeof file, "%s/libember_garbage.so.1", dir);
  FILE *f = fopen(file, "w");
  REQUIRE(f != NULL, "fopen %s", file);
  fputs("not an ELF file\n", f);
  fclose(f);

  setenv("EMBER_CUDA_HOME", scratch, 1);
  emk_libs *L = open_libs();
  unsetenv("EMBER_CUDA_HOME");
  REQUIRE(L != NULL, "open");
  const char *names[] = {"libember_garbage.so.1", NULL};
  void *dl;
  em_status st = emk_libs_find(L, names, &dl, NULL, 0, why, sizeof why);
  printf("     %s\n", why);
  CHECK(st == EM_ERR_UNSUPPORTED &&
        chk_msg_has(why, "libember_garbage.so.1 not loaded", "dlopen: ", file, (char *)NULL),
        "%s", why);
  CHECK(!strstr(why, "no such directory"), "the directory exists: %s", why);

  /* libnccl.so.2 that is really the CUDA runtime. */
  char real[256], link[192];
  int linked = 0;
  emk_libs *D = open_libs();
  if (D && emk_libs_load(D, EMK_LIB_CUDART, why, sizeof why) == EM_OK) {
    snprintf(real, sizeof real, "%s", emk_libs_path(D, EMK_LIB_CUDART));
    snprintf(link, sizeof link, "%s/libnccl.so.2", dir);
    linked = symlink(real, link) == 0;
  }
  emk_libs_close(D);
  if (linked) {
    st = emk_libs_load(L, EMK_LIB_NCCL, why, sizeof why);
    printf("     %s\n", why);
    /* The runtime is loaded already: the dynamic linker gives that same file back
    ** (named by its first path), so the message names the real one or the link. */
    CHECK(st == EM_ERR_UNSUPPORTED &&
          chk_msg_has(why, "NCCL: ", "has no ncclGetVersion", (char *)NULL) &&
          (strstr(why, link) || strstr(why, real)), "%s", why);
    char again[1024];
    CHECK(emk_libs_load(L, EMK_LIB_NCCL, again, sizeof again) == EM_ERR_UNSUPPORTED &&
          strcmp(again, why) == 0, "the failure is remembered: %s", again);
    unsigned char id[EMK_NCCL_ID_BYTES];
    CHECK(emk_nccl_unique_id(L, id, again, sizeof again) == EM_ERR_UNSUPPORTED &&
          strcmp(again, why) == 0, "%s", again);
    /* The other libraries do not mind. */
    LIB_OK(emk_libs_load(L, EMK_LIB_CUDART, why, sizeof why));
    emk_conv2d_shape sh = {2, 3, 32, 32, 8, 3, 3, 1, 1, 2, 2, 1, 1};
    emk_conv2d_check c;
    if (emk_libs_load(L, EMK_LIB_CUDNN, why, sizeof why) == EM_OK)
      LIB_OK(emk_cudnn_conv2d_check(L, &sh, &c, why, sizeof why));
    unlink(link);
  } else {
    check_skip("the wrong-library case: no CUDA runtime to link to");
  }
  emk_libs_close(L);
  unlink(file);
  rmdir(dir);
  rmdir(scratch);
}

int main(void) {
  emk_libs *L = NULL;
  if (emk_libs_open(&L, why, sizeof why) != EM_OK) return check_skip_all(why);
  em_state *S = NULL;
  if (em_open(&S, NULL) != EM_OK) {
    printf("em_open failed\n");
    return 1;
  }
  RUN(test_versions, L);
  RUN(test_driver_and_devices, L);
  RUN(test_cudnn_descriptors, L, S);
  RUN(test_handles, L);
  RUN(test_cublaslt_descriptors, L);
  RUN(test_nccl_ids, L);
  RUN(test_describe, L);
  RUN(test_lazy);
  RUN(test_threads);
  RUN(test_bad_home);
  RUN(test_wrong_files);
  emk_libs_close(L);
  em_close(S);
  return check_done();
}
