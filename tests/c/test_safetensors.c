/*
** test_safetensors.c -- reading and writing safetensors files through the C API.
**
**   - round trips of every dtype, of 0-d, empty and strided tensors (transposed,
**     stepped, broadcast with stride 0, and one big enough to go through the
**     writer's staging buffer several times), of names and metadata that need
**     JSON escapes, and the exact bytes of a small file;
**   - the files of tests/fixtures/safetensors/ (gen_safetensors.py): the valid
**     ones from another writer open, and every bad_* file fails with EM_ERR_IO and
**     the message this file lists for it;
**   - a small file truncated at every length, and corrupted at every header byte
**     with a set of bytes that matter to JSON: each must fail cleanly or read
**     consistently, never crash (run it under SANITIZE=1 for the memory side);
**   - a write that fails half-way (RLIMIT_FSIZE: the disk "fills up") leaves the
**     previous file intact and no temporary file behind;
**   - an allocator that refuses the Nth request: open, get and write report
**     EM_ERR_NOMEM for every N and give every byte back.
*/
#include "check.h"
#include "failalloc.h"
#include "fixtures.h"
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

static int write_file(const char *path, const void *data, size_t n) {
  FILE *f = fopen(path, "wb");
  if (!f) return -1;
  size_t k = n ? fwrite(data, 1, n, f) : 0;
  return fclose(f) == 0 && k == n ? 0 : -1;
}

/* The whole file into a malloc'd buffer. */
static unsigned char *read_file(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long len = ftell(f);
  fseek(f, 0, SEEK_SET);
  unsigned char *buf = malloc((size_t)len + 1);
  *n = fread(buf, 1, (size_t)len, f);
  fclose(f);
  return buf;
}

/* Files in the scratch folder whose name contains s. */
static int count_files(const char *s) {
  DIR *d = opendir(dir);
  int n = 0;
  struct dirent *e;
  while (d && (e = readdir(d)) != NULL) n += strstr(e->d_name, s) != NULL;
  if (d) closedir(d);
  return n;
}

/* Bit-exact equality of two tensors' elements (NaN payloads included). */
static int same_bits(const em_tensor *a, const em_tensor *b) {
  if (em_tensor_dtype(a) != em_tensor_dtype(b) || em_tensor_ndim(a) != em_tensor_ndim(b) ||
      em_tensor_numel(a) != em_tensor_numel(b))
    return 0;
  for (int d = 0; d < em_tensor_ndim(a); d++)
    if (em_tensor_sizes(a)[d] != em_tensor_sizes(b)[d]) return 0;
  size_t esz = em_dtype_size(em_tensor_dtype(a));
  int nd = em_tensor_ndim(a);
  for (int64_t i = 0; i < em_tensor_numel(a); i++) {
    int64_t oa = 0, ob = 0, r = i;
    for (int d = nd - 1; d >= 0; d--) {
      int64_t k = r % em_tensor_sizes(a)[d];
      r /= em_tensor_sizes(a)[d];
      oa += k * em_tensor_strides(a)[d];
      ob += k * em_tensor_strides(b)[d];
    }
    if (memcmp((char *)em_tensor_data(a) + oa * (int64_t)esz,
               (char *)em_tensor_data(b) + ob * (int64_t)esz, esz) != 0)
      return 0;
  }
  return 1;
}

/* Opens path and reads entry `name` (NULL if anything fails). */
static em_tensor *load_one(em_state *S, const char *path, const char *name) {
  em_safetensors *f;
  em_tensor *t = NULL;
  if (em_safetensors_open(S, path, &f)) return NULL;
  int64_t i = em_safetensors_find(f, name);
  if (i < 0 || em_safetensors_get(S, f, i, &t)) t = NULL;
  em_safetensors_close(f);
  return t;
}

/* -- Round trips ------------------------------------------------------------------- */

