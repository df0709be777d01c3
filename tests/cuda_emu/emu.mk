# tests/cuda_emu/emu.mk: the CUDA emulator's build (included from the top Makefile).
#   make test-cuda-emu   builds the emulated device (tests/cuda_emu) and, against it, the
#                        runtime (-DSHARD_CUDA), every kernels/*.cu (comm_nccl.cu against the
#                        NCCL stand-in, tests/cuda_emu/nccl.cpp) and bin/shard-emu; then runs the emulator's self-tests and the CUDA test
#                        programs (tests/gpu/test_*.c) on the emulated device (run.sh, then
#                        long.sh: make test runs the first, make test-long the second).
#   make shard-emu       only bin/shard-emu (bin/shard's link with the emulated objects).
# Nothing here uses an NVIDIA header or library: the kernels are rewritten by
# tests/cuda_emu/rewrite.lua (launches and __shared__; line numbers kept) and compiled by g++.
# Never part of lib/libshard.* or bin/shard.

EMU        ?= build-emu
EMU_DIR    := tests/cuda_emu
EMU_CXX    ?= g++
EMU_LUAJIT ?= luajit
EMU_OPT    ?= -O2
EMU_BIN    ?= bin/shard-emu

EMU_CFLAGS   := $(EMU_OPT) -g -std=gnu11 -fPIC -fopenmp-simd -Wall -Wextra -Wno-unused-parameter -Wno-format-truncation \
                -Iruntime -Ikernels -DSHARD_CUDA
EMU_CXXFLAGS := $(EMU_OPT) -g -std=c++17 -fPIC -Wall -Wno-unused-parameter -Wno-unknown-pragmas -Wno-unused-function \
                -Wno-comment -fno-strict-aliasing -I$(EMU_DIR)/include -I$(EMU_DIR) -Iruntime -Ikernels -DSHARD_CUDA
EMU_LIBS     := $(MPI_LIBS) $(BLAS_LIBS) -lstdc++ -lm -lpthread -ldl

EMU_HEADERS  := $(wildcard $(EMU_DIR)/*.h $(EMU_DIR)/include/*.h $(EMU_DIR)/include/*.cuh $(EMU_DIR)/include/*/*.cuh)

