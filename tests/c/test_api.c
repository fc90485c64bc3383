/*
** test_api.c -- the C API used the way a C host uses it, without Lua: states and
** configs, dtype facts and promotion, creation, views that alias their base,
** broadcasting, dtype conversion (float16/bfloat16 rounding included), error
** statuses and messages, a few values of every op family, random streams, and two
** states side by side (also on two threads at once).
**
** Expected values were worked out by hand or with PyTorch 1.13 (noted where it
** matters); the exhaustive op-by-op comparison with PyTorch lives in the Lua
** fixture tests (tests/fixtures/).
*/
#include "check.h"
#include <pthread.h>

static em_state *open_state(int threads, uint64_t seed) {
  em_config cfg;
  em_config_init(&cfg);
  cfg.num_threads = threads;
  cfg.seed = seed;
  em_state *S = NULL;
  if (em_open(&S, &cfg) != EM_OK) return NULL;
  return S;
}

/* float32 [3,4] holding 0..11 (arange then view), the base of many tests. */
static em_status iota34(em_state *S, em_tensor **out) {
  return t_make(S, out, EM_FLOAT32, SHP(3, 4), V(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11));
}

/* -- State --------------------------------------------------------------------- */

static void test_state(void) {
  em_state *S = NULL;
  CHECK(em_open(NULL, NULL) == EM_ERR_ARG, "em_open(NULL) must fail with EM_ERR_ARG");
  CHECK(em_errmsg(NULL) != NULL && *em_errmsg(NULL), "em_errmsg(NULL) gives a message");
  REQUIRE_OK(NULL, em_open(&S, NULL));                /* NULL config = defaults */
  CHECK(em_get_num_threads(S) >= 1);
  CHECK(em_memory_allocated(S) == 0, "fresh state holds %lld bytes",
        (long long)em_memory_allocated(S));
  em_close(S);

  S = open_state(3, 42);
  REQUIRE(S != NULL, "em_open with a config");
  CHECK(em_get_num_threads(S) == 3, "threads %d", em_get_num_threads(S));
  CHECK_OK(S, em_set_num_threads(S, 1));
  CHECK(em_get_num_threads(S) == 1);
  CHECK_OK(S, em_set_num_threads(S, 2));
  CHECK(em_get_num_threads(S) == 2);
  CHECK_ERR(S, em_set_num_threads(S, 0), EM_ERR_ARG, "set_num_threads");
  CHECK(em_get_num_threads(S) == 2, "a failed set_num_threads changes nothing");
  CHECK(em_version() && em_version()[0] >= '0' && em_version()[0] <= '9');
  CHECK(em_build_info() && strstr(em_build_info(), "cpu"));
  /* The seed in the config is the RNG's seed. */
  uint64_t seed = 0, off = 1;
  em_rng_get_state(S, &seed, &off);
  CHECK(seed == 42 && off == 0, "rng state (%llu, %llu) after open with seed 42",
        (unsigned long long)seed, (unsigned long long)off);
  em_close(S);
  em_close(NULL);                                     /* harmless */
}

/* -- Dtype facts ---------------------------------------------------------------- */

static void test_dtypes(em_state *S) {
  static const char *names[] = {"float32", "float64", "float16", "bfloat16",
                                "int32", "int64", "uint8", "bool"};
  static const size_t sizes[] = {4, 8, 2, 2, 4, 8, 1, 1};
  for (int i = 0; i < EM_NUM_DTYPES; i++) {
    em_dtype dt = (em_dtype)i, back = EM_BOOL;
    CHECK(strcmp(em_dtype_name(dt), names[i]) == 0, "name of %d: %s", i, em_dtype_name(dt));
    CHECK(em_dtype_size(dt) == sizes[i], "size of %s", names[i]);
    CHECK(em_dtype_is_floating(dt) == (i < 4), "is_floating(%s)", names[i]);
    CHECK_OK(S, em_dtype_from_name(S, names[i], &back));
    CHECK(back == dt, "from_name(%s)", names[i]);
  }
  static const struct { const char *n; em_dtype dt; } aliases[] = {
    {"float", EM_FLOAT32}, {"double", EM_FLOAT64}, {"half", EM_FLOAT16},
    {"int", EM_INT32}, {"long", EM_INT64}, {"byte", EM_UINT8}};
  for (size_t i = 0; i < sizeof aliases / sizeof *aliases; i++) {
    em_dtype dt = EM_BOOL;
    CHECK_OK(S, em_dtype_from_name(S, aliases[i].n, &dt));
    CHECK(dt == aliases[i].dt, "alias %s", aliases[i].n);
  }
  em_dtype dt = EM_INT32;
  CHECK_ERR(S, em_dtype_from_name(S, "float33", &dt), EM_ERR_DTYPE, "float33");
  CHECK(dt == EM_INT32, "a failed lookup leaves *dt alone");

  /* torch.promote_types(row, column), in em_dtype order. */
  static const em_dtype P[8][8] = {
    {EM_FLOAT32, EM_FLOAT64, EM_FLOAT32, EM_FLOAT32, EM_FLOAT32, EM_FLOAT32, EM_FLOAT32, EM_FLOAT32},
    {EM_FLOAT64, EM_FLOAT64, EM_FLOAT64, EM_FLOAT64, EM_FLOAT64, EM_FLOAT64, EM_FLOAT64, EM_FLOAT64},
    {EM_FLOAT32, EM_FLOAT64, EM_FLOAT16, EM_FLOAT32, EM_FLOAT16, EM_FLOAT16, EM_FLOAT16, EM_FLOAT16},
    {EM_FLOAT32, EM_FLOAT64, EM_FLOAT32, EM_BFLOAT16, EM_BFLOAT16, EM_BFLOAT16, EM_BFLOAT16, EM_BFLOAT16},
    {EM_FLOAT32, EM_FLOAT64, EM_FLOAT16, EM_BFLOAT16, EM_INT32, EM_INT64, EM_INT32, EM_INT32},
    {EM_FLOAT32, EM_FLOAT64, EM_FLOAT16, EM_BFLOAT16, EM_INT64, EM_INT64, EM_INT64, EM_INT64},
    {EM_FLOAT32, EM_FLOAT64, EM_FLOAT16, EM_BFLOAT16, EM_INT32, EM_INT64, EM_UINT8, EM_UINT8},
    {EM_FLOAT32, EM_FLOAT64, EM_FLOAT16, EM_BFLOAT16, EM_INT32, EM_INT64, EM_UINT8, EM_BOOL},
  };
  for (int a = 0; a < 8; a++)
    for (int b = 0; b < 8; b++)
      CHECK(em_dtype_promote((em_dtype)a, (em_dtype)b) == P[a][b], "promote(%s, %s) = %s",
            names[a], names[b], em_dtype_name(em_dtype_promote((em_dtype)a, (em_dtype)b)));
}

/* -- Creation ------------------------------------------------------------------------ */

static void test_creation(em_state *S) {
  em_tensor *t = NULL, *u = NULL;
  int64_t before = em_memory_allocated(S);
  REQUIRE_OK(S, em_empty(S, SHP(2, 3, 4), EM_FLOAT32, EM_CPU, &t));
  CHECK_SHAPE(t, SHP(2, 3, 4));
  CHECK(em_tensor_numel(t) == 24);
  CHECK(em_tensor_stride(t, 0) == 12 && em_tensor_stride(t, 1) == 4 &&
        em_tensor_stride(t, 2) == 1, "contiguous strides");
  CHECK(em_tensor_stride(t, -1) == 1, "negative dim counts from the end");
  CHECK(em_tensor_offset(t) == 0 && em_tensor_is_contiguous(t));
  CHECK(em_tensor_device(t) == EM_CPU && em_tensor_dtype(t) == EM_FLOAT32);
  CHECK(((uintptr_t)em_tensor_data(t) & 15) == 0, "data is at least 16-byte aligned");
  CHECK(em_memory_allocated(S) >= before + 96, "memory accounting counts the storage");
  em_tensor_release(t);
  CHECK(em_memory_allocated(S) == before, "released storage is uncounted");

  /* full in every dtype */
  static const double fillv[EM_NUM_DTYPES] = {1.5, -2.25, 0.5, 3.0, -7, 1LL << 40, 200, 1};
  for (int i = 0; i < EM_NUM_DTYPES; i++) {
    REQUIRE_OK(S, em_full(S, SHP(2, 2), fillv[i], (em_dtype)i, EM_CPU, &t));
    CHECK_DTYPE(t, (em_dtype)i);
    CHECK_VALS(t, 0, V(fillv[i], fillv[i], fillv[i], fillv[i]));
    em_tensor_release(t);
  }

  /* 0-d tensor and item */
  double d = 0;
  int64_t n = 0;
  REQUIRE_OK(S, em_full(S, NULL, 0, 2.5, EM_FLOAT64, EM_CPU, &t));
  CHECK(em_tensor_ndim(t) == 0 && em_tensor_numel(t) == 1, "0-d tensor has one element");
  CHECK_OK(S, em_tensor_item(S, t, &d));
  CHECK(d == 2.5);
  em_tensor_release(t);
  REQUIRE_OK(S, em_full(S, SHP(1, 1), 9007199254740993.0, EM_INT64, EM_CPU, &t));
  *(int64_t *)em_tensor_data(t) = 9007199254740993LL;     /* 2^53 + 1: not a double */
  CHECK_OK(S, em_tensor_item_int(S, t, &n));
  CHECK(n == 9007199254740993LL, "item_int keeps all 64 bits: %lld", (long long)n);
  em_tensor_release(t);

  /* zero-size tensors are fine */
  REQUIRE_OK(S, em_full(S, SHP(0, 3), 1, EM_FLOAT32, EM_CPU, &t));
  CHECK(em_tensor_numel(t) == 0 && em_tensor_size(t, 1) == 3);
  em_tensor_release(t);

  /* from_data converts from the source dtype */
  REQUIRE_OK(S, t_make(S, &t, EM_INT32, SHP(2, 2), V(1.9, -1.9, 7, 0.2)));
  CHECK_VALS(t, 0, V(1, -1, 7, 0));           /* truncation toward zero, as C/torch */
  em_tensor_release(t);
  static const int32_t raw[3] = {4, -5, 6};
  REQUIRE_OK(S, em_from_data(S, SHP(3), EM_FLOAT64, raw, EM_INT32, &t));
  CHECK_VALS(t, 0, V(4, -5, 6));
  em_tensor_release(t);

  /* arange: stop exclusive; length ceil((stop - start) / step) as torch */
  REQUIRE_OK(S, em_arange(S, 0, 5, 1, EM_INT64, EM_CPU, &t));
  CHECK_DTYPE(t, EM_INT64);
  CHECK_VALS(t, 0, V(0, 1, 2, 3, 4));
  em_tensor_release(t);
  REQUIRE_OK(S, em_arange(S, 0, 1, 0.1, EM_FLOAT32, EM_CPU, &t));
  CHECK(em_tensor_numel(t) == 10, "arange(0, 1, 0.1) has %lld elements",
        (long long)em_tensor_numel(t));
  CHECK_CLOSE(t_get(t, 9), 0.9, 1e-6);
  em_tensor_release(t);
  REQUIRE_OK(S, em_arange(S, 5, 0, -1.5, EM_FLOAT64, EM_CPU, &t));
  CHECK_VALS(t, 0, V(5, 3.5, 2, 0.5));
  em_tensor_release(t);
  REQUIRE_OK(S, em_arange(S, 3, 3, 1, EM_FLOAT32, EM_CPU, &t));
  CHECK(em_tensor_numel(t) == 0 && em_tensor_ndim(t) == 1, "empty arange is 1-D [0]");
  em_tensor_release(t);

  /* eye */
  REQUIRE_OK(S, em_eye(S, 3, 3, EM_FLOAT32, EM_CPU, &t));
  CHECK_VALS(t, 0, V(1, 0, 0, 0, 1, 0, 0, 0, 1));
  em_tensor_release(t);
  REQUIRE_OK(S, em_eye(S, 2, 4, EM_INT64, EM_CPU, &u));
  CHECK_SHAPE(u, SHP(2, 4));
  CHECK_VALS(u, 0, V(1, 0, 0, 0, 0, 1, 0, 0));
  em_tensor_release(u);
  CHECK(em_memory_allocated(S) == before, "creation leaks nothing");
}