static void test_roundtrip_dtypes(em_state *S) {
  static const double vals[] = {0, 1, -2.5, 3.25, 100, -7, 0.5, 255, 1e-3, 42, -0.0, 9};
  em_tensor *t[EM_NUM_DTYPES + 3] = {0};
  const char *names[EM_NUM_DTYPES + 3];
  char namebuf[EM_NUM_DTYPES][32];
  int n = 0;
  for (int d = 0; d < EM_NUM_DTYPES; d++) {
    double v[12];
    for (int i = 0; i < 12; i++) {
      v[i] = vals[i];
      if (d == EM_UINT8 || d == EM_BOOL) v[i] = fabs(floor(v[i]));
      if (d == EM_BOOL) v[i] = v[i] != 0;
    }
    REQUIRE_OK(S, t_make(S, &t[n], (em_dtype)d, SHP(3, 4), v, 12));
    snprintf(namebuf[d], sizeof namebuf[d], "model.%s", em_dtype_name((em_dtype)d));
    names[n++] = namebuf[d];
  }
  REQUIRE_OK(S, em_full(S, NULL, 0, 2.5, EM_FLOAT64, EM_CPU, &t[n]));
  names[n++] = "scalar";
  REQUIRE_OK(S, em_empty(S, SHP(0, 5), EM_INT32, EM_CPU, &t[n]));
  names[n++] = "empty \"quoted\\\" name\n\t\x01 caf\xc3\xa9";
  REQUIRE_OK(S, em_full(S, SHP(2, 1, 3), 1, EM_BFLOAT16, EM_CPU, &t[n]));
  names[n++] = "";
  const char *mk[] = {"format", "escapes \"\\\n"}, *mv[] = {"pt", "\xe2\x82\xac \x1f end"};
  const char *path = tmp_path("dtypes.safetensors");
  CHECK_OK(S, em_safetensors_write(S, path, names, t, n, mk, mv, 2, EM_SAVE_SYNC));

  em_safetensors *f;
  REQUIRE_OK(S, em_safetensors_open(S, path, &f));
  CHECK(em_safetensors_count(f) == n, "count %lld", (long long)em_safetensors_count(f));
  for (int i = 0; i < n; i++) {
    int64_t k = em_safetensors_find(f, names[i]);
    CHECK(k >= 0, "entry '%s' is missing", names[i]);
    if (k < 0) continue;
    CHECK(strcmp(em_safetensors_name(f, k), names[i]) == 0, "name of %lld", (long long)k);
    em_tensor *u = NULL;
    CHECK_OK(S, em_safetensors_get(S, f, k, &u));
    CHECK(u && same_bits(t[i], u), "'%s' differs after the round trip", names[i]);
    CHECK(u && em_tensor_is_contiguous(u), "'%s' is not contiguous", names[i]);
    em_dtype dt;
    int nd = -1;
    int64_t shape[EM_MAX_DIMS];
    CHECK_OK(S, em_safetensors_info(S, f, k, &dt, &nd, shape));
    CHECK(dt == em_tensor_dtype(t[i]) && nd == em_tensor_ndim(t[i]), "info of '%s'", names[i]);
    em_tensor_release(u);
  }
  CHECK(em_safetensors_metadata_count(f) == 2, "metadata count");
  for (int i = 0; i < 2; i++) {
    CHECK(strcmp(em_safetensors_metadata_key(f, i), mk[i]) == 0, "metadata key %d", i);
    CHECK(strcmp(em_safetensors_metadata_value(f, i), mv[i]) == 0, "metadata value %d", i);
  }
  CHECK(em_safetensors_metadata_key(f, 2) == NULL && em_safetensors_name(f, -1) == NULL &&
        em_safetensors_name(f, n) == NULL && em_safetensors_find(f, "nope") == -1,
        "out-of-range accessors");
  em_tensor *u = NULL;
  CHECK_ERR(S, em_safetensors_get(S, f, n, &u), EM_ERR_INDEX, "out of range");
  em_safetensors_close(f);
  em_safetensors_close(NULL);
  for (int i = 0; i < n; i++) em_tensor_release(t[i]);
}

