/*
** safetensors.c -- reading and writing safetensors files (see ember.h, "Saving").
**
** Reading trusts nothing in the file. The order of checks is what keeps a hostile
** file cheap: the 8-byte header length is checked against the file size and a
** fixed ceiling before anything is allocated; the JSON is walked by a schema-
** directed pull parser (io/json.c) that allocates nothing per value and limits
** nesting; every size and offset is range-checked with overflow-free arithmetic
** before it is used; and only when the offsets tile the data section exactly (no
** gap, no overlap, nothing past the end) is the file accepted. Tensor bytes are
** then read with pread into tensors made through the state's allocator, so the
** largest allocation a file can cause is the size of the file itself, and a
** refused one is a clean EM_ERR_NOMEM.
**
** Writing goes to a fresh temporary file in the target's folder that is renamed
** over the target at the end: rename is atomic, so a crash at any point leaves
** either the old file or the new one. With EM_SAVE_SYNC the file is fsynced
** before the rename and the folder after it, which makes the new content survive
** a power cut too (what checkpoints want). Strided tensors are written through a
** small staging buffer instead of a contiguous copy of the whole tensor.
**
** Byte order: the format is little-endian, as is every host ember targets; a
** big-endian host is refused rather than silently misread.
*/
#include "internal.h"
#include "io/json.h"
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

enum {
  MAX_HEADER = 100000000,   /* the format's own ceiling (as the reference reader) */
  MAX_DEPTH = 64,           /* JSON nesting; the schema itself needs 3 */
  STAGE_BYTES = 1 << 20     /* staging buffer for strided tensors */
};

/* safetensors dtype names; em < 0: a dtype of the format that ember lacks. */
static const struct { const char *name; int size; int em; } DTYPES[] = {
  {"F32", 4, EM_FLOAT32}, {"F64", 8, EM_FLOAT64}, {"F16", 2, EM_FLOAT16},
  {"BF16", 2, EM_BFLOAT16}, {"I32", 4, EM_INT32}, {"I64", 8, EM_INT64},
  {"U8", 1, EM_UINT8}, {"BOOL", 1, EM_BOOL},
  {"I8", 1, -1}, {"I16", 2, -1}, {"U16", 2, -1}, {"U32", 4, -1}, {"U64", 8, -1},
  {"F8_E4M3", 1, -1}, {"F8_E5M2", 1, -1}, {"F8_E8M0", 1, -1}, {"C64", 8, -1},
};
enum { NUM_ST_DTYPES = sizeof DTYPES / sizeof DTYPES[0] };

static const char *ST_NAME[EM_NUM_DTYPES] = {
  [EM_FLOAT32] = "F32", [EM_FLOAT64] = "F64", [EM_FLOAT16] = "F16",
  [EM_BFLOAT16] = "BF16", [EM_INT32] = "I32", [EM_INT64] = "I64",
  [EM_UINT8] = "U8", [EM_BOOL] = "BOOL",
};

typedef struct st_entry {
  const char *name;          /* points into the header buffer */
  int dtype;                 /* index into DTYPES */
  int ndim;                  /* may exceed EM_MAX_DIMS: then get/info refuse */
  int64_t shape[EM_MAX_DIMS];
  int64_t begin, end;        /* byte range in the data section */
} st_entry;

struct em_safetensors {
  em_state *S;
  int fd;
  char *path;
  size_t path_size;
  char *header;              /* N + 1 bytes; strings decoded in place */
  size_t header_size;
  int64_t data_start, data_size;
  st_entry *entries;
  int64_t n, cap;
  const char **meta;         /* key, value, key, value, ... */
  int64_t nmeta, meta_cap;
};

static bool little_endian(void) {
  const uint16_t one = 1;
  return *(const uint8_t *)&one == 1;
}

/* The path as messages show it: the end of very long ones. */
static const char *shown(const char *path) {
  size_t n = strlen(path);
  return n > 160 ? path + n - 160 : path;
}

/* "op: 'path': <message>" with the given status. */
static em_status fail(em_state *S, em_status code, const char *op, const char *path,
                      const char *fmt, ...) __attribute__((format(printf, 5, 6)));
static em_status fail(em_state *S, em_status code, const char *op, const char *path,
                      const char *fmt, ...) {
  char msg[EMI_ERRMSG_SIZE];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return emi_error(S, code, "%s: '%s%s': %s", op, strlen(path) > 160 ? "..." : "",
                   shown(path), msg);
}

