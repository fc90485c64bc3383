/*
** make_seeds.c -- writes the fuzzers' seed corpora into a build folder (nothing
** generated is committed): the test fixtures each harness's parser reads, and
** small valid files of each format made here, as the C tests make theirs.
**
**   make_seeds FIXTURES_DIR OUT_DIR     (OUT_DIR/<harness>/... is written)
**
** Valid seeds matter most: the fuzzer starts from code paths that reach the end
** of a parse, then mutates its way into the error paths.
*/
#define _GNU_SOURCE
#include <ember.h>
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>

static const char *out_dir;

static void die(const char *what) {
  fprintf(stderr, "make_seeds: %s\n", what);
  exit(1);
}

static const char *path_of(const char *harness, const char *name) {
  static char p[4096];
  snprintf(p, sizeof p, "%s/%s", out_dir, harness);
  if (mkdir(p, 0755) != 0 && errno != EEXIST) die(p);
  snprintf(p, sizeof p, "%s/%s/%s", out_dir, harness, name);
  return p;
}

static void put(const char *harness, const char *name, const void *b, size_t n) {
  FILE *f = fopen(path_of(harness, name), "wb");
  if (!f || fwrite(b, 1, n, f) != n || fclose(f) != 0) die(name);
}

static void put_gz(const char *harness, const char *name, const void *b, size_t n) {
  gzFile f = gzopen(path_of(harness, name), "wb9");
  if (!f || gzwrite(f, b, (unsigned)n) != (int)n || gzclose(f) != Z_OK) die(name);
}

static unsigned char *slurp(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (!f) die(path);
  unsigned char *b = NULL;
  size_t cap = 0;
  *n = 0;
  for (;;) {
    if (*n == cap && !(b = realloc(b, cap = cap ? 2 * cap : 4096))) die("out of memory");
    size_t got = fread(b + *n, 1, cap - *n, f);
    if (got == 0) break;
    *n += got;
  }
  fclose(f);
  return b;
}

/* Copies the fixtures of dir whose names end in one of exts (space-separated)
** into the harness's seeds; with header_only, only a safetensors file's JSON. */
static int copy_fixtures(const char *dir, const char *exts, const char *harness,
                         int header_only) {
  DIR *d = opendir(dir);
  if (!d) die(dir);
  int count = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    const char *dot = strrchr(e->d_name, '.');
    char ext[32];
    if (!dot || strlen(dot) > 20) continue;
    snprintf(ext, sizeof ext, " %s ", dot + 1);
    char list[256];
    snprintf(list, sizeof list, " %s ", exts);
    if (!strstr(list, ext)) continue;
    char p[4096];
    snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
    size_t n;
    unsigned char *b = slurp(p, &n);
    if (!header_only) {
      put(harness, e->d_name, b, n);
      count++;
    } else if (n >= 8) {
      uint64_t h = 0;
      for (int i = 7; i >= 0; i--) h = h << 8 | b[i];
      if (h > 0 && h <= n - 8) {
        put(harness, e->d_name, b + 8, (size_t)h);
        count++;
      }
    }
    free(b);
  }
  closedir(d);
  return count;
}

/* An IDX file: magic, type code, dims (big-endian), then bytes 0, 1, 2, ... */
static size_t idx_bytes(unsigned char *b, int type, int ndim, const uint32_t *dims,
                        size_t esz) {
  size_t at = 0, numel = 1;
  b[at++] = 0, b[at++] = 0, b[at++] = (unsigned char)type, b[at++] = (unsigned char)ndim;
  for (int d = 0; d < ndim; d++) {
    for (int k = 3; k >= 0; k--) b[at++] = (unsigned char)(dims[d] >> (8 * k));
    numel *= dims[d];
  }
  for (size_t i = 0; i < numel * esz; i++) b[at++] = (unsigned char)(i * 7);
  return at;
}

static void make_idx(void) {
  unsigned char b[1024];
  struct { const char *name; int type, ndim; uint32_t dims[3]; size_t esz; } f[] = {
    {"images_u8", 0x08, 3, {3, 4, 5}, 1}, {"labels_u8", 0x08, 1, {10}, 1},
    {"i32", 0x0C, 2, {2, 3}, 4},          {"f32", 0x0D, 2, {3, 2}, 4},
    {"f64", 0x0E, 1, {4}, 8},
  };
  for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
    size_t n = idx_bytes(b, f[i].type, f[i].ndim, f[i].dims, f[i].esz);
    char name[64];
    put("idx", f[i].name, b, n);
    snprintf(name, sizeof name, "%s.gz", f[i].name);
    put_gz("idx", name, b, n);
  }
}

static void make_cifar(void) {
  /* First byte: how many files the harness cuts the rest into; then records of
  ** a label byte and 3072 pixel bytes. */
  static unsigned char b[1 + 3 * 3073];
  for (int recs = 1; recs <= 3; recs++) {
    b[0] = (unsigned char)(recs - 1);
    for (int r = 0; r < recs; r++) {
      unsigned char *rec = b + 1 + r * 3073;
      rec[0] = (unsigned char)(r * 4 % 10);
      for (int i = 0; i < 3072; i++) rec[1 + i] = (unsigned char)(i * 13 + r);
    }
    char name[32];
    snprintf(name, sizeof name, "records_%d", recs);
    put("cifar", name, b, 1 + (size_t)recs * 3073);
  }
}

