# ember -- build, test, run and install.
#
#   make            build/libember.so, build/libember.a, build/ember, build/libember_cuda.so
#   make test       C and Lua tests; ends with "N passed, N failed, N skipped"
#   make check      the inner loop: the same C and Lua tests without the package
#                   check; `make check ONLY=regex` runs the programs whose names match
#   make test SANITIZE=1   the C tests under AddressSanitizer + UBSan
#   make test SANITIZE=thread   the tests of threaded code (loader, communicators, replicas) under ThreadSanitizer
#   make run        the main example
#   make bench      tests/bench/ (ember beside PyTorch where it is installed)
#   make fuzz FUZZ_S=60   each libFuzzer harness of tests/fuzz/ for FUZZ_S seconds
#   make install PREFIX=/usr/local   (the portable build, build-portable/: see below;
#                   the docs go to PREFIX/share/doc/ember, where help() finds them)
#
# Missing Debian packages are installed by the `deps` step (apt-get, as root or
# through sudo). CUDA, cuDNN, NCCL and MPI are detected and reported; where nvcc is
# found, the CUDA kernels (kernels/k_*.cu) are also compiled by it, as a build check.

PREFIX   ?= /usr/local
SANITIZE ?= 0
# Every core builds: a plain `make` is `make -j$(nproc)`. Only the top make sets
# it (a -j on the command line still wins); sub-makes share its job slots.
ifeq ($(MAKELEVEL),0)
MAKEFLAGS += -j$(shell nproc 2>/dev/null || echo 2)
endif
# The local build is for this machine's CPU. What leaves it (make install, the
# luarocks package, tests/bench/gpu_pack.sh's archive) is built for PORTABLE_ARCH,
# x86-64-v3 (AVX2, FMA, F16C: every x86 server CPU since 2015, AMD included), in
# its own folder; the AVX-512 and AVX2 kernels there are chosen at run time (nn_gemm.c).
ARCH     ?= -march=native
PORTABLE_ARCH  ?= -march=x86-64-v3
PORTABLE_BUILD ?= build-portable
CC       ?= cc

ifeq ($(SANITIZE),1)
BUILD    := build-asan
SANFLAGS := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
OPT      := -O1 -g
else ifeq ($(SANITIZE),thread)
BUILD    := build-tsan
SANFLAGS := -fsanitize=thread
OPT      := -O1 -g
else ifeq ($(SANITIZE),fuzz)
# The libFuzzer harnesses (tests/fuzz/): the core built by clang with coverage
# for the fuzzer, ASan and UBSan, any UB an abort the fuzzer reports.
BUILD    := build-fuzz
CC       := clang
SANFLAGS := -fsanitize=fuzzer-no-link,address,undefined -fno-omit-frame-pointer \
            -fno-sanitize-recover=undefined
OPT      := -O1 -g
else
BUILD    := build
SANFLAGS :=
OPT      := -O3 -g $(ARCH)
endif

# libdnnl-dev: oneDNN's header, which core/cpu/dnnl.c uses when present, and the
# library the tests use; ember opens libdnnl at run time and runs without it.
DEB_PACKAGES := luajit libluajit-5.1-dev libopenblas-dev zlib1g-dev libedit-dev pkg-config \
                libjpeg62-turbo-dev libpng-dev libopenmpi-dev openmpi-bin iproute2 \
                libdnnl-dev
RUN_PACKAGES := dataset-fashion-mnist
# make bench: the peers (PyTorch 2, TensorFlow 2) come from PyPI into a virtual
# environment (tests/bench/peers/setup.sh); Debian's Python makes it, and its PIL
# and numpy write the JPEG benchmark's images.
BENCH_PACKAGES := python3-venv python3-pip python3-pil python3-numpy
# test_profile_page opens the profiler's HTML page in headless Chromium;
# test_gpu_pack runs the packed portable build on an emulated Haswell (qemu-user).
TEST_PACKAGES := chromium qemu-user

LUAJIT_CFLAGS := -I/usr/include/luajit-2.1
LUAJIT_LIBS   := -lluajit-5.1
BLAS_CFLAGS   := -I/usr/include/x86_64-linux-gnu/openblas-pthread
BLAS_LIBS     := -L/usr/lib/x86_64-linux-gnu/openblas-pthread -lopenblas