/* -- Views alias their base -------------------------------------------------------- */

static void test_views(em_state *S) {
  em_tensor *a = NULL, *t = NULL, *n = NULL, *s = NULL, *e = NULL, *v = NULL, *r = NULL;
  REQUIRE_OK(S, iota34(S, &a));

  REQUIRE_OK(S, em_transpose(S, a, 0, 1, &t));
  CHECK_SHAPE(t, SHP(4, 3));
  CHECK(em_tensor_stride(t, 0) == 1 && em_tensor_stride(t, 1) == 4, "transposed strides");
  CHECK(!em_tensor_is_contiguous(t) && em_tensor_same_storage(a, t));
  CHECK_VALS(t, 0, V(0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11));

  /* narrow + fill_ writes into the base */
  REQUIRE_OK(S, em_narrow(S, a, 1, 1, 2, &n));
  CHECK_SHAPE(n, SHP(3, 2));
  CHECK(em_tensor_offset(n) == 1, "narrow offset %lld", (long long)em_tensor_offset(n));
  CHECK_OK(S, em_fill_(S, n, -1));
  CHECK_VALS(a, 0, V(0, -1, -1, 3, 4, -1, -1, 7, 8, -1, -1, 11));
  CHECK_VALS(t, 0, V(0, 4, 8, -1, -1, -1, -1, -1, -1, 3, 7, 11));  /* seen through t */

  /* select gives an offset view; writing through its data pointer shows in a */
  REQUIRE_OK(S, em_select(S, a, 0, 2, &s));
  CHECK_SHAPE(s, SHP(4));
  CHECK(em_tensor_offset(s) == 8);
  ((float *)em_tensor_data(s))[3] = 100;
  CHECK(t_get(a, 11) == 100, "write through select");
  CHECK_ERR(S, em_select(S, a, 0, 3, &r), EM_ERR_INDEX, "select", "3");
  REQUIRE_OK(S, em_select(S, a, 1, -1, &r));              /* negative index wraps */
  CHECK_VALS(r, 0, V(3, 7, 100));
  em_tensor_release(r); r = NULL;

  /* expand: stride 0, one element seen many times */
  REQUIRE_OK(S, em_narrow(S, a, 0, 0, 1, &r));             /* [1,4] */
  REQUIRE_OK(S, em_expand(S, r, SHP(2, 3, -1), &e));
  CHECK_SHAPE(e, SHP(2, 3, 4));
  CHECK(em_tensor_stride(e, 0) == 0 && em_tensor_stride(e, 1) == 0);
  CHECK(t_get(e, 23) == 3 && t_get(e, 5) == -1);
  em_tensor_release(r); r = NULL;
  CHECK_ERR(S, em_expand(S, a, SHP(3, 5), &r), EM_ERR_SHAPE, "expand", "[3,4]");

  /* permute / unsqueeze / squeeze keep the storage */
  REQUIRE_OK(S, em_unsqueeze(S, a, 1, &v));
  CHECK_SHAPE(v, SHP(3, 1, 4));
  REQUIRE_OK(S, em_permute(S, v, (const int[]){2, 0, 1}, 3, &r));
  CHECK_SHAPE(r, SHP(4, 3, 1));
  CHECK(em_tensor_same_storage(r, a) && t_get(r, 1) == 4);
  em_tensor_release(v);
  REQUIRE_OK(S, em_squeeze(S, r, -1, 1, &v));
  CHECK_SHAPE(v, SHP(4, 3));
  em_tensor_release(v); em_tensor_release(r); v = r = NULL;
  CHECK_ERR(S, em_permute(S, a, (const int[]){0, 0}, 2, &r), EM_ERR_ARG, "permute");

  /* as_strided: overlapping sliding windows of a 1-D view */
  REQUIRE_OK(S, em_as_strided(S, a, (const int64_t[]){3, 2}, (const int64_t[]){1, 1}, 2, 4, &r));
  CHECK_VALS(r, 0, V(4, -1, -1, -1, -1, 7));
  em_tensor_release(r); r = NULL;
  CHECK_ERR(S, em_as_strided(S, a, (const int64_t[]){2, 2}, (const int64_t[]){8, 1}, 2, 4, &r),
            EM_ERR_INDEX, "as_strided");

  /* view needs compatible strides; reshape copies when it must */
  REQUIRE_OK(S, em_view(S, a, SHP(2, -1, 2), &v));
  CHECK_SHAPE(v, SHP(2, 3, 2));
  CHECK(em_tensor_same_storage(v, a));
  em_tensor_release(v); v = NULL;
  CHECK_ERR(S, em_view(S, t, SHP(12), &v), EM_ERR_SHAPE, "view", "[4,3]");
  CHECK_ERR(S, em_view(S, a, SHP(5, -1), &v), EM_ERR_SHAPE, "view", "[3,4]");
  REQUIRE_OK(S, em_reshape(S, t, SHP(12), &r));
  CHECK(!em_tensor_same_storage(r, a), "reshape of a transposed tensor copies");
  CHECK_VALS(r, 0, V(0, 4, 8, -1, -1, -1, -1, -1, -1, 3, 7, 100));
  em_tensor_release(r); r = NULL;
  REQUIRE_OK(S, em_reshape(S, a, SHP(6, 2), &r));
  CHECK(em_tensor_same_storage(r, a), "reshape of a contiguous tensor is a view");
  em_tensor_release(r); r = NULL;

  /* contiguous / clone / to / copy_ */
  REQUIRE_OK(S, em_contiguous(S, a, &r));
  CHECK(r == a, "contiguous of a contiguous tensor returns the same handle");
  em_tensor_release(r); r = NULL;
  REQUIRE_OK(S, em_contiguous(S, t, &r));
  CHECK(em_tensor_is_contiguous(r) && !em_tensor_same_storage(r, t));
  CHECK_VALS(r, 0, V(0, 4, 8, -1, -1, -1, -1, -1, -1, 3, 7, 100));
  em_tensor_release(r); r = NULL;
  REQUIRE_OK(S, em_to(S, a, EM_FLOAT32, EM_CPU, &r));
  CHECK(r == a, "to() with the same dtype and device returns the same handle");
  em_tensor_release(r); r = NULL;
  REQUIRE_OK(S, em_clone(S, t, &r));
  CHECK(!em_tensor_same_storage(r, a));
  CHECK_SHAPE(r, SHP(4, 3));
  CHECK_VALS(r, 0, V(0, 4, 8, -1, -1, -1, -1, -1, -1, 3, 7, 100));
  em_tensor_release(r); r = NULL;
  /* copy_ into a transposed view broadcasts src and writes through to a */
  REQUIRE_OK(S, t_make(S, &r, EM_INT64, SHP(3), V(10, 20, 30)));
  CHECK_OK(S, em_copy_(S, t, r));
  CHECK_VALS(a, 0, V(10, 10, 10, 10, 20, 20, 20, 20, 30, 30, 30, 30));
  em_tensor_release(r); r = NULL;

  /* views keep the storage alive after the base handle is gone */
  em_tensor_release(a);
  CHECK_VALS(n, 0, V(10, 10, 20, 20, 30, 30));
  em_tensor_release(n); em_tensor_release(s); em_tensor_release(e); em_tensor_release(t);
}

/* -- Broadcasting and type promotion ------------------------------------------------- */

