/*
** fuzz_common.c -- the state, in-memory files and end-of-run checks the
** harnesses share (see fuzz.h).
*/
#define _GNU_SOURCE
#include "fuzz.h"
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* -- The capped allocator --------------------------------------------------- */
static void *capped_alloc(void *ud, void *ptr, size_t osize, size_t nsize) {
  (void)ud; (void)osize;
  if (nsize == 0) { free(ptr); return NULL; }
  if (nsize > FUZZ_ALLOC_LIMIT) return NULL;   /* refused: ember reports EM_ERR_NOMEM */
  return realloc(ptr, nsize);
}

static em_state *state;

em_state *fuzz_state(void) {
  if (state) return state;
  em_config cfg;
  em_config_init(&cfg);
  cfg.num_threads = 1;
  cfg.alloc = capped_alloc;
  cfg.cache_limit = -1;
  if (em_open(&state, &cfg) != EM_OK) fuzz_fail("em_open failed");
  return state;
}

/* -- In-memory files ------------------------------------------------------------ */
static int fds[FUZZ_MAX_FILES] = {-1, -1, -1, -1};
static char paths[FUZZ_MAX_FILES][40];

const char *fuzz_file(int k, const uint8_t *data, size_t n) {
  if (k < 0 || k >= FUZZ_MAX_FILES) fuzz_fail("fuzz_file: no file %d", k);
  if (fds[k] < 0) {
    fds[k] = memfd_create("ember-fuzz", MFD_CLOEXEC);
    if (fds[k] < 0) fuzz_fail("memfd_create failed");
    snprintf(paths[k], sizeof paths[k], "/proc/self/fd/%d", fds[k]);
  }
  /* Truncate first: the parsers measure the file with fstat. */
  if (ftruncate(fds[k], 0) != 0) fuzz_fail("ftruncate failed");
  for (size_t at = 0; at < n;) {
    ssize_t w = pwrite(fds[k], data + at, n - at, (off_t)at);
    if (w <= 0) fuzz_fail("pwrite failed");
    at += (size_t)w;
  }
  return paths[k];
}

/* -- Checks -------------------------------------------------------------------- */
void fuzz_fail(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "ember fuzz check failed: ");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
  abort();
}

void fuzz_end(void) {
  int64_t held = em_memory_allocated(state);
  if (held != 0) fuzz_fail("%lld bytes of tensor storage still held after the run",
                           (long long)held);
}

void fuzz_touch(const em_tensor *t) {
  int64_t numel = em_tensor_numel(t);
  if (numel < 0) fuzz_fail("a tensor with %lld elements", (long long)numel);
  if (numel == 0) return;   /* no data; and its layout may report non-contiguous */
  if (!em_tensor_is_contiguous(t)) fuzz_fail("a parser returned a non-contiguous tensor");
  const volatile uint8_t *p = em_tensor_data(t);
  size_t nbytes = (size_t)numel * em_dtype_size(em_tensor_dtype(t));
  uint8_t ends = p[0] ^ p[nbytes - 1];   /* both ends: ASan checks the extent */
  (void)ends;
}

/* -- Images ------------------------------------------------------------------------ */
int fuzz_image_one(const uint8_t *data, size_t n) {
  em_state *S = fuzz_state();
  const char *path = fuzz_file(0, data, n);
  /* Both channel modes: as stored, and expanded to RGB; the input's length
  ** picks one, so that the fuzzer reaches both and a finding replays alike. */
  int channels = n & 1 ? 3 : 0;
  em_tensor *t = NULL;
  if (em_image_load(S, path, channels, &t) == EM_OK) {
    if (em_tensor_ndim(t) != 3 || em_tensor_dtype(t) != EM_UINT8)
      fuzz_fail("an image that is not uint8 (C, H, W)");
    int64_t C = em_tensor_size(t, 0);
    if (channels == 3 ? C != 3 : C < 1 || C > 4) fuzz_fail("an image with %lld channels",
                                                         (long long)C);
    fuzz_touch(t);
    em_tensor_release(t);
  }
  fuzz_end();
  return 0;
}
