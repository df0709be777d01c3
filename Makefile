# shard: one entry point. `make` builds lib/libshard.{so,a} and bin/shard; `make run` trains the
# default recipe; `make test` runs every C test, busted spec and MPI script, and the CUDA path on
# the emulated device (tests/cuda_emu). CUDA kernels are compiled by nvcc when it exists (NVCC=
# disables them) and by g++ against the emulator for the tests; the build never needs a GPU.

BUILD   ?= build
CC      ?= gcc
OPT     ?= -O2
SAN     ?=
# -fno-trapping-math: shard never reads FP exception flags; it lets gcc if-convert the branches
# of the exp and tanh loops, so that they vectorize in every CPU kernel set (AVX2 has no masks).
CFLAGS  += $(OPT) -g -std=gnu11 -fPIC -fopenmp-simd -fno-trapping-math -Wall -Wextra -Wno-unused-parameter -Wno-format-truncation $(SAN)
CFLAGS  += -Iruntime -Ikernels
LDFLAGS += $(SAN)

# What make deps installs (LuaJIT, Open MPI) is asked for when this Makefile is read: on a fresh
# machine that is before deps ran. So run, test, test-asan, test-gpu and the benches run deps and
# then build in a make of their own ($(MAKE) in the recipe), which reads this file after deps.
LUAJIT_CFLAGS ?= $(shell pkg-config --cflags luajit 2>/dev/null)
LUAJIT_LIBS   ?= $(shell pkg-config --libs luajit 2>/dev/null)
MPI_CFLAGS    ?= $(shell mpicc --showme:compile 2>/dev/null)
MPI_LIBS      ?= $(shell mpicc --showme:link 2>/dev/null)
BLAS_LIBS     ?= -lopenblas

CUDA_HOME ?= /usr/local/cuda
NVCC      ?= $(shell command -v nvcc 2>/dev/null || (test -x $(CUDA_HOME)/bin/nvcc && echo $(CUDA_HOME)/bin/nvcc))
NVFLAGS   ?= -O2 -std=c++17 -Xcompiler -fPIC -Iruntime -Ikernels \
             -gencode=arch=compute_90a,code=sm_90a -gencode=arch=compute_90,code=compute_90