static void test_broadcast(em_state *S) {
  em_tensor *a = NULL, *b = NULL, *c = NULL, *t = NULL;
  REQUIRE_OK(S, t_make(S, &a, EM_FLOAT32, SHP(3, 1), V(1, 2, 3)));
  REQUIRE_OK(S, t_make(S, &b, EM_FLOAT32, SHP(1, 4), V(10, 20, 30, 40)));
  REQUIRE_OK(S, em_binary(S, EM_ADD, a, b, &c));
  CHECK_SHAPE(c, SHP(3, 4));
  CHECK_VALS(c, 0, V(11, 21, 31, 41, 12, 22, 32, 42, 13, 23, 33, 43));
  em_tensor_release(c);
  REQUIRE_OK(S, em_binary(S, EM_SUB, b, a, &c));             /* order matters */
  CHECK_VALS(c, 0, V(9, 19, 29, 39, 8, 18, 28, 38, 7, 17, 27, 37));
  em_tensor_release(c); em_tensor_release(a); em_tensor_release(b);

  /* [2,3,4] * [4], 0-d + [2,3], a transposed operand */
  REQUIRE_OK(S, em_arange(S, 0, 24, 1, EM_FLOAT32, EM_CPU, &t));
  REQUIRE_OK(S, em_view(S, t, SHP(2, 3, 4), &a));
  REQUIRE_OK(S, t_make(S, &b, EM_FLOAT32, SHP(4), V(1, -1, 2, 0)));
  REQUIRE_OK(S, em_binary(S, EM_MUL, a, b, &c));
  CHECK_SHAPE(c, SHP(2, 3, 4));
  CHECK(t_get(c, 21) == -21 && t_get(c, 22) == 44 && t_get(c, 23) == 0);
  em_tensor_release(c); em_tensor_release(b); em_tensor_release(a); em_tensor_release(t);
  REQUIRE_OK(S, em_full(S, NULL, 0, 0.5, EM_FLOAT32, EM_CPU, &a));
  REQUIRE_OK(S, iota34(S, &t));
  REQUIRE_OK(S, em_transpose(S, t, 0, 1, &b));
  REQUIRE_OK(S, em_binary(S, EM_ADD, a, b, &c));
  CHECK_SHAPE(c, SHP(4, 3));
  CHECK(em_tensor_is_contiguous(c), "results are contiguous");
  CHECK_VALS(c, 0, V(0.5, 4.5, 8.5, 1.5, 5.5, 9.5, 2.5, 6.5, 10.5, 3.5, 7.5, 11.5));
  em_tensor_release(c); em_tensor_release(b); em_tensor_release(a); em_tensor_release(t);
}

static void test_broadcast_errors(em_state *S) {
  em_tensor *a = NULL, *b = NULL, *c = NULL;
  REQUIRE_OK(S, iota34(S, &a));
  REQUIRE_OK(S, em_transpose(S, a, 0, 1, &b));
  CHECK_ERR(S, em_binary(S, EM_SUB, b, a, &c), EM_ERR_SHAPE, "[4,3]", "[3,4]");
  em_tensor_release(b);
  /* in-place: b must broadcast to a's shape, a never grows; a is left alone */
  REQUIRE_OK(S, t_make(S, &b, EM_FLOAT32, SHP(2, 3, 4), V(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                                          0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)));
  CHECK(em_binary_(S, EM_ADD, a, b) == EM_ERR_SHAPE, "in-place can't grow a: %s", em_errmsg(S));
  CHECK_SHAPE(a, SHP(3, 4));
  CHECK_VALS(a, 0, V(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11));
  em_tensor_release(a); em_tensor_release(b);
}

static void test_promotion(em_state *S) {
  em_tensor *i32 = NULL, *i64 = NULL, *u8 = NULL, *bl = NULL, *f32 = NULL, *h = NULL,
            *bf = NULL, *c = NULL;
  REQUIRE_OK(S, t_make(S, &i32, EM_INT32, SHP(3), V(7, -7, 2)));
  REQUIRE_OK(S, t_make(S, &i64, EM_INT64, SHP(3), V(2, 2, 4)));
  REQUIRE_OK(S, t_make(S, &u8, EM_UINT8, SHP(3), V(250, 3, 4)));
  REQUIRE_OK(S, t_make(S, &bl, EM_BOOL, SHP(3), V(1, 0, 1)));
  REQUIRE_OK(S, t_make(S, &f32, EM_FLOAT32, SHP(3), V(0.5, 0.25, 1)));
  REQUIRE_OK(S, t_make(S, &h, EM_FLOAT16, SHP(3), V(1, 2, 3)));
  REQUIRE_OK(S, t_make(S, &bf, EM_BFLOAT16, SHP(3), V(1, 2, 3)));
  static const struct { em_binop op; int a, b; em_dtype want; double v[3]; } cases[] = {
    {EM_ADD, 0, 4, EM_FLOAT32, {7.5, -6.75, 3}},
    {EM_ADD, 0, 1, EM_INT64, {9, -5, 6}},
    {EM_ADD, 2, 0, EM_INT32, {257, -4, 6}},
    {EM_ADD, 3, 0, EM_INT32, {8, -7, 3}},
    {EM_ADD, 2, 2, EM_UINT8, {244, 6, 8}},         /* uint8 wraps as in torch */
    {EM_ADD, 5, 6, EM_FLOAT32, {2, 4, 6}},         /* float16 + bfloat16 -> float32 */
    {EM_ADD, 5, 0, EM_FLOAT16, {8, -5, 5}},
    {EM_DIV, 0, 1, EM_FLOAT32, {3.5, -3.5, 0.5}},  /* true division of ints */
    {EM_MUL, 3, 3, EM_BOOL, {1, 0, 1}},
    {EM_LT, 0, 4, EM_BOOL, {0, 1, 0}},
    {EM_MAXIMUM, 0, 2, EM_INT32, {250, 3, 4}},
  };
  em_tensor *ts[] = {i32, i64, u8, bl, f32, h, bf};
  for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
    c = NULL;
    CHECK_OK(S, em_binary(S, cases[k].op, ts[cases[k].a], ts[cases[k].b], &c));
    if (!c) continue;
    CHECK(em_tensor_dtype(c) == cases[k].want, "case %zu: %s op %s gives %s, want %s", k,
          em_dtype_name(em_tensor_dtype(ts[cases[k].a])),
          em_dtype_name(em_tensor_dtype(ts[cases[k].b])),
          em_dtype_name(em_tensor_dtype(c)), em_dtype_name(cases[k].want));
    CHECK_VALS(c, 1e-6, cases[k].v, 3);
    em_tensor_release(c);
  }
  /* Python-number scalars: int tensor * 2.5 becomes float32; float16 stays float16;
  ** reverse puts the scalar on the left. */
  c = NULL;
  CHECK_OK(S, em_binary_scalar(S, EM_MUL, i32, 2.5, 0, &c));
  CHECK_DTYPE(c, EM_FLOAT32);
  CHECK_VALS(c, 0, V(17.5, -17.5, 5));
  em_tensor_release(c); c = NULL;
  CHECK_OK(S, em_binary_scalar(S, EM_ADD, i64, 3, 0, &c));
  CHECK_DTYPE(c, EM_INT64);
  em_tensor_release(c); c = NULL;
  CHECK_OK(S, em_binary_scalar(S, EM_MUL, h, 1e5, 0, &c));
  CHECK_DTYPE(c, EM_FLOAT16);
  CHECK_VALS(c, 0, V(INFINITY, INFINITY, INFINITY));         /* overflows float16 */
  em_tensor_release(c); c = NULL;
  CHECK_OK(S, em_binary_scalar(S, EM_SUB, f32, 10, 1, &c));
  CHECK_VALS(c, 0, V(9.5, 9.75, 9));
  em_tensor_release(c); c = NULL;
  CHECK_OK(S, em_binary_scalar(S, EM_POW, f32, 2, 1, &c));
  CHECK_VALS(c, 1e-6, V(1.4142135623730951, 1.189207115002721, 2));
  em_tensor_release(c); c = NULL;
  CHECK_OK(S, em_binary_scalar(S, EM_GE, i32, 2, 0, &c));
  CHECK_DTYPE(c, EM_BOOL);
  CHECK_VALS(c, 0, V(1, 0, 1));
  em_tensor_release(c); c = NULL;
  /* In-place keeps a's dtype. As in PyTorch, a result that can't be cast to it
  ** (float into an int tensor) is an error that leaves a alone; within a kind,
  ** or int into float, is fine. */
  CHECK_ERR(S, em_binary_(S, EM_ADD, i32, f32), EM_ERR_DTYPE, "float32", "int32");
  CHECK_VALS(i32, 0, V(7, -7, 2));
  CHECK_OK(S, em_binary_(S, EM_ADD, f32, i32));
  CHECK_DTYPE(f32, EM_FLOAT32);
  CHECK_VALS(f32, 0, V(7.5, -6.75, 3));
  CHECK_OK(S, em_binary_(S, EM_MUL, h, f32));       /* float16 *= float32 */
  CHECK_DTYPE(h, EM_FLOAT16);
  CHECK_VALS(h, 0, V(7.5, -13.5, 9));
  for (size_t k = 0; k < sizeof ts / sizeof *ts; k++) em_tensor_release(ts[k]);
}

/* -- float16 / bfloat16 conversion -------------------------------------------------------- */

