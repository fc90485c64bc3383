#!/bin/sh
# write_page.sh -- writes the benchmarks page from a run of tests/bench/run.sh:
#
#   sh tests/bench/write_page.sh EMBER PYTHON TABLE PAGE COMMAND
#
# EMBER is the ember command measured, PYTHON the peers' python (may be missing),
# TABLE the file holding the table run.sh printed (and its skipped configurations),
# PAGE the Markdown file to write, COMMAND the command line that made the table.
# The page is all generated: a fixed header, then the machine (date, CPU model and
# the instruction sets that choose kernels: AVX2, AVX-512, AMX; the GPU if any),
# the library versions (ember, PyTorch, TensorFlow, oneDNN, OpenBLAS), the command
# and the table as printed. Nothing on it is edited by hand: `make bench` writes it
# again.
EMBER=$1 PY=$2 TABLE=$3 PAGE=$4 COMMAND=$5

cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo 2>/dev/null | head -n 1)
cores=$(nproc 2>/dev/null || echo '?')
flags=$(grep -m 1 '^flags' /proc/cpuinfo 2>/dev/null)
has() { case " ${flags#*:} " in *" $1 "*) echo "$2" ;; esac; }
isa=$(echo $(has avx2 AVX2) $(has fma FMA) $(has avx512f AVX-512F) $(has avx512_bf16 AVX-512-BF16) \
  $(has avx512_fp16 AVX-512-FP16) $(has amx_tile AMX) $(has amx_bf16 AMX-BF16) $(has amx_int8 AMX-INT8))
[ -n "$isa" ] || isa="none of AVX2, AVX-512, AMX"
gpu="none"
if command -v nvidia-smi >/dev/null 2>&1; then
  g=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | \
      sed 's/^/  /')
  [ -n "$g" ] && gpu=$(printf 'driver and devices:\n%s' "$g")
fi

info=$("$EMBER" --info 2>/dev/null)
ember_v=$(echo "$info" | sed -n 's/^ember //p' | head -n 1)
luajit_v=$(echo "$info" | sed -n '2s/ (.*//p')
onednn=$(echo "$info" | sed -n 's/^  oneDNN \([0-9][0-9.]*\).*/\1/p' | head -n 1)
openblas=$(dpkg-query -W -f='${Version}' libopenblas0-pthread 2>/dev/null || \
           dpkg-query -W -f='${Version}' libopenblas0 2>/dev/null)
pyv() { [ -x "$PY" ] && "$PY" -c "import $1 as m; print(m.__version__)" 2>/dev/null || echo 'not installed'; }
torch_v=$(pyv torch)
tf_v=$(pyv tensorflow)

{
  echo '# Benchmarks'
  echo
  echo 'This page is written by `make bench` (tests/bench/run.sh and write_page.sh) from'
  echo 'its last full run; it is not edited by hand. Each line compares ember with PyTorch'
  echo '(and TensorFlow where it has a twin) measured in the same run on the same machine,'
  echo 'each side on 2 threads, the best of the rounds. The ratio is ember'"'"'s speed'
  echo 'relative to the peer'"'"'s: above 1 ember is faster (for times, peer / ember; for'
  echo 'throughputs, ember / peer). Lines named *_vs_* are headline ratios of their own.'
  echo 'The GPU benchmarks are run apart (tests/bench/gpu_run.sh) and are not on this page.'
  echo
  echo '## The machine'
  echo
  echo "- date: $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "- CPU: ${cpu:-unknown} ($cores cores seen), instruction sets: $isa"
  echo "- GPU: $gpu"
  echo "- ember ${ember_v:-?} (${luajit_v:-LuaJIT}), oneDNN: ${onednn:-not loaded}, OpenBLAS: ${openblas:-unknown}"
  echo "- PyTorch: $torch_v, TensorFlow: $tf_v"
  echo
  echo '## The command'
  echo
  echo '```sh'
  echo "$COMMAND"
  echo '```'
  echo
  echo '## The results'
  echo
  echo '```text'
  cat "$TABLE"
  echo '```'
} > "$PAGE.tmp" && mv "$PAGE.tmp" "$PAGE"