/* Strided inputs of each element size are written as their contiguous copies. */
static void test_roundtrip_strided(em_state *S) {
  static const em_dtype dts[] = {EM_UINT8, EM_FLOAT16, EM_FLOAT32, EM_FLOAT64};
  const char *path = tmp_path("strided.safetensors");
  for (int k = 0; k < 4; k++) {
    em_tensor *base, *views[4] = {0}, *flat;
    REQUIRE_OK(S, em_arange(S, 0, 60, 1, dts[k], EM_CPU, &flat));
    REQUIRE_OK(S, em_view(S, flat, SHP(3, 4, 5), &base));
    REQUIRE_OK(S, em_transpose(S, base, 0, 2, &views[0]));             /* (5, 4, 3) */
    REQUIRE_OK(S, em_as_strided(S, base, (const int64_t[]){3, 2}, (const int64_t[]){20, 7},
                                2, 1, &views[1]));                       /* stepped */
    em_tensor *row;
    REQUIRE_OK(S, em_select(S, base, 1, 2, &row));                       /* (3, 5) */
    REQUIRE_OK(S, em_expand(S, row, SHP(4, 3, 5), &views[2]));           /* stride 0 */
    em_tensor_release(row);
    REQUIRE_OK(S, em_narrow(S, base, 2, 1, 3, &views[3]));
    const char *names[] = {"t", "stepped", "expanded", "narrowed"};
    CHECK_OK(S, em_safetensors_write(S, path, names, views, 4, NULL, NULL, 0, 0));
    for (int i = 0; i < 4; i++) {
      em_tensor *u = load_one(S, path, names[i]);
      CHECK(u && same_bits(views[i], u), "%s %s differs after the round trip",
            em_dtype_name(dts[k]), names[i]);
      em_tensor_release(u);
    }
    for (int i = 0; i < 4; i++) em_tensor_release(views[i]);
    em_tensor_release(base);
    em_tensor_release(flat);
  }
  /* Bigger than the 1 MiB staging buffer, with short rows and long ones. */
  em_tensor *big, *bt, *cols;
  REQUIRE_OK(S, em_empty(S, SHP(700, 1000), EM_FLOAT32, EM_CPU, &big));
  REQUIRE_OK(S, em_uniform_(S, big, -1, 1));
  REQUIRE_OK(S, em_transpose(S, big, 0, 1, &bt));
  REQUIRE_OK(S, em_narrow(S, big, 1, 3, 990, &cols));
  em_tensor *two[] = {bt, cols};
  CHECK_OK(S, em_safetensors_write(S, path, (const char *[]){"bt", "cols"}, two, 2, NULL,
                                   NULL, 0, 0));
  em_tensor *u = load_one(S, path, "bt"), *v = load_one(S, path, "cols");
  CHECK(u && same_bits(bt, u), "big transposed tensor differs");
  CHECK(v && same_bits(cols, v), "big narrowed tensor differs");
  em_tensor_release(u);
  em_tensor_release(v);
  em_tensor_release(cols);
  em_tensor_release(bt);
  em_tensor_release(big);
}

/* The exact bytes: 8-byte length, compact JSON with metadata first, data of larger
** dtypes first, header padded with spaces to a multiple of 8. */
static void test_bytes(em_state *S) {
  em_tensor *a, *b;
  REQUIRE_OK(S, t_make(S, &a, EM_UINT8, SHP(3), V(1, 2, 3)));
  REQUIRE_OK(S, t_make(S, &b, EM_FLOAT32, SHP(1, 2), V(1, -2)));
  const char *path = tmp_path("bytes.safetensors");
  em_tensor *ts[] = {a, b};
  CHECK_OK(S, em_safetensors_write(S, path, (const char *[]){"a", "b"}, ts, 2,
                                   (const char *[]){"k"}, (const char *[]){"v"}, 1, 0));
  const char *want = "{\"__metadata__\":{\"k\":\"v\"},"
                     "\"b\":{\"dtype\":\"F32\",\"shape\":[1,2],\"data_offsets\":[0,8]},"
                     "\"a\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[8,11]}}";
  size_t n, wl = strlen(want), hl = (wl + 7) / 8 * 8;
  unsigned char *buf = read_file(path, &n);
  REQUIRE(buf != NULL, "can't read back %s", path);
  CHECK(n == 8 + hl + 11, "file size %zu, want %zu", n, 8 + hl + 11);
  uint64_t len = 0;
  for (int i = 7; i >= 0; i--) len = len << 8 | buf[i];
  CHECK(len == hl, "header length %llu, want %zu", (unsigned long long)len, hl);
  CHECK(n >= 8 + hl && memcmp(buf + 8, want, wl) == 0, "header is %.*s", (int)wl, buf + 8);
  int spaces = 1;
  for (size_t i = 8 + wl; i < 8 + hl && i < n; i++) spaces &= buf[i] == ' ';
  CHECK(spaces, "padding is not spaces");
  static const unsigned char data[] = {0, 0, 0x80, 0x3f, 0, 0, 0, 0xc0, 1, 2, 3};
  CHECK(n == 8 + hl + 11 && memcmp(buf + 8 + hl, data, 11) == 0, "data bytes differ");
  free(buf);
  em_tensor_release(a);
  em_tensor_release(b);
}