static void test_half(em_state *S) {
  /* Values and the float16 bits torch 1.13 gives for them (x.half()). */
  static const double in[] = {
    65504.0, 65519.0, 65520.0, 1e5, -65504.0,
    5.9604644775390625e-08,   /* 2^-24, the smallest subnormal */
    2.9802322387695312e-08,   /* 2^-25: a tie, rounds to even (0) */
    8.940696716308594e-08,    /* 3*2^-25: a tie, rounds to even (2^-23) */
    6.103515625e-05,          /* 2^-14, the smallest normal */
    6.097555160522461e-05,    /* the largest subnormal */
    1.00048828125,            /* 1 + 2^-11: tie, to even (1) */
    1.00146484375,            /* 1 + 3*2^-11: tie, to even (1 + 2^-9) */
    0.1, -0.0, INFINITY, -INFINITY, 1e-8, 0.333333};
  static const uint16_t bits[] = {
    0x7bff, 0x7bff, 0x7c00, 0x7c00, 0xfbff, 0x0001, 0x0000, 0x0002, 0x0400, 0x03ff,
    0x3c00, 0x3c02, 0x2e66, 0x8000, 0x7c00, 0xfc00, 0x0000, 0x3555};
  enum { N = sizeof in / sizeof *in };
  em_tensor *f = NULL, *h = NULL, *back = NULL, *b = NULL, *t = NULL;
  REQUIRE_OK(S, em_from_data(S, SHP(N), EM_FLOAT32, in, EM_FLOAT64, &f));
  REQUIRE_OK(S, em_to(S, f, EM_FLOAT16, EM_CPU, &h));
  CHECK_DTYPE(h, EM_FLOAT16);
  const uint16_t *hb = em_tensor_data(h);
  for (int i = 0; i < N; i++)
    CHECK(hb[i] == bits[i], "float16(%.17g) = 0x%04x, want 0x%04x", in[i], hb[i], bits[i]);
  REQUIRE_OK(S, em_to(S, h, EM_FLOAT32, EM_CPU, &back));
  for (int i = 0; i < N; i++)
    CHECK(t_get(back, i) == t_half(bits[i]) && signbit(t_get(back, i)) == signbit(t_half(bits[i])),
          "float16 0x%04x back to float32 is %.17g", bits[i], t_get(back, i));
  em_tensor_release(back); em_tensor_release(h); em_tensor_release(f);

  /* NaN stays NaN (any payload); from float64 directly as well */
  REQUIRE_OK(S, t_make(S, &f, EM_FLOAT64, SHP(2), V(NAN, -NAN)));
  REQUIRE_OK(S, em_to(S, f, EM_FLOAT16, EM_CPU, &h));
  hb = em_tensor_data(h);
  CHECK((hb[0] & 0x7c00) == 0x7c00 && (hb[0] & 0x3ff), "float16 NaN bits 0x%04x", hb[0]);
  REQUIRE_OK(S, em_to(S, f, EM_BFLOAT16, EM_CPU, &b));
  CHECK(isnan(t_get(b, 0)) && isnan(t_get(b, 1)), "bfloat16 NaN");
  em_tensor_release(b); em_tensor_release(h); em_tensor_release(f);

  /* bfloat16: round to nearest even on the 16 dropped bits */
  static const double bin[] = {1.00390625, 1.01171875, 3.3895313892515355e38, 3.4e38,
                               1e-40, -2.5, 0.1, INFINITY, 1.0039072036743164};
  static const uint16_t bbits[] = {0x3f80, 0x3f82, 0x7f7f, 0x7f80, 0x0001, 0xc020, 0x3dcd,
                                   0x7f80, 0x3f81};
  enum { NB = sizeof bin / sizeof *bin };
  REQUIRE_OK(S, em_from_data(S, SHP(NB), EM_FLOAT32, bin, EM_FLOAT64, &f));
  REQUIRE_OK(S, em_to(S, f, EM_BFLOAT16, EM_CPU, &b));
  const uint16_t *bb = em_tensor_data(b);
  for (int i = 0; i < NB; i++)
    CHECK(bb[i] == bbits[i], "bfloat16(%.17g) = 0x%04x, want 0x%04x", bin[i], bb[i], bbits[i]);
  /* bfloat16 -> float16 goes through float32 and overflows to inf */
  REQUIRE_OK(S, em_to(S, b, EM_FLOAT16, EM_CPU, &h));
  CHECK(t_get(h, 2) == INFINITY && t_get(h, 5) == -2.5, "bfloat16 -> float16");
  em_tensor_release(h); em_tensor_release(b); em_tensor_release(f);

  /* Arithmetic in float16 rounds the float32 result once: 2048 + 1 = 2048 (tie to
  ** even), 2048 + 3 = 2052; and int64 -> float16 overflows to inf. */
  REQUIRE_OK(S, t_make(S, &f, EM_FLOAT16, SHP(2), V(2048, 2048)));
  REQUIRE_OK(S, t_make(S, &b, EM_FLOAT16, SHP(2), V(1, 3)));
  REQUIRE_OK(S, em_binary(S, EM_ADD, f, b, &t));
  CHECK_VALS(t, 0, V(2048, 2052));
  em_tensor_release(t); em_tensor_release(b); em_tensor_release(f);
  REQUIRE_OK(S, t_make(S, &f, EM_INT64, SHP(3), V(70000, -3, 65504)));
  REQUIRE_OK(S, em_to(S, f, EM_FLOAT16, EM_CPU, &h));
  CHECK_VALS(h, 0, V(INFINITY, -3, 65504));
  em_tensor_release(h); em_tensor_release(f);

  /* float -> int truncates, -> bool is "non-zero" (NaN is true), -> uint8 */
  REQUIRE_OK(S, t_make(S, &f, EM_FLOAT32, SHP(6), V(-2.7, -0.5, 0, 0.5, 2.7, NAN)));
  REQUIRE_OK(S, em_to(S, f, EM_BOOL, EM_CPU, &b));
  CHECK_VALS(b, 0, V(1, 1, 0, 1, 1, 1));
  em_tensor_release(b);
  REQUIRE_OK(S, em_narrow(S, f, 0, 0, 5, &t));
  REQUIRE_OK(S, em_to(S, t, EM_INT32, EM_CPU, &b));
  CHECK_VALS(b, 0, V(-2, 0, 0, 0, 2));
  em_tensor_release(b); em_tensor_release(t); em_tensor_release(f);
  REQUIRE_OK(S, t_make(S, &f, EM_FLOAT64, SHP(3), V(2.7, 255.9, 3)));
  REQUIRE_OK(S, em_to(S, f, EM_UINT8, EM_CPU, &b));
  CHECK_VALS(b, 0, V(2, 255, 3));
  em_tensor_release(b); em_tensor_release(f);
}

/* -- Errors: statuses, messages, inputs left intact -------------------------------------- */

static void test_errors(em_state *S) {
  em_tensor *a = NULL, *b = NULL, *o = NULL, *idx = NULL;
  CHECK_ERR(S, em_empty(S, SHP(2, -2), EM_FLOAT32, EM_CPU, &o), EM_ERR_SHAPE, "empty", "-2");
  CHECK_ERR(S, em_empty(S, SHP(1, 1, 1, 1, 1, 1, 1, 1, 1), EM_FLOAT32, EM_CPU, &o),
            EM_ERR_SHAPE, "empty", "9");
  CHECK_ERR(S, em_empty(S, SHP(2), (em_dtype)99, EM_CPU, &o), EM_ERR_DTYPE, "empty");
  CHECK_ERR(S, em_empty(S, SHP(2), EM_FLOAT32, 3, &o), EM_ERR_DEVICE, "cuda:3");
  CHECK_ERR(S, em_full(S, SHP(2), 1, EM_FLOAT32, 7, &o), EM_ERR_DEVICE, "cuda:7");
  CHECK_ERR(S, em_from_data(S, SHP(2), EM_FLOAT32, NULL, EM_FLOAT32, &o), EM_ERR_ARG, "");
  CHECK_ERR(S, em_arange(S, 0, 5, 0, EM_FLOAT32, EM_CPU, &o), EM_ERR_ARG, "arange");
  CHECK_ERR(S, em_arange(S, 0, 5, -1, EM_FLOAT32, EM_CPU, &o), EM_ERR_ARG, "arange");

  REQUIRE_OK(S, iota34(S, &a));
  double d;
  CHECK_ERR(S, em_tensor_item(S, a, &d), EM_ERR_SHAPE, "item", "[3,4]");
  CHECK_ERR(S, em_unary(S, EM_EXP, NULL, &o), EM_ERR_ARG, "exp");
  CHECK_ERR(S, em_unary(S, (em_unop)EM_NUM_UNOPS, a, &o), EM_ERR_ARG, "");
  CHECK_ERR(S, em_binary(S, EM_ADD, a, NULL, &o), EM_ERR_ARG, "add");
  CHECK_ERR(S, em_transpose(S, a, 0, 5, &o), EM_ERR_INDEX, "transpose", "5");
  CHECK_ERR(S, em_narrow(S, a, 1, 3, 2, &o), EM_ERR_INDEX, "narrow");
  CHECK_ERR(S, em_reduce(S, EM_SUM, a, (const int[]){2}, 1, 0, &o), EM_ERR_INDEX, "sum");
  CHECK_ERR(S, em_softmax(S, a, -3, 0, &o), EM_ERR_INDEX, "softmax");
  CHECK_ERR(S, em_max_dim(S, a, 2, 0, 0, &o, &b), EM_ERR_INDEX, "max");

  /* the op and both shapes are named */
  REQUIRE_OK(S, em_empty(S, SHP(3, 5), EM_FLOAT32, EM_CPU, &b));
  CHECK_ERR(S, em_matmul(S, a, b, &o), EM_ERR_SHAPE, "matmul", "[3,4]", "[3,5]");
  em_tensor_release(b); b = NULL;
  REQUIRE_OK(S, em_empty(S, SHP(5), EM_FLOAT32, EM_CPU, &b));
  CHECK_ERR(S, em_binary(S, EM_MUL, a, b, &o), EM_ERR_SHAPE, "mul", "[3,4]", "[5]");
  CHECK_ERR(S, em_matmul(S, a, b, &o), EM_ERR_SHAPE, "matmul", "[3,4]", "[5]");
  em_tensor *list[2] = {a, b};
  CHECK_ERR(S, em_cat(S, list, 2, 0, &o), EM_ERR_SHAPE, "cat");
  CHECK_ERR(S, em_stack(S, list, 2, 0, &o), EM_ERR_SHAPE, "stack");
  CHECK_ERR(S, em_cat(S, list, 0, 0, &o), EM_ERR_ARG, "cat");
  REQUIRE_OK(S, t_make(S, &idx, EM_BOOL, SHP(2), V(1, 0)));
  CHECK_ERR(S, em_where(S, idx, a, b, &o), EM_ERR_SHAPE, "where");
  em_tensor_release(idx); idx = NULL;
  em_tensor_release(b); b = NULL;

  /* out-of-range indices are reported, not read */
  REQUIRE_OK(S, t_make(S, &idx, EM_INT64, SHP(2), V(0, 3)));
  CHECK_ERR(S, em_index_select(S, a, 0, idx, 0, &o), EM_ERR_INDEX, "index_select", "3");
  CHECK_ERR(S, em_index_select(S, a, 0, idx, 1, &o), EM_ERR_INDEX, "index_select", "0");
  REQUIRE_OK(S, t_make(S, &b, EM_FLOAT32, SHP(2), V(0, 1)));
  CHECK_ERR(S, em_index_select(S, a, 0, b, 0, &o), EM_ERR_DTYPE, "index_select", "float32");
  em_tensor_release(b); b = NULL;
  REQUIRE_OK(S, t_make(S, &b, EM_INT64, SHP(3, 1), V(0, 4, 1)));
  CHECK_ERR(S, em_gather(S, a, 1, b, 0, &o), EM_ERR_INDEX, "gather", "4");
  CHECK_ERR(S, em_one_hot(S, idx, 3, 0, &o), EM_ERR_INDEX, "one_hot", "3");
  em_tensor_release(b); b = NULL;

  /* A failed in-place op leaves its input as it was. */
  REQUIRE_OK(S, em_empty(S, SHP(2, 2), EM_FLOAT32, EM_CPU, &b));
  CHECK(em_copy_(S, b, a) == EM_ERR_SHAPE, "copy_ [3,4] into [2,2]");
  CHECK(em_binary_(S, EM_ADD, a, idx) == EM_ERR_SHAPE, "add_ of [2] into [3,4]");
  CHECK(em_randint_(S, a, 5, 5) == EM_ERR_ARG, "randint_ with an empty range");
  CHECK_VALS(a, 0, V(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11));
  em_tensor_release(b); em_tensor_release(idx); em_tensor_release(a);
}

