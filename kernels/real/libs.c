/*
** libs.c -- the real CUDA libraries, loaded with dlopen at first use (libs.h has
** the design: where they are looked for, why they are never unloaded, what works
** without a GPU).
**
** Each library is described once (lib_spec: display name, sonames, the major
** version of the headers, its symbol list from libs_fn.h) and loaded by one
** generic path: find the file (emk_libs_find), dlsym every symbol into the table,
** ask the version, refuse another major. The checks at the end build real
** descriptors with the loaded libraries, so that tests on a machine without a GPU
** still run cuDNN's and cuBLASLt's own code and NCCL's.
**
** Built without the CUDA headers (no cuda_runtime_api.h), the same API compiles
** to a stub whose every call says so.
*/
#define _GNU_SOURCE 1
#include "../runtime.h"
#include "libs_fn.h"
#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *const lib_names[EMK_LIB_COUNT] = {"CUDA runtime", "cuBLASLt", "cuDNN",
                                                     "NCCL"};

const char *emk_lib_name(emk_lib_id id) {
  return (unsigned)id < EMK_LIB_COUNT ? lib_names[id] : "unknown library";
}

/* The public summary, for `ember --info` (ember.h). */
em_status emk_libs_info(char *buf, size_t len) {
  if (!buf || !len) return EM_ERR_ARG;
  char err[256];
  emk_libs *L;
  em_status st = emk_libs_open(&L, err, sizeof err);
  if (st) {
    snprintf(buf, len, "%s\n", err);   /* err begins "CUDA libraries: " */
    return EM_OK;
  }
  st = emk_libs_describe(L, buf, len);
  emk_libs_close(L);
  return st;
}

#ifndef EMK_HAVE_CUDART_H
/* == Stub: built without the CUDA headers ============================================ */

#define NO_HEADERS "built without the CUDA headers (no cuda_runtime_api.h at build time)"

em_status emk_libs_open(emk_libs **out, char *err, size_t errlen) {
  if (out) *out = NULL;
  return emk_errf(err, errlen, EM_ERR_UNSUPPORTED, "CUDA libraries: ember was " NO_HEADERS);
}
void emk_libs_close(emk_libs *L) { (void)L; }
em_status emk_libs_load(emk_libs *L, emk_lib_id id, char *err, size_t errlen) {
  return emk_errf(err, errlen, EM_ERR_UNSUPPORTED, "%s: ember was " NO_HEADERS, emk_lib_name(id));
}
#define STUB_LOAD(fn, type, id) \
  em_status fn(emk_libs *L, const type **fns, char *err, size_t errlen) { \
    if (fns) *fns = NULL; \
    return emk_libs_load(L, id, err, errlen); \
  }
STUB_LOAD(emk_libs_cudart, emk_cudart_fns, EMK_LIB_CUDART)
STUB_LOAD(emk_libs_cublaslt, emk_cublaslt_fns, EMK_LIB_CUBLASLT)
STUB_LOAD(emk_libs_cudnn, emk_cudnn_fns, EMK_LIB_CUDNN)
STUB_LOAD(emk_libs_nccl, emk_nccl_fns, EMK_LIB_NCCL)
em_status emk_libs_version(emk_libs *L, emk_lib_id id, emk_lib_version *out, char *err,
                           size_t errlen) {
  if (out) memset(out, 0, sizeof *out);
  return emk_libs_load(L, id, err, errlen);
}
const char *emk_libs_path(emk_libs *L, emk_lib_id id) { return NULL; }
em_status emk_libs_driver_version(emk_libs *L, int *version, char *err, size_t errlen) {
  if (version) *version = 0;
  return emk_libs_load(L, EMK_LIB_CUDART, err, errlen);
}
em_status emk_libs_device_count(emk_libs *L, int *count, char *err, size_t errlen) {
  if (count) *count = 0;
  return emk_libs_load(L, EMK_LIB_CUDART, err, errlen);
}
em_status emk_libs_describe(emk_libs *L, char *buf, size_t len) {
  if (!buf || !len) return EM_ERR_ARG;
  snprintf(buf, len, "CUDA libraries: ember was " NO_HEADERS "\n");
  return EM_OK;
}
em_status emk_cudnn_conv2d_check(emk_libs *L, const emk_conv2d_shape *sh,
                                 emk_conv2d_check *out, char *err, size_t errlen) {
  return emk_libs_load(L, EMK_LIB_CUDNN, err, errlen);
}
em_status emk_cublaslt_gemm_check(emk_libs *L, const emk_gemm_shape *sh,
                                  emk_gemm_check *out, char *err, size_t errlen) {
  return emk_libs_load(L, EMK_LIB_CUBLASLT, err, errlen);
}
em_status emk_cublaslt_check_handle(emk_libs *L, char *err, size_t errlen) {
  return emk_libs_load(L, EMK_LIB_CUBLASLT, err, errlen);
}
em_status emk_cudnn_check_handle(emk_libs *L, char *err, size_t errlen) {
  return emk_libs_load(L, EMK_LIB_CUDNN, err, errlen);
}
em_status emk_nccl_unique_id(emk_libs *L, unsigned char id[EMK_NCCL_ID_BYTES], char *err,
                             size_t errlen) {
  return emk_libs_load(L, EMK_LIB_NCCL, err, errlen);
}
em_status emk_libs_find(emk_libs *L, const char *const *names, void **handle, char *path,
                        size_t pathlen, char *err, size_t errlen) {
  if (handle) *handle = NULL;
  return emk_errf(err, errlen, EM_ERR_UNSUPPORTED, "ember was " NO_HEADERS);
}