static void test_write_errors(em_state *S) {
  em_tensor *a;
  REQUIRE_OK(S, t_make(S, &a, EM_FLOAT32, SHP(2), V(1, 2)));
  em_tensor *two[] = {a, a};
  const char *path = tmp_path("errors.safetensors");
  CHECK_ERR(S, em_safetensors_write(S, path, (const char *[]){"x", "x"}, two, 2, NULL, NULL,
                                    0, 0), EM_ERR_ARG, "save", "'x' appears twice");
  CHECK_ERR(S, em_safetensors_write(S, path, (const char *[]){"__metadata__"}, two, 1, NULL,
                                    NULL, 0, 0), EM_ERR_ARG, "__metadata__");
  CHECK_ERR(S, em_safetensors_write(S, path, (const char *[]){"bad\xff"}, two, 1, NULL,
                                    NULL, 0, 0), EM_ERR_ARG, "not valid UTF-8");
  CHECK_ERR(S, em_safetensors_write(S, path, (const char *[]){"x"}, (em_tensor *[]){NULL}, 1,
                                    NULL, NULL, 0, 0), EM_ERR_ARG, "'x' is NULL");
  CHECK_ERR(S, em_safetensors_write(S, path, NULL, NULL, 0, (const char *[]){"k", "k"},
                                    (const char *[]){"1", "2"}, 2, 0), EM_ERR_ARG,
            "metadata key 'k' appears twice");
  CHECK_ERR(S, em_safetensors_write(S, path, NULL, NULL, 0, (const char *[]){"k"},
                                    (const char *[]){"\xc3"}, 1, 0), EM_ERR_ARG,
            "metadata value of 'k' is not valid UTF-8");
  CHECK_ERR(S, em_safetensors_write(S, tmp_path("no/such/dir/x.safetensors"),
                                    (const char *[]){"x"}, two, 1, NULL, NULL, 0, 0),
            EM_ERR_IO, "save", "no/such/dir/x.safetensors", "No such file");
  CHECK(count_files("errors.safetensors") == 0, "a failed write left a file");
  /* A file without tensors is valid. */
  CHECK_OK(S, em_safetensors_write(S, path, NULL, NULL, 0, NULL, NULL, 0, 0));
  em_safetensors *f;
  if (CHECK_OK(S, em_safetensors_open(S, path, &f))) {
    CHECK(em_safetensors_count(f) == 0 && em_safetensors_metadata_count(f) == 0, "empty");
    em_safetensors_close(f);
  }
  CHECK_ERR(S, em_safetensors_open(S, tmp_path("missing.safetensors"), &f), EM_ERR_IO,
            "load", "missing.safetensors", "can't open", "No such file");
  CHECK_ERR(S, em_safetensors_open(S, dir, &f), EM_ERR_IO, "not a regular file");
  /* Writing onto a non-regular file writes in place (here /dev/null). */
  CHECK_OK(S, em_safetensors_write(S, "/dev/null", (const char *[]){"x"}, two, 1, NULL, NULL,
                                   0, EM_SAVE_SYNC));
  em_tensor_release(a);
}

/* -- Files from elsewhere ----------------------------------------------------------------- */