/* -- Element-wise values ---------------------------------------------------------------- */

static void test_elementwise(em_state *S) {
  em_tensor *a = NULL, *b = NULL, *c = NULL, *o = NULL;
  REQUIRE_OK(S, t_make(S, &a, EM_FLOAT32, SHP(5), V(-2, -0.5, 0, 1, 4)));
  static const struct { em_unop op; double v[5]; } un[] = {
    {EM_NEG, {2, 0.5, 0, -1, -4}},
    {EM_ABS, {2, 0.5, 0, 1, 4}},
    {EM_EXP, {0.1353352832366127, 0.6065306597126334, 1, 2.718281828459045, 54.598150033144236}},
    {EM_RELU, {0, 0, 0, 1, 4}},
    {EM_SIGMOID, {0.11920292202211755, 0.3775406687981454, 0.5, 0.7310585786300049, 0.9820137900379085}},
    {EM_TANH, {-0.9640275800758169, -0.46211715726000974, 0, 0.7615941559557649, 0.999329299739067}},
    {EM_SILU, {-0.2384058440442351, -0.1887703343990727, 0, 0.7310585786300049, 3.928055160151634}},
    {EM_GELU, {-0.04550026389635842, -0.15426876936299347, 0, 0.841344746068543, 3.9998733150326675}},
    {EM_SQRT, {NAN, NAN, 0, 1, 2}},
    {EM_LOG, {NAN, NAN, -INFINITY, 0, 1.3862943611198906}},
  };
  for (size_t k = 0; k < sizeof un / sizeof *un; k++) {
    o = NULL;
    CHECK_OK(S, em_unary(S, un[k].op, a, &o));
    if (!o) continue;
    CHECK(em_unop_name(un[k].op) != NULL, "unop %d has a name", (int)un[k].op);
    CHECK_VALS(o, 1e-6, un[k].v, 5);
    em_tensor_release(o);
  }
  /* maximum/minimum propagate NaN; clamp keeps NaN; where picks */
  REQUIRE_OK(S, t_make(S, &b, EM_FLOAT32, SHP(5), V(NAN, 0, -1, 2, 4)));
  REQUIRE_OK(S, em_binary(S, EM_MAXIMUM, a, b, &o));
  CHECK_VALS(o, 0, V(NAN, 0, 0, 2, 4));
  em_tensor_release(o);
  REQUIRE_OK(S, em_binary(S, EM_EQ, a, b, &c));
  CHECK_DTYPE(c, EM_BOOL);
  CHECK_VALS(c, 0, V(0, 0, 0, 0, 1));
  REQUIRE_OK(S, em_where(S, c, a, b, &o));
  CHECK_VALS(o, 0, V(NAN, 0, -1, 2, 4));
  em_tensor_release(o); em_tensor_release(c);
  REQUIRE_OK(S, em_clamp(S, b, -0.5, 3, &o));
  CHECK_VALS(o, 0, V(NAN, 0, -0.5, 2, 3));
  em_tensor_release(o);
  REQUIRE_OK(S, em_clamp(S, a, -INFINITY, 0.5, &o));        /* only an upper bound */
  CHECK_VALS(o, 0, V(-2, -0.5, 0, 0.5, 0.5));
  em_tensor_release(o);
  REQUIRE_OK(S, em_add_scaled(S, a, b, -2, &o));
  CHECK_VALS(o, 0, V(NAN, -0.5, 2, -3, -4));
  em_tensor_release(o);
  /* in-place forms, through a strided view */
  REQUIRE_OK(S, iota34(S, &o));
  em_tensor *tr = NULL;
  REQUIRE_OK(S, em_transpose(S, o, 0, 1, &tr));
  REQUIRE_OK(S, em_narrow(S, tr, 0, 1, 2, &c));    /* columns 1..2 of o, as rows */
  CHECK_OK(S, em_unary_(S, EM_NEG, c));
  CHECK_OK(S, em_binary_scalar_(S, EM_MUL, c, 10));
  CHECK_OK(S, em_clamp_(S, c, -95, 0));
  CHECK_VALS(o, 0, V(0, -10, -20, 3, 4, -50, -60, 7, 8, -90, -95, 11));
  em_tensor_release(b);
  REQUIRE_OK(S, t_make(S, &b, EM_FLOAT64, SHP(3), V(0.5, 0.5, 0.5)));
  CHECK_OK(S, em_add_scaled_(S, c, b, 2));
  CHECK_VALS(o, 0, V(0, -9, -19, 3, 4, -49, -59, 7, 8, -89, -94, 11));
  em_tensor_release(c); em_tensor_release(tr); em_tensor_release(o);
  em_tensor_release(b); em_tensor_release(a);
}

/* -- Reductions ------------------------------------------------------------------------ */

static void test_reduce(em_state *S) {
  em_tensor *a = NULL, *o = NULL, *i = NULL, *t = NULL;
  REQUIRE_OK(S, t_make(S, &a, EM_FLOAT32, SHP(2, 3), V(1, 5, 2, 7, -1, 7)));
  REQUIRE_OK(S, em_reduce(S, EM_SUM, a, (const int[]){1}, 1, 0, &o));
  CHECK_SHAPE(o, SHP(2));
  CHECK_VALS(o, 0, V(8, 13));
  em_tensor_release(o);
  REQUIRE_OK(S, em_reduce(S, EM_SUM, a, (const int[]){0}, 1, 1, &o));
  CHECK_SHAPE(o, SHP(1, 3));
  CHECK_VALS(o, 0, V(8, 4, 9));
  em_tensor_release(o);
  REQUIRE_OK(S, em_reduce(S, EM_MEAN, a, NULL, 0, 0, &o));
  CHECK(em_tensor_ndim(o) == 0, "a full reduction is 0-d");
  CHECK_VALS(o, 1e-6, V(3.5));
  em_tensor_release(o);
  REQUIRE_OK(S, em_reduce(S, EM_PROD, a, (const int[]){-1}, 1, 0, &o));
  CHECK_VALS(o, 0, V(10, -49));
  em_tensor_release(o);
  REQUIRE_OK(S, em_reduce(S, EM_AMAX, a, (const int[]){0, 1}, 2, 0, &o));
  CHECK_VALS(o, 0, V(7));
  em_tensor_release(o);
  REQUIRE_OK(S, em_var(S, a, (const int[]){1}, 1, 1, 0, 0, &o));
  CHECK_VALS(o, 1e-6, V(4.333333333333333, 21.333333333333332));
  em_tensor_release(o);
  REQUIRE_OK(S, em_var(S, a, NULL, 0, 0, 0, 1, &o));          /* population std */
  CHECK_VALS(o, 1e-6, V(3.0413812651491097));
  em_tensor_release(o);
  REQUIRE_OK(S, em_norm(S, a, 2, NULL, 0, 0, &o));
  CHECK_VALS(o, 1e-6, V(11.357816691600547));
  em_tensor_release(o);
  REQUIRE_OK(S, em_norm(S, a, 1, (const int[]){1}, 1, 1, &o));
  CHECK_VALS(o, 1e-6, V(8, 15));
  em_tensor_release(o);
  REQUIRE_OK(S, em_norm(S, a, INFINITY, (const int[]){0}, 1, 0, &o));
  CHECK_VALS(o, 1e-6, V(7, 5, 7));
  em_tensor_release(o);
  /* ties give the first index; index_base shifts the numbering */
  REQUIRE_OK(S, em_max_dim(S, a, 1, 0, 0, &o, &i));
  CHECK_VALS(o, 0, V(5, 7));
  CHECK_DTYPE(i, EM_INT64);
  CHECK_VALS(i, 0, V(1, 0));
  em_tensor_release(o); em_tensor_release(i);
  REQUIRE_OK(S, em_min_dim(S, a, 0, 1, 1, &o, &i));
  CHECK_SHAPE(i, SHP(1, 3));
  CHECK_VALS(o, 0, V(1, -1, 2));
  CHECK_VALS(i, 0, V(1, 2, 1));
  em_tensor_release(o); em_tensor_release(i);
  REQUIRE_OK(S, em_argmax(S, a, 0, 1, 0, 1, &i));
  CHECK(em_tensor_ndim(i) == 0);
  CHECK_VALS(i, 0, V(4));                       /* flattened, 1-based, first of the 7s */
  em_tensor_release(i);
  REQUIRE_OK(S, em_argmin(S, a, 1, 0, 1, 0, &i));
  CHECK_SHAPE(i, SHP(2, 1));
  CHECK_VALS(i, 0, V(0, 1));
  em_tensor_release(i);
  /* softmax rows sum to 1; logsumexp is stable for large inputs */
  REQUIRE_OK(S, em_softmax(S, a, 1, 0, &o));
  CHECK_VALS(o, 1e-6, V(0.017147825545520388, 0.9362395518765058, 0.0466126225779739,
                         0.49991614840756216, 0.0001677031848757029, 0.49991614840756216));
  em_tensor_release(o);
  REQUIRE_OK(S, em_softmax(S, a, 0, 1, &o));
  CHECK_VALS(o, 1e-5, V(-6.00247568513773, -0.002475685137730357, -5.006715348489118,
                         -0.002475685137730357, -6.00247568513773, -0.006715348489117967));
  em_tensor_release(o);
  REQUIRE_OK(S, t_make(S, &t, EM_FLOAT32, SHP(2), V(1000, 1000)));
  REQUIRE_OK(S, em_reduce(S, EM_LOGSUMEXP, t, NULL, 0, 0, &o));
  CHECK_VALS(o, 1e-6, V(1000.6931471805599));
  em_tensor_release(o); em_tensor_release(t);
  /* integer sums widen to int64 as torch; empty sums are 0, empty prods 1 */
  REQUIRE_OK(S, t_make(S, &t, EM_INT32, SHP(3), V(2000000000, 2000000000, 1)));
  REQUIRE_OK(S, em_reduce(S, EM_SUM, t, NULL, 0, 0, &o));
  CHECK_DTYPE(o, EM_INT64);
  CHECK_VALS(o, 0, V(4000000001.0));
  em_tensor_release(o); em_tensor_release(t);
  REQUIRE_OK(S, em_empty(S, SHP(0, 3), EM_FLOAT32, EM_CPU, &t));
  REQUIRE_OK(S, em_reduce(S, EM_SUM, t, (const int[]){0}, 1, 0, &o));
  CHECK_VALS(o, 0, V(0, 0, 0));
  em_tensor_release(o);
  REQUIRE_OK(S, em_reduce(S, EM_PROD, t, NULL, 0, 0, &o));
  CHECK_VALS(o, 0, V(1));
  em_tensor_release(o);
  CHECK(em_max_dim(S, t, 0, 0, 0, &o, &i) != EM_OK, "max over an empty dim is an error");
  em_tensor_release(t);
  REQUIRE_OK(S, t_make(S, &t, EM_BOOL, SHP(2, 2), V(1, 0, 1, 1)));
  REQUIRE_OK(S, em_reduce(S, EM_ALL, t, (const int[]){1}, 1, 0, &o));
  CHECK_DTYPE(o, EM_BOOL);
  CHECK_VALS(o, 0, V(0, 1));
  em_tensor_release(o);
  REQUIRE_OK(S, em_reduce(S, EM_ANY, t, NULL, 0, 0, &o));
  CHECK_VALS(o, 0, V(1));
  em_tensor_release(o); em_tensor_release(t);
  /* a big strided reduction (parallel path) against a plain loop */
  REQUIRE_OK(S, em_arange(S, 0, 300000, 1, EM_FLOAT64, EM_CPU, &t));
  em_tensor *v = NULL, *tr = NULL;
  REQUIRE_OK(S, em_view(S, t, SHP(600, 500), &v));
  REQUIRE_OK(S, em_transpose(S, v, 0, 1, &tr));
  REQUIRE_OK(S, em_reduce(S, EM_SUM, tr, (const int[]){1}, 1, 0, &o));
  CHECK_SHAPE(o, SHP(500));
  CHECK_CLOSE(t_get(o, 0), 500.0 * 599 * 600 / 2, 1e-12);
  CHECK_CLOSE(t_get(o, 499), 500.0 * 599 * 600 / 2 + 600 * 499, 1e-12);
  em_tensor_release(o);
  REQUIRE_OK(S, em_reduce(S, EM_SUM, tr, NULL, 0, 0, &o));
  CHECK_CLOSE(t_get(o, 0), 299999.0 * 300000 / 2, 1e-12);
  em_tensor_release(o); em_tensor_release(tr); em_tensor_release(v); em_tensor_release(t);
  em_tensor_release(a);
}

