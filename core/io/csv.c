/*
** csv.c -- numeric CSV files (em_data_csv): comma-separated numbers, one sample
** a line, an optional header line of column names. Blank lines are skipped, CRLF
** endings are fine, spaces around a field are ignored; quoting is not supported
** (a quoted field is reported as not a number). Every row must have as many
** fields as the first.
**
** The file is parsed into a table of doubles, then split into float32 features
** (N, F) and, when a label column is chosen, labels (N): int64 when every label
** is a whole number, float32 otherwise, values as written. Errors name the file,
** the 1-based line and the 1-based field.
**
** The table grows as values arrive (doubling), never on a guess: reserving rows
** of the first row's width up front made a 10 MB one-line file of junk ask for
** 41 GB and fail with "out of memory" instead of "not a number".
*/
#include "../data/data.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

typedef struct csv_parse {
  em_state *S;
  const char *path;
  double *vals;          /* rows * ncols values, row-major */
  size_t cap;            /* in values */
  int64_t rows;
  int ncols;             /* 0 until the first row (or header) fixes it */
  char **names;          /* header fields, ncols of them, or NULL */
} csv_parse;

/* A field's text for messages: at most 40 characters. */
static const char *shown(const char *s, size_t n, char *buf, size_t len) {
  if (n > 40) snprintf(buf, len, "%.37s...", s);
  else snprintf(buf, len, "%.*s", (int)n, s);
  return buf;
}

static int is_space(char ch) { return ch == ' ' || ch == '\t'; }

/* Splits line [s, e) at commas into trimmed fields; calls back with each. Returns
** the number of fields. */
typedef int (*field_fn)(csv_parse *p, int64_t line, int k, const char *s, size_t n);
static int split(csv_parse *p, int64_t line, const char *s, const char *e, field_fn fn,
                 int *status) {
  int k = 0;
  for (;;) {
    const char *f = s;
    while (f < e && *f != ',') f++;
    const char *a = s, *b = f;
    while (a < b && is_space(*a)) a++;
    while (b > a && is_space(b[-1])) b--;
    if (fn && !*status) *status = fn(p, line, k, a, (size_t)(b - a));
    k++;
    if (f == e) return k;
    s = f + 1;
  }
}

static int take_name(csv_parse *p, int64_t line, int k, const char *s, size_t n) {
  char *name = malloc(n + 1);
  if (!name) return emi_error(p->S, EM_ERR_NOMEM, "csv: out of memory");
  memcpy(name, s, n);
  name[n] = 0;
  p->names[k] = name;
  return EM_OK;
}

static int take_value(csv_parse *p, int64_t line, int k, const char *s, size_t n) {
  char num[256], buf[48];
  double v = 0;
  int ok = n > 0 && n < sizeof num;
  if (ok) {
    memcpy(num, s, n);
    num[n] = 0;
    char *end;
    v = strtod(num, &end);   /* out of range gives +-inf or 0, as float() would */
    ok = end == num + n;
  }
  if (!ok)
    return emi_error(p->S, EM_ERR_IO, "csv: '%s' line %lld: field %d '%s' is not a number",
                     p->path, (long long)line, k + 1, shown(s, n, buf, sizeof buf));
  size_t at = (size_t)p->rows * (size_t)p->ncols + (size_t)k;
  if (at >= p->cap) {   /* room for this value only once it is known to be one */
    size_t cap = p->cap ? p->cap * 2 : 256;
    double *nv = realloc(p->vals, cap * sizeof(double));
    if (!nv)
      return emi_error(p->S, EM_ERR_NOMEM, "csv: '%s' line %lld: out of memory for %zu "
                       "values", p->path, (long long)line, cap);
    p->vals = nv;
    p->cap = cap;
  }
  p->vals[at] = v;
  return EM_OK;
}

static em_status parse(csv_parse *p, const char *text, size_t len, int header) {
  const char *s = text, *end = text + len;
  if (len >= 3 && !memcmp(s, "\xef\xbb\xbf", 3)) s += 3;   /* a UTF-8 byte order mark */
  int64_t line = 0;
  int need_header = header;
  while (s < end) {
    const char *e = memchr(s, '\n', (size_t)(end - s));
    const char *next = e ? e + 1 : end;
    if (!e) e = end;
    line++;
    const char *le = e;
    if (le > s && le[-1] == '\r') le--;
    const char *q = s;
    while (q < le && is_space(*q)) q++;
    if (q == le) { s = next; continue; }          /* blank line */
    int st = 0;
    int nf = split(p, line, s, le, NULL, &st);
    if (p->ncols == 0) p->ncols = nf;
    else if (nf != p->ncols)
      return emi_error(p->S, EM_ERR_IO, "csv: '%s' line %lld: %d fields, expected %d",
                       p->path, (long long)line, nf, p->ncols);
    if (need_header) {
      need_header = 0;
      p->names = calloc((size_t)nf, sizeof(char *));
      if (!p->names) return emi_error(p->S, EM_ERR_NOMEM, "csv: out of memory");
      split(p, line, s, le, take_name, &st);
      if (st) return st;
      s = next;
      continue;
    }
    split(p, line, s, le, take_value, &st);
    if (st) return st;
    p->rows++;
    s = next;
  }
  return EM_OK;
}

