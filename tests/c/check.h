/*
** check.h -- the tiny harness of the C tests (header-only: each test program is
** one .c file that includes it). The second half has tensor helpers.
**
** A test program is a list of groups, each a static function run with RUN():
**
**     static void test_views(em_state *S) {
**       em_tensor *t;
**       REQUIRE_OK(S, em_empty(S, shape, 2, EM_FLOAT32, EM_CPU, &t));
**       CHECK(em_tensor_ndim(t) == 2, "ndim is %d", em_tensor_ndim(t));
**       ...
**     }
**     int main(void) { RUN(test_views, S); return check_done(); }
**
** CHECK records one check and goes on; REQUIRE* return from the group on failure
** (so that a missing feature fails its group instead of crashing on a NULL
** tensor). Every group prints one line ("ok" or "FAIL" with counts), every failed
** check one line with file:line, and check_done() prints the machine-readable
** summary `#counts PASSED FAILED SKIPPED` that tests/run.sh adds up. The exit
** status is non-zero when a check failed. A program that cannot run here ends
** with `return check_skip_all("why");`: tests/run.sh fails a program that made
** no check unless it printed that `skip: ` line.
*/
#ifndef EMBER_TEST_CHECK_H
#define EMBER_TEST_CHECK_H
#include "ember.h"
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int chk_passed, chk_failed;      /* whole program */
static int chk_gpassed, chk_gfailed;    /* current group */
static const char *chk_gname;

static inline void chk_group_end(void) {
  if (!chk_gname) return;
  if (chk_gfailed)
    printf("FAIL %s (%d of %d checks failed)\n", chk_gname, chk_gfailed,
           chk_gpassed + chk_gfailed);
  else
    printf("ok   %s (%d checks)\n", chk_gname, chk_gpassed);
  fflush(stdout);
  chk_gname = NULL;
}

static inline void chk_group_begin(const char *name) {
  chk_group_end();
  chk_gname = name;
  chk_gpassed = chk_gfailed = 0;
}

/* Records one check; prints the failure with its location and message. */
static inline int chk_report(int ok, const char *file, int line, const char *expr,
                      const char *fmt, ...) __attribute__((format(printf, 5, 6)));
static inline int chk_report(int ok, const char *file, int line, const char *expr,
                      const char *fmt, ...) {
  if (ok) { chk_passed++; chk_gpassed++; return 1; }
  chk_failed++; chk_gfailed++;
  printf("  FAIL %s:%d: %s", file, line, expr);
  if (fmt && *fmt == ' ') fmt++;     /* CHECK prefixes its message with a space */
  if (fmt && *fmt) {
    va_list ap;
    va_start(ap, fmt);
    printf(" -- ");
    vprintf(fmt, ap);
    va_end(ap);
  }
  printf("\n");
  fflush(stdout);
  return 0;
}

/* Close enough: |got - want| <= tol * (1 + |want|); NaN only matches NaN and
** infinities only themselves. */
static inline int chk_close(double got, double want, double tol) {
  if (isnan(want)) return isnan(got);
  if (isinf(want)) return got == want;
  return fabs(got - want) <= tol * (1 + fabs(want));
}

/* The message contains every one of the NULL-terminated substrings. */
static inline int chk_msg_has(const char *msg, ...) {
  va_list ap;
  va_start(ap, msg);
  const char *s;
  int ok = msg != NULL;
  while ((s = va_arg(ap, const char *)) != NULL)
    if (ok && !strstr(msg, s)) ok = 0;
  va_end(ap);
  return ok;
}

static int chk_skipped;

/* One check that cannot run here, with the reason (counted apart). */
static inline void check_skip(const char *why) {
  chk_skipped++;
  printf("  skip %s\n", why);
  fflush(stdout);
}

static inline int check_done(void) {
  chk_group_end();
  printf("#counts %d %d %d\n", chk_passed, chk_failed, chk_skipped);
  fflush(stdout);
  return chk_failed ? 1 : 0;
}

