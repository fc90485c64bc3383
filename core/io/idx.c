/*
** idx.c -- reader for IDX files (MNIST, Fashion-MNIST), gzip-compressed or raw.
**
** Format: two zero bytes, a type code, the number of dims d, then d big-endian
** uint32 sizes and the data, big-endian. zlib's gzread reads both compressed
** and plain files, so one path serves both. Everything the header claims is
** checked against what the file really holds: a truncated or lying file is an
** error naming the file, never a short tensor or a crash.
**
** Nothing is allocated on the header's word alone (a fuzzer found an 8-byte
** file asking for 17 GB). A raw file's claim is checked against its length
** before the tensor is allocated. A gzip file's length bounds what it can
** inflate to (deflate never exceeds 1032:1, so that is the stated limit: a
** claim beyond it is refused at once), and below that the data is read into
** a buffer that grows as bytes actually arrive, so a lying header costs
** memory in proportion to the real data, not to the claim. The grown buffer
** becomes the tensor's storage (no copy); it comes from the state's
** allocator, so a host's memory cap holds.
*/
#include "../internal.h"
#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

/* Deflate's worst-case expansion (a 258-byte match per 2 bits, about 1032:1),
** plus slack for the gzip header and trailer of small files. */
enum { GZ_MAX_RATIO = 1032, GZ_SLACK = 1 << 16, GROW_FIRST = 1 << 20 };

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

/* Frees a grown gzip buffer that became a tensor's storage. */
static void state_free(void *ud, void *p, size_t n) { emi_free((em_state *)ud, p, n); }

/* Reads nbytes (the header's claim) of a gzip stream into a buffer from the state's
** allocator that doubles as data arrives (GROW_FIRST first), a record (rec bytes)
** per gzread; *got says how many came. Returns the buffer (exactly nbytes long
** when *got == nbytes; *cap bytes otherwise), or NULL when out of memory. */
static unsigned char *read_growing(em_state *S, gzFile f, size_t nbytes, size_t rec,
                                   size_t *got, size_t *cap) {
  unsigned char *buf = NULL;
  *got = *cap = 0;
  while (*got < nbytes) {
    if (*got == *cap) {
      /* whole records, so that read_some's chunks stay record-aligned */
      size_t first = rec && rec < GROW_FIRST ? GROW_FIRST / rec * rec : rec ? rec : GROW_FIRST;
      size_t ncap = *cap ? *cap * 2 : first;
      if (ncap > nbytes) ncap = nbytes;
      unsigned char *nb = S->alloc(S->alloc_ud, buf, *cap, ncap);
      if (!nb) { emi_free(S, buf, *cap); *cap = 0; return NULL; }
      buf = nb;
      *cap = ncap;
    }
    size_t want = *cap - *got;
    size_t k = read_some(f, buf + *got, want, rec);
    *got += k;
    if (k < want) break;   /* the stream ended (or broke) before the claim */
  }
  return buf;
}

em_status em_idx_load(em_state *S, const char *path, em_tensor **out) {
  if (!path || !out) return emi_error(S, EM_ERR_ARG, "idx: path and out are required");
  *out = NULL;
  /* Opened here, not by gzopen, to learn the length of the very file read. */
  int fd = open(path, O_RDONLY);
  struct stat sb;
  if (fd < 0) return emi_error(S, EM_ERR_IO, "idx: can't open '%s'", path);
  if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
    close(fd);
    return emi_error(S, EM_ERR_IO, "idx: '%s' is not a regular file", path);
  }
  gzFile f = gzdopen(fd, "rb");
  if (!f) {
    close(fd);
    return emi_error(S, EM_ERR_IO, "idx: can't open '%s'", path);
  }
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
  char b[EMI_SHAPE_STR], msg[300];
  if (!emi_shape_ok(shape, ndim)) {   /* e.g. [0, 2^32-1, 2^32-1, 2^32-1]: empty, yet */
    snprintf(msg, sizeof msg, "shape %s in the header is too large (its strides "
             "overflow)", emi_shape_str(b, shape, ndim));
    return idx_fail(S, f, NULL, EM_ERR_IO, path, msg);
  }
  size_t esz = em_dtype_size(dt), nbytes = (size_t)emi_shape_numel(shape, ndim) * esz;
  size_t head_len = 4 + 4 * (size_t)ndim, rec = shape[0] ? nbytes / (size_t)shape[0] : 0;
  /* What the file can hold at most: the raw bytes after the header, or what the
  ** compressed length can inflate to. */
  int raw = gzdirect(f);
  size_t file_len = (size_t)sb.st_size;
  size_t avail = raw ? (file_len > head_len ? file_len - head_len : 0)
                     : file_len > (SIZE_MAX - GZ_SLACK) / GZ_MAX_RATIO
                       ? SIZE_MAX : file_len * GZ_MAX_RATIO + GZ_SLACK;
  if (nbytes > avail) {
    if (raw)   /* as a read would find it: the first record cut short */
      snprintf(msg, sizeof msg, "truncated at record %lld of %lld (the header promises "
               "%lld records of %zu bytes, %zu bytes in all; the file holds %zu after the "
               "header)", (long long)(rec ? avail / rec + 1 : 1), (long long)shape[0],
               (long long)shape[0], rec, nbytes, avail);
    else
      snprintf(msg, sizeof msg, "the header promises %zu bytes (shape %s), but a gzip "
               "file of %zu bytes inflates to at most %zu (deflate's 1032:1 limit)",
               nbytes, emi_shape_str(b, shape, ndim), file_len, avail);
    return idx_fail(S, f, NULL, EM_ERR_IO, path, msg);
  }
  em_tensor *t = NULL;
  size_t got = 0, cap = 0;
  if (raw || nbytes == 0) {
    em_status st = em_empty(S, shape, ndim, dt, EM_CPU, &t);
    if (st) {
      snprintf(msg, sizeof msg, "%s", em_errmsg(S));
      return idx_fail(S, f, NULL, st, path, msg);
    }
    got = read_some(f, em_tensor_data(t), nbytes, 0);
  } else {
    /* Compressed files are read a record at a time so that a truncation is placed
    ** exactly (see read_some). */
    unsigned char *buf = read_growing(S, f, nbytes, rec, &got, &cap);
    if (!buf) {
      snprintf(msg, sizeof msg, "out of memory reading %zu bytes (shape %s)", nbytes,
               emi_shape_str(b, shape, ndim));
      return idx_fail(S, f, NULL, EM_ERR_NOMEM, path, msg);
    }
    if (got != nbytes) emi_free(S, buf, cap);
    else if (!(t = emi_tensor_try_external(S, buf, nbytes, state_free, S, shape, ndim, dt))) {
      emi_free(S, buf, cap);
      return idx_fail(S, f, NULL, EM_ERR_NOMEM, path, "out of memory");
    }
  }
  if (got != nbytes) {
    /* Name the first record cut short: a prefix of whole records is intact. */
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
