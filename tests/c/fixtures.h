/*
** fixtures.h -- reads the plain-text fixture files that tests/fixtures/gen_*.py
** write with PyTorch ("name ndim sizes... values..." per array), for the C tests
** that compare against them (test_nn_kernels.c, test_transforms.c: fx_open starts
** such a program), and where the fixtures are (fx_locate, for every C test that
** reads tests/fixtures/).
*/
#ifndef EMBER_TEST_FIXTURES_H
#define EMBER_TEST_FIXTURES_H
#include "ember.h"
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* A test's scratch folder (made by the test) and its fixtures folder (fx_locate),
** and paths inside them: rotating buffers, so a few may be used in one call. */
static char dir[64] __attribute__((unused));
static char fixtures[512] __attribute__((unused));

static inline const char *tmp_path(const char *name) {
  static char buf[4][256];
  static int k;
  k = (k + 1) % 4;
  snprintf(buf[k], sizeof buf[k], "%s/%s", dir, name);
  return buf[k];
}

static inline const char *fixture(const char *name) {
  static char buf[2][768];
  static int k;
  k = (k + 1) % 2;
  snprintf(buf[k], sizeof buf[k], "%s/%s", fixtures, name);
  return buf[k];
}

/* The path of tests/<rel>: under $EMBER_TESTS, else tests/ in the current folder,
** else the source tree this program was built in (BUILD/tests/ -> ../../tests). */
static inline void fx_locate(char *out, size_t n, const char *rel) {
  const char *tests = getenv("EMBER_TESTS");
  struct stat sb;
  snprintf(out, n, "%s/%s", tests ? tests : "tests", rel);
  if (tests || stat(out, &sb) == 0) return;
  char exe[256];
  ssize_t k = readlink("/proc/self/exe", exe, sizeof exe - 1);
  exe[k > 0 ? k : 0] = 0;
  char *slash = strrchr(exe, '/');
  if (slash) *slash = 0;
  snprintf(out, n, "%s/../../tests/%s", exe, rel);
}

typedef struct fx_arr { char name[48]; int ndim; int64_t sizes[8]; int64_t n; double *v; } fx_arr;
static fx_arr *fx __attribute__((unused));
static int nfx __attribute__((unused));

/* Loads every array of the file; 0 when it is missing or empty. */
static inline int fx_load(const char *path) {
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  int cap = 0;
  char name[48];
  while (fscanf(f, "%47s", name) == 1) {
    if (nfx == cap) { cap = cap ? cap * 2 : 256; fx = realloc(fx, sizeof *fx * cap); }
    fx_arr *a = &fx[nfx++];
    memset(a, 0, sizeof *a);
    snprintf(a->name, sizeof a->name, "%s", name);
    if (fscanf(f, "%d", &a->ndim) != 1) break;
    a->n = 1;
    for (int d = 0; d < a->ndim; d++) {
      long long s;
      if (fscanf(f, "%lld", &s) != 1) break;
      a->sizes[d] = s;
      a->n *= s;
    }
    a->v = malloc(sizeof(double) * (a->n + 1));
    for (int64_t i = 0; i < a->n; i++)
      if (fscanf(f, "%lf", &a->v[i]) != 1) break;
  }
  fclose(f);
  return nfx > 0;
}

/* The start of a program that compares against one fixture file (tests/<rel>):
** a state with two intra-op threads and the file's arrays loaded. NULL when
** either cannot be had, after a FAIL line and the counts of one failed check. */
static inline em_state *fx_open(const char *rel) {
  char path[512];
  fx_locate(path, sizeof path, rel);
  em_state *S;
  em_config cfg;
  em_config_init(&cfg);
  cfg.num_threads = 2;
  if (em_open(&S, &cfg)) {
    printf("FAIL em_open failed\n#counts 0 1 0\n");
    return NULL;
  }
  if (!fx_load(path)) {
    printf("FAIL cannot read %s\n#counts 0 1 0\n", path);
    em_close(S);
    return NULL;
  }
  return S;
}

/* The array named by printf(fmt, i), or NULL (and a line saying it is missing). */
static inline const fx_arr *get(const char *fmt, int i) {
  char name[64];
  snprintf(name, sizeof name, fmt, i);
  for (int k = 0; k < nfx; k++)
    if (!strcmp(fx[k].name, name)) return &fx[k];
  printf("  missing fixture %s\n", name);
  return NULL;
}

#endif