static void test_fixtures_valid(em_state *S) {
  em_safetensors *f;
  REQUIRE_OK(S, em_safetensors_open(S, fixture("all_dtypes.safetensors"), &f));
  CHECK(em_safetensors_count(f) == 11, "count %lld", (long long)em_safetensors_count(f));
  CHECK(em_safetensors_metadata_count(f) == 2, "metadata count");
  for (int64_t i = 0; i < em_safetensors_count(f); i++) {
    em_tensor *t = NULL;
    CHECK_OK(S, em_safetensors_get(S, f, i, &t));
    em_tensor_release(t);
  }
  em_tensor *t = NULL;
  int64_t k = em_safetensors_find(f, "i64");
  if (CHECK(k >= 0, "no i64") && CHECK_OK(S, em_safetensors_get(S, f, k, &t))) {
    CHECK_SHAPE(t, SHP(3, 2));
    CHECK_DTYPE(t, EM_INT64);
    CHECK(((int64_t *)em_tensor_data(t))[0] == ((int64_t)1 << 52) + 1, "i64[0]");
    em_tensor_release(t);
  }
  em_safetensors_close(f);

  REQUIRE_OK(S, em_safetensors_open(S, fixture("quirks.safetensors"), &f));
  CHECK(em_safetensors_count(f) == 4, "quirks count");
  CHECK(em_safetensors_find(f, "caf\xc3\xa9.weight") == 0, "\\u00e9 decoded");
  CHECK(em_safetensors_find(f, "emoji.\xf0\x9f\x98\x80") == 1, "surrogate pair decoded");
  CHECK(em_safetensors_find(f, "quote\"back\\slash") == 3, "escapes decoded");
  for (int64_t i = 0; i < em_safetensors_count(f); i++) {
    em_tensor *u = NULL;
    CHECK_OK(S, em_safetensors_get(S, f, i, &u));
    em_tensor_release(u);
  }
  em_safetensors_close(f);

  REQUIRE_OK(S, em_safetensors_open(S, fixture("empty.safetensors"), &f));
  CHECK(em_safetensors_count(f) == 0, "empty file");
  em_safetensors_close(f);

  REQUIRE_OK(S, em_safetensors_open(S, fixture("unsupported_i16.safetensors"), &f));
  CHECK_ERR(S, em_safetensors_get(S, f, 0, &t), EM_ERR_DTYPE, "'a'", "I16", "not support");
  em_safetensors_close(f);
  REQUIRE_OK(S, em_safetensors_open(S, fixture("unsupported_9d.safetensors"), &f));
  CHECK_ERR(S, em_safetensors_get(S, f, 0, &t), EM_ERR_UNSUPPORTED, "9 dimensions");
  em_safetensors_close(f);
}

static const struct { const char *file, *msg1, *msg2; } BAD[] = {
  {"empty", "0 bytes long", "too short"},
  {"short", "3 bytes long", "too short"},
  {"header_past_end", "header length 1000", "past the end of the file"},
  {"header_absurd", "header length 4611686018427387904 is absurd", NULL},
  {"header_zero", "header is empty", NULL},
  {"json_truncated", "invalid JSON", "unterminated string"},
  {"json_bad_escape", "invalid JSON", "invalid escape '\\q'"},
  {"json_bad_unicode", "invalid JSON", "\\u escape"},
  {"json_lone_surrogate", "invalid JSON", "lone high surrogate"},
  {"json_deep", "invalid JSON", "nesting deeper than 64"},
  {"json_trailing", "invalid JSON", "trailing characters"},
  {"json_trailing_comma", "invalid JSON", "trailing comma"},
  {"json_control", "invalid JSON", "control character 0x0a"},
  {"json_utf8", "invalid JSON", "invalid UTF-8"},
  {"json_not_json", "invalid JSON in the header at byte 0", "not JSON"},
  {"top_array", "header is an array, expected a JSON object", NULL},
  {"entry_not_object", "entry 'a' is an array, expected an object", NULL},
  {"missing_dtype", "tensor 'a' has no dtype", NULL},
  {"unknown_dtype", "tensor 'a' has unknown dtype 'F33'", NULL},
  {"dtype_not_string", "tensor 'a': dtype is a number", NULL},
  {"shape_negative", "tensor 'a': shape: -2 is negative", NULL},
  {"shape_float", "tensor 'a': shape: 2.0 is not an integer", NULL},
  {"shape_exponent", "tensor 'a': shape: 2e0 is not an integer", NULL},
  {"shape_big_int", "99999999999999999999 is too large", NULL},
  {"shape_overflow", "tensor 'a': shape [4294967296,4294967296,4294967296] is too large", NULL},
  {"shape_not_list", "tensor 'a': shape is a number, expected a list", NULL},
  {"shape_string", "tensor 'a': shape holds a string", NULL},
  {"huge_claim", "[0, 4000000000000] run past the end of the data (8 bytes)", NULL},
  {"offsets_mismatch", "[0, 12] hold 12 bytes, but shape [2] of F32 needs 8", NULL},
  {"offsets_past_end", "[0, 16] run past the end of the data (8 bytes)", NULL},
  {"offsets_reversed", "[8, 0] end before they begin", NULL},
  {"offsets_negative", "data_offsets: -8 is negative", NULL},
  {"offsets_three", "data_offsets has 3 entries", NULL},
  {"overlap", "tensors 'a' [0, 8] and 'b' [4, 12] overlap", NULL},
  {"gap", "bytes [8, 16) of the data belong to no tensor (a gap before 'b')", NULL},
  {"leading_gap", "bytes [0, 8) of the data belong to no tensor", NULL},
  {"trailing_data", "bytes [8, 12) at the end of the data belong to no tensor", NULL},
  {"no_tensors_with_data", "no tensors, but 8 data bytes", NULL},
  {"duplicate_name", "tensor name 'a' appears twice", NULL},
  {"duplicate_field", "tensor 'a' has 'dtype' twice", NULL},
  {"metadata_value", "__metadata__ value of 'k' is a number, expected a string", NULL},
  {"metadata_not_object", "__metadata__ is an array", NULL},
  {"metadata_twice", "__metadata__ appears twice", NULL},
  {"metadata_duplicate_key", "metadata key 'k' appears twice", NULL},
  {"nul_in_name", "invalid JSON", "\\u0000"},
};

