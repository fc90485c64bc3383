/*
** idx.c -- reader for IDX files (MNIST, Fashion-MNIST), gzip-compressed or raw.
**
** Format: two zero bytes, a type code, the number of dims d, then d big-endian
** uint32 sizes and the data, big-endian. zlib's gzread reads both compressed
** and plain files, so one path serves both. Everything the header claims is
** checked against what the file really holds: a truncated or lying file is an
** error naming the file, never a short tensor or a crash.
*/
#include "../internal.h"
#include <stdio.h>
#include <zlib.h>

static em_status idx_fail(em_state *S, gzFile f, em_tensor *t, em_status code,
                          const char *path, const char *what) {
  if (f) gzclose(f);
  em_tensor_release(t);
  return emi_error(S, code, "idx: '%s': %s", path, what);
}

/* Reads up to n bytes, at most `step` per gzread; returns how many were read (n
** unless the file is short). A gzread that meets the end of a truncated gzip
** stream returns an error, dropping what it had inflated, so the count is exact
** only to within one step: callers wanting the exact record pass its size. */
static size_t read_some(gzFile f, void *buf, size_t n, size_t step) {
  char *p = buf;
  size_t total = 0;
  if (step == 0 || step > (1u << 30)) step = 1u << 30;
  while (n > 0) {
    unsigned chunk = n > step ? (unsigned)step : (unsigned)n;
    int got = gzread(f, p, chunk);
    if (got <= 0) break;
    p += got;
    n -= (size_t)got;
    total += (size_t)got;
  }
  return total;
}

/* Reads exactly n bytes or reports how the file fell short. */
static int read_full(gzFile f, void *buf, size_t n) { return read_some(f, buf, n, 0) == n; }

static void swap_bytes(void *data, int64_t count, size_t size) {
  unsigned char *p = data;
  for (int64_t i = 0; i < count; i++, p += size)
    for (size_t a = 0, b = size - 1; a < b; a++, b--) {
      unsigned char c = p[a]; p[a] = p[b]; p[b] = c;
    }
}

em_status em_idx_load(em_state *S, const char *path, em_tensor **out) {
  if (!path || !out) return emi_error(S, EM_ERR_ARG, "idx: path and out are required");
  *out = NULL;
  gzFile f = gzopen(path, "rb");
  if (!f) return emi_error(S, EM_ERR_IO, "idx: can't open '%s'", path);
  unsigned char head[4];
  if (!read_full(f, head, 4))
    return idx_fail(S, f, NULL, EM_ERR_IO, path, "file too short for an IDX header");
  if (head[0] != 0 || head[1] != 0)
    return idx_fail(S, f, NULL, EM_ERR_IO, path, "wrong magic number (not an IDX file)");
  em_dtype dt;
  switch (head[2]) {
  case 0x08: dt = EM_UINT8; break;
  case 0x0C: dt = EM_INT32; break;
  case 0x0D: dt = EM_FLOAT32; break;
  case 0x0E: dt = EM_FLOAT64; break;
  default:
    return idx_fail(S, f, NULL, EM_ERR_IO, path,
                    "unsupported IDX type code (ubyte, int, float and double are read)");
  }
  int ndim = head[3];
  if (ndim < 1 || ndim > EM_MAX_DIMS)
    return idx_fail(S, f, NULL, EM_ERR_IO, path, "bad number of dimensions in the header");
  int64_t shape[EM_MAX_DIMS];
  for (int d = 0; d < ndim; d++) {
    unsigned char b[4];
    if (!read_full(f, b, 4))
      return idx_fail(S, f, NULL, EM_ERR_IO, path, "truncated header");
    shape[d] = (int64_t)b[0] << 24 | (int64_t)b[1] << 16 | (int64_t)b[2] << 8 | b[3];
  }
  em_tensor *t;
  em_status st = em_empty(S, shape, ndim, dt, EM_CPU, &t);
  if (st) { gzclose(f); return st; }
  size_t esz = em_dtype_size(dt), nbytes = (size_t)t->numel * esz;
  /* Compressed files are read a record at a time so that a truncation is placed
  ** exactly (see read_some); plain ones in one go. */
  size_t rec = shape[0] ? nbytes / (size_t)shape[0] : 0;
  size_t got = read_some(f, em_tensor_data(t), nbytes, gzdirect(f) ? 0 : rec);
  if (got != nbytes) {
    /* Name the first record cut short: a prefix of whole records is intact. */
    char msg[200];
    snprintf(msg, sizeof msg, "truncated at record %lld of %lld (the header promises %lld "
             "records of %zu bytes)", (long long)(rec ? got / rec + 1 : 1),
             (long long)shape[0], (long long)shape[0], rec);
    return idx_fail(S, f, t, EM_ERR_IO, path, msg);
  }
  char extra;
  if (gzread(f, &extra, 1) > 0)
    return idx_fail(S, f, t, EM_ERR_IO, path, "trailing bytes after the data the header describes");
  gzclose(f);
  if (esz > 1) swap_bytes(em_tensor_data(t), t->numel, esz);   /* big-endian on disk */
  *out = t;
  return EM_OK;
}
