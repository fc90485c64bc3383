/* test_hostile_files.c -- the file readers on files that lie about their size
** (what a fuzzer tries first). Every file is made here,
** tiny, with a header claiming something huge:
**   - shapes with a zero dimension whose strides overflow: [0, 2^62, 2^62] from a
**     safetensors header or em_empty, [0, 2^32-1, 2^32-1, 2^32-1] from a 20-byte IDX;
**   - IDX headers claiming 17 GB: an 8-byte raw file, a gzip file of a few bytes, a
**     gzip file whose claim fits deflate's ratio but whose data stops early;
**   - PNG and JPEG headers claiming 60000x60000 pixels (also inside an image folder
**     with a size), and the max_pixels setting and option;
**   - a 10 MB one-line CSV of junk.
** Each must fail fast, with a clear error naming the file, within bounded memory,
** and leave the state usable. Memory is bounded two ways: the state's allocator
** refuses any request over CAP_BYTES and records its peak, and (outside ASan,
** whose shadow memory needs the address space) RLIMIT_AS caps the process, so a
** plain malloc of the claimed size fails too. Reduced JPEG decode (image_folder
** with a size) is checked for staying close to a full decode + resize, and for
** really decoding less (it fits under a cap that a full decode doesn't). */
#include "check.h"
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#if defined(__SANITIZE_ADDRESS__)
#define UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define UNDER_ASAN 1
#endif
#endif
#ifndef UNDER_ASAN
#define UNDER_ASAN 0
#endif

static char dir[64];

/* -- A capped allocator: refuses big requests, records the peak ----------------- */
enum { CAP_BYTES = 256 << 20 };
static size_t cap_bytes = CAP_BYTES, live, peak;