# -MMD: a header change rebuilds what includes it. -fno-math-errno: core never
# reads errno, and without it sqrt & co. cannot be vectorized. -fno-trapping-math:
# core never reads the floating-point exception flags, and without it gcc keeps a
# select on a NaN test (x != x ? x : y, as in vmath.h's exp, tanh, log) as a branch
# where AVX2 has no masks, so those loops stay scalar (5-20x slower); results are
# the same either way.
CFLAGS_BASE := -std=gnu11 -MMD -MP -fno-math-errno -fno-trapping-math -Wall -Wextra -Wno-unused-parameter -Wno-missing-field-initializers \
               -fPIC -pthread -Icore/include -Icore $(BLAS_CFLAGS)
CFLAGS  := $(CFLAGS_BASE) $(OPT) $(SANFLAGS)
LDLIBS  := $(BLAS_LIBS) -ljpeg -lpng -lz -lm -lpthread -ldl

CORE_SRC := $(wildcard core/*.c core/ops/*.c core/cpu/*.c core/io/*.c core/autograd/*.c core/data/*.c \
                      core/dist/*.c core/profile/*.c core/device/*.c core/meta/*.c \
                      core/compile/*.c)
CORE_OBJ := $(CORE_SRC:%.c=$(BUILD)/obj/%.o)
# The CUDA backend is a library of its own, libember_cuda.so, that libember loads
# when a state first asks for a CUDA device (core/device/registry.c): a CPU-only
# host carries none of it. kernels/real/ talks to the real CUDA libraries, which
# it loads at run time (dlopen): it takes only types and constants from the
# toolkit's headers. Without them libs.c and runtime_real.c are stubs that say so
# at run time, and gemm_real.c keeps only its GPU-free layout arithmetic.
CUDA_SRC := $(wildcard kernels/*.c kernels/emu/*.c)
CUDA_HOME ?= /usr/local/cuda
ifneq ($(wildcard $(CUDA_HOME)/include/cuda_runtime_api.h),)
CUDA_CFLAGS := -I$(CUDA_HOME)/include
CUDA_SRC += $(wildcard kernels/real/*.c)
else
CUDA_CFLAGS :=
CUDA_SRC += kernels/real/libs.c kernels/real/runtime_real.c kernels/real/gemm_real.c
endif
CUDA_OBJ := $(CUDA_SRC:%.c=$(BUILD)/obj/%.o)
HOST_SRC := $(wildcard lua/host/*.c)
HOST_OBJ := $(HOST_SRC:%.c=$(BUILD)/obj/%.o)
LUA_SRC  := $(wildcard lua/ember/*.lua lua/ember/*/*.lua lua/ember/*/*/*.lua)
LUA_OUT  := $(LUA_SRC:lua/%=$(BUILD)/lua/%) $(BUILD)/lua/ember/cdefs.lua \
            $(BUILD)/lua/ember/hostdefs.lua $(BUILD)/lua/ember/capi.lua
CTEST_SRC := $(wildcard tests/c/test_*.c)
CTEST_BIN := $(CTEST_SRC:tests/c/%.c=$(BUILD)/tests/%)

.PHONY: all FORCE deps deps-run deps-bench deps-test report test test-c test-lua run bench fuzz deps-fuzz install portable clean

# The kernels' device code, kernels/k_*.cu, is compiled twice: by the host C++
# compiler into libember_cuda, for the grid emulator (with the core's flags and
# $(SANFLAGS)), and, where nvcc is found (as in CI), as CUDA C++ into
# $(BUILD)/kernels/*.fatbin: sm_80 and sm_90 code plus compute_90 PTX, with
# warnings as errors and any register spill in our kernels an error (ptxas).
NVCC := $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
# The fuzzing build tests the parsers: no CUDA kernels (the fatbin table is empty);
# the emulator's objects come from clang++, without UBSan's function check, whose
# type info needs the C++ runtime that libember_cuda's C link does not bring (the
# kernels are called from C anyway).
ifeq ($(SANITIZE),fuzz)
NVCC :=
CXX := clang++
KERNEL_CXXSAN := -fno-sanitize=function
endif
NVCC_ARCH  := -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 \
              -gencode arch=compute_90,code=compute_90