/* Reads exactly n bytes at off: 0, or -1 with errno set, or 1 at an early end. */
static int read_at(int fd, void *buf, size_t n, int64_t off) {
  char *p = buf;
  while (n > 0) {
    size_t chunk = n > ((size_t)1 << 30) ? (size_t)1 << 30 : n;
    ssize_t k = pread(fd, p, chunk, (off_t)off);
    if (k < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    if (k == 0) return 1;
    p += k;
    n -= (size_t)k;
    off += k;
  }
  return 0;
}

/* Writes all n bytes: 0, or -1 with errno set. */
static int write_all(int fd, const void *buf, size_t n) {
  const char *p = buf;
  while (n > 0) {
    size_t chunk = n > ((size_t)1 << 30) ? (size_t)1 << 30 : n;
    ssize_t k = write(fd, p, chunk);
    if (k < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    p += k;
    n -= (size_t)k;
  }
  return 0;
}

/* "[2,3]", or "[2,3,...]" past EM_MAX_DIMS. */
static const char *shape_str(char *buf, const st_entry *e) {
  emi_shape_str(buf, e->shape, e->ndim < EM_MAX_DIMS ? e->ndim : EM_MAX_DIMS);
  if (e->ndim > EM_MAX_DIMS) strcpy(buf + strlen(buf) - 1, ",...]");
  return buf;
}

/* == Reading ====================================================================== */

typedef struct parser {
  emi_json j;
  em_safetensors *f;
  char msg[EMI_ERRMSG_SIZE - 64];   /* a schema problem ("" for a JSON one) */
  bool nomem;
} parser;

static bool bad(parser *P, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static bool bad(parser *P, const char *fmt, ...) {
  if (P->msg[0]) return false;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(P->msg, sizeof P->msg, fmt, ap);
  va_end(ap);
  return false;
}

/* Grows a state-allocated array of elem-byte items to hold at least need. */
static bool grow(em_state *S, void **arr, int64_t *cap, int64_t need, size_t elem) {
  if (need <= *cap) return true;
  int64_t ncap = *cap ? *cap * 2 : 16;
  while (ncap < need) ncap *= 2;
  void *p = emi_malloc(S, (size_t)ncap * elem);
  if (!p) return false;
  if (*arr) {
    memcpy(p, *arr, (size_t)*cap * elem);
    emi_free(S, *arr, (size_t)*cap * elem);
  }
  *arr = p;
  *cap = ncap;
  return true;
}

static bool parse_metadata(parser *P) {
  emi_json *j = &P->j;
  em_safetensors *f = P->f;
  if (emi_json_peek(j) != '{')
    return bad(P, "__metadata__ is %s, expected an object of strings", emi_json_kind(j));
  if (!emi_json_open(j, '{')) return false;
  int64_t count = 0;
  bool more;
  for (;;) {
    char *key, *val;
    size_t klen, vlen;
    if (!emi_json_more(j, '}', &count, &more)) return false;
    if (!more) return true;
    if (!emi_json_string(j, &key, &klen) || !emi_json_colon(j)) return false;
    if (emi_json_peek(j) != '"')
      return bad(P, "__metadata__ value of '%.100s' is %s, expected a string", key,
                 emi_json_kind(j));
    if (!emi_json_string(j, &val, &vlen)) return false;
    if (!grow(f->S, (void **)&f->meta, &f->meta_cap, 2 * (f->nmeta + 1), sizeof(char *))) {
      P->nomem = true;
      return false;
    }
    f->meta[2 * f->nmeta] = key;
    f->meta[2 * f->nmeta + 1] = val;
    f->nmeta++;
  }
}

/* An array of non-negative integers: the shape (count unbounded, the first
** EM_MAX_DIMS kept) or the offsets (want exactly 2). */
static bool parse_ints(parser *P, const char *name, const char *what, int64_t *vals,
                       int keep, int *count) {
  emi_json *j = &P->j;
  if (emi_json_peek(j) != '[')
    return bad(P, "tensor '%.100s': %s is %s, expected a list of integers", name, what,
               emi_json_kind(j));
  if (!emi_json_open(j, '[')) return false;
  int64_t n = 0;
  bool more;
  for (;;) {
    if (!emi_json_more(j, ']', &n, &more)) return false;
    if (!more) break;
    int64_t v;
    if (emi_json_peek(j) != '-' && (emi_json_peek(j) < '0' || emi_json_peek(j) > '9'))
      return bad(P, "tensor '%.100s': %s holds %s, expected integers", name, what,
                 emi_json_kind(j));
    if (!emi_json_uint(j, &v))
      return bad(P, "tensor '%.100s': %s: %s", name, what, j->err);
    if (n > 1000) return bad(P, "tensor '%.100s': %s has over 1000 entries", name, what);
    if (n <= keep) vals[n - 1] = v;
  }
  *count = (int)n;
  return true;
}

static bool parse_entry(parser *P, const char *name) {
  emi_json *j = &P->j;
  em_safetensors *f = P->f;
  st_entry e = {.name = name, .dtype = -1, .ndim = -1};
  int noff = -1;
  int64_t off[2] = {0, 0};
  if (emi_json_peek(j) != '{')
    return bad(P, "entry '%.100s' is %s, expected an object {dtype, shape, data_offsets}",
               name, emi_json_kind(j));
  if (!emi_json_open(j, '{')) return false;
  int64_t count = 0;
  bool more;
  for (;;) {
    char *key;
    size_t klen;
    if (!emi_json_more(j, '}', &count, &more)) return false;
    if (!more) break;
    if (!emi_json_string(j, &key, &klen) || !emi_json_colon(j)) return false;
    if (strcmp(key, "dtype") == 0) {
      char *dt;
      size_t dlen;
      if (e.dtype != -1) return bad(P, "tensor '%.100s' has 'dtype' twice", name);
      if (emi_json_peek(j) != '"')
        return bad(P, "tensor '%.100s': dtype is %s, expected a string", name,
                   emi_json_kind(j));
      if (!emi_json_string(j, &dt, &dlen)) return false;
      for (int k = 0; k < NUM_ST_DTYPES && e.dtype < 0; k++)
        if (strcmp(dt, DTYPES[k].name) == 0) e.dtype = k;
      if (e.dtype < 0)
        return bad(P, "tensor '%.100s' has unknown dtype '%.40s' (expected F32, F64, F16, "
                   "BF16, I32, I64, U8 or BOOL)", name, dt);
    } else if (strcmp(key, "shape") == 0) {
      if (e.ndim != -1) return bad(P, "tensor '%.100s' has 'shape' twice", name);
      if (!parse_ints(P, name, "shape", e.shape, EM_MAX_DIMS, &e.ndim)) return false;
    } else if (strcmp(key, "data_offsets") == 0) {
      if (noff != -1) return bad(P, "tensor '%.100s' has 'data_offsets' twice", name);
      if (!parse_ints(P, name, "data_offsets", off, 2, &noff)) return false;
      if (noff != 2)
        return bad(P, "tensor '%.100s': data_offsets has %d entries, expected [begin, end]",
                   name, noff);
    } else if (!emi_json_skip(j)) {   /* unknown keys are allowed, as other readers do */
      return false;
    }
  }
  if (e.dtype < 0) return bad(P, "tensor '%.100s' has no dtype", name);
  if (e.ndim < 0) return bad(P, "tensor '%.100s' has no shape", name);
  if (noff < 0) return bad(P, "tensor '%.100s' has no data_offsets", name);

  /* Bytes the shape needs, refusing any overflow on the way (sizes are < 2^63).
  ** A zero dim makes the byte count 0 but not the strides of the other dims:
  ** [0, 2^62, 2^62] holds nothing yet its strides overflow, so every stride
  ** product is checked too (emi_shape_ok), empty or not. */
  char sb[EMI_SHAPE_STR + 8];
  int64_t nbytes = DTYPES[e.dtype].size;
  for (int d = 0; d < e.ndim && d < EM_MAX_DIMS; d++) {
    if (e.shape[d] != 0 && nbytes > INT64_MAX / e.shape[d])
      return bad(P, "tensor '%.100s': shape %s is too large", name, shape_str(sb, &e));
    nbytes *= e.shape[d];
  }
  if (!emi_shape_ok(e.shape, e.ndim < EM_MAX_DIMS ? e.ndim : EM_MAX_DIMS))
    return bad(P, "tensor '%.100s': shape %s is too large (its strides overflow)", name,
               shape_str(sb, &e));
  if (e.ndim > EM_MAX_DIMS) nbytes = -1;   /* unknowable here: only the range checks */
  e.begin = off[0];
  e.end = off[1];
  if (e.end < e.begin)
    return bad(P, "tensor '%.100s': data_offsets [%lld, %lld] end before they begin", name,
               (long long)e.begin, (long long)e.end);
  if (nbytes >= 0 && e.end - e.begin != nbytes)
    return bad(P, "tensor '%.100s': data_offsets [%lld, %lld] hold %lld bytes, but shape %s "
               "of %s needs %lld", name, (long long)e.begin, (long long)e.end,
               (long long)(e.end - e.begin), shape_str(sb, &e), DTYPES[e.dtype].name,
               (long long)nbytes);
  if (e.end > f->data_size)
    return bad(P, "tensor '%.100s': data_offsets [%lld, %lld] run past the end of the data "
               "(%lld bytes)", name, (long long)e.begin, (long long)e.end,
               (long long)f->data_size);
  if (!grow(f->S, (void **)&f->entries, &f->cap, f->n + 1, sizeof(st_entry))) {
    P->nomem = true;
    return false;
  }
  f->entries[f->n++] = e;
  return true;
}

static bool parse_header(parser *P) {
  emi_json *j = &P->j;
  if (emi_json_peek(j) != '{') {
    if (emi_json_peek(j) < 0) return bad(P, "the header is blank");
    if (emi_json_peek(j) != '[' && emi_json_peek(j) != '"' && emi_json_peek(j) != 'n' &&
        emi_json_peek(j) != 't' && emi_json_peek(j) != 'f' && emi_json_peek(j) != '-' &&
        (emi_json_peek(j) < '0' || emi_json_peek(j) > '9'))
      return emi_json_fail(j, "not JSON");
    return bad(P, "the header is %s, expected a JSON object", emi_json_kind(j));
  }
  if (!emi_json_open(j, '{')) return false;
  int64_t count = 0;
  bool more, have_meta = false;
  for (;;) {
    char *key;
    size_t klen;
    if (!emi_json_more(j, '}', &count, &more)) return false;
    if (!more) break;
    if (!emi_json_string(j, &key, &klen) || !emi_json_colon(j)) return false;
    if (strcmp(key, "__metadata__") == 0) {
      if (have_meta) return bad(P, "__metadata__ appears twice");
      have_meta = true;
      if (!parse_metadata(P)) return false;
    } else if (!parse_entry(P, key)) {
      return false;
    }
  }
  return emi_json_finish(j);
}

static int cmp_name(const void *a, const void *b) {
  return strcmp((*(st_entry *const *)a)->name, (*(st_entry *const *)b)->name);
}
static int cmp_range(const void *a, const void *b) {
  const st_entry *x = *(st_entry *const *)a, *y = *(st_entry *const *)b;
  if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
  if (x->end != y->end) return x->end < y->end ? -1 : 1;
  return 0;
}
static int cmp_str(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Unique names and metadata keys; the byte ranges tile [0, data_size). */
static em_status check_layout(em_safetensors *f) {
  em_state *S = f->S;
  int64_t m = f->n > f->nmeta ? f->n : f->nmeta;
  if (m == 0) {
    if (f->data_size)
      return fail(S, EM_ERR_IO, "load", f->path, "the file holds no tensors, but %lld data "
                  "bytes follow the header", (long long)f->data_size);
    return EM_OK;
  }
  size_t bytes = (size_t)m * sizeof(void *);
  void **v = emi_malloc(S, bytes);
  if (!v) return fail(S, EM_ERR_NOMEM, "load", f->path, "out of memory checking the header");
  em_status st = EM_OK;
  st_entry **e = (st_entry **)v;
  const char **keys = (const char **)v;

  for (int64_t i = 0; i < f->nmeta; i++) keys[i] = f->meta[2 * i];
  qsort(keys, (size_t)f->nmeta, sizeof *keys, cmp_str);
  for (int64_t i = 1; i < f->nmeta && !st; i++)
    if (strcmp(keys[i - 1], keys[i]) == 0)
      st = fail(S, EM_ERR_IO, "load", f->path, "metadata key '%.100s' appears twice", keys[i]);

  for (int64_t i = 0; i < f->n; i++) e[i] = &f->entries[i];
  qsort(e, (size_t)f->n, sizeof *e, cmp_name);
  for (int64_t i = 1; i < f->n && !st; i++)
    if (strcmp(e[i - 1]->name, e[i]->name) == 0)
      st = fail(S, EM_ERR_IO, "load", f->path, "tensor name '%.100s' appears twice",
                e[i]->name);

  qsort(e, (size_t)f->n, sizeof *e, cmp_range);
  int64_t pos = 0;
  for (int64_t i = 0; i < f->n && !st; i++) {
    if (e[i]->begin < pos)
      st = fail(S, EM_ERR_IO, "load", f->path, "tensors '%.80s' [%lld, %lld] and '%.80s' "
                "[%lld, %lld] overlap", e[i - 1]->name, (long long)e[i - 1]->begin,
                (long long)e[i - 1]->end, e[i]->name, (long long)e[i]->begin,
                (long long)e[i]->end);
    else if (e[i]->begin > pos)
      st = fail(S, EM_ERR_IO, "load", f->path, "bytes [%lld, %lld) of the data belong to no "
                "tensor (a gap before '%.100s')", (long long)pos, (long long)e[i]->begin,
                e[i]->name);
    pos = e[i]->end;
  }
  if (!st && pos != f->data_size)
    st = fail(S, EM_ERR_IO, "load", f->path, "bytes [%lld, %lld) at the end of the data "
              "belong to no tensor", (long long)pos, (long long)f->data_size);
  emi_free(S, v, bytes);
  return st;
}

void em_safetensors_close(em_safetensors *f) {
  if (!f) return;
  em_state *S = f->S;
  if (f->fd >= 0) close(f->fd);
  emi_free(S, f->entries, (size_t)f->cap * sizeof(st_entry));
  emi_free(S, f->meta, (size_t)f->meta_cap * sizeof(char *));
  emi_free(S, f->header, f->header_size + 1);
  emi_free(S, f->path, f->path_size);
  emi_free(S, f, sizeof *f);
}

em_status em_safetensors_open(em_state *S, const char *path, em_safetensors **out) {
  if (!S) return EM_ERR_ARG;
  if (!path || !out) return emi_error(S, EM_ERR_ARG, "load: path and out must not be NULL");
  *out = NULL;
  if (!little_endian())
    return fail(S, EM_ERR_UNSUPPORTED, "load", path, "big-endian hosts are not supported");
  em_safetensors *f = emi_malloc(S, sizeof *f);
  if (!f) return fail(S, EM_ERR_NOMEM, "load", path, "out of memory");
  memset(f, 0, sizeof *f);
  f->S = S;
  f->fd = -1;
  f->path_size = strlen(path) + 1;
  f->path = emi_malloc(S, f->path_size);
  if (!f->path) {
    emi_free(S, f, sizeof *f);
    return fail(S, EM_ERR_NOMEM, "load", path, "out of memory");
  }
  memcpy(f->path, path, f->path_size);

  em_status st;
  /* O_NONBLOCK: opening a FIFO must not hang; the S_ISREG check then refuses it. */
  f->fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  struct stat sb;
  if (f->fd < 0) {
    st = fail(S, EM_ERR_IO, "load", path, "can't open: %s", strerror(errno));
    goto out;
  }
  if (fstat(f->fd, &sb) != 0) {
    st = fail(S, EM_ERR_IO, "load", path, "can't stat: %s", strerror(errno));
    goto out;
  }
  if (!S_ISREG(sb.st_mode)) {
    st = fail(S, EM_ERR_IO, "load", path, "not a regular file");
    goto out;
  }
  int64_t fsize = (int64_t)sb.st_size;
  if (fsize < 8) {
    st = fail(S, EM_ERR_IO, "load", path, "the file is %lld bytes long, too short for a "
              "safetensors file (8-byte header length, then the header)", (long long)fsize);
    goto out;
  }
  unsigned char lenb[8];
  int r = read_at(f->fd, lenb, 8, 0);
  if (r) {
    st = fail(S, EM_ERR_IO, "load", path, "can't read: %s",
              r < 0 ? strerror(errno) : "the file ended early");
    goto out;
  }
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; i--) hlen = hlen << 8 | lenb[i];
  if (hlen > MAX_HEADER) {
    st = fail(S, EM_ERR_IO, "load", path, "header length %llu is absurd (more than %d "
              "bytes): not a safetensors file, or a corrupt one", (unsigned long long)hlen,
              MAX_HEADER);
    goto out;
  }
  if ((int64_t)hlen > fsize - 8) {
    st = fail(S, EM_ERR_IO, "load", path, "header length %llu runs past the end of the "
              "file (%lld bytes): the file is truncated or corrupt",
              (unsigned long long)hlen, (long long)fsize);
    goto out;
  }
  if (hlen == 0) {
    st = fail(S, EM_ERR_IO, "load", path, "the header is empty (length 0)");
    goto out;
  }
  f->header_size = (size_t)hlen;
  f->header = emi_malloc(S, f->header_size + 1);
  if (!f->header) {
    st = fail(S, EM_ERR_NOMEM, "load", path, "out of memory for the %llu-byte header",
              (unsigned long long)hlen);
    goto out;
  }
  r = read_at(f->fd, f->header, f->header_size, 8);
  if (r) {
    st = fail(S, EM_ERR_IO, "load", path, "can't read the header: %s",
              r < 0 ? strerror(errno) : "the file ended early");
    goto out;
  }
  f->header[f->header_size] = 0;
  f->data_start = 8 + (int64_t)hlen;
  f->data_size = fsize - f->data_start;

  parser P;
  memset(&P, 0, sizeof P);
  P.f = f;
  emi_json_init(&P.j, f->header, f->header_size, MAX_DEPTH);
  if (!parse_header(&P)) {
    if (P.nomem) st = fail(S, EM_ERR_NOMEM, "load", path, "out of memory reading the header");
    else if (P.msg[0]) st = fail(S, EM_ERR_IO, "load", path, "%s", P.msg);
    else st = fail(S, EM_ERR_IO, "load", path, "invalid JSON in the header at byte %zu: %s",
                   P.j.err_at, P.j.err);
    goto out;
  }
  st = check_layout(f);
out:
  if (st) em_safetensors_close(f);
  else *out = f;
  return st;
}

int64_t em_safetensors_count(const em_safetensors *f) { return f ? f->n : 0; }

const char *em_safetensors_name(const em_safetensors *f, int64_t i) {
  return f && i >= 0 && i < f->n ? f->entries[i].name : NULL;
}

int64_t em_safetensors_find(const em_safetensors *f, const char *name) {
  for (int64_t i = 0; f && name && i < f->n; i++)
    if (strcmp(f->entries[i].name, name) == 0) return i;
  return -1;
}

int64_t em_safetensors_metadata_count(const em_safetensors *f) { return f ? f->nmeta : 0; }

const char *em_safetensors_metadata_key(const em_safetensors *f, int64_t i) {
  return f && i >= 0 && i < f->nmeta ? f->meta[2 * i] : NULL;
}

const char *em_safetensors_metadata_value(const em_safetensors *f, int64_t i) {
  return f && i >= 0 && i < f->nmeta ? f->meta[2 * i + 1] : NULL;
}

/* Entry i, checked to be readable by ember. */
static em_status entry(em_state *S, const em_safetensors *f, int64_t i, const st_entry **e) {
  if (!S) return EM_ERR_ARG;
  if (!f) return emi_error(S, EM_ERR_ARG, "load: the file handle is NULL");
  if (f->S != S) return emi_error(S, EM_ERR_ARG, "load: the file was opened by another state");
  if (i < 0 || i >= f->n)
    return fail(S, EM_ERR_INDEX, "load", f->path, "entry %lld is out of range (the file has "
                "%lld tensors)", (long long)i, (long long)f->n);
  *e = &f->entries[i];
  if (DTYPES[(*e)->dtype].em < 0)
    return fail(S, EM_ERR_DTYPE, "load", f->path, "tensor '%.100s' has dtype %s, which ember "
                "does not support (F32 F64 F16 BF16 I32 I64 U8 BOOL)", (*e)->name,
                DTYPES[(*e)->dtype].name);
  if ((*e)->ndim > EM_MAX_DIMS)
    return fail(S, EM_ERR_UNSUPPORTED, "load", f->path, "tensor '%.100s' has %d dimensions "
                "(ember supports at most %d)", (*e)->name, (*e)->ndim, EM_MAX_DIMS);
  return EM_OK;
}

em_status em_safetensors_info(em_state *S, const em_safetensors *f, int64_t i,
                              em_dtype *dt, int *ndim, int64_t *shape) {
  const st_entry *e = NULL;
  em_status st = entry(S, f, i, &e);
  if (st) return st;
  if (dt) *dt = (em_dtype)DTYPES[e->dtype].em;
  if (ndim) *ndim = e->ndim;
  for (int d = 0; shape && d < e->ndim; d++) shape[d] = e->shape[d];
  return EM_OK;
}

em_status em_safetensors_get(em_state *S, em_safetensors *f, int64_t i, em_tensor **out) {
  const st_entry *e = NULL;
  em_status st = entry(S, f, i, &e);
  if (st) return st;
  if (!out) return emi_error(S, EM_ERR_ARG, "load: out must not be NULL");
  *out = NULL;
  em_tensor *t;
  st = em_empty(S, e->shape, e->ndim, (em_dtype)DTYPES[e->dtype].em, EM_CPU, &t);
  if (st) {
    char msg[EMI_ERRMSG_SIZE];
    snprintf(msg, sizeof msg, "%s", em_errmsg(S));
    return fail(S, st, "load", f->path, "tensor '%.100s': %s", e->name, msg);
  }
  int r = read_at(f->fd, em_tensor_data(t), (size_t)(e->end - e->begin),
                  f->data_start + e->begin);
  if (r) {
    em_tensor_release(t);
    return fail(S, EM_ERR_IO, "load", f->path, "can't read tensor '%.100s': %s", e->name,
                r < 0 ? strerror(errno) : "the file ended early (was it changed while open?)");
  }
  if (DTYPES[e->dtype].em == EM_BOOL) {   /* kernels rely on bools being 0 or 1 */
    uint8_t *b = em_tensor_data(t);
    for (int64_t k = 0; k < e->end - e->begin; k++) b[k] = b[k] != 0;
  }
  *out = t;
  return EM_OK;
}

em_status em_safetensors_read_range(em_state *S, em_safetensors *f, int64_t i, int64_t lo,
                                    int64_t hi, em_tensor **out) {
  const st_entry *e = NULL;
  em_status st = entry(S, f, i, &e);
  if (st) return st;
  if (!out) return emi_error(S, EM_ERR_ARG, "load: out must not be NULL");
  *out = NULL;
  int64_t esz = DTYPES[e->dtype].size, numel = (e->end - e->begin) / esz;
  if (lo < 0 || hi < lo || hi > numel)
    return fail(S, EM_ERR_INDEX, "load", f->path, "range [%lld, %lld) of tensor '%.100s' is "
                "out of bounds (it has %lld elements)", (long long)lo, (long long)hi, e->name,
                (long long)numel);
  int64_t n = hi - lo;
  em_tensor *t;
  st = em_empty(S, &n, 1, (em_dtype)DTYPES[e->dtype].em, EM_CPU, &t);
  if (st) {
    char msg[EMI_ERRMSG_SIZE];
    snprintf(msg, sizeof msg, "%s", em_errmsg(S));
    return fail(S, st, "load", f->path, "tensor '%.100s': %s", e->name, msg);
  }
  int r = read_at(f->fd, em_tensor_data(t), (size_t)(n * esz), f->data_start + e->begin + lo * esz);
  if (r) {
    em_tensor_release(t);
    return fail(S, EM_ERR_IO, "load", f->path, "can't read tensor '%.100s': %s", e->name,
                r < 0 ? strerror(errno) : "the file ended early (was it changed while open?)");
  }
  if (DTYPES[e->dtype].em == EM_BOOL) {
    uint8_t *b = em_tensor_data(t);
    for (int64_t k = 0; k < n; k++) b[k] = b[k] != 0;
  }
  *out = t;
  return EM_OK;
}

/* == Writing ====================================================================== */

/* The header JSON for tensors in the given order, padded with spaces to a multiple
** of 8 bytes; written into dst when not NULL. Returns its length. */
static size_t build_header(char *dst, const char *const *names, em_tensor *const *tensors,
                           const int64_t *order, int64_t n, const char *const *mk,
                           const char *const *mv, int64_t nmeta) {
  size_t k = 0;
  char num[32];
#define RAW(s, len) do { if (dst) memcpy(dst + k, (s), (len)); k += (len); } while (0)
#define LIT(s) RAW(s, strlen(s))
#define QUOTE(s) do { k += emi_json_quote(dst ? dst + k : NULL, (s), strlen(s)); } while (0)
#define NUM(v) do { int nn_ = snprintf(num, sizeof num, "%lld", (long long)(v)); \
                    RAW(num, (size_t)nn_); } while (0)
  LIT("{");
  if (nmeta > 0) {
    LIT("\"__metadata__\":{");
    for (int64_t i = 0; i < nmeta; i++) {
      if (i) LIT(",");
      QUOTE(mk[i]);
      LIT(":");
      QUOTE(mv[i]);
    }
    LIT("}");
  }
  int64_t pos = 0;
  for (int64_t r = 0; r < n; r++) {
    const em_tensor *t = tensors[order[r]];
    if (r || nmeta > 0) LIT(",");
    QUOTE(names[order[r]]);
    LIT(":{\"dtype\":\"");
    LIT(ST_NAME[t->dtype]);
    LIT("\",\"shape\":[");
    for (int d = 0; d < t->ndim; d++) {
      if (d) LIT(",");
      NUM(t->sizes[d]);
    }
    int64_t nbytes = t->numel * (int64_t)em_dtype_size(t->dtype);
    LIT("],\"data_offsets\":[");
    NUM(pos);
    LIT(",");
    NUM(pos + nbytes);
    LIT("]}");
    pos += nbytes;
  }
  LIT("}");
  while (k % 8) LIT(" ");
  return k;
#undef RAW
#undef LIT
#undef QUOTE
#undef NUM
}

/* Tensor t's elements in row-major order, through the staging buffer when it is
** not contiguous. 0, or -1 with errno set. */
static int write_tensor(int fd, const em_tensor *t, char *stage) {
  size_t esz = em_dtype_size(t->dtype);
  if (t->numel == 0) return 0;
  if (em_tensor_is_contiguous(t))
    return write_all(fd, em_tensor_data(t), (size_t)t->numel * esz);
  emi_iter it;
  em_tensor *ops[1] = {(em_tensor *)t};
  emi_iter_init(&it, ops, 1);
  int64_t inner = it.inner, st = it.strides[0][it.ndim - 1];
  size_t fill = 0;
  for (int64_t r = 0; r < it.nrows; r++) {
    char *p;
    emi_iter_row(&it, r, &p);
    for (int64_t k = 0; k < inner;) {
      if (fill == STAGE_BYTES) {
        if (write_all(fd, stage, fill)) return -1;
        fill = 0;
      }
      int64_t m = (int64_t)((STAGE_BYTES - fill) / esz);
      if (m > inner - k) m = inner - k;
      char *o = stage + fill;
      const char *src = p + k * st;
      if (st == (int64_t)esz) memcpy(o, src, (size_t)m * esz);
      else if (esz == 4) for (int64_t q = 0; q < m; q++) memcpy(o + 4 * q, src + q * st, 4);
      else if (esz == 8) for (int64_t q = 0; q < m; q++) memcpy(o + 8 * q, src + q * st, 8);
      else if (esz == 2) for (int64_t q = 0; q < m; q++) memcpy(o + 2 * q, src + q * st, 2);
      else for (int64_t q = 0; q < m; q++) o[q] = src[q * st];
      fill += (size_t)m * esz;
      k += m;
    }
  }
  return fill ? write_all(fd, stage, fill) : 0;
}

/* Larger dtypes first (keeps every tensor aligned to its element size, as the
** reference writer does), then the caller's order. */
typedef struct order_item { int64_t size, index; } order_item;
static int cmp_order(const void *a, const void *b) {
  const order_item *x = a, *y = b;
  if (x->size != y->size) return x->size > y->size ? -1 : 1;
  return x->index < y->index ? -1 : x->index > y->index;
}

/* Checks names/keys: non-NULL, valid UTF-8, unique. */
static em_status check_names(em_state *S, const char *path, const char *what,
                             const char *const *names, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    if (!names[i]) return fail(S, EM_ERR_ARG, "save", path, "%s %lld is NULL", what,
                               (long long)i);
    if (!emi_utf8_valid(names[i], strlen(names[i])))
      return fail(S, EM_ERR_ARG, "save", path, "%s '%.100s' is not valid UTF-8", what,
                  names[i]);
  }
  if (n < 2) return EM_OK;
  size_t bytes = (size_t)n * sizeof(char *);
  const char **v = emi_malloc(S, bytes);
  if (!v) return fail(S, EM_ERR_NOMEM, "save", path, "out of memory");
  memcpy(v, names, bytes);
  qsort(v, (size_t)n, sizeof *v, cmp_str);
  em_status st = EM_OK;
  for (int64_t i = 1; i < n && !st; i++)
    if (strcmp(v[i - 1], v[i]) == 0)
      st = fail(S, EM_ERR_ARG, "save", path, "%s '%.100s' appears twice", what, v[i]);
  emi_free(S, v, bytes);
  return st;
}

em_status em_safetensors_write(em_state *S, const char *path, const char *const *names,
                               em_tensor *const *tensors, int64_t n,
                               const char *const *meta_keys,
                               const char *const *meta_values, int64_t nmeta, int flags) {
  if (!S) return EM_ERR_ARG;
  if (!path) return emi_error(S, EM_ERR_ARG, "save: path is NULL");
  if (n < 0 || nmeta < 0 || (n > 0 && (!names || !tensors)) ||
      (nmeta > 0 && (!meta_keys || !meta_values)))
    return fail(S, EM_ERR_ARG, "save", path, "bad arguments (n = %lld, nmeta = %lld, or a "
                "NULL array)", (long long)n, (long long)nmeta);
  if (!little_endian())
    return fail(S, EM_ERR_UNSUPPORTED, "save", path, "big-endian hosts are not supported");
  em_status st = check_names(S, path, "tensor name", names, n);
  if (!st) st = check_names(S, path, "metadata key", meta_keys, nmeta);
  if (st) return st;
  for (int64_t i = 0; i < nmeta; i++) {
    if (!meta_values[i])
      return fail(S, EM_ERR_ARG, "save", path, "metadata value of '%.100s' is NULL",
                  meta_keys[i]);
    if (!emi_utf8_valid(meta_values[i], strlen(meta_values[i])))
      return fail(S, EM_ERR_ARG, "save", path, "metadata value of '%.100s' is not valid "
                  "UTF-8", meta_keys[i]);
  }
  for (int64_t i = 0; i < n; i++) {
    const em_tensor *t = tensors[i];
    char dev[32];
    if (strcmp(names[i], "__metadata__") == 0)
      return fail(S, EM_ERR_ARG, "save", path, "'__metadata__' can't name a tensor");
    if (!t) return fail(S, EM_ERR_ARG, "save", path, "tensor '%.100s' is NULL", names[i]);
    if (t->device != EM_CPU)
      return fail(S, EM_ERR_DEVICE, "save", path, "tensor '%.100s' is on %s; move it to the "
                  "cpu first", names[i], emi_device_name(dev, t->device));
  }

  /* Everything that can run out of memory comes before the file is touched. */
  size_t order_bytes = (size_t)(n ? n : 1) * sizeof(order_item);
  order_item *items = emi_malloc(S, order_bytes);
  if (!items) return fail(S, EM_ERR_NOMEM, "save", path, "out of memory");
  for (int64_t i = 0; i < n; i++)
    items[i] = (order_item){(int64_t)em_dtype_size(tensors[i]->dtype), i};
  qsort(items, (size_t)n, sizeof *items, cmp_order);
  int64_t *order = (int64_t *)items;   /* compacted in place: index r from items[r] */
  for (int64_t r = 0; r < n; r++) order[r] = items[r].index;
  size_t hlen = build_header(NULL, names, tensors, order, n, meta_keys, meta_values, nmeta);
  char *hdr = NULL, *stage = NULL, *tmp = NULL;
  size_t tmp_size = strlen(path) + 48;
  int fd = -1;
  bool need_stage = false;
  for (int64_t i = 0; i < n; i++) need_stage |= !em_tensor_is_contiguous(tensors[i]);
  if (hlen > MAX_HEADER) {
    st = fail(S, EM_ERR_ARG, "save", path, "the header would be %zu bytes (readers accept "
              "at most %d): too many tensors or too much metadata", hlen, MAX_HEADER);
    goto done;
  }
  hdr = emi_malloc(S, hlen + 8);
  stage = need_stage ? emi_malloc(S, STAGE_BYTES) : NULL;
  tmp = emi_malloc(S, tmp_size);
  if (!hdr || !tmp || (need_stage && !stage)) {
    st = fail(S, EM_ERR_NOMEM, "save", path, "out of memory");
    goto done;
  }
  for (int b = 0; b < 8; b++) hdr[b] = (char)((uint64_t)hlen >> (8 * b));
  build_header(hdr + 8, names, tensors, order, n, meta_keys, meta_values, nmeta);

  /* The file to write: a fresh temporary beside the target -- unless the target
  ** is something other than a regular file (a device, a FIFO), which is written
  ** in place. A symlink is followed, so that the link stays a link. */
  char real[PATH_MAX];
  const char *target = path;
  struct stat sb;
  if (lstat(path, &sb) == 0 && S_ISLNK(sb.st_mode) && realpath(path, real)) {
    target = real;
    if (strlen(real) + 48 > tmp_size) {
      emi_free(S, tmp, tmp_size);
      tmp_size = strlen(real) + 48;
      tmp = emi_malloc(S, tmp_size);
      if (!tmp) {
        st = fail(S, EM_ERR_NOMEM, "save", path, "out of memory");
        goto done;
      }
    }
  }
  bool asked = (flags & EM_SAVE_IN_PLACE) != 0;
  bool in_place = asked || (stat(target, &sb) == 0 && !S_ISREG(sb.st_mode));
  if (in_place) {
    fd = open(target, O_WRONLY | O_TRUNC | O_CLOEXEC | (asked ? O_CREAT : 0), 0666);
    if (fd < 0) {
      st = fail(S, EM_ERR_IO, "save", path, "can't open: %s", strerror(errno));
      goto done;
    }
  } else {
    static unsigned counter;     /* only makes names differ; races are harmless */
    for (int attempt = 0; attempt < 100 && fd < 0; attempt++) {
      snprintf(tmp, tmp_size, "%s.tmp-%ld-%u", target, (long)getpid(),
               __atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED));
      fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
      if (fd < 0 && errno != EEXIST) break;
    }
    if (fd < 0) {
      st = fail(S, EM_ERR_IO, "save", path, "can't create the temporary file '%s': %s",
                shown(tmp), strerror(errno));
      goto done;
    }
  }

  const char *step = "write";
  int r = write_all(fd, hdr, hlen + 8);
  for (int64_t i = 0; i < n && !r; i++) r = write_tensor(fd, tensors[order[i]], stage);
  if (!r && (flags & EM_SAVE_SYNC) && fsync(fd) != 0 && !(in_place && errno == EINVAL)) {
    step = "fsync";
    r = -1;
  }
  int e = errno;
  if (close(fd) != 0 && !r) { step = "close"; r = -1; e = errno; }   /* late write errors */
  fd = -1;
  if (!r && !in_place && rename(tmp, target) != 0) { step = "rename"; r = -1; e = errno; }
  if (r) {
    if (!in_place) unlink(tmp);
    st = fail(S, EM_ERR_IO, "save", path, "%s failed: %s%s", step, strerror(e),
              in_place ? "" : " (the previous file, if any, is untouched)");
    goto done;
  }
  if ((flags & EM_SAVE_SYNC) && !in_place && emi_sync_folder_of(target) != 0)
    st = fail(S, EM_ERR_IO, "save", path, "the file was written, but syncing its folder "
              "failed: %s", strerror(errno));
done:
  emi_free(S, items, order_bytes);
  emi_free(S, hdr, hlen + 8);
  emi_free(S, stage, STAGE_BYTES);
  emi_free(S, tmp, tmp_size);
  return st;
}