static void test_fixtures_bad(em_state *S) {
  for (size_t i = 0; i < sizeof BAD / sizeof BAD[0]; i++) {
    char name[96];
    snprintf(name, sizeof name, "bad_%s.safetensors", BAD[i].file);
    em_safetensors *f = (em_safetensors *)&f;   /* must come back NULL */
    em_status st = em_safetensors_open(S, fixture(name), &f);
    const char *m = em_errmsg(S);
    CHECK(st == EM_ERR_IO && f == NULL && strstr(m, "load: '") && strstr(m, name) &&
          strstr(m, BAD[i].msg1) && (!BAD[i].msg2 || strstr(m, BAD[i].msg2)),
          "%s: status %d, message \"%s\" (want \"%s\"%s%s)", name, (int)st, m, BAD[i].msg1,
          BAD[i].msg2 ? " and " : "", BAD[i].msg2 ? BAD[i].msg2 : "");
  }
}

/* -- Truncation and corruption ------------------------------------------------------------ */

/* A small valid file: three tensors and metadata. Returns its bytes. */
static unsigned char *small_file(em_state *S, size_t *n) {
  em_tensor *a, *b, *c;
  unsigned char *buf = NULL;
  if (t_make(S, &a, EM_FLOAT32, SHP(2, 2), V(1, 2, 3, 4))) return NULL;
  if (!t_make(S, &b, EM_INT64, SHP(1), V(-5))) {
    if (!t_make(S, &c, EM_BOOL, SHP(3), V(1, 0, 1))) {
      em_tensor *ts[] = {a, b, c};
      const char *path = tmp_path("small.safetensors");
      if (!em_safetensors_write(S, path, (const char *[]){"w", "step", "mask"}, ts, 3,
                                (const char *[]){"k"}, (const char *[]){"v"}, 1, 0))
        buf = read_file(path, n);
      em_tensor_release(c);
    }
    em_tensor_release(b);
  }
  em_tensor_release(a);
  return buf;
}

/* Opens path and reads every tensor: EM_OK, or the first failure's status. */
static em_status open_all(em_state *S, const char *path, int64_t *count) {
  em_safetensors *f;
  em_status st = em_safetensors_open(S, path, &f);
  *count = 0;
  if (st) return st;
  for (int64_t i = 0; i < em_safetensors_count(f) && !st; i++) {
    em_tensor *t = NULL;
    st = em_safetensors_get(S, f, i, &t);
    if (!st) {
      /* whatever was read is usable: touch every byte */
      volatile unsigned char sink = 0;
      for (int64_t k = 0; k < em_tensor_numel(t) * (int64_t)em_dtype_size(em_tensor_dtype(t));
           k++)
        sink ^= ((unsigned char *)em_tensor_data(t))[k];
      (void)sink;
      em_tensor_release(t);
      (*count)++;
    }
  }
  em_safetensors_close(f);
  return st;
}

static void test_truncated(em_state *S) {
  size_t n;
  unsigned char *buf = small_file(S, &n);
  REQUIRE(buf != NULL, "can't make the small file");
  const char *path = tmp_path("truncated.safetensors");
  int bad = 0;
  for (size_t k = 0; k < n; k++) {
    int64_t count;
    if (write_file(path, buf, k)) { bad++; continue; }
    em_status st = open_all(S, path, &count);
    if (st != EM_ERR_IO || !strstr(em_errmsg(S), "truncated.safetensors")) {
      if (bad++ < 3) printf("  truncated to %zu bytes: status %d: %s\n", k, (int)st,
                            em_errmsg(S));
    }
  }
  CHECK(bad == 0, "%d of %zu truncations were not refused with EM_ERR_IO", bad, n);
  int64_t count;
  write_file(path, buf, n);
  CHECK(open_all(S, path, &count) == EM_OK && count == 3, "the whole file reads");
  free(buf);
}