static void make_csv(void) {
  /* The harness picks how it reads a file by its length modulo 3: pad each text
  ** to all three lengths so that every seed is read every way. */
  const char *texts[] = {
    "a,b,label\n1,2,0\n3,4,1\n",
    "x,y\r\n0.5,-1e3\r\n2,inf\r\n",
    "label,f1,f2,f3\n1,0.25,0.5,0.75\n0,1,2,3\n2,-0,nan,1e-300\n",
  };
  for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++)
    for (int pad = 0; pad < 3; pad++) {
      char b[256], name[32];
      int n = snprintf(b, sizeof b, "%s%.*s", texts[i], pad, "\n\n");
      snprintf(name, sizeof name, "gen_%zu_%d.csv", i, pad);
      put("csv", name, b, (size_t)n);
    }
}

/* Images and safetensors files written by ember itself. */
static void make_with_ember(void) {
  em_state *S;
  if (em_open(&S, NULL) != EM_OK) die("em_open");
  char tmp[4096];
  struct { int C, H, W; const char *ext; int quality; } im[] = {
    {3, 8, 8, "png", 0}, {1, 5, 17, "png", 0}, {3, 16, 9, "jpg", 50}, {1, 8, 8, "jpg", 90},
    {3, 33, 7, "jpg", 10},
  };
  for (size_t i = 0; i < sizeof im / sizeof im[0]; i++) {
    em_tensor *t;
    if (em_empty(S, (const int64_t[]){im[i].C, im[i].H, im[i].W}, 3, EM_UINT8, EM_CPU, &t))
      die(em_errmsg(S));
    uint8_t *p = em_tensor_data(t);
    for (int k = 0; k < im[i].C * im[i].H * im[i].W; k++) p[k] = (uint8_t)(k * 29 + k / 7);
    snprintf(tmp, sizeof tmp, "%s/gen_%zu.%s", out_dir, i, im[i].ext);
    if (em_image_save(S, tmp, t, im[i].quality)) die(em_errmsg(S));
    em_tensor_release(t);
    size_t n;
    unsigned char *b = slurp(tmp, &n);
    remove(tmp);
    put(strcmp(im[i].ext, "png") ? "jpeg" : "png", strrchr(tmp, '/') + 1, b, n);
    free(b);
  }

  em_tensor *ts[3];
  em_dtype dts[3] = {EM_FLOAT32, EM_INT64, EM_BOOL};
  int64_t shapes[3][2] = {{2, 3}, {4, 1}, {0, 5}};
  for (int i = 0; i < 3; i++) {
    if (em_full(S, shapes[i], 2, 0, dts[i], EM_CPU, &ts[i])) die(em_errmsg(S));
  }
  const char *names[3] = {"weight", "step", "mask"};
  const char *keys[1] = {"format"}, *vals[1] = {"pt"};
  snprintf(tmp, sizeof tmp, "%s/gen.safetensors", out_dir);
  if (em_safetensors_write(S, tmp, names, ts, 3, keys, vals, 1, 0)) die(em_errmsg(S));
  size_t n;
  unsigned char *b = slurp(tmp, &n);
  remove(tmp);
  put("safetensors", "gen.safetensors", b, n);
  uint64_t h = 0;
  for (int i = 7; i >= 0; i--) h = h << 8 | b[i];
  put("json", "gen_header.json", b + 8, (size_t)h);
  free(b);
  for (int i = 0; i < 3; i++) em_tensor_release(ts[i]);
  em_close(S);
}

int main(int argc, char **argv) {
  if (argc != 3) die("usage: make_seeds FIXTURES_DIR OUT_DIR");
  out_dir = argv[2];
  if (mkdir(out_dir, 0755) != 0 && errno != EEXIST) die(out_dir);
  char dir[4096];
  snprintf(dir, sizeof dir, "%s/safetensors", argv[1]);
  copy_fixtures(dir, "safetensors", "safetensors", 0);
  copy_fixtures(dir, "safetensors", "json", 1);
  snprintf(dir, sizeof dir, "%s/data", argv[1]);
  copy_fixtures(dir, "csv", "csv", 0);
  copy_fixtures(dir, "jpg jpeg", "jpeg", 0);
  copy_fixtures(dir, "png", "png", 0);
  /* A few JSON texts beyond safetensors headers: every kind of value. */
  const char *js[] = {"[1, -2.5e+3, true, false, null, \"\\u00e9\\ud83d\\ude00\\n\"]",
                      "{\"a\": {\"b\": [[], {}]}, \"c\": \"\\\"\\\\\\/\\b\\f\\r\\t\"}",
                      "  0  ", "\"caf\xc3\xa9\""};
  for (size_t i = 0; i < sizeof js / sizeof js[0]; i++) {
    char name[32];
    snprintf(name, sizeof name, "gen_%zu.json", i);
    put("json", name, js[i], strlen(js[i]));
  }
  make_idx();
  make_cifar();
  make_csv();
  make_with_ember();
  return 0;
}