static char *read_all(em_state *S, const char *path, size_t *len, em_status *st) {
  FILE *f = fopen(path, "rb");
  if (!f) { *st = emi_error(S, EM_ERR_IO, "csv: can't open '%s'", path); return NULL; }
  struct stat sb;
  if (fstat(fileno(f), &sb) != 0 || !S_ISREG(sb.st_mode)) {
    fclose(f);
    *st = emi_error(S, EM_ERR_IO, "csv: '%s' is not a regular file", path);
    return NULL;
  }
  size_t n = (size_t)sb.st_size;
  char *buf = malloc(n + 1);
  if (!buf) {
    fclose(f);
    *st = emi_error(S, EM_ERR_NOMEM, "csv: '%s': out of memory", path);
    return NULL;
  }
  size_t got = n ? fread(buf, 1, n, f) : 0;
  fclose(f);
  if (got != n) {
    free(buf);
    *st = emi_error(S, EM_ERR_IO, "csv: '%s': read error", path);
    return NULL;
  }
  buf[n] = 0;
  *len = n;
  *st = EM_OK;
  return buf;
}

/* Finds the label column (or -1 for none) once the header is known. */
static em_status pick_label(csv_parse *p, const char *label_name, int label_column,
                            int *col) {
  *col = -1;
  if (label_name) {
    if (!p->names)
      return emi_error(p->S, EM_ERR_ARG, "csv: '%s': label '%s' is a column name, but the "
                       "file is read without a header", p->path, label_name);
    for (int k = 0; k < p->ncols; k++)
      if (!strcmp(p->names[k], label_name)) { *col = k; return EM_OK; }
    char list[256];
    size_t at = 0;
    list[0] = 0;
    for (int k = 0; k < p->ncols && at < sizeof list - 8; k++)
      at += (size_t)snprintf(list + at, sizeof list - at, k ? ", %s" : "%s", p->names[k]);
    if (at >= sizeof list - 8) snprintf(list + sizeof list - 8, 8, ", ...");
    return emi_error(p->S, EM_ERR_ARG, "csv: '%s': no column named '%s' in the header (%s)",
                     p->path, label_name, list);
  }
  if (label_column >= 0) {
    if (label_column >= p->ncols)
      return emi_error(p->S, EM_ERR_ARG, "csv: '%s': label column %d (0-based) out of range: "
                       "the rows have %d fields", p->path, label_column, p->ncols);
    *col = label_column;
  }
  return EM_OK;
}

static em_status build(csv_parse *p, int col, em_dataset **out) {
  em_state *S = p->S;
  int64_t N = p->rows, C = p->ncols, F = col >= 0 ? C - 1 : C;
  if (F < 1)
    return emi_error(S, EM_ERR_ARG, "csv: '%s': the label is the only column; no features",
                     p->path);
  em_tensor *fields[2] = {NULL, NULL};
  em_status st = em_empty(S, (const int64_t[]){N, F}, 2, EM_FLOAT32, EM_CPU, &fields[0]);
  if (st) return st;
  float *x = em_tensor_data(fields[0]);
  for (int64_t i = 0; i < N; i++) {
    const double *r = p->vals + i * C;
    float *xr = x + i * F;
    for (int64_t k = 0, j = 0; k < C; k++)
      if (k != col) xr[j++] = (float)r[k];
  }
  int nf = 1;
  if (col >= 0) {
    int integral = 1;
    for (int64_t i = 0; i < N && integral; i++) {
      double v = p->vals[i * C + col];
      integral = isfinite(v) && v == floor(v) && fabs(v) < 9.2e18;
    }
    st = em_empty(S, (const int64_t[]){N}, 1, integral ? EM_INT64 : EM_FLOAT32, EM_CPU,
                  &fields[1]);
    if (!st) {
      void *y = em_tensor_data(fields[1]);
      for (int64_t i = 0; i < N; i++) {
        double v = p->vals[i * C + col];
        if (integral) ((int64_t *)y)[i] = (int64_t)v;
        else ((float *)y)[i] = (float)v;
      }
    }
    nf = 2;
  }
  if (!st) st = emi_data_tensors_kind(S, "csv", fields, nf, out);
  em_tensor_release(fields[0]);
  em_tensor_release(fields[1]);
  return st;
}

em_status em_data_csv(em_state *S, const char *path, int header, const char *label_name,
                      int label_column, em_dataset **out) {
  if (!out) return emi_error(S, EM_ERR_ARG, "csv: out is required");
  *out = NULL;
  if (!path) return emi_error(S, EM_ERR_ARG, "csv: path is required");
  em_status st;
  size_t len = 0;
  char *text = read_all(S, path, &len, &st);
  if (!text) return st;
  csv_parse p = {.S = S, .path = path};
  st = parse(&p, text, len, header);
  free(text);
  if (!st && p.ncols == 0) st = emi_error(S, EM_ERR_IO, "csv: '%s': empty file", path);
  if (!st && p.rows == 0) st = emi_error(S, EM_ERR_IO, "csv: '%s': no data rows", path);
  int col = -1;
  if (!st) st = pick_label(&p, label_name, label_column, &col);
  if (!st) st = build(&p, col, out);
  if (p.names)
    for (int k = 0; k < p.ncols; k++) free(p.names[k]);
  free(p.names);
  free(p.vals);
  return st;
}