static void *capped_alloc(void *ud, void *p, size_t osize, size_t nsize) {
  (void)ud;
  if (nsize == 0) {
    free(p);
    if (p) live -= osize;
    return NULL;
  }
  size_t was = p ? osize : 0;
  if (live - was + nsize > cap_bytes) return NULL;
  void *q = realloc(p, nsize);
  if (!q) return NULL;
  live = live - was + nsize;
  if (live > peak) peak = live;
  return q;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static const char *path_of(const char *name) {
  static char path[4][160];
  static int k;
  k = (k + 1) % 4;
  snprintf(path[k], sizeof path[k], "%s/%s", dir, name);
  return path[k];
}

static const char *write_bytes(const char *name, const void *b, size_t n) {
  const char *p = path_of(name);
  FILE *f = fopen(p, "wb");
  if (f) { fwrite(b, 1, n, f); fclose(f); }
  return p;
}

static const char *write_gz(const char *name, const void *b, size_t n) {
  const char *p = path_of(name);
  gzFile f = gzopen(p, "wb");
  if (f) { gzwrite(f, b, (unsigned)n); gzclose(f); }
  return p;
}

/* The state still works after an error: a tensor can be made and summed. */
static void check_usable(em_state *S) {
  em_tensor *t = NULL, *s = NULL;
  double v = 0;
  CHECK(!em_full(S, (const int64_t[]){3, 4}, 2, 2.0, EM_FLOAT32, EM_CPU, &t) &&
        !em_reduce(S, EM_SUM, t, NULL, 0, 0, &s) && !em_tensor_item(S, s, &v) && v == 24,
        "state usable after the error: %s", em_errmsg(S));
  em_tensor_release(t);
  em_tensor_release(s);
}

/* -- 1. Overflowing strides on empty tensors -------------------------------------- */
static void test_empty_strides(em_state *S) {
  const int64_t big = (int64_t)1 << 62;
  em_tensor *t = NULL;
  CHECK_ERR(S, em_empty(S, (const int64_t[]){0, big, big}, 3, EM_FLOAT32, EM_CPU, &t),
            EM_ERR_SHAPE, "too large", "[0,4611686018427387904,4611686018427387904]");
  CHECK_ERR(S, em_empty(S, (const int64_t[]){big, big, 0}, 3, EM_UINT8, EM_CPU, &t),
            EM_ERR_SHAPE, "too large");
  CHECK(t == NULL, "no tensor on error");
  /* a big but representable empty shape is fine, with exact strides */
  if (CHECK_OK(S, em_empty(S, (const int64_t[]){0, 4294967295LL, 3}, 3, EM_FLOAT64,
                           EM_CPU, &t))) {
    const int64_t *st = em_tensor_strides(t);
    CHECK(st[0] == 3 * 4294967295LL && st[1] == 3 && st[2] == 1, "strides %lld %lld %lld",
          (long long)st[0], (long long)st[1], (long long)st[2]);
    CHECK(em_tensor_numel(t) == 0, "empty");
    /* must not overflow (UBSan watches); an empty tensor is contiguous, as in
    ** PyTorch, whatever its zero dimension does to the strides (the fuzzer's
    ** (2051, 0) from IDX and (0, 5) from safetensors) */
    CHECK(em_tensor_is_contiguous(t), "an empty tensor is contiguous");
    em_tensor *e2 = NULL;
    if (CHECK_OK(S, em_empty(S, (const int64_t[]){2051, 0}, 2, EM_UINT8, EM_CPU, &e2))) {
      CHECK(em_tensor_is_contiguous(e2), "(2051, 0) is contiguous");
      em_tensor_release(e2);
    }
    /* views of an empty tensor: any shape with a 0 has 0 elements, but not any
    ** shape has strides that fit */
    em_tensor *v = NULL;
    CHECK_ERR(S, em_view(S, t, (const int64_t[]){0, big, big}, 3, &v), EM_ERR_SHAPE,
              "too large");
    CHECK_ERR(S, em_view(S, t, (const int64_t[]){big, big, 0}, 3, &v), EM_ERR_SHAPE,
              "view");
    CHECK(v == NULL, "no view on error");
    if (CHECK_OK(S, em_view(S, t, (const int64_t[]){7, 0, 5}, 3, &v))) {
      CHECK(em_tensor_stride(v, 0) == 5 && em_tensor_stride(v, 1) == 5,
            "[7, 0, 5] of an empty tensor: stride %lld", (long long)em_tensor_stride(v, 0));
      em_tensor_release(v);
    }
    em_tensor_release(t);
  }

  /* safetensors: [0, 2^62, 2^62] in a header, no data */
  static const char json[] = "{\"t\":{\"dtype\":\"F32\",\"shape\":[0,4611686018427387904,"
                             "4611686018427387904],\"data_offsets\":[0,0]}}";
  unsigned char file[8 + sizeof json];
  uint64_t n = sizeof json - 1;
  for (int i = 0; i < 8; i++) file[i] = (unsigned char)(n >> (8 * i));
  memcpy(file + 8, json, n);
  const char *p = write_bytes("empty.safetensors", file, 8 + n);
  em_safetensors *f = NULL;
  em_status st = em_safetensors_open(S, p, &f);
  CHECK(st != EM_OK && strstr(em_errmsg(S), p) && strstr(em_errmsg(S), "too large"),
        "safetensors [0, 2^62, 2^62]: status %d, '%s'", st, em_errmsg(S));
  if (!st) em_safetensors_close(f);

  /* IDX: 20 bytes, ubyte, [0, 2^32-1, 2^32-1, 2^32-1] */
  static const unsigned char idx[20] = {0, 0, 8, 4, 0, 0, 0, 0, 255, 255, 255, 255,
                                        255, 255, 255, 255, 255, 255, 255, 255};
  p = write_bytes("empty.idx", idx, sizeof idx);
  CHECK_ERR(S, em_idx_load(S, p, &t), EM_ERR_IO, p, "too large");
  CHECK(t == NULL, "no tensor on error");
  /* [0, 2^32-1] alone is a legal empty tensor */
  unsigned char idx2[12];
  memcpy(idx2, idx, 12);
  idx2[3] = 2;
  p = write_bytes("empty2.idx", idx2, sizeof idx2);
  if (CHECK_OK(S, em_idx_load(S, p, &t))) {
    CHECK(em_tensor_numel(t) == 0 && em_tensor_stride(t, 0) == 4294967295LL,
          "[0, 2^32-1] loads empty");
    em_tensor_release(t);
  }
  check_usable(S);
}

/* -- 2. IDX claims ---------------------------------------------------------------- */
static void test_idx_claims(em_state *S) {
  em_tensor *t = NULL;
  /* 8 bytes: double, [2^31 - 1]: 17 GB claimed */
  static const unsigned char raw[8] = {0, 0, 0x0E, 1, 0x7f, 0xff, 0xff, 0xff};
  const char *p = write_bytes("claim.idx", raw, sizeof raw);
  peak = live;
  double t0 = now_s();
  CHECK_ERR(S, em_idx_load(S, p, &t), EM_ERR_IO, p, "truncated at record 1 of 2147483647");
  CHECK(now_s() - t0 < 1.0, "fast");
  CHECK(peak - live < (1 << 20), "raw claim: %zu bytes allocated at peak", peak - live);
  check_usable(S);

  /* the same header gzip'd: a tiny file can't inflate to 17 GB */
  p = write_gz("claim.idx.gz", raw, sizeof raw);
  peak = live;
  CHECK_ERR(S, em_idx_load(S, p, &t), EM_ERR_IO, p, "inflates to at most");
  CHECK(peak - live < (1 << 20), "gzip claim: %zu bytes at peak", peak - live);

  /* A claim deflate's ratio allows (incompressible data), but only 1 MB arrives:
  ** the buffer grows with the data, never to the 500 MB claimed. */
  size_t have = 1 << 20, n = 8 + have;
  unsigned char *b = malloc(n);
  if (!b) return;
  uint32_t claim = 500u << 20;
  memcpy(b, (const unsigned char[]){0, 0, 8, 1, (unsigned char)(claim >> 24),
                                    (unsigned char)(claim >> 16), (unsigned char)(claim >> 8),
                                    (unsigned char)claim}, 8);
  uint32_t x = 12345;
  for (size_t i = 8; i < n; i++) { x = x * 1664525u + 1013904223u; b[i] = (unsigned char)(x >> 24); }
  p = write_gz("short.idx.gz", b, n);
  peak = live;
  t0 = now_s();
  CHECK_ERR(S, em_idx_load(S, p, &t), EM_ERR_IO, p, "truncated");
  CHECK(now_s() - t0 < 2.0, "fast");
  CHECK(peak - live <= (4u << 20), "gzip short data: %zu bytes at peak", peak - live);
  /* and a true gzip file still loads, exactly */
  uint32_t m = 3000;
  memcpy(b, (const unsigned char[]){0, 0, 8, 1, 0, 0, (unsigned char)(m >> 8),
                                    (unsigned char)m}, 8);
  p = write_gz("ok.idx.gz", b, 8 + m);
  if (CHECK_OK(S, em_idx_load(S, p, &t))) {
    CHECK(em_tensor_numel(t) == m && !memcmp(em_tensor_data(t), b + 8, m), "gzip data exact");
    em_tensor_release(t);
  }
  free(b);
  check_usable(S);
}

/* -- 3. Images: decompression bombs ------------------------------------------------- */
static void put32(unsigned char *p, uint32_t v) {
  p[0] = (unsigned char)(v >> 24); p[1] = (unsigned char)(v >> 16);
  p[2] = (unsigned char)(v >> 8); p[3] = (unsigned char)v;
}

/* A PNG chunk (length, type, data, CRC) at p; returns its size. */
static size_t png_chunk(unsigned char *p, const char *type, const void *data, uint32_t n) {
  put32(p, n);
  memcpy(p + 4, type, 4);
  if (n) memcpy(p + 8, data, n);
  put32(p + 8 + n, (uint32_t)crc32(crc32(0, NULL, 0), p + 4, n + 4));
  return 12 + n;
}

/* A minimal valid PNG header claiming w x h RGB: IHDR, one small IDAT, IEND. */
static const char *bomb_png(const char *name, uint32_t w, uint32_t h) {
  unsigned char b[256], ihdr[13] = {0};
  static const unsigned char sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  memcpy(b, sig, 8);
  put32(ihdr, w);
  put32(ihdr + 4, h);
  ihdr[8] = 8;   /* depth */
  ihdr[9] = 2;   /* RGB */
  size_t n = 8 + png_chunk(b + 8, "IHDR", ihdr, 13);
  unsigned char zeros[64] = {0}, z[128];
  uLongf zn = sizeof z;
  compress(z, &zn, zeros, sizeof zeros);
  n += png_chunk(b + n, "IDAT", z, (uint32_t)zn);
  n += png_chunk(b + n, "IEND", NULL, 0);
  return write_bytes(name, b, n);
}

/* A real 16x16 JPEG (saved here) whose SOF dimensions are patched to w x h. */
static const char *bomb_jpeg(em_state *S, const char *name, unsigned w, unsigned h) {
  em_tensor *img = NULL;
  const char *p = path_of(name);
  if (em_full(S, (const int64_t[]){3, 16, 16}, 3, 100, EM_UINT8, EM_CPU, &img) ||
      em_image_save(S, p, img, 90)) {
    em_tensor_release(img);
    return p;
  }
  em_tensor_release(img);
  FILE *f = fopen(p, "r+b");
  unsigned char b[4096];
  size_t n = fread(b, 1, sizeof b, f);
  for (size_t i = 2; i + 9 < n; i++)
    if (b[i] == 0xff && (b[i + 1] == 0xc0 || b[i + 1] == 0xc2)) {   /* SOF0 / SOF2 */
      b[i + 5] = (unsigned char)(h >> 8); b[i + 6] = (unsigned char)h;
      b[i + 7] = (unsigned char)(w >> 8); b[i + 8] = (unsigned char)w;
      break;
    }
  rewind(f);
  fwrite(b, 1, n, f);
  fclose(f);
  return p;
}

static void test_image_bombs(em_state *S) {
  em_tensor *t = NULL;
  const char *png = bomb_png("bomb.png", 60000, 60000);
  const char *jpg = bomb_jpeg(S, "bomb.jpg", 60000, 60000);
  struct stat sb;
  CHECK(stat(jpg, &sb) == 0 && sb.st_size < 2048, "the JPEG bomb is small");
  peak = live;
  double t0 = now_s();
  CHECK_ERR(S, em_image_load(S, png, 3, &t), EM_ERR_IO, png, "60000x60000",
            "3600000000 pixels", "limit of 89478485", "max_pixels");
  CHECK_ERR(S, em_image_load(S, jpg, 3, &t), EM_ERR_IO, jpg, "60000x60000", "max_pixels");
  CHECK(now_s() - t0 < 1.0, "refused fast");
  CHECK(peak - live < (1 << 20), "refused before allocating: %zu bytes at peak", peak - live);
  CHECK(t == NULL, "no tensor on error");
  check_usable(S);

  /* the limit is a setting: of the state, and of each call */
  const char *small = bomb_png("small.png", 100, 100);   /* header only: 10,000 pixels */
  em_image_opts o = {5000, 0};
  CHECK_ERR(S, em_image_load_opts(S, small, 3, &o, &t), EM_ERR_IO, "100x100", "5000");
  CHECK(em_image_max_pixels(S) == EM_IMAGE_MAX_PIXELS, "default is PIL's");
  em_image_set_max_pixels(S, 9999);
  CHECK(em_image_max_pixels(S) == 9999, "set");
  CHECK_ERR(S, em_image_load(S, small, 3, &t), EM_ERR_IO, "limit of 9999");
  /* with no limit, the truncated small file gets past the header and fails as corrupt */
  em_image_set_max_pixels(S, -1);
  CHECK(em_image_max_pixels(S) == -1, "no limit");
  CHECK_ERR(S, em_image_load(S, small, 3, &t), EM_ERR_IO, "corrupt PNG");
  em_image_set_max_pixels(S, 0);
  CHECK(em_image_max_pixels(S) == EM_IMAGE_MAX_PIXELS, "back to the default");
  o.max_pixels = -1;   /* no limit for this call: the 10.8 GB tensor hits the cap */
  CHECK_ERR(S, em_image_load_opts(S, png, 3, &o, &t), EM_ERR_NOMEM, png);
  check_usable(S);

  /* inside an image folder with a size: refused from the header, naming the file */
  char root[128], cls[160], p[200];
  snprintf(root, sizeof root, "%s/folder", dir);
  snprintf(cls, sizeof cls, "%s/a", root);
  mkdir(root, 0700);
  mkdir(cls, 0700);
  snprintf(p, sizeof p, "%s/big.png", cls);
  rename(bomb_png("tmp.png", 30000, 30000), p);
  em_dataset *d = NULL;
  REQUIRE_OK(S, em_data_image_folder(S, root, 64, 64, 0, &d));
  em_tensor *s[2] = {NULL, NULL};
  peak = live;
  CHECK_ERR(S, em_dataset_get(S, d, 0, 0, s), EM_ERR_IO, "big.png", "30000x30000",
            "max_pixels");
  CHECK(peak - live < (1 << 20), "folder: %zu bytes at peak", peak - live);
  em_dataset_release(d);
  o.max_pixels = 100;
  REQUIRE_OK(S, em_data_image_folder_opts(S, root, 64, 64, 0, &o, &d));
  CHECK_ERR(S, em_dataset_get(S, d, 0, 0, s), EM_ERR_IO, "big.png", "limit of 100 ");
  em_dataset_release(d);
  check_usable(S);
}

/* A smooth RGB test card (gradients and slow waves: what a photo's
** low frequencies look like), saved as JPEG. */
static int save_card(em_state *S, const char *path, int64_t H, int64_t W) {
  em_tensor *img = NULL;
  if (em_empty(S, (const int64_t[]){3, H, W}, 3, EM_UINT8, EM_CPU, &img)) return 0;
  uint8_t *px = em_tensor_data(img);
  for (int c = 0; c < 3; c++)
    for (int64_t y = 0; y < H; y++)
      for (int64_t x = 0; x < W; x++) {
        double v = 128 + 60 * sin((x * (c + 1) + y * 0.7) / W * 6.0) +
                   50 * cos((y * (3 - c)) / (double)H * 5.0 + c);
        px[(c * H + y) * W + x] = (uint8_t)fmin(255, fmax(0, v));
      }
  int ok = em_image_save(S, path, img, 95) == EM_OK;
  em_tensor_release(img);
  return ok;
}

static void test_reduced_decode(em_state *S) {
  char root[128], cls[160], p[200];
  snprintf(root, sizeof root, "%s/cards", dir);
  snprintf(cls, sizeof cls, "%s/a", root);
  mkdir(root, 0700);
  mkdir(cls, 0700);
  snprintf(p, sizeof p, "%s/card.jpg", cls);
  REQUIRE(save_card(S, p, 768, 1024), "test bug: can't save %s", p);
  static const int64_t sizes[][2] = {{64, 64}, {224, 224}, {100, 300}, {768, 1024}};
  for (int k = 0; k < 4; k++) {
    em_dataset *full = NULL, *red = NULL;
    em_image_opts fo = {0, 1};
    em_tensor *a[2] = {NULL, NULL}, *b[2] = {NULL, NULL};
    if (!CHECK_OK(S, em_data_image_folder_opts(S, root, sizes[k][0], sizes[k][1], 0, &fo,
                                               &full)) ||
        !CHECK_OK(S, em_data_image_folder(S, root, sizes[k][0], sizes[k][1], 0, &red)) ||
        !CHECK_OK(S, em_dataset_get(S, full, 0, 0, a)) ||
        !CHECK_OK(S, em_dataset_get(S, red, 0, 0, b))) {
      em_dataset_release(full);
      em_dataset_release(red);
      continue;
    }
    CHECK_SHAPE(b[0], (const int64_t[]){3, sizes[k][0], sizes[k][1]}, 3);
    int64_t n = em_tensor_numel(a[0]);
    const uint8_t *x = em_tensor_data(a[0]), *y = em_tensor_data(b[0]);
    double sum = 0, mx = 0;
    for (int64_t i = 0; i < n; i++) {
      double e = fabs((double)x[i] - y[i]);
      sum += e;
      mx = fmax(mx, e);
    }
    /* full size: no scaling happens, so the pixels are the very same */
    if (k == 3) CHECK(mx == 0, "%lldx%lld: identical (max error %g)",
                      (long long)sizes[k][0], (long long)sizes[k][1], mx);
    CHECK(sum / n <= 2.0 && mx <= 12, "%lldx%lld: reduced vs full decode: mean error %.3f, "
          "max %g", (long long)sizes[k][0], (long long)sizes[k][1], sum / n, mx);
    for (int j = 0; j < 2; j++) { em_tensor_release(a[j]); em_tensor_release(b[j]); }
    em_dataset_release(full);
    em_dataset_release(red);
  }

  /* The reduced decode really decodes less: a 4096x4096 JPEG needs a 48 MB tensor
  ** at full scale, which a 16 MB cap refuses; at 1/8 (for 64x64) it needs 0.75 MB. */
  snprintf(p, sizeof p, "%s/big.jpg", cls);
  remove(p);
  snprintf(p, sizeof p, "%s/card.jpg", cls);
  REQUIRE(save_card(S, p, 4096, 4096), "test bug: can't save %s", p);
  size_t keep = cap_bytes;
  cap_bytes = live + (16u << 20);
  em_dataset *d = NULL;
  em_tensor *s[2] = {NULL, NULL};
  em_image_opts fo = {0, 1};
  if (CHECK_OK(S, em_data_image_folder_opts(S, root, 64, 64, 0, &fo, &d)))
    CHECK_ERR(S, em_dataset_get(S, d, 0, 0, s), EM_ERR_NOMEM, "card.jpg");
  em_dataset_release(d);
  d = NULL;
  if (CHECK_OK(S, em_data_image_folder(S, root, 64, 64, 0, &d)) &&
      CHECK_OK(S, em_dataset_get(S, d, 0, 0, s))) {
    CHECK_SHAPE(s[0], (const int64_t[]){3, 64, 64}, 3);
    em_tensor_release(s[0]);
    em_tensor_release(s[1]);
  }
  em_dataset_release(d);
  cap_bytes = keep;
  check_usable(S);
}

/* -- 4. CSV: a 10 MB line of junk ----------------------------------------------------- */
static void test_csv_junk(em_state *S) {
  size_t n = 10u << 20;
  char *b = malloc(n);
  if (!b) return;
  for (size_t i = 0; i < n; i += 2) { b[i] = 'x'; b[i + 1] = ','; }
  b[n - 1] = 'x';
  const char *p = write_bytes("junk.csv", b, n);
  em_dataset *d = NULL;
  double t0 = now_s();
  CHECK_ERR(S, em_data_csv(S, p, 0, NULL, -1, &d), EM_ERR_IO, p, "line 1", "field 1",
            "not a number");
  CHECK(now_s() - t0 < 2.0, "fast");
  /* numbers on one long line: one row of 5M values, grown as they arrive */
  for (size_t i = 0; i < n; i += 2) b[i] = '1';
  b[n - 1] = '7';
  p = write_bytes("wide.csv", b, n);
  if (CHECK_OK(S, em_data_csv(S, p, 0, NULL, -1, &d))) {
    em_tensor *s[2] = {NULL, NULL};
    if (CHECK_OK(S, em_dataset_get(S, d, 0, 0, s))) {
      CHECK(em_tensor_numel(s[0]) == (int64_t)(n / 2), "one row of %zu", n / 2);
      em_tensor_release(s[0]);
    }
    em_dataset_release(d);
  }
  free(b);
  check_usable(S);
}

int main(void) {
  snprintf(dir, sizeof dir, "/tmp/ember-hostile-%d", (int)getpid());
  if (mkdir(dir, 0700) != 0) { perror("mkdir"); return 1; }
  if (!UNDER_ASAN) {   /* a plain malloc of a claimed size fails too */
    struct rlimit rl = {(rlim_t)3 << 30, (rlim_t)3 << 30};
    setrlimit(RLIMIT_AS, &rl);
  }
  em_config cfg;
  em_config_init(&cfg);
  cfg.alloc = capped_alloc;
  cfg.num_threads = 1;
  cfg.cache_limit = -1;   /* no block cache: live bytes are what tensors hold */
  em_state *S;
  if (em_open(&S, &cfg) != EM_OK) return 1;
  RUN(test_empty_strides, S);
  RUN(test_idx_claims, S);
  RUN(test_image_bombs, S);
  RUN(test_reduced_decode, S);
  RUN(test_csv_junk, S);
  chk_group_begin("memory");
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  long max_mb = ru.ru_maxrss / 1024;
  CHECK(max_mb < (UNDER_ASAN ? 1536 : 512), "max RSS %ld MB", max_mb);
  CHECK(em_memory_allocated(S) == 0, "nothing leaked: %lld bytes live",
        (long long)em_memory_allocated(S));
  em_close(S);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
  return check_done();
}