#else
/* == The libraries ================================================================= */

enum { PATH_LEN = 512, WHY_LEN = 1024 };

/* One symbol of a table: its name, where it goes, whether a library without it
** is refused. */
typedef struct sym_ref {
  const char *name;
  size_t offset;
  int required;
} sym_ref;

#define SYM_REF(table, f, req) {#f, offsetof(table, f), req},
#define CUDART_REF(f, req) SYM_REF(emk_cudart_fns, f, req)
#define CUBLASLT_REF(f, req) SYM_REF(emk_cublaslt_fns, f, req)
#define CUDNN_REF(f, req) SYM_REF(emk_cudnn_fns, f, req)
#define NCCL_REF(f, req) SYM_REF(emk_nccl_fns, f, req)

static const sym_ref cudart_syms[] = {EMK_CUDART_FNS(CUDART_REF) {NULL, 0, 0}};
#ifdef EMK_HAVE_CUBLASLT_H
static const sym_ref cublaslt_syms[] = {EMK_CUBLASLT_FNS(CUBLASLT_REF) {NULL, 0, 0}};
#define CUBLASLT_BUILT_MAJOR CUBLAS_VER_MAJOR
#else
static const sym_ref cublaslt_syms[] = {{NULL, 0, 0}};
#define CUBLASLT_BUILT_MAJOR 0
#endif
#ifdef EMK_HAVE_CUDNN_H
static const sym_ref cudnn_syms[] = {EMK_CUDNN_FNS(CUDNN_REF) {NULL, 0, 0}};
#define CUDNN_BUILT_MAJOR CUDNN_MAJOR
#else
static const sym_ref cudnn_syms[] = {{NULL, 0, 0}};
#define CUDNN_BUILT_MAJOR 0
#endif
#ifdef EMK_HAVE_NCCL_H
static const sym_ref nccl_syms[] = {EMK_NCCL_FNS(NCCL_REF) {NULL, 0, 0}};
#define NCCL_BUILT_MAJOR NCCL_MAJOR
_Static_assert(sizeof(ncclUniqueId) == EMK_NCCL_ID_BYTES, "ncclUniqueId is 128 bytes");
#else
static const sym_ref nccl_syms[] = {{NULL, 0, 0}};
#define NCCL_BUILT_MAJOR 0
#endif

typedef struct lib_spec {
  const char *stem;         /* "libcudnn": the files are stem.so.MAJOR, then stem.so */
  const char *header;       /* the header its types come from */
  int built_major;          /* 0 = the header was missing at build time */
  const sym_ref *syms;
} lib_spec;

static const lib_spec specs[EMK_LIB_COUNT] = {
  {"libcudart", "cuda_runtime_api.h", CUDART_VERSION / 1000, cudart_syms},
  {"libcublasLt", "cublasLt.h", CUBLASLT_BUILT_MAJOR, cublaslt_syms},
  {"libcudnn", "cudnn.h", CUDNN_BUILT_MAJOR, cudnn_syms},
  {"libnccl", "nccl.h", NCCL_BUILT_MAJOR, nccl_syms},
};

typedef struct lib_slot {
  int state;                /* 0 not tried, 1 loaded, -1 failed (why says it) */
  void *dl;
  char path[PATH_LEN];
  char why[WHY_LEN];
  emk_lib_version version;
} lib_slot;

struct emk_libs {
  pthread_mutex_t mu;       /* guards the slots while a library loads */
  char home[PATH_LEN];      /* EMBER_CUDA_HOME, "" when unset */
  lib_slot slot[EMK_LIB_COUNT];
  emk_cudart_fns cudart;
  emk_cublaslt_fns cublaslt;
  emk_cudnn_fns cudnn;
  emk_nccl_fns nccl;
};

static void *table_of(emk_libs *L, emk_lib_id id) {
  switch (id) {
  case EMK_LIB_CUDART: return &L->cudart;
  case EMK_LIB_CUBLASLT: return &L->cublaslt;
  case EMK_LIB_CUDNN: return &L->cudnn;
  default: return &L->nccl;
  }
}

/* -- Opening ------------------------------------------------------------------------ */

em_status emk_libs_open(emk_libs **out, char *err, size_t errlen) {
  *out = NULL;
  emk_libs *L = calloc(1, sizeof *L);
  if (!L) return emk_errf(err, errlen, EM_ERR_NOMEM, "CUDA libraries: out of memory");
  if (pthread_mutex_init(&L->mu, NULL)) {
    free(L);
    return emk_errf(err, errlen, EM_ERR_INTERNAL, "CUDA libraries: pthread_mutex_init failed");
  }
  const char *home = getenv("EMBER_CUDA_HOME");
  if (home && *home) snprintf(L->home, sizeof L->home, "%s", home);
  *out = L;
  return EM_OK;
}

