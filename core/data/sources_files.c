/*
** sources_files.c -- dataset sources backed by files: IDX image/label pairs
** (read whole into memory, served by an in-memory "idx" source) and image folders
** (a list of files made at construction; each sample is read and decoded by the
** worker that asks for it).
**
** Image folder layout: root/<class>/<file>, classes sorted by name (class k gets
** label label_base + k), files sorted by name within a class; files in folders
** nested inside a class folder belong to that class (as torchvision's ImageFolder).
** Only .jpg, .jpeg and .png files count (any case); other files are skipped,
** hidden entries too.
** A listed file that turns out not to be a valid image fails the sample that
** reads it, naming the file: it is never silently dropped.
** So does an image over the pixel limit (checked from its header). With a size,
** JPEGs are decoded at a reduced DCT scale that still covers it (core/io/image.c)
** before the resize, unless full_decode is asked for.
*/
#include "data.h"
#include "../io/image.h"
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>
#include <sys/stat.h>

/* -- IDX ------------------------------------------------------------------------ */

em_status em_data_idx(em_state *S, const char *images, const char *labels,
                      int label_base, em_dataset **out) {
  if (!out) return emi_error(S, EM_ERR_ARG, "idx: out is required");
  *out = NULL;
  if (!images || !labels)
    return emi_error(S, EM_ERR_ARG, "idx: an images file and a labels file are required");
  em_tensor *img = NULL, *lab = NULL, *fields[2] = {NULL, NULL};
  em_status st = em_idx_load(S, images, &img);
  if (!st) st = em_idx_load(S, labels, &lab);
  if (!st && (img->ndim != 3 || img->dtype != EM_UINT8))
    st = emi_error(S, EM_ERR_SHAPE, "idx: '%s' holds %s %s; images must be uint8 (N, H, W)",
                   images, em_dtype_name(img->dtype), emi_tshape(S, img));
  if (!st && lab->ndim != 1)
    st = emi_error(S, EM_ERR_SHAPE, "idx: '%s' holds %s; labels must be 1-D", labels,
                   emi_tshape(S, lab));
  if (!st && lab->dtype != EM_UINT8 && lab->dtype != EM_INT32)
    st = emi_error(S, EM_ERR_DTYPE, "idx: '%s' holds %s labels; ubyte or int expected",
                   labels, em_dtype_name(lab->dtype));
  if (!st && img->sizes[0] != lab->sizes[0])
    st = emi_error(S, EM_ERR_SHAPE, "idx: '%s' has %lld images but '%s' has %lld labels",
                   images, (long long)img->sizes[0], labels, (long long)lab->sizes[0]);
  /* images (N, H, W) seen as (N, 1, H, W): a view, no copy */
  if (!st)
    st = em_view(S, img, (const int64_t[]){img->sizes[0], 1, img->sizes[1], img->sizes[2]},
                 4, &fields[0]);
  if (!st) st = em_empty(S, lab->sizes, 1, EM_INT64, EM_CPU, &fields[1]);
  if (!st) {
    int64_t *y = em_tensor_data(fields[1]), n = lab->sizes[0];
    if (lab->dtype == EM_UINT8) {
      const uint8_t *s = em_tensor_data(lab);
      for (int64_t i = 0; i < n; i++) y[i] = (int64_t)s[i] + label_base;
    } else {
      const int32_t *s = em_tensor_data(lab);
      for (int64_t i = 0; i < n; i++) y[i] = (int64_t)s[i] + label_base;
    }
    st = emi_data_tensors_kind(S, "idx", fields, 2, out);
  }
  em_tensor_release(img);
  em_tensor_release(lab);
  em_tensor_release(fields[0]);
  em_tensor_release(fields[1]);
  return st;
}

/* -- Image folders ------------------------------------------------------------------ */

typedef struct folder_src {
  int64_t n;
  char **paths;            /* n paths, malloc'd */
  int64_t *labels;         /* n labels, label_base added */
  em_transform *resize;    /* NULL: images keep their size */
  emi_image_want want;     /* pixel limit; the size a reduced JPEG decode must cover */
} folder_src;

