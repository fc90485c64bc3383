#!/bin/sh
# gpu_pack.sh -- packs what tests/bench/gpu_run.sh needs on a GPU machine that has
# no LuaJIT, OpenBLAS or other Debian packages into one folder, BUILD/carry, laid
# out as BUILD itself is (so ember finds its Lua modules and kernels beside it):
#
#   BUILD/carry/ember          stripped copy (the FFI's symbols are in .dynsym, kept)
#   BUILD/carry/lua/           BUILD/lua
#   BUILD/carry/kernels/       BUILD/kernels/*.fatbin (when nvcc built them)
#   BUILD/carry/tests/         stripped test_cuda_*, test_comm_nccl and test_grid_emu
#   BUILD/carry/lib/           the shared libraries `ldd` names for those, except
#                              glibc's own (libc, libm, libpthread, libdl, librt, ld.so)
#
#   sh tests/bench/gpu_pack.sh [BUILD]          (after make; BUILD defaults to build)
#
# Then carry BUILD/carry alone (it stays under the device runner's 64 MiB) and run
# `sh tests/bench/gpu_run.sh` there. The CUDA libraries themselves (libcudart,
# libcublasLt: hundreds of MB) are not packed: gpu_run.sh finds the ones PyTorch's
# wheels bring. The GPU machine's glibc must be at least the version printed
# (the newest GLIBC_ symbol version the packed files ask for).
BUILD=${1:-build}
CARRY="$BUILD/carry"
if [ ! -x "$BUILD/ember" ]; then echo "gpu_pack: $BUILD/ember not found (run make first)"; exit 1; fi
rm -rf "$CARRY"
mkdir -p "$CARRY/lib" "$CARRY/tests" "$CARRY/kernels" || exit 1

strip -o "$CARRY/ember" "$BUILD/ember" 2>/dev/null || cp "$BUILD/ember" "$CARRY/ember"
cp -R "$BUILD/lua" "$CARRY/lua"
for f in "$BUILD"/kernels/*.fatbin; do [ -f "$f" ] && cp "$f" "$CARRY/kernels/"; done
bins="$BUILD/ember"
for t in "$BUILD"/tests/test_cuda_* "$BUILD"/tests/test_comm_nccl "$BUILD"/tests/test_grid_emu; do
  case "$t" in *.d|*.o) continue ;; esac
  [ -x "$t" ] || continue
  strip -o "$CARRY/tests/$(basename "$t")" "$t" 2>/dev/null || cp "$t" "$CARRY/tests/"
  bins="$bins $t"
done

# The libraries: the resolved files (cp -L follows the alternatives' links), under
# the names the binaries ask for.
for b in $bins; do ldd "$b"; done | awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }' | sort -u |
while read -r name path; do
  case "$name" in
    libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*|libresolv.so*|libutil.so*) continue ;;
  esac
  cp -L "$path" "$CARRY/lib/$name" || echo "gpu_pack: could not copy $path"
done

echo "gpu_pack: $CARRY"
ls -la "$CARRY/lib" | awk 'NR > 1 && $1 !~ /^d/ { printf "  lib/%s  %d\n", $9, $5 }'
total=$(du -sk "$CARRY" | awk '{ print $1 }')
echo "  total $((total / 1024)) MiB ($CARRY: ember, lua/, kernels/, tests/, lib/)"
need=$(for f in "$CARRY/ember" "$CARRY"/lib/* "$CARRY"/tests/*; do objdump -T "$f" 2>/dev/null; done |
  grep -o 'GLIBC_2\.[0-9]*' | sort -t. -k2,2n -u | tail -n 1)
[ -n "$need" ] && echo "  needs glibc >= ${need#GLIBC_} on the GPU machine (this one: $(ldd --version | head -n 1 | awk '{ print $NF }'))"
[ "$total" -gt $((64 * 1024)) ] && echo "gpu_pack: warning: more than 64 MiB, over the device runner's carry limit"
exit 0
