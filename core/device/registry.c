/*
** registry.c -- the device registry: which backend serves a device number, and
** the accelerator kind's library, loaded on the first ask.
**
** Numbering. cpu (EM_CPU) and meta (EM_META) are built in: their contexts are
** fields of the state and always there. Devices 0 .. EMI_MAX_DEVICES-1 belong to
** the accelerator kind, cuda. Its backend -- kernels, fatbins, the emulated
** runtime -- is a library of its own, libember_cuda.so, so a CPU-only host
** carries none of it. The first state that asks for a CUDA device loads it:
**   1. linked in already (a host that links libember_cuda.a, or has
**      libember_cuda.so among its libraries): the library registered its kind
**      when the process started (emi_register_kind, from its constructor), and
**      no library is loaded;
**   2. else $EMBER_CUDA_LIB, or libember_cuda.so beside the object that holds
**      this code (libember.so, or the ember executable), then in lib/, ../lib/
**      and a rock's ../lib/lua/5.1/ember/ from there (a packed, an installed and
**      a luarocks tree), then the system's search path.
** The library leaves core's functions undefined, to be bound to the one core in
** the process. So libember.so, if that is where core lives, is promoted to
** global scope first (a plain luajit loads it with RTLD_LOCAL); an executable
** that links core statically must export its symbols (-rdynamic), or the load
** fails with the undefined symbol named in the reason.
**
** Loading is once per process, under a mutex (replicas open their states in
** threads); opening the kind is once per state (emi_kind_slot), and opening one
** of its devices is once per state and device, at the first use of that device
** (emi_device_attach): a state that uses cuda:1 alone never touches cuda:0, as
** a replica or an mpirun rank on a shared machine must not (each context costs
** memory on its GPU, and a GPU in EXCLUSIVE_PROCESS mode refuses a second
** process). A library built for another version of the device interface, or
** against other layouts of its tables, is refused, and the reason says which.
*/
#define _GNU_SOURCE
#include "internal.h"
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

static pthread_mutex_t load_mu = PTHREAD_MUTEX_INITIALIZER;
static const emi_backend_kind *loaded;     /* set once, under load_mu */
static char load_why[256];                 /* why none was found, once looked for */

/* The folder of the object this code is in, with a trailing '/', or "". */
static void own_dir(char *buf, size_t len, char *path, size_t plen) {
  Dl_info info;
  buf[0] = path[0] = 0;
  if (!dladdr((void *)&emi_device_attach, &info) || !info.dli_fname) return;
  snprintf(path, plen, "%s", info.dli_fname);
  const char *slash = strrchr(info.dli_fname, '/');
  if (slash) snprintf(buf, len, "%.*s/", (int)(slash - info.dli_fname), info.dli_fname);
}

/* Puts core's symbols in global scope when core is a shared library. */
static void promote_core(const char *core_path) {
  if (!core_path[0]) return;
  void *h = dlopen(core_path, RTLD_NOW | RTLD_NOLOAD | RTLD_GLOBAL);
  (void)h;                  /* the executable itself, or already global: nothing to do */
}

/* Whether kind k was built for this libember's device interface. */
static int fits(const emi_backend_kind *k) {
  return k->version == EMI_DEVICE_INTERFACE_VERSION && k->abi == EMI_BACKEND_ABI;
}

static const emi_backend_kind *try_open(const char *path, char *err, size_t errlen) {
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char *e = dlerror();
    snprintf(err, errlen, "%s", e ? e : "dlopen failed");
    return NULL;
  }
  const emi_backend_kind *k = dlsym(h, "emk_cuda_kind");
  if (!k) {
    snprintf(err, errlen, "%s has no emk_cuda_kind", path);
    dlclose(h);
    return NULL;
  }
  if (!fits(k)) {
    if (k->version != EMI_DEVICE_INTERFACE_VERSION)
      snprintf(err, errlen, "%s implements version %d of the device interface, this libember "
               "version %d (rebuild them together)", path, k->version,
               EMI_DEVICE_INTERFACE_VERSION);
    else
      snprintf(err, errlen, "%s was built against other layouts of the device tables "
               "(rebuild it with this libember)", path);
    dlclose(h);
    return NULL;
  }
  return k;            /* the library stays loaded for the process's life */
}

/* The kind a library registered as it was loaded (its constructor runs before
** main for a linked library, inside dlopen for a loaded one: no lock here, as
** dlopen runs under load_mu). */
static const emi_backend_kind *registered;

void emi_register_kind(const emi_backend_kind *k) {
  if (k && fits(k)) __atomic_store_n(&registered, k, __ATOMIC_RELEASE);
}

static const emi_backend_kind *linked_in(void) {
  return __atomic_load_n(&registered, __ATOMIC_ACQUIRE);
}