NVCC_FLAGS := -x cu -std=c++17 $(NVCC_ARCH) -Werror all-warnings \
              -Xptxas -warn-spills -Xptxas -Werror -Icore/include -Icore -Ikernels
# gnu++17 as the core's gnu11: the same floating-point contraction, so the
# emulator's results are the same bits as from C.
KERNEL_CXXFLAGS := $(filter-out -std=gnu11,$(CFLAGS)) $(KERNEL_CXXSAN) -std=gnu++17 \
                   -fno-exceptions -fno-rtti
KERNEL_SRC := $(wildcard kernels/k_*.cu)
# The fatbins depend on neither the host's flags nor the sanitizer: one folder
# serves every build (build/, the sanitizer builds, the portable ones), so nvcc
# compiles each kernel once.
FATBIN_DIR := build-fatbin
KERNEL_FATBIN := $(if $(NVCC),$(KERNEL_SRC:kernels/%.cu=$(FATBIN_DIR)/%.fatbin))
CUDA_OBJ += $(KERNEL_SRC:%=$(BUILD)/obj/%.o)
# The fatbins are embedded in libember_cuda (kernels/real/fatbins.h): a generated
# assembler file .incbin's each one and lists them; without nvcc its table is empty.
FATBIN_S   := $(BUILD)/kernels/fatbins.S
FATBIN_OBJ := $(BUILD)/obj/kernels/fatbins.o

all: deps $(BUILD)/libember.so $(BUILD)/libember.a $(BUILD)/ember $(BUILD)/libember_lua.so \
     $(BUILD)/libember_cuda.so $(BUILD)/libember_cuda.a $(LUA_OUT) $(KERNEL_FATBIN) report

# -- Dependencies ---------------------------------------------------------------
# dpkg-query tells which packages are missing; only then is apt-get run.
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
define install_missing
	@missing=""; for p in $(1); do dpkg-query -W -f='$${Status}' $$p 2>/dev/null | \
	  grep -q "install ok installed" || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then echo "installing Debian packages:$$missing"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
	  $(SUDO) apt-get install -y -qq --no-install-recommends $$missing >/dev/null || exit 1; fi
endef

# Each list's check leaves a stamp in $(BUILD)/deps/ and runs again only when dpkg's
# status file (rewritten by every install or removal) or this Makefile (the lists)
# is newer than the stamp: a make with nothing to do runs no dpkg-query. Without
# dpkg there is no status file and no stamp, and apt-get's failure stops the build.
DPKG_STATUS := $(wildcard /var/lib/dpkg/status)
DEPS_STAMP  := $(BUILD)/deps
deps: $(DEPS_STAMP)/build
deps-run: $(DEPS_STAMP)/run
deps-bench: $(DEPS_STAMP)/bench
deps-test: $(DEPS_STAMP)/test
$(DEPS_STAMP)/build: DEB_LIST = $(DEB_PACKAGES)
$(DEPS_STAMP)/run: DEB_LIST = $(RUN_PACKAGES)
$(DEPS_STAMP)/bench: DEB_LIST = $(BENCH_PACKAGES)
$(DEPS_STAMP)/test: DEB_LIST = $(TEST_PACKAGES)
$(DEPS_STAMP)/build $(DEPS_STAMP)/run $(DEPS_STAMP)/bench $(DEPS_STAMP)/test: \
    $(DEPS_STAMP)/%: $(DPKG_STATUS) $(firstword $(MAKEFILE_LIST))
	$(call install_missing,$(DEB_LIST))
	@mkdir -p $(dir $@) && touch $@