static void test_corrupted(em_state *S) {
  size_t n;
  unsigned char *buf = small_file(S, &n);
  REQUIRE(buf != NULL, "can't make the small file");
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; i--) hlen = hlen << 8 | buf[i];
  static const unsigned char subst[] = {' ', '"', '{', '}', '[', ']', ',', ':', '0', '9',
                                        '-', '.', 'e', '\\', 'u', 'x', 0x00, 0x7f, 0xc3,
                                        0xff, '\n'};
  const char *path = tmp_path("corrupt.safetensors");
  unsigned char *copy = malloc(n);
  int refused = 0, accepted = 0, wrong = 0;
  for (size_t pos = 0; pos < 8 + hlen; pos++) {
    for (size_t s = 0; s < sizeof subst; s++) {
      if (pos < 8 && s > 6) break;          /* length bytes: a few values suffice */
      memcpy(copy, buf, n);
      copy[pos] = pos < 8 ? (unsigned char)(buf[pos] ^ (1u << s)) : subst[s];
      if (copy[pos] == buf[pos]) continue;
      write_file(path, copy, n);
      int64_t count;
      em_status st = open_all(S, path, &count);
      if (st == EM_OK) accepted++;
      else if (st == EM_ERR_IO || st == EM_ERR_DTYPE || st == EM_ERR_UNSUPPORTED) refused++;
      else if (wrong++ < 3)
        printf("  byte %zu -> 0x%02x: status %d: %s\n", pos, copy[pos], (int)st, em_errmsg(S));
    }
  }
  CHECK(wrong == 0, "%d corruptions gave an unexpected status", wrong);
  CHECK(refused > 1000 && accepted > 0, "%d refused, %d accepted", refused, accepted);
  free(copy);
  free(buf);
}

/* -- Atomic replacement ---------------------------------------------------------------------- */

static void test_failed_write_keeps_old(em_state *S) {
  const char *path = tmp_path("keep.safetensors");
  em_tensor *small, *big;
  REQUIRE_OK(S, t_make(S, &small, EM_FLOAT32, SHP(3), V(7, 8, 9)));
  REQUIRE_OK(S, em_full(S, SHP(256, 1024), 1.0, EM_FLOAT32, EM_CPU, &big));
  CHECK_OK(S, em_safetensors_write(S, path, (const char *[]){"x"}, &small, 1, NULL, NULL, 0,
                                   EM_SAVE_SYNC));
  /* The "disk" fills up after 64 KiB: the write of the 1 MiB tensor fails half-way. */
  struct rlimit old, lim;
  getrlimit(RLIMIT_FSIZE, &old);
  lim = old;
  lim.rlim_cur = 64 * 1024;
  signal(SIGXFSZ, SIG_IGN);
  if (setrlimit(RLIMIT_FSIZE, &lim) == 0) {
    em_status st = em_safetensors_write(S, path, (const char *[]){"x"}, &big, 1, NULL, NULL,
                                        0, EM_SAVE_SYNC);
    setrlimit(RLIMIT_FSIZE, &old);
    CHECK(st == EM_ERR_IO && strstr(em_errmsg(S), "write failed") &&
          strstr(em_errmsg(S), "previous file"), "status %d: %s", (int)st, em_errmsg(S));
  } else {
    CHECK(0, "setrlimit: %s", strerror(errno));
  }
  signal(SIGXFSZ, SIG_DFL);
  em_tensor *u = load_one(S, path, "x");
  CHECK(u && same_bits(u, small), "the previous file is damaged");
  CHECK(count_files(".tmp-") == 0, "a temporary file was left behind");
  /* And a successful write replaces it. */
  CHECK_OK(S, em_safetensors_write(S, path, (const char *[]){"x"}, &big, 1, NULL, NULL, 0, 0));
  em_tensor *v = load_one(S, path, "x");
  CHECK(v && same_bits(v, big), "the new file is wrong");
  struct stat sb;
  mode_t um = umask(0);
  umask(um);
  CHECK(stat(path, &sb) == 0 && (sb.st_mode & 0777) == (0666 & ~um), "mode %o (umask %o)",
        (unsigned)sb.st_mode, (unsigned)um);
  /* A symlink to the file stays a symlink; its target gets the new content. */
  const char *link = tmp_path("link.safetensors");
  if (symlink("keep.safetensors", link) == 0) {
    CHECK_OK(S, em_safetensors_write(S, link, (const char *[]){"x"}, &small, 1, NULL, NULL, 0,
                                     0));
    CHECK(lstat(link, &sb) == 0 && S_ISLNK(sb.st_mode), "the symlink was replaced");
    em_tensor *w = load_one(S, path, "x");
    CHECK(w && same_bits(w, small), "the symlink's target was not written");
    em_tensor_release(w);
  }
  em_tensor_release(u);
  em_tensor_release(v);
  em_tensor_release(small);
  em_tensor_release(big);
}