/* Ends a program that cannot run on this machine: one `skip: WHY` line (what
** tests/run.sh accepts from a program with no checks) and the counts. */
static inline int check_skip_all(const char *why) {
  chk_group_end();
  chk_skipped++;
  printf("skip: %s\n", why);
  return check_done();
}

/* CHECK_SANITIZED: 1 in the AddressSanitizer and ThreadSanitizer builds, where code
** runs several times slower. A race or an overflow shows at the smallest size that
** reaches its code path, so a test may run its large cases there at a smaller size
** that still reaches the same path (and says which in a comment). */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define CHECK_SANITIZED 1
#else
#define CHECK_SANITIZED 0
#endif

/* -- The macros ----------------------------------------------------------------- */
#define RUN(fn, ...) (chk_group_begin(#fn), fn(__VA_ARGS__))

#define CHECK(cond, ...) \
  chk_report(!!(cond), __FILE__, __LINE__, #cond, " " __VA_ARGS__)

#define CHECK_CLOSE(got, want, tol) do { \
    double chk_g_ = (double)(got), chk_w_ = (double)(want); \
    chk_report(chk_close(chk_g_, chk_w_, (tol)), __FILE__, __LINE__, #got " ~ " #want, \
               "got %.9g, want %.9g", chk_g_, chk_w_); \
  } while (0)

/* The call returns EM_OK; otherwise prints the status and em_errmsg. An
** expression: non-zero when the call succeeded. */
static inline int chk_ok(em_state *S, em_status st, const char *file, int line,
                         const char *expr) {
  return chk_report(st == EM_OK, file, line, expr, "status %d: %s", (int)st,
                    st ? em_errmsg(S) : "");
}
#define CHECK_OK(S, call) chk_ok((S), (call), __FILE__, __LINE__, #call)

/* Like CHECK / CHECK_OK, but leave the group (return) when they fail. */
#define REQUIRE(cond, ...) do { \
    if (!chk_report(!!(cond), __FILE__, __LINE__, #cond, " " __VA_ARGS__)) return; \
  } while (0)
#define REQUIRE_OK(S, call) do { \
    if (!chk_ok((S), (call), __FILE__, __LINE__, #call)) return; \
  } while (0)

/* The call fails with status `code` and a message containing each of the
** following strings (a NULL-terminated list is built by the macro). */
#define CHECK_ERR(S, call, code, ...) do { \
    em_status chk_st_ = (call); \
    const char *chk_m_ = em_errmsg(S); \
    chk_report(chk_st_ == (code) && chk_msg_has(chk_m_, __VA_ARGS__, (const char *)NULL), \
               __FILE__, __LINE__, #call, "status %d (want %d), message \"%s\"", \
               (int)chk_st_, (int)(code), chk_m_ ? chk_m_ : "(null)"); \
  } while (0)


/* == Tensor helpers =================================================================
** Shape and value literals, making a tensor from doubles, and reading any element
** of any (strided) tensor back as a double with decoders written here independently
** of the library's own, so that a conversion bug in core/ can't hide behind itself.
** (Kept in this file because the Makefile rebuilds the tests when check.h changes.)
*/
#include <stdint.h>

/* SHP(2, 3) expands to `shape, ndim`; V(1, 2, 3) to `values, count`. */
#define SHP(...) (const int64_t[]){__VA_ARGS__}, \
  (int)(sizeof((const int64_t[]){__VA_ARGS__}) / sizeof(int64_t))
#define V(...) (const double[]){__VA_ARGS__}, \
  (int64_t)(sizeof((const double[]){__VA_ARGS__}) / sizeof(double))

static inline double t_half(uint16_t h) {
  int e = (h >> 10) & 31, m = h & 1023;
  double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY)
                                               : ldexp(1024 + m, e - 25);
  return (h & 0x8000) ? -v : v;
}

static inline double t_bf16(uint16_t b) {
  union { uint32_t u; float f; } v;
  v.u = (uint32_t)b << 16;
  return v.f;
}