# What optional engines this machine has (reported; the CPU build never needs them).
report: $(BUILD)/.reported
$(BUILD)/.reported: | $(BUILD)
	@echo "ember build: CPU backend with OpenBLAS"
	@if [ -n "$(NVCC)" ]; then echo "  nvcc:  $$($(NVCC) --version | tail -n 2 | head -n 1) (kernels: sm_80, sm_90 + PTX)"; \
	  else echo "  nvcc:  not found (CPU only)"; fi
	@f=$$(ls /usr/local/cuda/include/cudnn_version.h /usr/include/cudnn_version.h 2>/dev/null | head -n 1); \
	  if [ -n "$$f" ]; then echo "  cuDNN: $$(awk '/define CUDNN_MAJOR/{a=$$3}/define CUDNN_MINOR/{b=$$3}END{print a"."b}' $$f)"; \
	  else echo "  cuDNN: not found"; fi
	@f=$$(ls /usr/local/cuda/include/nccl.h /usr/include/nccl.h 2>/dev/null | head -n 1); \
	  if [ -n "$$f" ]; then echo "  NCCL:  $$(awk '/define NCCL_MAJOR/{a=$$3}/define NCCL_MINOR/{b=$$3}END{print a"."b}' $$f)"; \
	  else echo "  NCCL:  not found"; fi
	@if command -v mpicc >/dev/null 2>&1; then echo "  MPI:   $$(mpicc --showme:version 2>&1 | head -n 1)"; \
	  else echo "  MPI:   not found"; fi
	@touch $@

$(BUILD):
	@mkdir -p $(BUILD)

# -- Library ----------------------------------------------------------------------
# The objects depend on the compiler and its flags through a stamp rewritten only when
# they change (a new Makefile, ARCH=...): make alone would keep objects built otherwise.
# The compiler is named by the file it resolves to (cc and gcc are one compiler).
FLAGS_STAMP := $(BUILD)/cflags
FLAGS_NOW   := $(or $(realpath $(shell command -v $(CC) 2>/dev/null)),$(CC)) $(CFLAGS)
$(shell mkdir -p $(BUILD) && { printf '%s\n' '$(FLAGS_NOW)' | cmp -s - $(FLAGS_STAMP) || \
  printf '%s\n' '$(FLAGS_NOW)' > $(FLAGS_STAMP); })

$(BUILD)/obj/%.o: %.c core/include/ember.h core/internal.h $(FLAGS_STAMP) | deps
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

# The MPI communicator takes only mpi.h's types from Debian's OpenMPI; libmpi itself
# is loaded at run time (dlopen), so libember never requires it.
MPI_CFLAGS := $(shell pkg-config --cflags-only-I ompi-c 2>/dev/null || echo -I/usr/lib/x86_64-linux-gnu/openmpi/include)
$(BUILD)/obj/core/dist/%.o: core/dist/%.c core/dist/comm.h core/include/ember.h core/internal.h | deps
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(MPI_CFLAGS) -c $< -o $@

$(BUILD)/obj/kernels/real/%.o: kernels/real/%.c kernels/real/libs.h kernels/real/libs_fn.h \
                               core/include/ember.h | deps
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(CUDA_CFLAGS) -c $< -o $@

# The kernels for the grid emulator: each .cu as C++ (k_x.cu -> k_x.cu.o, beside
# its C launchers' k_x.o).
$(BUILD)/obj/kernels/%.cu.o: kernels/%.cu kernels/device.h kernels/runtime.h | deps
	@mkdir -p $(dir $@)
	$(CXX) $(KERNEL_CXXFLAGS) -x c++ -c $< -o $@

# The kernels as CUDA (device code only: a fatbin per source, embedded in libember_cuda
# below and loaded by the real runtime with cudaLibraryLoadData). nvcc's -MMD lists
# the headers each one includes.
$(FATBIN_DIR)/%.fatbin: kernels/%.cu kernels/device.h kernels/runtime.h | deps
	@mkdir -p $(dir $@)
	@echo "  NVCC  $<"
	@$(NVCC) $(NVCC_FLAGS) -fatbin -MMD -MP -MF $(@:.fatbin=.d) -MT $@ $< -o $@ || \
	  { rm -f $@; exit 1; }