/* -- Allocation failures (failalloc.h) ----------------------------------------------------- */

/* write (strided input) + open + get all; the first failure's status. */
static em_status fa_sequence(em_state *S, const char *path) {
  em_tensor *a = NULL, *at = NULL, *b = NULL;
  em_status st = em_arange(S, 0, 12, 1, EM_FLOAT32, EM_CPU, &a);
  if (!st) st = em_view(S, a, SHP(3, 4), &b);
  if (!st) st = em_transpose(S, b, 0, 1, &at);
  if (!st) {
    em_tensor *ts[] = {at, a};
    st = em_safetensors_write(S, path, (const char *[]){"at", "a"}, ts, 2,
                              (const char *[]){"k"}, (const char *[]){"v"}, 1, 0);
  }
  int64_t count;
  if (!st) st = open_all(S, path, &count);
  em_tensor_release(a);
  em_tensor_release(b);
  em_tensor_release(at);
  return st;
}

static void test_failalloc(em_state *S0) {
  const char *path = tmp_path("failalloc.safetensors");
  int nomem = 0, other = 0, leaks = 0;
  for (long k = 1; k < 1000; k++) {
    fa_state fa = FA_STATE_INIT;
    em_config cfg;
    em_config_init(&cfg);
    cfg.alloc = fa_alloc;
    cfg.alloc_ud = &fa;
    cfg.num_threads = 1;
    cfg.cache_limit = -1;
    em_state *S;
    if (em_open(&S, &cfg)) { CHECK(0, "em_open"); return; }
    fa.fail_at = fa.count + k;
    em_status st = fa_sequence(S, path);
    if (st == EM_ERR_NOMEM) nomem++;
    else if (st != EM_OK && other++ < 3) printf("  N=%ld: status %d: %s\n", k, (int)st,
                                                em_errmsg(S));
    em_close(S);
    if (fa.live_bytes != 0 && leaks++ < 3) printf("  N=%ld: %lld bytes leaked\n", k,
                                                  (long long)fa.live_bytes);
    if (!fa.injected) {
      CHECK(st == EM_OK, "the run without refusal failed");
      break;
    }
  }
  CHECK(nomem > 5, "only %d refusals reached", nomem);
  CHECK(other == 0, "%d refusals gave another status than EM_ERR_NOMEM", other);
  CHECK(leaks == 0, "%d runs leaked", leaks);
  (void)S0;
}

/* -- Main ------------------------------------------------------------------------------------ */

static void cleanup(void) {
  DIR *d = opendir(dir);
  struct dirent *e;
  char p[512];
  while (d && (e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.') continue;
    snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
    unlink(p);
  }
  if (d) closedir(d);
  rmdir(dir);
}

int main(void) {
  fx_locate(fixtures, sizeof fixtures, "fixtures/safetensors");
  /* tmpfs when there is one: thousands of small files, and fsync costs nothing */
  snprintf(dir, sizeof dir, "/dev/shm/ember-st-XXXXXX");
  if (!mkdtemp(dir)) {
    snprintf(dir, sizeof dir, "/tmp/ember-st-XXXXXX");
    if (!mkdtemp(dir)) { perror("mkdtemp"); return 1; }
  }
  em_state *S;
  if (em_open(&S, NULL)) { printf("em_open failed\n"); return 1; }
  RUN(test_roundtrip_dtypes, S);
  RUN(test_roundtrip_strided, S);
  RUN(test_bytes, S);
  RUN(test_write_errors, S);
  RUN(test_fixtures_valid, S);
  RUN(test_fixtures_bad, S);
  RUN(test_truncated, S);
  RUN(test_corrupted, S);
  RUN(test_failed_write_keeps_old, S);
  RUN(test_failalloc, S);
  em_close(S);
  cleanup();
  return check_done();
}