/* -- Matmul ------------------------------------------------------------------------------ */

static void test_matmul(em_state *S) {
  em_tensor *a = NULL, *b = NULL, *o = NULL, *t = NULL;
  REQUIRE_OK(S, t_make(S, &a, EM_FLOAT32, SHP(2, 3), V(1, 2, 3, 4, 5, 6)));
  REQUIRE_OK(S, t_make(S, &b, EM_FLOAT32, SHP(3, 2), V(7, 8, 9, 10, 11, 12)));
  REQUIRE_OK(S, em_matmul(S, a, b, &o));
  CHECK_SHAPE(o, SHP(2, 2));
  CHECK_VALS(o, 0, V(58, 64, 139, 154));
  em_tensor_release(o);
  /* transposed operands: a^T (3x2) @ a (2x3) */
  REQUIRE_OK(S, em_transpose(S, a, 0, 1, &t));
  REQUIRE_OK(S, em_matmul(S, t, a, &o));
  CHECK_VALS(o, 0, V(17, 22, 27, 22, 29, 36, 27, 36, 45));
  em_tensor_release(o); em_tensor_release(t); em_tensor_release(b);
  /* 1-D: vector @ vector is 0-d, matrix @ vector drops the dim */
  REQUIRE_OK(S, t_make(S, &b, EM_FLOAT32, SHP(3), V(1, 0, -1)));
  REQUIRE_OK(S, em_matmul(S, a, b, &o));
  CHECK_SHAPE(o, SHP(2));
  CHECK_VALS(o, 0, V(-2, -2));
  em_tensor_release(o);
  REQUIRE_OK(S, em_matmul(S, b, b, &o));
  CHECK(em_tensor_ndim(o) == 0);
  CHECK_VALS(o, 0, V(2));
  em_tensor_release(o); em_tensor_release(b);
  /* batch dims broadcast: [2,1,2,3] @ [4,3,5] -> [2,4,2,5] */
  REQUIRE_OK(S, em_full(S, SHP(2, 1, 2, 3), 1, EM_FLOAT64, EM_CPU, &t));
  REQUIRE_OK(S, em_full(S, SHP(4, 3, 5), 2, EM_FLOAT64, EM_CPU, &b));
  REQUIRE_OK(S, em_matmul(S, t, b, &o));
  CHECK_SHAPE(o, SHP(2, 4, 2, 5));
  CHECK_DTYPE(o, EM_FLOAT64);
  CHECK(t_get(o, 79) == 6);
  em_tensor_release(o); em_tensor_release(b); em_tensor_release(t); em_tensor_release(a);
  /* odd sizes against a plain loop */
  enum { M = 17, K = 33, N = 9 };
  double da[M * K], db[K * N];
  for (int k = 0; k < M * K; k++) da[k] = sin(k * 0.37);
  for (int k = 0; k < K * N; k++) db[k] = cos(k * 0.11);
  REQUIRE_OK(S, em_from_data(S, SHP(M, K), EM_FLOAT32, da, EM_FLOAT64, &a));
  REQUIRE_OK(S, em_from_data(S, SHP(K, N), EM_FLOAT32, db, EM_FLOAT64, &b));
  REQUIRE_OK(S, em_matmul(S, a, b, &o));
  int bad = 0;
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++) {
      double s = 0;
      for (int k = 0; k < K; k++) s += (float)da[i * K + k] * (double)(float)db[k * N + j];
      if (fabs(t_get(o, i * N + j) - s) > 1e-4 * (1 + fabs(s))) bad++;
    }
  CHECK(bad == 0, "%d of %d elements differ from a plain loop", bad, M * N);
  em_tensor_release(o); em_tensor_release(b); em_tensor_release(a);
}

/* -- Joining and indexing ------------------------------------------------------------- */

static void test_index(em_state *S) {
  em_tensor *a = NULL, *b = NULL, *tr = NULL, *o = NULL, *idx = NULL;
  REQUIRE_OK(S, t_make(S, &a, EM_FLOAT32, SHP(2, 2), V(1, 2, 3, 4)));
  REQUIRE_OK(S, t_make(S, &b, EM_FLOAT32, SHP(1, 2), V(5, 6)));
  REQUIRE_OK(S, em_transpose(S, a, 0, 1, &tr));
  em_tensor *l1[3] = {a, b, tr};
  REQUIRE_OK(S, em_cat(S, l1, 3, 0, &o));
  CHECK_SHAPE(o, SHP(5, 2));
  CHECK_VALS(o, 0, V(1, 2, 3, 4, 5, 6, 1, 3, 2, 4));
  em_tensor_release(o);
  em_tensor *l2[2] = {a, tr};
  REQUIRE_OK(S, em_cat(S, l2, 2, -1, &o));
  CHECK_SHAPE(o, SHP(2, 4));
  CHECK_VALS(o, 0, V(1, 2, 1, 3, 3, 4, 2, 4));
  em_tensor_release(o);
  REQUIRE_OK(S, em_stack(S, l2, 2, 1, &o));
  CHECK_SHAPE(o, SHP(2, 2, 2));
  CHECK_VALS(o, 0, V(1, 2, 1, 3, 3, 4, 2, 4));
  em_tensor_release(o);
  REQUIRE_OK(S, em_stack(S, l2, 2, 2, &o));
  CHECK_SHAPE(o, SHP(2, 2, 2));
  CHECK_VALS(o, 0, V(1, 1, 2, 3, 3, 2, 4, 4));
  em_tensor_release(o);
  /* index_select / gather with 0- and 1-based indices */
  REQUIRE_OK(S, t_make(S, &idx, EM_INT64, SHP(3), V(2, 1, 2)));
  REQUIRE_OK(S, em_index_select(S, tr, 1, idx, 1, &o));
  CHECK_SHAPE(o, SHP(2, 3));
  CHECK_VALS(o, 0, V(3, 1, 3, 4, 2, 4));
  em_tensor_release(o); em_tensor_release(idx);
  REQUIRE_OK(S, t_make(S, &idx, EM_INT32, SHP(2), V(1, 0)));
  REQUIRE_OK(S, em_index_select(S, a, 0, idx, 0, &o));
  CHECK_VALS(o, 0, V(3, 4, 1, 2));
  em_tensor_release(o); em_tensor_release(idx);
  REQUIRE_OK(S, t_make(S, &idx, EM_INT64, SHP(2, 3), V(1, 2, 1, 2, 2, 1)));
  REQUIRE_OK(S, em_gather(S, a, 1, idx, 1, &o));
  CHECK_SHAPE(o, SHP(2, 3));
  CHECK_VALS(o, 0, V(1, 2, 1, 4, 4, 3));
  em_tensor_release(o);
  /* one_hot: int64, a trailing dim of n; n <= 0 infers max + 1 - base */
  REQUIRE_OK(S, em_one_hot(S, idx, 0, 1, &o));
  CHECK_SHAPE(o, SHP(2, 3, 2));
  CHECK_DTYPE(o, EM_INT64);
  CHECK_VALS(o, 0, V(1, 0, 0, 1, 1, 0, 0, 1, 0, 1, 1, 0));
  em_tensor_release(o);
  REQUIRE_OK(S, em_one_hot(S, idx, 4, 0, &o));
  CHECK_SHAPE(o, SHP(2, 3, 4));
  CHECK(t_get(o, 1) == 1 && t_get(o, 6) == 1 && t_get(o, 23) == 0);
  em_tensor_release(o); em_tensor_release(idx);
  em_tensor_release(tr); em_tensor_release(b); em_tensor_release(a);
}

