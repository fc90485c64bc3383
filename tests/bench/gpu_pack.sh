#!/bin/sh
# gpu_pack.sh -- builds and packs what tests/bench/gpu_run.sh needs on a GPU machine
# that has no LuaJIT, OpenBLAS or other Debian packages, as one archive:
#
#   sh tests/bench/gpu_pack.sh            -> build-portable/ember-gpu.tar.gz
#
# The build is the portable one (BUILD=build-portable, ARCH=-march=x86-64-v3: AVX2 and
# FMA, no AVX-512 instruction outside the paths chosen at run time), so the archive
# runs on the AMD and Intel hosts GPUs sit in. The archive holds one folder,
# ember-gpu/, laid out as a build folder is (ember finds its Lua modules beside it):
#
#   ember          the command, stripped (the FFI's symbols stay in .dynsym)
#   lua/           its Lua modules
#   tests/         the C tests that touch a device (make gpu-tests), linked against
#                  lib/libember.so (the core) and lib/libember_cuda.so (the CUDA
#                  backend with its fatbins, which ember loads from lib/ itself)
#   lib/           those two and the libraries `ldd` names that a bare GPU machine
#                  lacks: not glibc's own, not libgcc_s (every system has one, and
#                  Debian's asks for a newer glibc than ember does)
#
# It fails, not warns, when the archive is over the device runner's 64 MiB. Carry the
# archive alone (`carry: ["build-portable/ember-gpu.tar.gz"]`); gpu_run.sh unpacks it.
# EMBER_PACK_NO_BUILD=1 packs build-portable as it is; EMBER_PACK_LIMIT_MB=N checks
# against N MiB instead (tests/lua/test_gpu_pack.lua tests the failure that way).
cd "$(dirname "$0")/../.." || exit 2
BUILD=build-portable
LIMIT_MB=${EMBER_PACK_LIMIT_MB:-64}
if [ -z "${EMBER_PACK_NO_BUILD:-}" ]; then
  make --no-print-directory BUILD=$BUILD ARCH=-march=x86-64-v3 -j"$(nproc)" all gpu-tests ||
    { echo "gpu_pack: the portable build failed"; exit 1; }
fi
[ -x "$BUILD/ember" ] || { echo "gpu_pack: $BUILD/ember not found"; exit 1; }
STAGE="$BUILD/pack/ember-gpu"
rm -rf "$BUILD/pack"
mkdir -p "$STAGE/lib" "$STAGE/tests" || exit 1

strip -o "$STAGE/ember" "$BUILD/ember" || exit 1
strip -o "$STAGE/lib/libember.so" "$BUILD/libember.so" || exit 1
strip -o "$STAGE/lib/libember_cuda.so" "$BUILD/libember_cuda.so" || exit 1
cp -R "$BUILD/lua" "$STAGE/lua" || exit 1
for t in "$BUILD"/gpu-tests/test_*; do
  case "$t" in *.d) continue ;; esac
  strip -o "$STAGE/tests/$(basename "$t")" "$t" || exit 1
done

# The libraries: the resolved files (cp -L follows the alternatives' links), under
# the names the binaries ask for.
for b in "$BUILD/ember" "$BUILD/libember.so" "$BUILD/libember_cuda.so" "$BUILD"/gpu-tests/test_*; do
  case "$b" in *.d) continue ;; esac
  ldd "$b"
done | awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }' | sort -u |
while read -r name path; do
  case "$name" in
    libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*|libresolv.so*|libutil.so*) continue ;;
    libgcc_s.so*|libember.so|libember_cuda.so) continue ;;
  esac
  cp -L "$path" "$STAGE/lib/$name" || { echo "gpu_pack: could not copy $path"; exit 1; }
done || exit 1

ARCHIVE="$BUILD/ember-gpu.tar.gz"
tar -C "$BUILD/pack" -czf "$ARCHIVE" ember-gpu || exit 1
size=$(wc -c < "$ARCHIVE")
echo "gpu_pack: $ARCHIVE, $((size / 1048576)) MiB ($(du -sm "$STAGE" | cut -f 1) MiB unpacked)"
( cd "$STAGE" && find . -type f | sort | while read -r f; do
    printf '  %-40s %6d KiB\n' "$f" $(( $(wc -c < "$f") / 1024 )); done )
need=$(for f in "$STAGE/ember" "$STAGE"/lib/* "$STAGE"/tests/*; do objdump -T "$f" 2>/dev/null; done |
  grep -o 'GLIBC_2\.[0-9]*' | sort -t. -k2,2n -u | tail -n 1)
[ -n "$need" ] && echo "  needs glibc >= ${need#GLIBC_} on the GPU machine (this one: $(ldd --version | head -n 1 | awk '{ print $NF }'))"
if [ "$size" -gt $((LIMIT_MB * 1048576)) ]; then
  echo "gpu_pack: FAILED: the archive is over the device runner's $LIMIT_MB MiB ($size bytes)"
  exit 1
fi
exit 0
