/* test_idx.c -- the IDX reader: raw and gzip files written here, every kind of
** bad file (missing, bad magic, bad type, truncated header and data, trailing
** bytes), values and byte order checked. */
#include "check.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

static char dir[64];

static const char *write_file(const char *name, const unsigned char *b, size_t n, int gz) {
  static char path[128];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  if (gz) {
    gzFile f = gzopen(path, "wb");
    gzwrite(f, b, (unsigned)n);
    gzclose(f);
  } else {
    FILE *f = fopen(path, "wb");
    fwrite(b, 1, n, f);
    fclose(f);
  }
  return path;
}

static void expect_error(em_state *S, const char *path, const char *needle) {
  em_tensor *t = (em_tensor *)1;
  em_status st = em_idx_load(S, path, &t);
  CHECK(st == EM_ERR_IO, "status %d for %s", st, path);
  CHECK(t == NULL, "out cleared on error");
  CHECK(strstr(em_errmsg(S), needle) != NULL, "message '%s' should mention '%s'",
        em_errmsg(S), needle);
  CHECK(strstr(em_errmsg(S), path) != NULL, "message names the file");
}

static void test_idx(em_state *S) {

  /* 2 images of 2x3 ubyte */
  unsigned char img[4 + 12 + 12] = {0, 0, 0x08, 3, 0, 0, 0, 2, 0, 0, 0, 2, 0, 0, 0, 3};
  for (int i = 0; i < 12; i++) img[16 + i] = (unsigned char)(i * 20);
  for (int gz = 0; gz < 2; gz++) {
    em_tensor *t;
    CHECK_OK(S, em_idx_load(S, write_file(gz ? "img.gz" : "img", img, sizeof img, gz), &t));
    if (t) {
      CHECK(em_tensor_dtype(t) == EM_UINT8 && em_tensor_ndim(t) == 3, "uint8 3-D");
      CHECK(em_tensor_size(t, 0) == 2 && em_tensor_size(t, 1) == 2 && em_tensor_size(t, 2) == 3,
            "shape 2x2x3");
      const unsigned char *d = em_tensor_data(t);
      int ok = 1;
      for (int i = 0; i < 12; i++) ok &= d[i] == i * 20;
      CHECK(ok, "values (%s)", gz ? "gzip" : "raw");
      em_tensor_release(t);
    }
  }
  /* int32 labels, big-endian on disk */
  unsigned char lab[4 + 4 + 8] = {0, 0, 0x0C, 1, 0, 0, 0, 2, 0, 0, 1, 2, 0xff, 0xff, 0xff, 0xfe};
  em_tensor *t;
  CHECK_OK(S, em_idx_load(S, write_file("lab", lab, sizeof lab, 0), &t));
  if (t) {
    const int32_t *d = em_tensor_data(t);
    CHECK(em_tensor_dtype(t) == EM_INT32 && d[0] == 258 && d[1] == -2, "int32 byte order");
    em_tensor_release(t);
  }
  /* bad files */
  char missing[96];
  snprintf(missing, sizeof missing, "%s/nope", dir);
  em_status st = em_idx_load(S, missing, &t);
  CHECK(st == EM_ERR_IO && strstr(em_errmsg(S), "can't open"), "missing file: %s", em_errmsg(S));
  unsigned char bad[sizeof img];
  memcpy(bad, img, sizeof img); bad[0] = 7;
  expect_error(S, write_file("magic", bad, sizeof bad, 0), "magic");
  memcpy(bad, img, sizeof img); bad[2] = 0x0B;
  expect_error(S, write_file("type", bad, sizeof bad, 0), "type code");
  expect_error(S, write_file("short", img, 3, 0), "too short");
  expect_error(S, write_file("hdr", img, 10, 1), "truncated header");
  for (size_t n = 16; n < sizeof img; n += 5)
    expect_error(S, write_file("data", img, n, n & 1), "truncated");
  unsigned char longer[sizeof img + 1];
  memcpy(longer, img, sizeof img); longer[sizeof img] = 1;
  expect_error(S, write_file("long", longer, sizeof longer, 0), "trailing");
  CHECK(em_memory_allocated(S) == 0, "nothing leaked: %lld bytes live",
        (long long)em_memory_allocated(S));
}

int main(void) {
  snprintf(dir, sizeof dir, "/tmp/ember-idx-%d", (int)getpid());
  if (mkdir(dir, 0700) != 0) { perror("mkdir"); return 1; }
  em_state *S;
  if (em_open(&S, NULL) != EM_OK) return 1;
  RUN(test_idx, S);
  em_close(S);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
  return check_done();
}