# The table of embedded fatbins, rewritten only when its text changes (the list of
# fatbins differs with and without nvcc); the object is rebuilt when a fatbin is.
$(FATBIN_S): FORCE
	@mkdir -p $(dir $@)
	@{ echo '/* generated by the Makefile: the fatbins of the kernels (kernels/real/fatbins.h) */'; \
	  i=0; for f in $(KERNEL_FATBIN); do \
	    printf '\t.section .rodata.emk_fatbin,"a",@progbits\n\t.balign 64\n'; \
	    printf 'emk_fb_%d:\n\t.incbin "%s"\nemk_fb_%d_end:\n' $$i $$f $$i; \
	    printf '\t.section .rodata.emk_fatbin_names,"a",@progbits\n'; \
	    printf 'emk_fb_name_%d:\n\t.asciz "%s"\n' $$i $$(basename $$f .fatbin); \
	    i=$$((i+1)); done; \
	  printf '\t.section .data.rel.ro,"aw",@progbits\n\t.balign 8\n'; \
	  printf '\t.globl emk_fatbins\n\t.type emk_fatbins, @object\nemk_fatbins:\n'; \
	  j=0; while [ $$j -lt $$i ]; do \
	    printf '\t.quad emk_fb_name_%d, emk_fb_%d, emk_fb_%d_end - emk_fb_%d\n' $$j $$j $$j $$j; \
	    j=$$((j+1)); done; \
	  printf '\t.quad 0, 0, 0\n\t.size emk_fatbins, .-emk_fatbins\n'; \
	  printf '\t.section .rodata\n\t.balign 8\n\t.globl emk_fatbin_count\n'; \
	  printf '\t.type emk_fatbin_count, @object\nemk_fatbin_count:\n\t.quad %d\n' $$i; \
	  printf '\t.size emk_fatbin_count, 8\n\t.section .note.GNU-stack,"",@progbits\n'; \
	} > $@.tmp
	@if cmp -s $@.tmp $@; then rm -f $@.tmp; else mv $@.tmp $@; fi

$(FATBIN_OBJ): $(FATBIN_S) $(KERNEL_FATBIN)
	@mkdir -p $(dir $@)
	$(CC) $(SANFLAGS) -c $< -o $@

FORCE:

$(BUILD)/obj/lua/host/%.o: lua/host/%.c lua/host/host.h lua/host/ffi_exports.h core/include/ember.h | deps
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LUAJIT_CFLAGS) -DEMBER_PREFIX='"$(PREFIX)"' -c $< -o $@

