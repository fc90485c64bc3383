/*
** fixtures.h -- reads the plain-text fixture files that tests/fixtures/gen_*.py
** write with PyTorch ("name ndim sizes... values..." per array), for the C tests
** that compare against them (test_nn_kernels.c, test_transforms.c).
*/
#ifndef EMBER_TEST_FIXTURES_H
#define EMBER_TEST_FIXTURES_H
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct fx_arr { char name[48]; int ndim; int64_t sizes[8]; int64_t n; double *v; } fx_arr;
static fx_arr *fx;
static int nfx;

/* Loads every array of the file; 0 when it is missing or empty. */
static int fx_load(const char *path) {
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

/* The array named by printf(fmt, i), or NULL (and a line saying it is missing). */
static const fx_arr *get(const char *fmt, int i) {
  char name[64];
  snprintf(name, sizeof name, fmt, i);
  for (int k = 0; k < nfx; k++)
    if (!strcmp(fx[k].name, name)) return &fx[k];
  printf("  missing fixture %s\n", name);
  return NULL;
}

#endif