static inline double t_load(const void *p, em_dtype dt) {
  switch (dt) {
  case EM_FLOAT32: return *(const float *)p;
  case EM_FLOAT64: return *(const double *)p;
  case EM_FLOAT16: return t_half(*(const uint16_t *)p);
  case EM_BFLOAT16: return t_bf16(*(const uint16_t *)p);
  case EM_INT32: return *(const int32_t *)p;
  case EM_INT64: return (double)*(const int64_t *)p;
  case EM_UINT8: return *(const uint8_t *)p;
  case EM_BOOL: return *(const uint8_t *)p;
  default: return NAN;
  }
}

/* Element i of t in row-major logical order, following t's strides. */
static inline double t_get(const em_tensor *t, int64_t i) {
  int nd = em_tensor_ndim(t);
  const int64_t *sz = em_tensor_sizes(t), *st = em_tensor_strides(t);
  int64_t off = 0;
  for (int d = nd - 1; d >= 0; d--) {
    off += (i % sz[d]) * st[d];
    i /= sz[d];
  }
  em_dtype dt = em_tensor_dtype(t);
  return t_load((const char *)em_tensor_data(t) + off * (int64_t)em_dtype_size(dt), dt);
}

/* A contiguous tensor of dtype dt holding the given values (converted from
** double by the library). */
static inline em_status t_make(em_state *S, em_tensor **out, em_dtype dt,
                               const int64_t *shape, int ndim, const double *data,
                               int64_t n) {
  int64_t numel = 1;
  for (int d = 0; d < ndim; d++) numel *= shape[d];
  if (numel != n) {
    printf("  test bug: %lld values for %lld elements\n", (long long)n, (long long)numel);
    return EM_ERR_ARG;
  }
  return em_from_data(S, shape, ndim, dt, data, EM_FLOAT64, out);
}

/* Values of t equal want[0..n) within tol (chk_close); describes the first
** difference in why. */
static inline int t_values(const em_tensor *t, const double *want, int64_t n, double tol,
                           char *why, size_t whylen) {
  if (!t) { snprintf(why, whylen, "tensor is NULL"); return 0; }
  if (em_tensor_numel(t) != n) {
    snprintf(why, whylen, "numel %lld, want %lld", (long long)em_tensor_numel(t),
             (long long)n);
    return 0;
  }
  for (int64_t i = 0; i < n; i++) {
    double g = t_get(t, i);
    if (!chk_close(g, want[i], tol)) {
      snprintf(why, whylen, "element %lld is %.9g, want %.9g", (long long)i, g, want[i]);
      return 0;
    }
  }
  why[0] = 0;
  return 1;
}

static inline int t_shape_is(const em_tensor *t, const int64_t *shape, int ndim,
                             char *why, size_t whylen) {
  if (!t) { snprintf(why, whylen, "tensor is NULL"); return 0; }
  int ok = em_tensor_ndim(t) == ndim;
  for (int d = 0; ok && d < ndim; d++) ok = em_tensor_sizes(t)[d] == shape[d];
  if (!ok) {
    int k = snprintf(why, whylen, "shape is [");
    for (int d = 0; d < em_tensor_ndim(t) && k < (int)whylen - 24; d++)
      k += snprintf(why + k, whylen - k, d ? ",%lld" : "%lld",
                    (long long)em_tensor_sizes(t)[d]);
    snprintf(why + k, whylen - k, "]");
  }
  return ok;
}

/* CHECK_VALS(t, tol, V(1, 2, 3)); CHECK_SHAPE(t, SHP(2, 3)). */
#define CHECK_VALS(t, tol, ...) do { \
    char why_[160]; \
    chk_report(t_values((t), __VA_ARGS__, (tol), why_, sizeof why_), __FILE__, __LINE__, \
               "values of " #t, "%s", why_); \
  } while (0)
#define CHECK_SHAPE(t, ...) do { \
    char why_[160]; \
    chk_report(t_shape_is((t), __VA_ARGS__, why_, sizeof why_), __FILE__, __LINE__, \
               "shape of " #t, "%s", why_); \
  } while (0)
#define CHECK_DTYPE(t, dt) \
  CHECK((t) && em_tensor_dtype(t) == (dt), "dtype %s, want %s", \
        (t) ? em_dtype_name(em_tensor_dtype(t)) : "(null)", em_dtype_name(dt))

#endif