void emk_libs_close(emk_libs *L) {
  if (!L) return;
  /* RTLD_NODELETE: this drops our reference, the code stays mapped (libs.h). */
  for (int i = 0; i < EMK_LIB_COUNT; i++)
    if (L->slot[i].dl) dlclose(L->slot[i].dl);
  pthread_mutex_destroy(&L->mu);
  free(L);
}

/* -- Finding a file ------------------------------------------------------------------- */

static int is_dir(const char *p) {
  struct stat st;
  return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

/* Appends to buf (always NUL-terminated, silently truncated). */
static void append(char *buf, size_t len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void append(char *buf, size_t len, const char *fmt, ...) {
  size_t n = strlen(buf);
  if (n + 1 >= len) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf + n, len - n, fmt, ap);
  va_end(ap);
}

/* The file a handle came from, as the dynamic linker resolved it. */
static void loaded_path(void *dl, const char *fallback, char *path, size_t pathlen) {
  struct link_map *lm = NULL;
  const char *p = fallback;
  if (dlinfo(dl, RTLD_DI_LINKMAP, &lm) == 0 && lm && lm->l_name && lm->l_name[0])
    p = lm->l_name;
  if (path && pathlen) snprintf(path, pathlen, "%s", p);
}

em_status emk_libs_find(emk_libs *L, const char *const *names, void **handle, char *path,
                        size_t pathlen, char *err, size_t errlen) {
  *handle = NULL;
  if (!names || !names[0]) return emk_errf(err, errlen, EM_ERR_ARG, "emk_libs_find: no file names");
  /* The places, in order; NULL is the system search path. */
  char homedir[PATH_LEN + 8];
  const char *dirs[3];
  int nd = 0;
  if (L->home[0]) {
    snprintf(homedir, sizeof homedir, "%s/lib64", L->home);
    dirs[nd++] = homedir;
  }
  dirs[nd++] = "/usr/local/cuda/lib64";
  dirs[nd++] = NULL;
  char problems[WHY_LEN] = "";
  char file[PATH_LEN + 160];
  for (int i = 0; names[i]; i++) {
    for (int d = 0; d < nd; d++) {
      if (dirs[d]) {
        snprintf(file, sizeof file, "%s/%s", dirs[d], names[i]);
        if (access(file, F_OK) != 0) continue;
      } else {
        snprintf(file, sizeof file, "%s", names[i]);
      }
      dlerror();
      void *dl = dlopen(file, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
      if (dl) {
        *handle = dl;
        loaded_path(dl, file, path, pathlen);
        return EM_OK;
      }
      const char *e = dlerror();
      if (!e) e = "dlopen failed";
      /* Not on the system path at all is the ordinary miss, said below. */
      if (!dirs[d] && strstr(e, "No such file or directory")) continue;
      append(problems, sizeof problems, "; dlopen: %s", e);   /* e names the file */
    }
  }
  /* "libcudnn.so.9 or libcudnn.so not found; tried A, B and the system search path" */
  char what[256] = "";
  for (int i = 0; names[i]; i++)
    append(what, sizeof what, "%s%s", i == 0 ? "" : names[i + 1] ? ", " : " or ", names[i]);
  char tried[WHY_LEN] = "";
  for (int d = 0; d < nd - 1; d++) {
    append(tried, sizeof tried, "%s%s", d ? ", " : "", dirs[d]);
    int from_home = L->home[0] && d == 0;
    int missing = !is_dir(dirs[d]);
    if (from_home || missing)
      append(tried, sizeof tried, " (%s%s%s)", from_home ? "EMBER_CUDA_HOME" : "",
             from_home && missing ? ": " : "", missing ? "no such directory" : "");
  }
  return emk_errf(err, errlen, EM_ERR_UNSUPPORTED,
              "%s %s; tried %s and the system search path (LD_LIBRARY_PATH, ld.so.cache)%s",
              what, problems[0] ? "not loaded" : "not found", tried, problems);
}

/* -- Loading a library ------------------------------------------------------------------ */

static void split_version(emk_lib_id id, int code, emk_lib_version *v) {
  v->code = code;
  switch (id) {
  case EMK_LIB_CUDART:         /* 1000 * major + 10 * minor */
    v->major = code / 1000, v->minor = code % 1000 / 10, v->patch = 0;
    break;
  case EMK_LIB_CUDNN:          /* 9.x: 10000 * major + 100 * minor + patch; 8.x: 1000 * */
  case EMK_LIB_NCCL:           /* >= 2.9: 10000 * major ...; before: 1000 * major ... */
    if (code >= 10000) v->major = code / 10000, v->minor = code / 100 % 100, v->patch = code % 100;
    else v->major = code / 1000, v->minor = code / 100 % 10, v->patch = code % 100;
    break;
  default:                     /* cuBLASLt: 10000 * major + 100 * minor + patch */
    v->major = code / 10000, v->minor = code / 100 % 100, v->patch = code % 100;
  }
}

/* Asks a library whose table is filled its version. */
static em_status ask_version(emk_libs *L, emk_lib_id id, int *code, char *why, size_t whylen) {
  *code = 0;
  switch (id) {
  case EMK_LIB_CUDART: {
    cudaError_t e = L->cudart.cudaRuntimeGetVersion(code);
    if (e != cudaSuccess)
      return emk_errf(why, whylen, EM_ERR_UNSUPPORTED, "cudaRuntimeGetVersion: %s: %s",
                  L->cudart.cudaGetErrorName(e), L->cudart.cudaGetErrorString(e));
    return EM_OK;
  }
#ifdef EMK_HAVE_CUBLASLT_H
  case EMK_LIB_CUBLASLT: *code = (int)L->cublaslt.cublasLtGetVersion(); return EM_OK;
#endif
#ifdef EMK_HAVE_CUDNN_H
  case EMK_LIB_CUDNN: *code = (int)L->cudnn.cudnnGetVersion(); return EM_OK;
#endif
#ifdef EMK_HAVE_NCCL_H
  case EMK_LIB_NCCL: {
    ncclResult_t r = L->nccl.ncclGetVersion(code);
    if (r != ncclSuccess)
      return emk_errf(why, whylen, EM_ERR_UNSUPPORTED, "ncclGetVersion: %s",
                  L->nccl.ncclGetErrorString(r));
    return EM_OK;
  }
#endif
  default: return emk_errf(why, whylen, EM_ERR_INTERNAL, "no version call");
  }
}

/* slot->why = the message, and the slot failed. (Through a copy: the arguments are
** often other fields of the same slot.) */
static void slot_fail(lib_slot *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void slot_fail(lib_slot *s, const char *fmt, ...) {
  char msg[WHY_LEN];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  memcpy(s->why, msg, sizeof msg);
  s->state = -1;
}

/* Finds, binds and checks one library; on failure s->why says why. Under L->mu. */
static void load_locked(emk_libs *L, lib_slot *s, const lib_spec *sp, const char *lib,
                        char *table) {
  if (!sp->built_major) {
    slot_fail(s, "%s: ember was built without %s (the CUDA headers had none)", lib, sp->header);
    return;
  }
  char versioned[64], plain[64], why[WHY_LEN];
  snprintf(versioned, sizeof versioned, "%s.so.%d", sp->stem, sp->built_major);
  snprintf(plain, sizeof plain, "%s.so", sp->stem);
  const char *names[] = {versioned, plain, NULL};
  void *dl;
  if (emk_libs_find(L, names, &dl, s->path, sizeof s->path, why, sizeof why)) {
    slot_fail(s, "%s: %s", lib, why);
    return;
  }
  for (const sym_ref *r = sp->syms; r->name; r++) {
    void *f = dlsym(dl, r->name);
    if (!f && r->required) {
      slot_fail(s, "%s: %s has no %s (ember needs %s %d.x)", lib, s->path, r->name, lib,
                sp->built_major);
      dlclose(dl);
      return;
    }
    memcpy(table + r->offset, &f, sizeof f);   /* object pointer to function pointer */
  }
  int code;
  if (ask_version(L, (emk_lib_id)(sp - specs), &code, why, sizeof why)) {
    slot_fail(s, "%s: %s: %s", lib, s->path, why);
    dlclose(dl);
    return;
  }
  split_version((emk_lib_id)(sp - specs), code, &s->version);
  s->version.built_major = sp->built_major;
  if (s->version.major != sp->built_major) {
    slot_fail(s, "%s: %s is %s %d.%d; ember was built with the %s %d headers (set "
              "EMBER_CUDA_HOME to a toolkit with %s.so.%d)", lib, s->path, lib,
              s->version.major, s->version.minor, lib, sp->built_major, sp->stem,
              sp->built_major);
    dlclose(dl);
    return;
  }
  s->dl = dl;
  s->state = 1;
}

em_status emk_libs_load(emk_libs *L, emk_lib_id id, char *err, size_t errlen) {
  if (!L || (unsigned)id >= EMK_LIB_COUNT)
    return emk_errf(err, errlen, EM_ERR_ARG, "emk_libs_load: no such library (%d)", (int)id);
  pthread_mutex_lock(&L->mu);
  lib_slot *s = &L->slot[id];
  if (s->state == 0) load_locked(L, s, &specs[id], lib_names[id], table_of(L, id));
  em_status st = s->state > 0 ? EM_OK : emk_errf(err, errlen, EM_ERR_UNSUPPORTED, "%s", s->why);
  pthread_mutex_unlock(&L->mu);
  return st;
}

#define LOAD_FN(fn, type, id, field) \
  em_status fn(emk_libs *L, const type **fns, char *err, size_t errlen) { \
    if (fns) *fns = NULL; \
    em_status st = emk_libs_load(L, id, err, errlen); \
    if (!st && fns) *fns = &L->field; \
    return st; \
  }
LOAD_FN(emk_libs_cudart, emk_cudart_fns, EMK_LIB_CUDART, cudart)
LOAD_FN(emk_libs_cublaslt, emk_cublaslt_fns, EMK_LIB_CUBLASLT, cublaslt)
LOAD_FN(emk_libs_cudnn, emk_cudnn_fns, EMK_LIB_CUDNN, cudnn)
LOAD_FN(emk_libs_nccl, emk_nccl_fns, EMK_LIB_NCCL, nccl)

/* -- What was found --------------------------------------------------------------------- */

em_status emk_libs_version(emk_libs *L, emk_lib_id id, emk_lib_version *out, char *err,
                           size_t errlen) {
  memset(out, 0, sizeof *out);
  em_status st = emk_libs_load(L, id, err, errlen);
  if (!st) *out = L->slot[id].version;
  return st;
}

const char *emk_libs_path(emk_libs *L, emk_lib_id id) {
  if (!L || (unsigned)id >= EMK_LIB_COUNT) return NULL;
  pthread_mutex_lock(&L->mu);
  const char *p = L->slot[id].state > 0 ? L->slot[id].path : NULL;
  pthread_mutex_unlock(&L->mu);
  return p;
}

em_status emk_libs_driver_version(emk_libs *L, int *version, char *err, size_t errlen) {
  *version = 0;
  const emk_cudart_fns *f;
  em_status st = emk_libs_cudart(L, &f, err, errlen);
  if (st) return st;
  int v = 0;
  cudaError_t e = f->cudaDriverGetVersion(&v);
  if (e != cudaSuccess)
    return emk_errf(err, errlen, EM_ERR_DEVICE, "CUDA runtime: cudaDriverGetVersion: %s: %s",
                f->cudaGetErrorName(e), f->cudaGetErrorString(e));
  *version = v;
  return EM_OK;
}

em_status emk_libs_device_count(emk_libs *L, int *count, char *err, size_t errlen) {
  *count = 0;
  const emk_cudart_fns *f;
  em_status st = emk_libs_cudart(L, &f, err, errlen);
  if (st) return st;
  int n = 0;
  cudaError_t e = f->cudaGetDeviceCount(&n);
  if (e == cudaSuccess) {
    *count = n > 0 ? n : 0;
    return EM_OK;
  }
  if (e == cudaErrorNoDevice) return EM_OK;       /* a driver, no device: zero */
  int drv = 0, rt = L->slot[EMK_LIB_CUDART].version.code;
  if (f->cudaDriverGetVersion(&drv) != cudaSuccess) drv = 0;
  if (drv == 0)
    return emk_errf(err, errlen, EM_ERR_DEVICE, "no CUDA driver (cudaGetDeviceCount: %s: %s)",
                f->cudaGetErrorName(e), f->cudaGetErrorString(e));
  if (e == cudaErrorInsufficientDriver)
    return emk_errf(err, errlen, EM_ERR_DEVICE,
                "the CUDA driver (%d.%d) is older than the CUDA runtime (%d.%d): "
                "cudaGetDeviceCount: %s", drv / 1000, drv % 1000 / 10, rt / 1000,
                rt % 1000 / 10, f->cudaGetErrorName(e));
  return emk_errf(err, errlen, EM_ERR_DEVICE, "cudaGetDeviceCount: %s: %s",
              f->cudaGetErrorName(e), f->cudaGetErrorString(e));
}

/* "CUDA runtime 13.0 (libcudart.so.13 from /usr/local/cuda/lib64)" */
static void describe_one(emk_libs *L, emk_lib_id id, char *buf, size_t len) {
  char why[WHY_LEN];
  if (emk_libs_load(L, id, why, sizeof why)) {
    append(buf, len, "%s", why);
    return;
  }
  const lib_slot *s = &L->slot[id];
  const char *slash = strrchr(s->path, '/');
  append(buf, len, "%s %d.%d", lib_names[id], s->version.major, s->version.minor);
  if (id != EMK_LIB_CUDART) append(buf, len, ".%d", s->version.patch);
  if (slash)
    append(buf, len, " (%s from %.*s)", slash + 1, (int)(slash - s->path), s->path);
  else
    append(buf, len, " (%s)", s->path);
}

em_status emk_libs_describe(emk_libs *L, char *buf, size_t len) {
  if (!buf || !len) return EM_ERR_ARG;
  buf[0] = 0;
  for (int id = 0; id < EMK_LIB_COUNT; id++) {
    describe_one(L, (emk_lib_id)id, buf, len);
    if (id == EMK_LIB_CUDART && L->slot[id].state > 0) {
      int drv = 0, n = 0;
      char why[WHY_LEN];
      emk_libs_driver_version(L, &drv, why, sizeof why);
      if (drv == 0) {
        append(buf, len, "; driver: none (no GPU)");
      } else {
        append(buf, len, "; driver %d.%d", drv / 1000, drv % 1000 / 10);
        if (emk_libs_device_count(L, &n, why, sizeof why)) append(buf, len, ": %s", why);
        else append(buf, len, ", %d device%s", n, n == 1 ? "" : "s");
      }
    }
    append(buf, len, "\n");
  }
  /* A truncated text still ends its last line. */
  size_t n = strlen(buf);
  if (n + 1 >= len && n > 0) buf[n - 1] = '\n';
  return EM_OK;
}

/* -- cuDNN: descriptors ------------------------------------------------------------------ */

#ifdef EMK_HAVE_CUDNN_H
/* "cuDNN: cudnnSetTensor4dDescriptor(...): CUDNN_STATUS_BAD_PARAM (detail)" */
static em_status cudnn_fail(const emk_cudnn_fns *f, cudnnStatus_t s, const char *call,
                            char *err, size_t errlen) {
  char detail[400] = "";
  if (f->cudnnGetLastErrorString) f->cudnnGetLastErrorString(detail, sizeof detail);
  /* The detail is cuDNN's log line ("CUDNN_STATUS_...; Reason: ..."): its last line
  ** suffices. */
  size_t n = strlen(detail);
  while (n && (detail[n - 1] == '\n' || detail[n - 1] == ' ')) detail[--n] = 0;
  em_status code = s / 1000 == 2 || s == CUDNN_STATUS_NOT_SUPPORTED_SHAPE ? EM_ERR_SHAPE
                 : s == CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED ? EM_ERR_NOMEM
                 : EM_ERR_UNSUPPORTED;
  return emk_errf(err, errlen, code, "cuDNN: %s: %s%s%s%s", call, f->cudnnGetErrorString(s),
              detail[0] ? " (" : "", detail, detail[0] ? ")" : "");
}

/* cuDNN keeps the last error's text per thread until it is read: read it before a
** sequence of calls, so that a failure reports its own text, not an older one. */
static void cudnn_clear_last(const emk_cudnn_fns *f) {
  char old[256];
  if (f->cudnnGetLastErrorString) f->cudnnGetLastErrorString(old, sizeof old);
}

em_status emk_cudnn_conv2d_check(emk_libs *L, const emk_conv2d_shape *sh,
                                 emk_conv2d_check *out, char *err, size_t errlen) {
  memset(out, 0, sizeof *out);
  const emk_cudnn_fns *f;
  em_status st = emk_libs_cudnn(L, &f, err, errlen);
  if (st) return st;
  cudnn_clear_last(f);
  cudnnTensorDescriptor_t x = NULL;
  cudnnFilterDescriptor_t w = NULL;
  cudnnConvolutionDescriptor_t cd = NULL;
  cudnnStatus_t s;
  const char *call;
  char what[200];
  if ((s = f->cudnnCreateTensorDescriptor(&x))) { call = "cudnnCreateTensorDescriptor"; goto bad; }
  snprintf(what, sizeof what, "cudnnSetTensor4dDescriptor(NCHW float32 %dx%dx%dx%d)", sh->n,
           sh->c, sh->h, sh->w);
  call = what;
  if ((s = f->cudnnSetTensor4dDescriptor(x, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, sh->n, sh->c,
                                         sh->h, sh->w)))
    goto bad;
  cudnnDataType_t dt;
  int *in = out->input;
  call = "cudnnGetTensor4dDescriptor";
  if ((s = f->cudnnGetTensor4dDescriptor(x, &dt, &in[0], &in[1], &in[2], &in[3], &in[4],
                                         &in[5], &in[6], &in[7])))
    goto bad;

  call = "cudnnCreateFilterDescriptor";
  if ((s = f->cudnnCreateFilterDescriptor(&w))) goto bad;
  snprintf(what, sizeof what, "cudnnSetFilter4dDescriptor(KCRS float32 %dx%dx%dx%d)", sh->k,
           sh->c, sh->r, sh->s);
  call = what;
  if ((s = f->cudnnSetFilter4dDescriptor(w, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, sh->k, sh->c,
                                         sh->r, sh->s)))
    goto bad;
  cudnnTensorFormat_t fmt;
  int *fl = out->filter;
  call = "cudnnGetFilter4dDescriptor";
  if ((s = f->cudnnGetFilter4dDescriptor(w, &dt, &fmt, &fl[0], &fl[1], &fl[2], &fl[3]))) goto bad;

  call = "cudnnCreateConvolutionDescriptor";
  if ((s = f->cudnnCreateConvolutionDescriptor(&cd))) goto bad;
  snprintf(what, sizeof what,
           "cudnnSetConvolution2dDescriptor(pad %dx%d, stride %dx%d, dilation %dx%d)",
           sh->pad_h, sh->pad_w, sh->stride_h, sh->stride_w, sh->dil_h, sh->dil_w);
  call = what;
  if ((s = f->cudnnSetConvolution2dDescriptor(cd, sh->pad_h, sh->pad_w, sh->stride_h,
                                              sh->stride_w, sh->dil_h, sh->dil_w,
                                              CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT)))
    goto bad;
  cudnnConvolutionMode_t mode;
  int *cv = out->conv;
  call = "cudnnGetConvolution2dDescriptor";
  if ((s = f->cudnnGetConvolution2dDescriptor(cd, &cv[0], &cv[1], &cv[2], &cv[3], &cv[4],
                                              &cv[5], &mode, &dt)))
    goto bad;

  snprintf(what, sizeof what,
           "cudnnGetConvolution2dForwardOutputDim(input %dx%dx%dx%d, filter %dx%dx%dx%d)",
           sh->n, sh->c, sh->h, sh->w, sh->k, sh->c, sh->r, sh->s);
  call = what;
  if ((s = f->cudnnGetConvolution2dForwardOutputDim(cd, x, w, &out->out[0], &out->out[1],
                                                    &out->out[2], &out->out[3])))
    goto bad;
  st = EM_OK;
  goto done;
bad:
  st = cudnn_fail(f, s, call, err, errlen);
done:
  if (cd) f->cudnnDestroyConvolutionDescriptor(cd);
  if (w) f->cudnnDestroyFilterDescriptor(w);
  if (x) f->cudnnDestroyTensorDescriptor(x);
  return st;
}

em_status emk_cudnn_check_handle(emk_libs *L, char *err, size_t errlen) {
  const emk_cudnn_fns *f;
  em_status st = emk_libs_cudnn(L, &f, err, errlen);
  if (st) return st;
  cudnnHandle_t h = NULL;
  cudnn_clear_last(f);
  cudnnStatus_t s = f->cudnnCreate(&h);
  if (s != CUDNN_STATUS_SUCCESS) {
    cudnn_fail(f, s, "cudnnCreate", err, errlen);
    return EM_ERR_DEVICE;
  }
  f->cudnnDestroy(h);
  return EM_OK;
}
#else
em_status emk_cudnn_conv2d_check(emk_libs *L, const emk_conv2d_shape *sh,
                                 emk_conv2d_check *out, char *err, size_t errlen) {
  memset(out, 0, sizeof *out);
  return emk_libs_load(L, EMK_LIB_CUDNN, err, errlen);
}
em_status emk_cudnn_check_handle(emk_libs *L, char *err, size_t errlen) {
  return emk_libs_load(L, EMK_LIB_CUDNN, err, errlen);
}
#endif

/* -- cuBLASLt: matmul descriptor and layouts ------------------------------------------------ */

#ifdef EMK_HAVE_CUBLASLT_H
static em_status lt_fail(const emk_cublaslt_fns *f, cublasStatus_t s, const char *call,
                         char *err, size_t errlen) {
  em_status code = s == CUBLAS_STATUS_INVALID_VALUE ? EM_ERR_SHAPE
                 : s == CUBLAS_STATUS_ALLOC_FAILED ? EM_ERR_NOMEM : EM_ERR_UNSUPPORTED;
  return emk_errf(err, errlen, code, "cuBLASLt: %s: %s (%s)", call, f->cublasLtGetStatusName(s),
              f->cublasLtGetStatusString(s));
}

/* Reads one attribute of exactly n bytes back ("wrote k bytes" is a failure too). */
#define LT_GET(getter, obj, attr, dst, callname) do { \
    size_t written_ = 0; \
    call = callname; \
    if ((s = f->getter(obj, attr, dst, sizeof *(dst), &written_))) goto bad; \
    if (written_ != sizeof *(dst)) { \
      st = emk_errf(err, errlen, EM_ERR_INTERNAL, "cuBLASLt: %s wrote %zu bytes, expected %zu", \
                callname, written_, sizeof *(dst)); \
      goto done; \
    } \
  } while (0)

em_status emk_cublaslt_gemm_check(emk_libs *L, const emk_gemm_shape *sh,
                                  emk_gemm_check *out, char *err, size_t errlen) {
  memset(out, 0, sizeof *out);
  const emk_cublaslt_fns *f;
  em_status st = emk_libs_cublaslt(L, &f, err, errlen);
  if (st) return st;
  /* cuBLASLt takes the sizes as uint64_t and checks them only when it multiplies:
  ** a negative one would pass as a huge matrix. */
  if (sh->m < 1 || sh->n < 1 || sh->k < 1)
    return emk_errf(err, errlen, EM_ERR_SHAPE, "cuBLASLt: GEMM sizes must be positive, got m %lld, "
                "n %lld, k %lld", (long long)sh->m, (long long)sh->n, (long long)sh->k);
  cublasLtMatmulDesc_t md = NULL;
  cublasLtMatrixLayout_t lay[3] = {NULL, NULL, NULL};
  cublasStatus_t s;
  const char *call = "cublasLtMatmulDescCreate(CUBLAS_COMPUTE_32F, CUDA_R_32F)";
  if ((s = f->cublasLtMatmulDescCreate(&md, CUBLAS_COMPUTE_32F, CUDA_R_32F))) goto bad;
  cublasOperation_t ta = sh->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasOperation_t tb = sh->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  call = "cublasLtMatmulDescSetAttribute(TRANSA)";
  if ((s = f->cublasLtMatmulDescSetAttribute(md, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta)))
    goto bad;
  call = "cublasLtMatmulDescSetAttribute(TRANSB)";
  if ((s = f->cublasLtMatmulDescSetAttribute(md, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb)))
    goto bad;
  LT_GET(cublasLtMatmulDescGetAttribute, md, CUBLASLT_MATMUL_DESC_TRANSA, &out->trans_a,
         "cublasLtMatmulDescGetAttribute(TRANSA)");
  LT_GET(cublasLtMatmulDescGetAttribute, md, CUBLASLT_MATMUL_DESC_TRANSB, &out->trans_b,
         "cublasLtMatmulDescGetAttribute(TRANSB)");
  LT_GET(cublasLtMatmulDescGetAttribute, md, CUBLASLT_MATMUL_DESC_COMPUTE_TYPE,
         &out->compute_type, "cublasLtMatmulDescGetAttribute(COMPUTE_TYPE)");
  LT_GET(cublasLtMatmulDescGetAttribute, md, CUBLASLT_MATMUL_DESC_SCALE_TYPE, &out->scale_type,
         "cublasLtMatmulDescGetAttribute(SCALE_TYPE)");

  /* A is m x k (stored k x m when transposed), B k x n, C m x n; the leading
  ** dimension is the stored row length in row-major order, the column length in
  ** column-major. */
  uint64_t rows[3] = {(uint64_t)(sh->trans_a ? sh->k : sh->m), (uint64_t)(sh->trans_b ? sh->n : sh->k),
                      (uint64_t)sh->m};
  uint64_t cols[3] = {(uint64_t)(sh->trans_a ? sh->m : sh->k), (uint64_t)(sh->trans_b ? sh->k : sh->n),
                      (uint64_t)sh->n};
  emk_gemm_layout *back[3] = {&out->a, &out->b, &out->c};
  static const char *const mat[3] = {"A", "B", "C"};
  char what[160];
  for (int i = 0; i < 3; i++) {
    int64_t ld = (int64_t)(sh->row_major ? cols[i] : rows[i]);
    snprintf(what, sizeof what, "cublasLtMatrixLayoutCreate(%s %llux%llu, ld %lld)", mat[i],
             (unsigned long long)rows[i], (unsigned long long)cols[i], (long long)ld);
    call = what;
    if ((s = f->cublasLtMatrixLayoutCreate(&lay[i], CUDA_R_32F, rows[i], cols[i], ld))) goto bad;
    if (sh->row_major) {
      cublasLtOrder_t order = CUBLASLT_ORDER_ROW;
      int32_t o = order;
      call = "cublasLtMatrixLayoutSetAttribute(ORDER)";
      if ((s = f->cublasLtMatrixLayoutSetAttribute(lay[i], CUBLASLT_MATRIX_LAYOUT_ORDER, &o,
                                                   sizeof o)))
        goto bad;
    }
    LT_GET(cublasLtMatrixLayoutGetAttribute, lay[i], CUBLASLT_MATRIX_LAYOUT_TYPE, &back[i]->type,
           "cublasLtMatrixLayoutGetAttribute(TYPE)");
    LT_GET(cublasLtMatrixLayoutGetAttribute, lay[i], CUBLASLT_MATRIX_LAYOUT_ORDER,
           &back[i]->order, "cublasLtMatrixLayoutGetAttribute(ORDER)");
    LT_GET(cublasLtMatrixLayoutGetAttribute, lay[i], CUBLASLT_MATRIX_LAYOUT_ROWS, &back[i]->rows,
           "cublasLtMatrixLayoutGetAttribute(ROWS)");
    LT_GET(cublasLtMatrixLayoutGetAttribute, lay[i], CUBLASLT_MATRIX_LAYOUT_COLS, &back[i]->cols,
           "cublasLtMatrixLayoutGetAttribute(COLS)");
    LT_GET(cublasLtMatrixLayoutGetAttribute, lay[i], CUBLASLT_MATRIX_LAYOUT_LD, &back[i]->ld,
           "cublasLtMatrixLayoutGetAttribute(LD)");
  }
  st = EM_OK;
  goto done;
bad:
  st = lt_fail(f, s, call, err, errlen);
done:
  for (int i = 0; i < 3; i++)
    if (lay[i]) f->cublasLtMatrixLayoutDestroy(lay[i]);
  if (md) f->cublasLtMatmulDescDestroy(md);
  return st;
}

em_status emk_cublaslt_check_handle(emk_libs *L, char *err, size_t errlen) {
  const emk_cublaslt_fns *f;
  em_status st = emk_libs_cublaslt(L, &f, err, errlen);
  if (st) return st;
  cublasLtHandle_t h = NULL;
  cublasStatus_t s = f->cublasLtCreate(&h);
  if (s != CUBLAS_STATUS_SUCCESS) {
    lt_fail(f, s, "cublasLtCreate", err, errlen);
    return EM_ERR_DEVICE;
  }
  f->cublasLtDestroy(h);
  return EM_OK;
}
#else
em_status emk_cublaslt_gemm_check(emk_libs *L, const emk_gemm_shape *sh,
                                  emk_gemm_check *out, char *err, size_t errlen) {
  memset(out, 0, sizeof *out);
  return emk_libs_load(L, EMK_LIB_CUBLASLT, err, errlen);
}
em_status emk_cublaslt_check_handle(emk_libs *L, char *err, size_t errlen) {
  return emk_libs_load(L, EMK_LIB_CUBLASLT, err, errlen);
}
#endif

/* -- NCCL ------------------------------------------------------------------------------- */

em_status emk_nccl_unique_id(emk_libs *L, unsigned char id[EMK_NCCL_ID_BYTES], char *err,
                             size_t errlen) {
  memset(id, 0, EMK_NCCL_ID_BYTES);
#ifdef EMK_HAVE_NCCL_H
  const emk_nccl_fns *f;
  em_status st = emk_libs_nccl(L, &f, err, errlen);
  if (st) return st;
  ncclUniqueId u;
  ncclResult_t r = f->ncclGetUniqueId(&u);
  if (r != ncclSuccess) {
    const char *last = f->ncclGetLastError ? f->ncclGetLastError(NULL) : NULL;
    return emk_errf(err, errlen, r == ncclSystemError ? EM_ERR_IO : EM_ERR_UNSUPPORTED,
                "NCCL: ncclGetUniqueId: %s%s%s%s", f->ncclGetErrorString(r),
                last && *last ? " (" : "", last && *last ? last : "", last && *last ? ")" : "");
  }
  memcpy(id, u.internal, EMK_NCCL_ID_BYTES);
  return EM_OK;
#else
  return emk_libs_load(L, EMK_LIB_NCCL, err, errlen);
#endif
}

#endif /* EMK_HAVE_CUDART_H */