/* -- Big, strided, odd-sized: the parallel and vectorised paths --------------------------
** Sizes are well past any sensible grain and not multiples of a vector width;
** every result is compared element by element with a plain double loop. */

static int count_bad(const em_tensor *t, const double *want, int64_t n, double tol) {
  int bad = 0;
  for (int64_t i = 0; i < n; i++)
    if (!chk_close(t_get(t, i), want[i], tol)) {
      if (!bad) printf("  first difference at %lld: %.9g vs %.9g\n", (long long)i, t_get(t, i),
                       want[i]);
      bad++;
    }
  return bad;
}

static void test_large(em_state *S) {
  enum { R = 1003, K = 301 };              /* A is [R, K]; At = A^T is [K, R] */
  double *a = malloc(sizeof(double) * R * K), *w = malloc(sizeof(double) * R * K);
  double bv[R];
  em_tensor *A = NULL, *At = NULL, *B = NULL, *o = NULL, *i = NULL;
  REQUIRE(a && w);
  for (int k = 0; k < R * K; k++) a[k] = (float)(sin(k * 0.001) * (k % 7 - 3));
  for (int k = 0; k < R; k++) bv[k] = (float)(1 + 0.5 * cos(k));
  if (!CHECK_OK(S, em_from_data(S, SHP(R, K), EM_FLOAT32, a, EM_FLOAT64, &A)) ||
      !CHECK_OK(S, em_transpose(S, A, 0, 1, &At)) ||
      !CHECK_OK(S, em_from_data(S, SHP(R), EM_FLOAT32, bv, EM_FLOAT64, &B)))
    goto out;
  /* At (strided) * B (broadcast over rows): At[k][r] = a[r*K + k] */
  if (CHECK_OK(S, em_binary(S, EM_MUL, At, B, &o))) {
    for (int k = 0; k < K; k++)
      for (int r = 0; r < R; r++) w[k * R + r] = (double)(float)(a[r * K + k] * bv[r]);
    CHECK(count_bad(o, w, (int64_t)R * K, 1e-6) == 0, "strided * broadcast");
    em_tensor_release(o); o = NULL;
  }
  if (CHECK_OK(S, em_unary(S, EM_EXP, At, &o))) {
    for (int k = 0; k < K; k++)
      for (int r = 0; r < R; r++) w[k * R + r] = exp(a[r * K + k]);
    CHECK(count_bad(o, w, (int64_t)R * K, 1e-5) == 0, "exp of a strided tensor");
    em_tensor_release(o); o = NULL;
  }
  /* sums along either dim of the strided view, and over everything */
  if (CHECK_OK(S, em_reduce(S, EM_SUM, At, (const int[]){1}, 1, 0, &o))) {
    for (int k = 0; k < K; k++) {
      w[k] = 0;
      for (int r = 0; r < R; r++) w[k] += a[r * K + k];
    }
    CHECK(count_bad(o, w, K, 1e-4) == 0, "sum along the strided dim");
    em_tensor_release(o); o = NULL;
  }
  if (CHECK_OK(S, em_reduce(S, EM_MEAN, At, NULL, 0, 0, &o))) {
    double s = 0;
    for (int k = 0; k < R * K; k++) s += a[k];
    CHECK_CLOSE(t_get(o, 0), s / (R * K), 1e-4);
    em_tensor_release(o); o = NULL;
  }
  /* max with indices along rows of the strided view */
  if (CHECK_OK(S, em_max_dim(S, At, 1, 0, 1, &o, &i))) {
    int bad = 0;
    for (int k = 0; k < K; k++) {
      double m = -INFINITY;
      int arg = 0;
      for (int r = 0; r < R; r++) if (a[r * K + k] > m) { m = a[r * K + k]; arg = r; }
      if (t_get(o, k) != m || t_get(i, k) != arg + 1) bad++;
    }
    CHECK(bad == 0, "%d of %d rows have the wrong max or index", bad, K);
    em_tensor_release(o); em_tensor_release(i); o = i = NULL;
  }
  /* softmax along the long, strided dim */
  if (CHECK_OK(S, em_softmax(S, At, 1, 0, &o))) {
    for (int k = 0; k < K; k++) {
      double m = -INFINITY, z = 0;
      for (int r = 0; r < R; r++) m = fmax(m, a[r * K + k]);
      for (int r = 0; r < R; r++) z += exp(a[r * K + k] - m);
      for (int r = 0; r < R; r++) w[k * R + r] = exp(a[r * K + k] - m) / z;
    }
    CHECK(count_bad(o, w, (int64_t)R * K, 1e-5) == 0, "softmax of a strided tensor");
    em_tensor_release(o); o = NULL;
  }
  /* float16: conversion and arithmetic round once from float32 */
  em_tensor *h = NULL;
  if (CHECK_OK(S, em_to(S, At, EM_FLOAT16, EM_CPU, &h)) &&
      CHECK_OK(S, em_binary(S, EM_ADD, h, h, &o))) {
    int bad = 0;
    for (int k = 0; k < K && bad < 5; k++)
      for (int r = 0; r < R; r++) {
        double x = t_get(h, (int64_t)k * R + r);
        if (t_get(o, (int64_t)k * R + r) != 2 * x) bad++;   /* doubling is exact */
        if (fabs(x - a[r * K + k]) > 1e-3 * (1 + fabs(a[r * K + k]))) bad++;
      }
    CHECK(bad == 0, "float16 conversion/add of a big strided tensor");
  }
  em_tensor_release(o); em_tensor_release(h); o = NULL;
  /* int32 sum of a big tensor widens to int64 and is exact */
  em_tensor *n = NULL;
  if (CHECK_OK(S, em_to(S, A, EM_INT32, EM_CPU, &n)) &&
      CHECK_OK(S, em_reduce(S, EM_SUM, n, NULL, 0, 0, &o))) {
    double s = 0;
    for (int k = 0; k < R * K; k++) s += (double)(int32_t)a[k];
    CHECK_DTYPE(o, EM_INT64);
    CHECK(t_get(o, 0) == s, "int sum %.17g, want %.17g", t_get(o, 0), s);
  }
  em_tensor_release(o); em_tensor_release(n); o = NULL;
out:
  em_tensor_release(A); em_tensor_release(At); em_tensor_release(B);
  free(a); free(w);
}

/* -- Random streams ------------------------------------------------------------------ */

static void stats(const em_tensor *t, double *mean, double *var, double *lo, double *hi) {
  int64_t n = em_tensor_numel(t);
  double s = 0, s2 = 0;
  *lo = INFINITY; *hi = -INFINITY;
  for (int64_t i = 0; i < n; i++) {
    double v = t_get(t, i);
    s += v; s2 += v * v;
    if (v < *lo) *lo = v;
    if (v > *hi) *hi = v;
  }
  *mean = s / n;
  *var = s2 / n - *mean * *mean;
}

static void test_random(em_state *S) {
  em_tensor *a = NULL, *b = NULL;
  double mean, var, lo, hi;
  enum { N = 200000 };
  REQUIRE_OK(S, em_empty(S, SHP(N), EM_FLOAT32, EM_CPU, &a));
  REQUIRE_OK(S, em_empty(S, SHP(N), EM_FLOAT32, EM_CPU, &b));
  em_manual_seed(S, 7);
  REQUIRE_OK(S, em_uniform_(S, a, 2, 5));
  stats(a, &mean, &var, &lo, &hi);
  CHECK(lo >= 2 && hi < 5, "uniform in [2,5): [%g, %g]", lo, hi);
  CHECK(fabs(mean - 3.5) < 0.02 && fabs(var - 0.75) < 0.02, "uniform mean %g var %g", mean, var);
  REQUIRE_OK(S, em_uniform_(S, b, 2, 5));
  CHECK(memcmp(em_tensor_data(a), em_tensor_data(b), N * 4) != 0, "two draws differ");
  em_manual_seed(S, 7);
  REQUIRE_OK(S, em_uniform_(S, b, 2, 5));
  CHECK(memcmp(em_tensor_data(a), em_tensor_data(b), N * 4) == 0, "same seed, same draw");
  /* get/set state replays a draw */
  uint64_t seed, off;
  em_rng_get_state(S, &seed, &off);
  REQUIRE_OK(S, em_normal_(S, a, 1, 2));
  stats(a, &mean, &var, &lo, &hi);
  CHECK(fabs(mean - 1) < 0.03 && fabs(sqrt(var) - 2) < 0.03, "normal mean %g std %g", mean,
        sqrt(var));
  em_rng_set_state(S, seed, off);
  REQUIRE_OK(S, em_normal_(S, b, 1, 2));
  CHECK(memcmp(em_tensor_data(a), em_tensor_data(b), N * 4) == 0, "rng state replays");
  em_tensor_release(a); em_tensor_release(b);
  /* randint: [lo, hi) and every value is hit */
  REQUIRE_OK(S, em_empty(S, SHP(10000), EM_INT64, EM_CPU, &a));
  REQUIRE_OK(S, em_randint_(S, a, -3, 4));
  int seen[7] = {0}, out = 0;
  for (int i = 0; i < 10000; i++) {
    int64_t v = ((int64_t *)em_tensor_data(a))[i];
    if (v < -3 || v >= 4) out++; else seen[v + 3]++;
  }
  CHECK(out == 0, "%d values outside [-3, 4)", out);
  for (int k = 0; k < 7; k++) CHECK(seen[k] > 1200, "value %d drawn %d times", k - 3, seen[k]);
  em_tensor_release(a);
  /* float16 draws stay in range after rounding */
  REQUIRE_OK(S, em_empty(S, SHP(4096), EM_FLOAT16, EM_CPU, &a));
  REQUIRE_OK(S, em_uniform_(S, a, 0, 1));
  stats(a, &mean, &var, &lo, &hi);
  CHECK(lo >= 0 && hi <= 1 && fabs(mean - 0.5) < 0.03, "float16 uniform [%g, %g]", lo, hi);
  em_tensor_release(a);
}