$(BUILD)/libember.a: $(CORE_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/libember.so: $(CORE_OBJ)
	$(CC) -shared $(SANFLAGS) -Wl,-soname,libember.so -o $@ $^ $(LDLIBS)

# The CUDA backend with its fatbins. Core's functions stay undefined here: they
# bind to the one core of the process (libember.so, or a host that links
# libember.a and exports its symbols) when the registry loads the library.
$(BUILD)/libember_cuda.so: $(CUDA_OBJ) $(FATBIN_OBJ)
	$(CC) -shared $(SANFLAGS) -o $@ $^ -lm -lpthread -ldl
$(BUILD)/libember_cuda.a: $(CUDA_OBJ) $(FATBIN_OBJ)
	@rm -f $@
	ar rcs $@ $^

# The ember command links the core statically and exports its symbols, so the
# Lua layer finds them through ffi.C without loading the shared library.
$(BUILD)/ember: $(HOST_OBJ) $(BUILD)/libember.a
	$(CC) $(SANFLAGS) -rdynamic -o $@ $(HOST_OBJ) -Wl,--whole-archive $(BUILD)/libember.a \
	  -Wl,--no-whole-archive $(LUAJIT_LIBS) -ledit $(LDLIBS)

# Worker LuaJIT states for ds:map(fn) from a plain `luajit` (the ember command
# has these functions built in): the Lua layer loads this beside libember.so.
# It also carries luaopen_ember for C hosts that embed LuaJIT (examples/embed/).
$(BUILD)/libember_lua.so: $(BUILD)/obj/lua/host/luamap.o $(BUILD)/obj/lua/host/luaopen.o
	$(CC) -shared $(SANFLAGS) -o $@ $^ $(LUAJIT_LIBS) -lpthread

# -- Lua layer: copied beside the binary; cdefs generated from the header -----------
$(BUILD)/lua/%.lua: lua/%.lua
	@mkdir -p $(dir $@)
	cp $< $@

$(BUILD)/lua/ember/cdefs.lua: core/include/ember.h tools/gen_cdefs.sh | deps
	@mkdir -p $(dir $@)
	sh tools/gen_cdefs.sh $< > $@.tmp
	@luajit -e 'dofile(arg[1])' $@.tmp || { echo "ember.h: the FFI can't parse these declarations" >&2; rm -f $@.tmp; exit 1; }
	@mv $@.tmp $@

# The table of C functions the Lua layer calls: each one that may allocate tensor
# memory wrapped once with the collect-and-retry on a device out of memory.
$(BUILD)/lua/ember/capi.lua: core/include/ember.h tools/gen_capi.lua | deps
	@mkdir -p $(dir $@)
	luajit tools/gen_capi.lua $< > $@.tmp
	@mv $@.tmp $@

# Host declarations: lua/host's exports as its header states them, then the C
# library's as the compiler sees them (tools/gen_hostdefs.c checks each one).
$(BUILD)/tools/gen_hostdefs: tools/gen_hostdefs.c | deps
	@mkdir -p $(dir $@)
	$(CC) -std=c11 -Wall -Wextra -o $@ $<

$(BUILD)/lua/ember/hostdefs.lua: lua/host/ffi_exports.h tools/gen_cdefs.sh $(BUILD)/tools/gen_hostdefs \
                                 $(BUILD)/lua/ember/cdefs.lua
	@mkdir -p $(dir $@)
	{ sh tools/gen_cdefs.sh $<; $(BUILD)/tools/gen_hostdefs; } > $@.tmp
	@luajit -e "dofile('$(BUILD)/lua/ember/cdefs.lua') dofile('$@.tmp')" || \
	  { echo "$@: the FFI can't parse these declarations" >&2; rm -f $@.tmp; exit 1; }
	@mv $@.tmp $@

# -- Tests ------------------------------------------------------------------------------
# The C tests link the CUDA backend in (the tests of kernels/ reach inside it):
# it registers itself as the program starts, and the registry loads no library.
$(BUILD)/tests/%: tests/c/%.c $(wildcard tests/c/*.h) $(BUILD)/libember.a $(BUILD)/libember_cuda.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itests/c -o $@ $< -Wl,--whole-archive $(BUILD)/libember_cuda.a \
	  -Wl,--no-whole-archive $(BUILD)/libember.a $(LDLIBS)

# The GPU carry's tests (tests/bench/gpu_pack.sh): the C tests that touch a device,
# linked against libember_cuda.so and libember.so (one copy of the core and of the
# fatbins for all of them), which they find in ../lib beside themselves.
GPU_TESTS := test_cuda_libs test_cuda_real test_cuda_backend test_cuda_elementwise \
             test_cuda_transfer test_cuda_reduce test_cuda_index test_cuda_random \
             test_cuda_matmul test_cuda_dnn test_cuda_graph test_cuda_loader test_comm_nccl \
             test_cuda_optim test_backend_parity
.PHONY: gpu-tests
gpu-tests: $(GPU_TESTS:%=$(BUILD)/gpu-tests/%)
$(BUILD)/gpu-tests/%: tests/c/%.c $(wildcard tests/c/*.h) $(BUILD)/libember.so $(BUILD)/libember_cuda.so
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itests/c -o $@ $< -L$(BUILD) -Wl,--no-as-needed -lember_cuda -lember \
	  -Wl,-rpath,'$$ORIGIN/../lib' $(LDLIBS)

# ONLY=regex: the test programs whose names match (make test and make check).
RUN_TESTS = bash tests/run.sh $(if $(value ONLY),--only '$(value ONLY)')
# build-tests: what `make test` of this configuration runs, built and not run
# (.ci/run times the builds apart from the tests).
.PHONY: build-tests
ifeq ($(SANITIZE),1)
build-tests: deps $(CTEST_BIN)
test: build-tests
	@$(RUN_TESTS) --c-only $(BUILD)
else ifeq ($(SANITIZE),thread)
# The code that runs on several threads: the loader, its stages and transforms,
# the communicators and replicas (sharded and activation checkpoints, the
# mixed-precision scaler, the gradient buckets on replicas and the memory sweep,
# whose finalizers free reducers and wait for dropped collectives, too), OpenBLAS's
# thread count under several states, and the profiler recording from all of
# them. (Not test_comm_mpi: Open MPI's uninstrumented
# plugins trip ThreadSanitizer inside libmpi; all of ember's MPI calls are made on
# one thread, the communicator's, whose queue test_comm covers.) OpenBLAS is not
# instrumented either: its own thread pool's hand-offs would read as races, and
# more or fewer of them show depending on the kernel it picks for the host's CPU,
# so tests/tsan.supp leaves frames inside libopenblas out. test_compile: a compiled
# element-wise chain shares its tiles among the threads, each calling kernels inside
# its share.
TSAN_TESTS := loader|data|transforms|nccl_emu|^test_compile$$|^test_comm$$|^test_comm_p2p$$|^test_comm_group$$|distribute|^test_profile(\.lua)?$$|^test_cuda_(emu|alloc|backend|elementwise|reduce|index|random|matmul|transfer|graph|dnn)$$|^test_grid_emu$$|^test_comm_nccl$$|^test_cuda(_ops|_index_grads|_optim|_nn_dnn)?\.lua$$|^test_embed\.lua$$|^test_blas_threads$$|^test_(checkpoint_shard|checkpoint_act|amp_strategies|wrap_grad_dest|memory_sweep)\.lua$$
build-tests: all $(CTEST_BIN)
test: build-tests
	@EMBER_TEST_NO_MPI='Open MPI is not instrumented for ThreadSanitizer' \
	  TSAN_OPTIONS="suppressions=$(CURDIR)/tests/tsan.supp $$TSAN_OPTIONS" \
	  $(RUN_TESTS) --only '$(if $(value ONLY),$(value ONLY),$(TSAN_TESTS))' $(BUILD)
else
# deps-run: test_distribute trains the example on a slice of Fashion-MNIST;
# deps-test: test_profile_page renders the profiler's page in headless Chromium.
build-tests: all deps-run deps-test $(CTEST_BIN)
test: build-tests
	@$(RUN_TESTS) $(BUILD)
endif

# The inner loop: the plain build's C and Lua tests, without the package checks
# (`make test` once installs what they need) and without test_gpu_pack, which
# makes the whole portable build again to check what leaves this machine.
.PHONY: check
check: all $(CTEST_BIN)
	@$(RUN_TESTS) --except '^test_gpu_pack\.lua$$' $(BUILD)

# Fault tests (tests/faults/run.sh): replicas killed, stopped or cut off under
# mpirun, a full disk during a checkpoint; two cases at a time, about half a minute. Needs root for the
# network namespaces and the tmpfs (those cases skip otherwise).
.PHONY: test-faults
test-faults: deps all
	@bash tests/faults/run.sh $(BUILD)

# -- Running -------------------------------------------------------------------------------
# The main job: the Fashion-MNIST CNN, 5 epochs; its last line is the test accuracy.
run: all deps-run
	$(BUILD)/ember examples/fashion_mnist.lua --model cnn --epochs 5 \
	  --checkpoint $(BUILD)/fashion_mnist.ckpt

bench: all deps-bench
	@sh tests/bench/run.sh $(BUILD)

# -- Fuzzing ---------------------------------------------------------------------------------
# `make fuzz` builds the libFuzzer harnesses of tests/fuzz/ with clang (ASan + UBSan,
# the core in build-fuzz/ with coverage), writes their seed corpora from the fixtures,
# then runs each for FUZZ_S seconds: a crash, leak, UB, timeout or out-of-memory in
# any of them fails it (the input is kept in build-fuzz/fuzz/findings/).
FUZZ_S ?= 60
FUZZ_PACKAGES := clang libclang-rt-14-dev
FUZZ_NAMES := safetensors json idx cifar csv jpeg png
FUZZ_CFLAGS := -std=gnu11 -Wall -Wextra -Wno-unused-parameter -pthread -Icore/include -Icore \
               -O1 -g -fno-omit-frame-pointer -fno-sanitize-recover=undefined

deps-fuzz:
	$(call install_missing,$(FUZZ_PACKAGES))

# fuzz-build and fuzz-run are its two halves (.ci/run times them apart).
.PHONY: fuzz-build fuzz-run
ifeq ($(SANITIZE),fuzz)
fuzz-build: deps-fuzz $(FUZZ_NAMES:%=$(BUILD)/fuzz/fuzz_%) $(BUILD)/fuzz/seeds.done
fuzz-run:
	@sh tests/fuzz/run.sh $(BUILD) $(FUZZ_S) $(FUZZ_NAMES)
fuzz: fuzz-build
	@sh tests/fuzz/run.sh $(BUILD) $(FUZZ_S) $(FUZZ_NAMES)
else
fuzz fuzz-build fuzz-run: deps deps-fuzz
	@$(MAKE) --no-print-directory SANITIZE=fuzz $@
endif

$(BUILD)/fuzz/fuzz_%: tests/fuzz/fuzz_%.c tests/fuzz/fuzz_common.c tests/fuzz/fuzz.h $(BUILD)/libember.a
	@mkdir -p $(dir $@)
	$(CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer,address,undefined -o $@ $< tests/fuzz/fuzz_common.c \
	  $(BUILD)/libember.a $(LDLIBS)

# The seeds: generated here from tests/fixtures and by ember's own writers.
$(BUILD)/fuzz/make_seeds: tests/fuzz/make_seeds.c $(BUILD)/libember.a
	@mkdir -p $(dir $@)
	$(CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link,address,undefined -o $@ $< \
	  $(BUILD)/libember.a $(LDLIBS)

$(BUILD)/fuzz/seeds.done: $(BUILD)/fuzz/make_seeds $(wildcard tests/fixtures/safetensors/* tests/fixtures/data/*)
	@rm -rf $(BUILD)/fuzz/seeds
	$(BUILD)/fuzz/make_seeds tests/fixtures $(BUILD)/fuzz/seeds
	@touch $@

# -- Install ---------------------------------------------------------------------------------
# What is installed runs on other machines than this one: `portable` builds it for
# PORTABLE_ARCH into PORTABLE_BUILD (a make of its own, so that the ARCH and BUILD
# it passes reach every rule), and the install targets copy from there.
portable:
	@$(MAKE) --no-print-directory BUILD=$(PORTABLE_BUILD) ARCH='$(PORTABLE_ARCH)' SANITIZE=0 all

install: portable
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/lib/pkgconfig \
	  $(DESTDIR)$(PREFIX)/include $(DESTDIR)$(PREFIX)/share/lua/5.1/ember
	install -m 755 $(PORTABLE_BUILD)/ember $(DESTDIR)$(PREFIX)/bin/ember
	install -m 644 $(PORTABLE_BUILD)/libember.a $(PORTABLE_BUILD)/libember.so \
	  $(PORTABLE_BUILD)/libember_lua.so $(PORTABLE_BUILD)/libember_cuda.so \
	  $(PORTABLE_BUILD)/libember_cuda.a $(DESTDIR)$(PREFIX)/lib/
	install -m 644 core/include/ember.h $(DESTDIR)$(PREFIX)/include/
	cp -R $(PORTABLE_BUILD)/lua/ember/. $(DESTDIR)$(PREFIX)/share/lua/5.1/ember/
	install -d $(DESTDIR)$(PREFIX)/share/doc/ember
	cp -R docs/. $(DESTDIR)$(PREFIX)/share/doc/ember/
	sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@VERSION@|0.1.0|' tools/ember.pc.in \
	  > $(DESTDIR)$(PREFIX)/lib/pkgconfig/ember.pc

# For luarocks (rocks/ember-scm-1.rockspec builds `portable` into build-portable,
# then passes the rock's LUADIR, LIBDIR and BINDIR here): the Lua
# modules, the libraries in LIBDIR/ember/ (lua/ember/ffi.lua finds them there
# through package.cpath), the ember command, and the docs in LUADIR/ember/docs/
# (a rock has no share/doc of its own; help() looks beside its Lua files).
.PHONY: install-rock
install-rock: portable
	install -d $(LUADIR)/ember $(LIBDIR)/ember $(BINDIR)
	cp -R $(PORTABLE_BUILD)/lua/ember/. $(LUADIR)/ember/
	install -d $(LUADIR)/ember/docs
	cp -R docs/. $(LUADIR)/ember/docs/
	install -m 644 $(PORTABLE_BUILD)/libember.so $(PORTABLE_BUILD)/libember_lua.so \
	  $(PORTABLE_BUILD)/libember_cuda.so $(LIBDIR)/ember/
	install -m 755 $(PORTABLE_BUILD)/ember $(BINDIR)/ember

clean:
	rm -rf build build-asan build-tsan build-fuzz build-rock build-fatbin $(PORTABLE_BUILD)

-include $(wildcard $(BUILD)/obj/*/*.d $(BUILD)/obj/*/*/*.d $(BUILD)/tests/*.d $(FATBIN_DIR)/*.d)