# runtime/ in layers, each a folder that includes only the ones before it (make check-layers):
# core, cpu, ops, dist, io; host.c (bin/shard) stands above them all.
LAYERS      := core cpu ops dist io
RUNTIME_SRC := $(foreach l,$(LAYERS),$(wildcard runtime/$(l)/*.c))
RUNTIME_HDR := $(foreach l,$(LAYERS),$(wildcard runtime/$(l)/*.h))
RUNTIME_OBJ := $(RUNTIME_SRC:%.c=$(BUILD)/%.o)
ifneq ($(NVCC),)
  CUDA_SRC  := $(wildcard kernels/*.cu)
  CUDA_OBJ  := $(CUDA_SRC:%.cu=$(BUILD)/%.o)
  CUDA_PTXAS := $(CUDA_SRC:%.cu=$(BUILD)/%.ptxas)
  CUDA_LIBS := -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcudart -lcublasLt -lnccl -lstdc++
  CFLAGS    += -DSHARD_CUDA -I$(CUDA_HOME)/include
endif
LIBS := $(MPI_LIBS) $(BLAS_LIBS) $(CUDA_LIBS) -lm -lpthread
MAKEFLAGS += --no-print-directory

# Expanded in a recipe: stops a build that lacks what make deps installs with one line naming
# it, before a compiler fails on mpi.h or a link on dozens of undefined references.
need_mpi    = $(if $(MPI_LIBS),,$(error mpicc --showme:link gives nothing: Open MPI is missing; run `make deps` (make run and make test run it)))
need_luajit = $(if $(LUAJIT_LIBS),,$(error pkg-config --libs luajit gives nothing: LuaJIT is missing; run `make deps` (make run and make test run it)))

.DEFAULT_GOAL := all

# The CUDA emulator's build (test infrastructure; never part of lib/ or bin/shard).
include tests/cuda_emu/emu.mk

C_TESTS := $(patsubst tests/c/%.c,$(BUILD)/tests/%,$(wildcard tests/c/test_*.c)) $(BUILD)/tests/test_safetensors_fuzz
GPU_TESTS := $(patsubst tests/gpu/%.c,$(BUILD)/tests/gpu/%,$(wildcard tests/gpu/test_*.c))
HOST    ?= bin/shard

.PHONY: all deps run test test-build c-tests test-asan test-gpu gpu-report check-layers bench bench-adamw clean check-long test-long check-fresh check-hf fuzz readme-figures
all: lib/libshard.so lib/libshard.a $(HOST)

$(BUILD)/runtime/%.o: runtime/%.c $(RUNTIME_HDR)
	$(need_mpi)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(MPI_CFLAGS) -c $< -o $@

# The optimizer's sqrt must not set errno, or gcc will not vectorize its loop; no FMA
# contraction, so that its vector loops (AVX-512, AVX2) and its portable one give the same bits.
$(BUILD)/runtime/cpu/optim.o $(BUILD)/runtime/ops/optim.o: CFLAGS += -fno-math-errno -ffp-contract=off

# Each object keeps ptxas's report of its kernels beside it (make gpu-report reads them);
# ptxas's info lines go there only, anything else nvcc says still shows.
$(BUILD)/kernels/%.o $(BUILD)/kernels/%.ptxas: kernels/%.cu $(wildcard kernels/*.h kernels/*.cuh) $(RUNTIME_HDR)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -Xptxas -v -c $< -o $(BUILD)/kernels/$*.o 2>$(BUILD)/kernels/$*.ptxas; \
	  rc=$$?; grep -v -e '^ptxas info' -e '^    [0-9]* bytes stack frame' $(BUILD)/kernels/$*.ptxas >&2; exit $$rc

lib/libshard.so: $(RUNTIME_OBJ) $(CUDA_OBJ)
	@mkdir -p lib
	$(CC) -shared -o $@ $^ $(LDFLAGS) $(LIBS)

lib/libshard.a: $(RUNTIME_OBJ) $(CUDA_OBJ)
	@mkdir -p lib
	rm -f $@ && ar rcs $@ $^

# The host links the runtime statically and exports every symbol (-Wl,-E) so that LuaJIT's
# FFI finds them in the executable itself. Only Lua calls readline, so it is kept linked
# past the toolchain's default --as-needed.
$(HOST): runtime/host.c $(RUNTIME_OBJ) $(CUDA_OBJ)
	$(need_mpi)$(need_luajit)
	@mkdir -p bin
	$(CC) $(CFLAGS) $(LUAJIT_CFLAGS) -o $@ $^ -Wl,-E $(LDFLAGS) $(LUAJIT_LIBS) -Wl,--push-state,--no-as-needed -lreadline -Wl,--pop-state $(LIBS) -ldl

$(BUILD)/tests/%: tests/c/%.c tests/c/check.h tests/c/check_cpu.h tests/ops/op_table.h $(RUNTIME_OBJ) $(CUDA_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(MPI_CFLAGS) -Itests/c -o $@ $< $(RUNTIME_OBJ) $(CUDA_OBJ) $(LDFLAGS) $(LIBS)

# CUDA op tests (tests/gpu): built with the same objects, run by `make test-gpu` on a GPU.
$(BUILD)/tests/gpu/%: tests/gpu/%.c tests/gpu/gpu_test.h tests/c/check.h tests/ops/op_table.h $(RUNTIME_OBJ) $(CUDA_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(MPI_CFLAGS) -Itests/c -o $@ $< $(RUNTIME_OBJ) $(CUDA_OBJ) $(LDFLAGS) $(LIBS)

# The safetensors fuzzer (tests/fuzz) compiles the reader into itself with a counting
# allocator; as a C test it runs 20,000 iterations (under SAN in test-asan).
FUZZ_BUILD := tests/fuzz/fuzz_safetensors.c runtime/core/status.c runtime/core/dtype.c
FUZZ_DEPS  := $(FUZZ_BUILD) runtime/io/safetensors.c $(RUNTIME_HDR)
$(BUILD)/tests/test_safetensors_fuzz: $(FUZZ_DEPS)
	@mkdir -p $(dir $@)
	$(CC) $(OPT) -g -std=gnu11 -Wall -Wextra -Wno-unused-parameter -Wno-format-truncation $(SAN) -Iruntime -o $@ $(FUZZ_BUILD)

c-tests: $(C_TESTS)

# The pseudo-terminal driver of the REPL's tests (tests/pty, tests/spec/repl_pty_spec.lua).
PTY_DRIVER := $(BUILD)/tests/pty/ptyexpect
$(PTY_DRIVER): tests/pty/ptyexpect.c
	@mkdir -p $(dir $@)
	$(CC) $(OPT) -g -std=gnu11 -Wall -Wextra $(SAN) -o $@ $< -lutil

deps:
	@sh tests/deps.sh

run: deps
	@$(MAKE) all
	bin/shard run recipes/gpt_shakespeare_char.lua --max_iters=300 --eval_interval=100 --demo $(ARGS)

# T=NAME[:CASE] runs only the matching tests (tests/run.sh says how).
# The CUDA path runs too, on the emulated device (tests/cuda_emu/emu.mk: make test-cuda-emu alone).
test: deps
	@$(MAKE) test-build
	@SHARD_EMU_BUILD=$(EMU) SHARD_EMU_BIN=$(EMU_BIN) sh tests/run.sh $(BUILD) bin/shard $(T)

test-build: all $(C_TESTS) $(PTY_DRIVER) $(EMU_SELF) $(EMU_BIN) $(EMU_GPU_TESTS) $(CUDA_PTXAS)

# make check-layers: no file of runtime/ or kernels/ includes or calls a higher layer, no circle
# of calls among more than two runtime/ files (tools/check_layers.lua; make test runs it).
check-layers: $(RUNTIME_OBJ) $(CUDA_OBJ)
	@luajit tools/check_layers.lua $(BUILD)

# make gpu-report: each kernel's registers, shared memory, spills and blocks per SM on an H100
# (tools/gpu_report.lua), from the ptxas reports of the nvcc build; fails on a spill in the
# attention, matmul or optimizer kernels. make test runs it as a C test (tests/run.sh).
gpu-report: $(CUDA_PTXAS)
	$(if $(NVCC),@luajit tools/gpu_report.lua $(CUDA_PTXAS),@echo "gpu-report: no nvcc, no kernels to report")

# Everything again under AddressSanitizer and UBSan, in its own build tree.
test-asan: deps
	$(MAKE) BUILD=build-asan OPT=-O1 NVCC= HOST=bin/shard-asan \
	  SAN="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined" \
	  bin/shard-asan c-tests build-asan/tests/pty/ptyexpect
	@ASAN_OPTIONS=detect_leaks=0 sh tests/run.sh build-asan bin/shard-asan $(T)

test-gpu: deps
	@$(MAKE) all $(GPU_TESTS)
	@sh tests/run_gpu.sh bin/shard $(BUILD)

# make bench: shard vs PyTorch 1.13 (/usr/bin/python3; bench/deps.sh installs python3-torch as
# root or names it) and PyTorch 2.x eager and torch.compile'd (bench/venv.sh installs it once into
# the git-ignored .venv-bench/; never needed by make test) at 1 and nproc threads in alternating
# rounds, beside an OpenBLAS sgemm peak; medians [min-max], with the recipe's own loop each round;
# then the CPU AdamW step (bench-adamw below) and the bf16 step. Knobs (whole numbers): ROUNDS=3
# ITERS=50 RECIPE_ITERS=300 THREADS="1 2" PEAK_N=2048 PEER_SPIN=1, and bench-adamw's;
# BENCH=train|f32|bf16 runs a part; PEERS="system venv compiled" a subset of the peers;
# ISA=avx2|avx512|generic every side on that kernel set (make bench ISA=avx2 on an AVX-512 CPU).
ADAMW_BENCH := $(BUILD)/bench/adamw_bench $(BUILD)/bench/adamw_membw
bench: deps
	@$(MAKE) all $(ADAMW_BENCH)
	@sh bench/run.sh

# make bench-adamw: the CPU AdamW step alone (minutes, mostly PyTorch's; make bench runs it too): shard
# vs PyTorch 1.13's torch.optim.AdamW on GPT-2 124M's parameters, beside the machine's memory
# bandwidth, in alternating rounds. Knobs: ADAMW_ROUNDS=2 ADAMW_ITERS=3 THREADS="1 2" (bench/adamw.sh).
bench-adamw: deps
	@$(MAKE) $(ADAMW_BENCH)
	@sh bench/adamw.sh $(BUILD)

# The C benchmarks linked with the runtime's objects of this build (not tests: bench/*.c say
# how to run them): make build/bench/sgemm_cpu, build/bench/kernels_cpu.
$(BUILD)/bench/adamw_bench $(BUILD)/bench/sgemm_cpu $(BUILD)/bench/kernels_cpu: $(BUILD)/bench/%: bench/%.c $(RUNTIME_OBJ) $(CUDA_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $< $(RUNTIME_OBJ) $(CUDA_OBJ) $(LDFLAGS) $(LIBS)

$(BUILD)/bench/adamw_membw: bench/adamw_membw.c
	@mkdir -p $(dir $@)
	$(CC) $(OPT) -g -std=gnu11 -fopenmp -Wall -Wextra -march=native -o $@ $<

# make fuzz: the safetensors reader under AddressSanitizer and UBSan against FUZZ_ITERS
# mutated files (minutes; never part of make test). check-long runs it.
FUZZ_ITERS ?= 1000000
FUZZ_SEED  ?= 1
build-fuzz/fuzz_safetensors: $(FUZZ_DEPS)
	@mkdir -p $(dir $@)
	$(CC) -O1 -g -std=gnu11 -Wall -Wextra -Wno-unused-parameter -Wno-format-truncation -Iruntime \
	  -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all -o $@ $(FUZZ_BUILD)

fuzz: build-fuzz/fuzz_safetensors
	ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:allocator_may_return_null=0:max_allocation_size_mb=2048 \
	UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 build-fuzz/fuzz_safetensors $(FUZZ_ITERS) $(FUZZ_SEED)

# make test-long: what does not fit make test's 10 minutes (tests/run.sh, SHARD_TEST_LONG=1): the
# C tests and recipe specs under the further lower CPU kernel sets, the multi-process scripts
# of minutes (tests/mpi/*.sh: deterministic mode at world 5-8), the emulated device's other
# drain orders and its op table on a small device (tests/cuda_emu/long.sh). CI runs it.
test-long: deps
	@$(MAKE) test-build
	@SHARD_TEST_LONG=1 SHARD_EMU_BUILD=$(EMU) SHARD_EMU_BIN=$(EMU_BIN) sh tests/run.sh $(BUILD) bin/shard $(T)

check-long: test-long fuzz

# make check-fresh: README's two commands (make run, then make test) in a fresh Debian 12 root,
# debootstrap's minbase plus only what README says a fresh machine needs, on a clean clone of
# HEAD (root, network; the root cached in .fresh/; about 7 minutes on 2 cores): tests/fresh/check.sh.
check-fresh:
	@sh tests/fresh/check.sh

# make check-hf: Hugging Face import/export and the checkpoint files against the real clients:
# tiny random GPT-2 and Llama models saved by transformers load through from_pretrained (one
# process and FSDP world 2) with its logits within 1e-5; shard.export_hf loads in
# AutoModelForCausalLM with shard's logits; the safetensors library reads shard.checkpoint's
# rank files (tests/hf/check.sh). transformers, safetensors and torch go into the git-ignored
# .venv-hf from PyPI on first use (tests/hf/venv.sh, about 1 minute); then about 20 s.
check-hf: all
	@sh tests/hf/check.sh

# make readme-figures: reruns the commands behind README's figures and rewrites them with their
# command, CPU and date (tools/readme_figures.lua; about 2 minutes, the strategies sweep's
# PNGs and table included); CHECK=1 rewrites nothing and names each figure that does not depend
# on the machine's speed (bytes, peaks, FLOPs, losses) and is stale; FIG=name,... picks some.
readme-figures: all
	@luajit tools/readme_figures.lua $(if $(CHECK),--check) $(FIG)

clean:
	rm -rf build build-asan build-emu build-cpu build-fuzz lib bin/shard bin/shard-asan bin/shard-emu bin/shard-cpu