# The emulated device: the core and the library stand-ins (every tests/cuda_emu/*.cpp).
EMU_LIB_SRC  := $(wildcard $(EMU_DIR)/*.cpp)
EMU_LIB_OBJ  := $(EMU_LIB_SRC:$(EMU_DIR)/%.cpp=$(EMU)/emu/%.o)

EMU_RUNTIME_OBJ := $(RUNTIME_SRC:%.c=$(EMU)/%.o)
EMU_KERNEL_SRC  := $(wildcard kernels/*.cu)
EMU_KERNEL_OBJ  := $(EMU_KERNEL_SRC:%.cu=$(EMU)/%.o)
EMU_KERNEL_HDR  := $(patsubst %,$(EMU)/rw/%,$(wildcard kernels/*.cuh))

EMU_SELF_CU   := $(wildcard $(EMU_DIR)/tests/*.cu)
EMU_SELF_CPP  := $(wildcard $(EMU_DIR)/tests/*.cpp)
EMU_SELF      := $(EMU_SELF_CU:$(EMU_DIR)/tests/%.cu=$(EMU)/self/%) $(EMU_SELF_CPP:$(EMU_DIR)/tests/%.cpp=$(EMU)/self/%)
EMU_GPU_TESTS := $(patsubst tests/gpu/%.c,$(EMU)/tests/gpu/%,$(wildcard tests/gpu/test_*.c))

.PHONY: test-cuda-emu shard-emu
.SECONDARY: $(EMU_KERNEL_HDR) $(EMU_KERNEL_SRC:%=$(EMU)/rw/%) $(EMU_SELF_CU:%=$(EMU)/rw/%)

test-cuda-emu: $(EMU_SELF) $(EMU_BIN) $(EMU_GPU_TESTS)
	@SHARD_EMU_ALL=1 sh $(EMU_DIR)/run.sh $(EMU) $(EMU_BIN)

shard-emu: $(EMU_BIN)

# The rewrite: kernels/x.cu -> build-emu/rw/kernels/x.cu, headers alongside (a quoted include
# finds the rewritten header next to the rewritten file first).
$(EMU)/rw/%: % $(EMU_DIR)/rewrite.lua
	@mkdir -p $(dir $@)
	$(EMU_LUAJIT) $(EMU_DIR)/rewrite.lua $< $@ $<

$(EMU)/emu/%.o: $(EMU_DIR)/%.cpp $(EMU_HEADERS)
	@mkdir -p $(dir $@)
	$(EMU_CXX) $(EMU_CXXFLAGS) -c $< -o $@

$(EMU)/runtime/%.o: runtime/%.c $(RUNTIME_HDR)
	$(need_mpi)
	@mkdir -p $(dir $@)
	$(CC) $(EMU_CFLAGS) $(MPI_CFLAGS) -c $< -o $@

# as the main build: no FMA contraction, so the vector and portable loops give the same bits
$(EMU)/runtime/cpu/optim.o $(EMU)/runtime/ops/optim.o: EMU_CFLAGS += -fno-math-errno -ffp-contract=off

$(EMU)/kernels/%.o: $(EMU)/rw/kernels/%.cu $(EMU_KERNEL_HDR) $(wildcard kernels/*.h) $(RUNTIME_HDR) $(EMU_HEADERS)
	@mkdir -p $(dir $@)
	$(EMU_CXX) $(EMU_CXXFLAGS) -x c++ -c $< -o $@

$(EMU_BIN): runtime/host.c $(EMU_RUNTIME_OBJ) $(EMU_KERNEL_OBJ) $(EMU_LIB_OBJ)
	$(need_mpi)$(need_luajit)
	@mkdir -p $(dir $@)
	$(CC) $(EMU_CFLAGS) $(LUAJIT_CFLAGS) -o $@ $^ -Wl,-E $(LDFLAGS) $(LUAJIT_LIBS) \
	  -Wl,--push-state,--no-as-needed -lreadline -Wl,--pop-state $(EMU_LIBS)

# The emulator's self-tests: .cu through the rewrite, .cpp as they are.
$(EMU)/self/%: $(EMU)/rw/$(EMU_DIR)/tests/%.cu $(EMU_LIB_OBJ) $(EMU_HEADERS) $(wildcard $(EMU_DIR)/tests/*.h) tests/c/check.h
	@mkdir -p $(dir $@)
	$(EMU_CXX) $(EMU_CXXFLAGS) -I$(EMU_DIR)/tests -Itests/c -x c++ $< -x none $(EMU_LIB_OBJ) -o $@ $(EMU_LIBS)

$(EMU)/self/%: $(EMU_DIR)/tests/%.cpp $(EMU_LIB_OBJ) $(EMU_HEADERS) $(wildcard $(EMU_DIR)/tests/*.h) tests/c/check.h
	@mkdir -p $(dir $@)
	$(EMU_CXX) $(EMU_CXXFLAGS) -I$(EMU_DIR)/tests -Itests/c $< $(EMU_LIB_OBJ) -o $@ $(EMU_LIBS)

# The CUDA test programs (tests/gpu), linked with the emulated objects.
$(EMU)/tests/gpu/%: tests/gpu/%.c tests/gpu/gpu_test.h tests/c/check.h tests/ops/op_table.h $(EMU_RUNTIME_OBJ) $(EMU_KERNEL_OBJ) $(EMU_LIB_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(EMU_CFLAGS) $(MPI_CFLAGS) -Itests/c -o $@ $< $(EMU_RUNTIME_OBJ) $(EMU_KERNEL_OBJ) $(EMU_LIB_OBJ) $(LDFLAGS) $(EMU_LIBS)