/* A growable list of malloc'd strings. */
typedef struct strlist {
  char **v;
  size_t n, cap;
} strlist;

static int strlist_push(strlist *l, const char *s) {
  if (l->n == l->cap) {
    size_t cap = l->cap ? l->cap * 2 : 64;
    char **v = realloc(l->v, cap * sizeof *v);
    if (!v) return 0;
    l->v = v;
    l->cap = cap;
  }
  char *c = strdup(s);
  if (!c) return 0;
  l->v[l->n++] = c;
  return 1;
}

static void strlist_free(strlist *l) {
  for (size_t i = 0; i < l->n; i++) free(l->v[i]);
  free(l->v);
  l->v = NULL;
  l->n = l->cap = 0;
}

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

static int is_image_name(const char *name) {
  const char *dot = strrchr(name, '.');
  return dot && (!strcasecmp(dot, ".jpg") || !strcasecmp(dot, ".jpeg") ||
                 !strcasecmp(dot, ".png"));
}

static char *join(const char *a, const char *b) {
  size_t na = strlen(a), nb = strlen(b);
  char *p = malloc(na + nb + 2);
  if (!p) return NULL;
  memcpy(p, a, na);
  size_t at = na;
  if (na && a[na - 1] != '/') p[at++] = '/';
  memcpy(p + at, b, nb + 1);
  return p;
}

/* Nested folders inside a class folder are searched this deep (as torchvision's
** ImageFolder walks them); the limit stops symlink loops. */
enum { MAX_DEPTH = 8 };