/* Draws do not depend on the number of threads. */
static void test_random_threads(void) {
  em_state *S1 = open_state(1, 123), *S2 = open_state(2, 123);
  REQUIRE(S1 && S2);
  em_tensor *a = NULL, *b = NULL;
  enum { N = 300001 };
  if (!CHECK_OK(S1, em_empty(S1, SHP(N), EM_FLOAT32, EM_CPU, &a)) ||
      !CHECK_OK(S2, em_empty(S2, SHP(N), EM_FLOAT32, EM_CPU, &b)))
    goto out;
  for (int k = 0; k < 2; k++) {
    CHECK_OK(S1, k ? em_normal_(S1, a, 0, 1) : em_uniform_(S1, a, -1, 1));
    CHECK_OK(S2, k ? em_normal_(S2, b, 0, 1) : em_uniform_(S2, b, -1, 1));
    CHECK(memcmp(em_tensor_data(a), em_tensor_data(b), (size_t)N * 4) == 0,
          "%s draw differs between 1 and 2 threads", k ? "normal" : "uniform");
  }
out:
  em_tensor_release(a); em_tensor_release(b);
  em_close(S1); em_close(S2);
}

/* -- Two states side by side --------------------------------------------------------- */

static void test_two_states(void) {
  em_state *S1 = open_state(1, 1), *S2 = open_state(2, 2);
  REQUIRE(S1 && S2);
  em_tensor *a = NULL, *b = NULL, *o = NULL;
  if (CHECK_OK(S1, em_full(S1, SHP(1000), 1, EM_FLOAT32, EM_CPU, &a)) &&
      CHECK_OK(S2, em_full(S2, SHP(10), 2, EM_FLOAT32, EM_CPU, &b))) {
    CHECK(em_memory_allocated(S1) >= 4000 && em_memory_allocated(S2) < 4000,
          "memory is counted per state (%lld, %lld)", (long long)em_memory_allocated(S1),
          (long long)em_memory_allocated(S2));
    CHECK(em_empty(S2, SHP(-1), EM_FLOAT32, EM_CPU, &o) != EM_OK);
    CHECK(em_transpose(S1, a, 0, 4, &o) != EM_OK);
    CHECK(strstr(em_errmsg(S1), "transpose") && strstr(em_errmsg(S2), "empty") &&
          !strstr(em_errmsg(S2), "transpose"), "each state keeps its own message");
  }
  em_tensor_release(a); em_tensor_release(b);
  CHECK(em_memory_allocated(S1) == 0 && em_memory_allocated(S2) == 0);
  em_close(S1); em_close(S2);
}

/* Each thread works with its own state at the same time as the other. */
typedef struct worker { int id; double result; int ok; } worker;

static void *work(void *arg) {
  worker *w = arg;
  em_state *S = open_state(2, (uint64_t)w->id);
  em_tensor *a = NULL, *b = NULL, *c = NULL, *s = NULL;
  w->ok = 0;
  if (!S) return NULL;
  double total = 0;
  for (int it = 0; it < 50; it++) {
    if (em_arange(S, 0, 100000, 1, EM_FLOAT32, EM_CPU, &a) ||
        em_full(S, SHP(100000), w->id, EM_FLOAT32, EM_CPU, &b) ||
        em_binary(S, EM_MUL, a, b, &c) ||
        em_reduce(S, EM_SUM, c, NULL, 0, 0, &s))
      goto out;
    double v;
    if (em_tensor_item(S, s, &v)) goto out;
    total += v;
    em_tensor_release(a); em_tensor_release(b); em_tensor_release(c); em_tensor_release(s);
    a = b = c = s = NULL;
  }
  w->result = total;
  w->ok = 1;
out:
  em_tensor_release(a); em_tensor_release(b); em_tensor_release(c); em_tensor_release(s);
  em_close(S);
  return NULL;
}

static void test_threads(void) {
  worker w[2] = {{1, 0, 0}, {3, 0, 0}};
  pthread_t th[2];
  for (int i = 0; i < 2; i++) REQUIRE(pthread_create(&th[i], NULL, work, &w[i]) == 0);
  for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
  for (int i = 0; i < 2; i++) {
    double want = 50.0 * w[i].id * (99999.0 * 100000 / 2);
    CHECK(w[i].ok, "thread %d ran its ops", i);
    CHECK_CLOSE(w[i].result, want, 1e-5);
  }
}

/* Messages number dims, positions and indices from the state's index base (the Lua
** layer sets 1); index_base arguments of ops stay what they are. */
static void test_index_base(em_state *S) {
  em_tensor *a = NULL, *b = NULL, *o = NULL;
  REQUIRE_OK(S, iota34(S, &a));
  CHECK(em_get_index_base(S) == 0, "index base starts at 0");
  CHECK_ERR(S, em_select(S, a, 1, 4, &o), EM_ERR_INDEX, "index 4", "dimension 1 ");
  CHECK_ERR(S, em_set_index_base(S, 2), EM_ERR_ARG, "set_index_base", "2");
  REQUIRE_OK(S, em_set_index_base(S, 1));
  CHECK(em_get_index_base(S) == 1, "index base set to 1");
  CHECK_ERR(S, em_select(S, a, 1, 4, &o), EM_ERR_INDEX, "index 5", "dimension 2 ");
  CHECK_ERR(S, em_select(S, a, 0, -4, &o), EM_ERR_INDEX, "index -4", "dimension 1 ");
  CHECK_ERR(S, em_transpose(S, a, 0, 2, &o), EM_ERR_INDEX, "dimension 3 ", "count from 1");
  CHECK_ERR(S, em_narrow(S, a, 1, 3, 2, &o), EM_ERR_INDEX, "start 4", "dimension 2 ");
  REQUIRE_OK(S, em_empty(S, SHP(3, 5), EM_FLOAT32, EM_CPU, &b));
  em_tensor *list[3] = {a, a, b};
  CHECK_ERR(S, em_cat(S, list, 3, 0, &o), EM_ERR_SHAPE, "dimension 1:", "position 1 ",
            "position 3");
  CHECK_ERR(S, em_stack(S, list, 3, 0, &o), EM_ERR_SHAPE, "position 1 ", "position 3");
  REQUIRE_OK(S, em_set_index_base(S, 0));
  CHECK_ERR(S, em_cat(S, list, 3, 0, &o), EM_ERR_SHAPE, "dimension 0:", "position 0 ",
            "position 2");
  em_tensor_release(a); em_tensor_release(b);
}

/* Writing a tensor's memory directly: em_tensor_bump_version checks and counts it
** like an in-place op; the float16 / bfloat16 conversions are the ops' own. */
static void test_direct_writes(em_state *S) {
  em_tensor *x = NULL, *y = NULL, *s = NULL, *v = NULL;
  REQUIRE_OK(S, t_make(S, &x, EM_FLOAT64, SHP(3), V(1, 2, 3)));
  REQUIRE_OK(S, em_tensor_set_requires_grad(S, x, 1));
  CHECK_ERR(S, em_tensor_bump_version(S, x, "poke"), EM_ERR_ARG, "poke", "leaf");
  REQUIRE_OK(S, em_binary(S, EM_MUL, x, x, &y));       /* saves x */
  REQUIRE_OK(S, em_reduce(S, EM_SUM, y, NULL, 0, 0, &s));
  REQUIRE_OK(S, em_detach(S, x, &v));                 /* x's storage, no history */
  REQUIRE_OK(S, em_tensor_bump_version(S, v, "poke"));
  ((double *)em_tensor_data(v))[0] = 0;
  CHECK_ERR(S, em_backward(S, s, NULL), EM_ERR_ARG, "modified by an inplace operation");
  em_tensor_release(v); em_tensor_release(s); em_tensor_release(y); em_tensor_release(x);
  CHECK(em_half_to_float(0x3c00) == 1.0f && em_float_to_half(65520.0f) == 0x7c00 &&
        em_half_to_float(0x0001) == 5.9604644775390625e-08f, "float16 conversions");
  CHECK(em_bfloat16_to_float(0x3f80) == 1.0f && em_float_to_bfloat16(1.00390625f) == 0x3f80,
        "bfloat16 conversions (1 + 2^-8 ties to even)");
}

int main(void) {
  RUN(test_state);
  em_state *S = open_state(2, 0);
  if (!S) { printf("FAIL em_open\n"); return check_done() | 1; }
  RUN(test_dtypes, S);
  RUN(test_creation, S);
  RUN(test_views, S);
  RUN(test_broadcast, S);
  RUN(test_broadcast_errors, S);
  RUN(test_promotion, S);
  RUN(test_half, S);
  RUN(test_errors, S);
  RUN(test_index_base, S);
  RUN(test_direct_writes, S);
  RUN(test_elementwise, S);
  RUN(test_reduce, S);
  RUN(test_matmul, S);
  RUN(test_index, S);
  RUN(test_large, S);
  RUN(test_random, S);
  RUN(test_random_threads);
  RUN(test_two_states);
  RUN(test_threads);
  chk_group_begin("no_leaks");
  CHECK(em_memory_allocated(S) == 0, "%lld bytes still held after every test released "
        "its tensors (a test that failed early may have skipped its releases)",
        (long long)em_memory_allocated(S));
  em_close(S);
  return check_done();
}
