/*
** files.c -- the file operations of checkpoints made of several files (a
** sharded checkpoint's folder): a whole small file replaced atomically, a
** folder made, a folder synced (see ember.h, "Saving").
**
** em_file_write follows em_safetensors_write: the bytes go to a fresh temporary
** file beside the target, which is fsynced (with EM_SAVE_SYNC) and renamed over
** it, then the folder is fsynced, so that the target holds its old content or
** the whole new one, across a crash of the process or of the machine.
*/
#include "../internal.h"
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

/* The folder of path ("." when it has none) into dir[size]; false when too long. */
static bool folder_of(const char *path, char *dir, size_t size) {
  const char *slash = strrchr(path, '/');
  if (!slash) { snprintf(dir, size, "."); return true; }
  if (slash == path) { snprintf(dir, size, "/"); return true; }
  size_t n = (size_t)(slash - path);
  if (n >= size) return false;
  memcpy(dir, path, n);
  dir[n] = 0;
  return true;
}

static int sync_dir(const char *dir) {
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return -1;
  int r = fsync(fd);
  if (r != 0 && (errno == EINVAL || errno == EROFS)) r = 0;   /* not supported there */
  int e = errno;
  close(fd);
  errno = e;
  return r;
}

/* fsync of the folder that holds path, so that a rename into it is durable;
** 0 or -1 with errno (shared with the safetensors writer). */
int emi_sync_folder_of(const char *path) {
  char dir[PATH_MAX];
  if (!folder_of(path, dir, sizeof dir)) return 0;
  return sync_dir(dir);
}

em_status em_dir_sync(em_state *S, const char *path) {
  if (!S) return EM_ERR_ARG;
  if (!path) return emi_error(S, EM_ERR_ARG, "dir_sync: path is NULL");
  if (sync_dir(path) != 0)
    return emi_error(S, EM_ERR_IO, "dir_sync: '%s': %s", path, strerror(errno));
  return EM_OK;
}

em_status em_dir_make(em_state *S, const char *path) {
  if (!S) return EM_ERR_ARG;
  if (!path || !*path) return emi_error(S, EM_ERR_ARG, "dir_make: the path is empty");
  if (mkdir(path, 0777) == 0) return EM_OK;
  int e = errno;
  struct stat sb;
  if (e == EEXIST && stat(path, &sb) == 0) {
    if (S_ISDIR(sb.st_mode)) return EM_OK;
    return emi_error(S, EM_ERR_IO, "dir_make: '%s' exists and is not a folder", path);
  }
  return emi_error(S, EM_ERR_IO, "dir_make: can't create the folder '%s': %s", path,
                   strerror(e));
}

em_status em_file_write(em_state *S, const char *path, const void *data, size_t n, int flags) {
  if (!S) return EM_ERR_ARG;
  if (!path || (!data && n > 0))
    return emi_error(S, EM_ERR_ARG, "file_write: path and data must not be NULL");
  char tmp[PATH_MAX], dir[PATH_MAX];
  if (!folder_of(path, dir, sizeof dir) || strlen(path) + 48 > sizeof tmp)
    return emi_error(S, EM_ERR_ARG, "file_write: the path is too long");
  static unsigned counter;     /* only makes names differ; races are harmless */
  int fd = -1;
  for (int attempt = 0; attempt < 100 && fd < 0; attempt++) {
    snprintf(tmp, sizeof tmp, "%s.tmp-%ld-%u", path, (long)getpid(),
             __atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED));
    fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0 && errno != EEXIST) break;
  }
  if (fd < 0)
    return emi_error(S, EM_ERR_IO, "file_write: '%s': can't create the temporary file: %s",
                     path, strerror(errno));
  const char *step = "write";
  const char *p = data;
  size_t left = n;
  int r = 0;
  while (left > 0) {
    ssize_t k = write(fd, p, left);
    if (k < 0) {
      if (errno == EINTR) continue;
      r = -1;
      break;
    }
    p += k;
    left -= (size_t)k;
  }
  if (!r && (flags & EM_SAVE_SYNC) && fsync(fd) != 0) { step = "fsync"; r = -1; }
  int e = errno;
  if (close(fd) != 0 && !r) { step = "close"; r = -1; e = errno; }
  if (!r && rename(tmp, path) != 0) { step = "rename"; r = -1; e = errno; }
  if (r) {
    unlink(tmp);
    return emi_error(S, EM_ERR_IO, "file_write: '%s': %s failed: %s (the previous file, if "
                     "any, is untouched)", path, step, strerror(e));
  }
  if ((flags & EM_SAVE_SYNC) && sync_dir(dir) != 0)
    return emi_error(S, EM_ERR_IO, "file_write: '%s': the file was written, but syncing its "
                     "folder failed: %s", path, strerror(errno));
  return EM_OK;
}