/* Adds the names in dir (not hidden) that are directories (want_dirs), or the
** image files in dir and, to MAX_DEPTH, its subfolders (as paths relative to the
** first dir, prefixed by prefix). Returns 0 when dir can't be read. */
static int walk_dir(const char *dir, const char *prefix, int want_dirs, int depth,
                    strlist *out, int *nomem) {
  DIR *d = opendir(dir);
  if (!d) return 0;
  struct dirent *e;
  while (!*nomem && (e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.') continue;
    char *p = join(dir, e->d_name);
    char *rel = *prefix ? join(prefix, e->d_name) : strdup(e->d_name);
    struct stat sb;
    if (!p || !rel) *nomem = 1;
    else if (stat(p, &sb) != 0) {}                    /* a dangling link: skipped */
    else if (S_ISDIR(sb.st_mode)) {
      if (want_dirs) { if (!strlist_push(out, rel)) *nomem = 1; }
      else if (depth < MAX_DEPTH) walk_dir(p, rel, 0, depth + 1, out, nomem);
    } else if (!want_dirs && is_image_name(e->d_name) && !strlist_push(out, rel)) {
      *nomem = 1;
    }
    free(p);
    free(rel);
  }
  closedir(d);
  return 1;
}

/* The class folders of root, or the images of one class (nested folders
** included), sorted by (relative) name. */
static int list_dir(const char *dir, int want_dirs, strlist *out, int *nomem) {
  if (!walk_dir(dir, "", want_dirs, 0, out, nomem)) return 0;
  if (out->n) qsort(out->v, out->n, sizeof *out->v, cmp_str);
  return 1;
}

static void folder_destroy(em_dataset *d) {
  folder_src *f = d->impl;
  if (!f) return;
  for (int64_t i = 0; i < f->n; i++) free(f->paths[i]);
  free(f->paths);
  free(f->labels);
  em_transform_release(f->resize);
  emi_free(d->S, f, sizeof *f);
}

static em_status folder_get(em_dataset *d, emi_dctx *c, int64_t i, em_tensor **out) {
  folder_src *f = d->impl;
  unsigned char *buf;
  size_t n;
  em_status st = emi_read_file(c, "image_folder", f->paths[i], &buf, &n);
  if (st) return st;
  st = emi_image_decode(c, "image_folder", f->paths[i], buf, n, 3, &f->want, &out[0]);
  free(buf);
  if (st) return st;
  if (f->resize) {
    st = emi_transform_run(f->resize, c, NULL, out, 1);
    if (st) return st;   /* the caller releases out[] */
  }
  st = emi_dtensor_new(c, "image_folder", (const int64_t[]){1}, 0, EM_INT64, &out[1]);
  if (st) return st;
  *(int64_t *)em_tensor_data(out[1]) = f->labels[i];
  return EM_OK;
}

static const emi_dataset_vt folder_vt = {"image_folder", folder_get, NULL, folder_destroy};

em_status em_data_image_folder(em_state *S, const char *root, int64_t height,
                               int64_t width, int label_base, em_dataset **out) {
  return em_data_image_folder_opts(S, root, height, width, label_base, NULL, out);
}

em_status em_data_image_folder_opts(em_state *S, const char *root, int64_t height,
                                    int64_t width, int label_base,
                                    const em_image_opts *o, em_dataset **out) {
  if (!out) return emi_error(S, EM_ERR_ARG, "image_folder: out is required");
  *out = NULL;
  if (!root) return emi_error(S, EM_ERR_ARG, "image_folder: root is required");
  if ((height > 0) != (width > 0) || height < 0 || width < 0)
    return emi_error(S, EM_ERR_ARG, "image_folder: size %lldx%lld: give both height and "
                     "width > 0, or neither", (long long)height, (long long)width);
  strlist classes = {0}, files = {0}, paths = {0};
  int64_t *labels = NULL;
  size_t nlab = 0, labcap = 0;
  int nomem = 0;
  em_status st = EM_OK;
  if (!list_dir(root, 1, &classes, &nomem))
    st = emi_error(S, EM_ERR_IO, "image_folder: can't read the folder '%s'", root);
  for (size_t k = 0; !st && !nomem && k < classes.n; k++) {
    char *dir = join(root, classes.v[k]);
    if (!dir) { nomem = 1; break; }
    if (!list_dir(dir, 0, &files, &nomem))
      st = emi_error(S, EM_ERR_IO, "image_folder: can't read the folder '%s'", dir);
    for (size_t j = 0; !st && !nomem && j < files.n; j++) {
      char *p = join(dir, files.v[j]);
      if (!p || !strlist_push(&paths, p)) nomem = 1;
      free(p);
      if (nomem) break;
      if (nlab == labcap) {
        labcap = labcap ? labcap * 2 : 256;
        int64_t *l = realloc(labels, labcap * sizeof *l);
        if (!l) { nomem = 1; break; }
        labels = l;
      }
      labels[nlab++] = (int64_t)k + label_base;
    }
    strlist_free(&files);
    free(dir);
  }
  if (!st && nomem) st = emi_error(S, EM_ERR_NOMEM, "image_folder: out of memory listing '%s'",
                                   root);
  if (!st && classes.n == 0)
    st = emi_error(S, EM_ERR_IO, "image_folder: '%s' has no class subfolders", root);
  if (!st && paths.n == 0)
    st = emi_error(S, EM_ERR_IO, "image_folder: no .jpg, .jpeg or .png files in the %zu "
                   "class folders of '%s'", classes.n, root);
  strlist_free(&classes);
  em_transform *resize = NULL;
  if (!st && height > 0) st = em_transform_resize(S, height, width, &resize);
  folder_src *f = NULL;
  if (!st && !(f = emi_malloc(S, sizeof *f)))
    st = emi_error(S, EM_ERR_NOMEM, "image_folder: out of memory");
  if (st) {
    strlist_free(&paths);
    free(labels);
    em_transform_release(resize);
    return st;
  }
  f->n = (int64_t)paths.n;
  f->paths = paths.v;      /* ownership moves to the node */
  f->labels = labels;
  f->resize = resize;
  /* resolved now: workers must not read the state's setting while it may change */
  f->want.max_pixels = emi_image_resolve_max(S, o ? o->max_pixels : 0);
  f->want.min_h = resize && !(o && o->full_decode) ? height : 0;
  f->want.min_w = resize && !(o && o->full_decode) ? width : 0;
  return emi_dataset_new(S, &folder_vt, NULL, f->n, 2, f, out);
}