static const emi_backend_kind *load_kind(void) {
  pthread_mutex_lock(&load_mu);
  if (!loaded) loaded = linked_in();
  if (!loaded && !load_why[0]) {            /* looked for once: the reason stays */
    char dir[1024], core[1024], path[1200], err[170] = "";
    own_dir(dir, sizeof dir, core, sizeof core);
    promote_core(core);
    const char *env = getenv("EMBER_CUDA_LIB");
    if (env && *env) {
      if (!(loaded = try_open(env, err, sizeof err)))
        snprintf(load_why, sizeof load_why, "EMBER_CUDA_LIB=%.60s: %.170s", env, err);
    } else {
      const char *where[] = {"%slibember_cuda.so", "%slib/libember_cuda.so",
                             "%s../lib/libember_cuda.so",
                             "%s../lib/lua/5.1/ember/libember_cuda.so", "libember_cuda.so"};
      enum { N_WHERE = sizeof where / sizeof *where };
      char first[170] = "";
      for (int i = 0; i < N_WHERE && !loaded; i++) {
        if (i < N_WHERE - 1 && !dir[0]) continue;
        snprintf(path, sizeof path, where[i], dir);
        loaded = try_open(path, err, sizeof err);
        /* the first reason that is not "no such file" tells the most */
        if (!loaded && !first[0] && !strstr(err, "No such file"))
          snprintf(first, sizeof first, "%s", err);
      }
      if (!loaded)
        snprintf(load_why, sizeof load_why, "the CUDA backend (libember_cuda.so) is not "
                 "available: %.190s", first[0] ? first : err);
    }
  }
  const emi_backend_kind *k = loaded;
  pthread_mutex_unlock(&load_mu);
  return k;
}

const emi_backend_kind *emi_accel_library(char *why, size_t whylen) {
  const emi_backend_kind *k = load_kind();
  if (!k) {
    pthread_mutex_lock(&load_mu);
    snprintf(why, whylen, "%s", load_why);
    pthread_mutex_unlock(&load_mu);
  }
  return k;
}

const emi_backend_kind *emi_accel_loaded(void) {
  pthread_mutex_lock(&load_mu);
  const emi_backend_kind *k = loaded;
  pthread_mutex_unlock(&load_mu);
  return k;
}

/* Opens the kind for S once; the slot keeps the context or the reason. */
static emi_kind_slot *open_slot(em_state *S, const emi_backend_kind **kind) {
  emi_kind_slot *slot = &S->kinds[0];
  const emi_backend_kind *k = load_kind();
  if (!slot->tried) {
    slot->tried = 1;
    if (!k) {
      pthread_mutex_lock(&load_mu);
      snprintf(slot->why, sizeof slot->why, "%s", load_why);
      pthread_mutex_unlock(&load_mu);
    } else if (k->open(S, &slot->ctx, slot->why, sizeof slot->why) != EM_OK || !slot->ctx) {
      slot->ctx = NULL;
    }
  }
  *kind = k;
  return slot;
}

/* A device number of the kind's, or -1. */
static int accel_index(emi_kind_slot *slot, const emi_backend_kind *k, int device) {
  if (!slot->ctx || device < 0 || device >= EMI_MAX_DEVICES) return -1;
  return device < k->count(slot->ctx) ? device : -1;
}

/* The device opened once: later calls find it in S->devices (emi_device_of). A
** device that can't be opened leaves its reason for emi_accel_why, and the next
** use tries again. */
emi_device *emi_device_attach(em_state *S, int device) {
  const emi_backend_kind *k;
  emi_kind_slot *slot = open_slot(S, &k);
  if (accel_index(slot, k, device) < 0) return NULL;
  if (S->devices[device]) return S->devices[device];
  if (k->open_device(slot->ctx, device, slot->why, sizeof slot->why) != EM_OK) return NULL;
  emi_device *d = k->device(slot->ctx, device);
  __atomic_store_n(&S->devices[device], d, __ATOMIC_RELEASE);
  return d;
}

emi_device *emi_accel_peek(em_state *S, int device) {
  const emi_backend_kind *k;
  emi_kind_slot *slot = open_slot(S, &k);
  if (accel_index(slot, k, device) < 0) return NULL;
  return S->devices[device] ? S->devices[device] : k->device(slot->ctx, device);
}

const emi_backend_kind *emi_accel(em_state *S, void **ctx) {
  const emi_backend_kind *k;
  emi_kind_slot *slot = open_slot(S, &k);
  *ctx = slot->ctx;
  return slot->ctx ? k : NULL;
}

const char *emi_accel_why(em_state *S) {
  return S->kinds[0].why[0] ? S->kinds[0].why : "no CUDA device";
}

int emi_accel_count(em_state *S) {
  void *ctx;
  const emi_backend_kind *k = emi_accel(S, &ctx);
  if (!k) return 0;
  int n = k->count(ctx);
  return n < EMI_MAX_DEVICES ? n : EMI_MAX_DEVICES;
}

void *emi_kind_ctx(em_state *S, const emi_backend_kind *k) {
  (void)k;                           /* one accelerator kind: slot 0 */
  return S->kinds[0].ctx;
}

const emi_services *emi_services_of(em_state *S, int device) {
  if (device < 0 || !emi_accel_peek(S, device)) return NULL;   /* opens no device */
  void *ctx;
  const emi_backend_kind *k = emi_accel(S, &ctx);
  return k ? k->svc : NULL;
}

emi_device *emi_cpu_device(em_state *S) { return &S->cpu; }

void emi_devices_close(em_state *S) {
  emi_kind_slot *slot = &S->kinds[0];
  if (slot->ctx) {
    const emi_backend_kind *k = emi_accel_loaded();
    if (k) k->close(S, slot->ctx);
  }
  memset(S->devices, 0, sizeof S->devices);
  memset(slot, 0, sizeof *slot);
}
