# tcc: one flat GNU Makefile. Generated files and objects live in build/.
#   make               build ./tcc
#   make test          install missing dependencies, build, run every suite
#   make demo          compile every sample and show its IR
#   make fuzz          run the fuzzers for longer (FUZZ_SECONDS, default 600)
#   make format-check  clang-format over the project's C sources (make format fixes them)

CC      ?= cc
CFLAGS  ?= -O1 -g
WARN    := -Wall -Wextra -Werror -Wmissing-prototypes -Wstrict-prototypes -Wshadow \
           -Wno-unused-parameter -Wno-unused-function
SANFLAGS := -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer

B := build
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
FUZZ_SHORT ?= 30
FUZZ_SECONDS ?= 600
PYTHON ?= python3

# ---- CUDA toolkit (optional): NVRTC, the cuda device and the nccl comm backend ----
CUDA_HOME ?= /usr/local/cuda
ifneq ($(wildcard $(CUDA_HOME)/include/nvrtc.h),)
HAVE_CUDA := 1
CUDA_DEFS := -DTCC_HAVE_CUDA=1
CUDA_CFLAGS := -isystem $(CUDA_HOME)/include
CUDA_LIBS := -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lnccl -lcublasLt -lnvrtc -lcudart
CUDA_NOTE := tcc: CUDA toolkit at $(CUDA_HOME)
else
HAVE_CUDA := 0
CUDA_DEFS :=
CUDA_CFLAGS :=
CUDA_LIBS :=
CUDA_NOTE := tcc: no CUDA toolkit found (set CUDA_HOME); building without the CUDA parts
endif
# Said once per top-level make, not by the sub-makes, and not for clean.
ifeq ($(MAKELEVEL),0)
ifneq ($(filter-out clean format format-check,$(or $(MAKECMDGOALS),all)),)
$(info $(CUDA_NOTE))
endif
endif

BASEFLAGS := -std=c11 -D_POSIX_C_SOURCE=200809L -D_DEFAULT_SOURCE -I. -I$(B)/gen $(CUDA_DEFS) $(WARN)
GENFLAGS := -Wno-missing-prototypes -Wno-shadow -Wno-sign-compare

# Compiler sources (everything but the driver main).
# The compiler writes plans with the plan format's room, plan/ (cJSON).
LIB_SRCS := common/base.c $(sort $(wildcard plan/*.c ir/*.c frontend/*.c passes/*.c model/*.c codegen/*.c))
# The rooms above the passes (the compile API, the planner, the reports and
# --verify): tcc's alone, they run plans (the runtime library).
DRV_SRCS := $(sort $(wildcard driver/*.c explain/*.c planner/*.c))
LIB_LIBS := -lcjson -lm
GEN_SRCS := $(B)/gen/parser.c $(B)/gen/lexer.c
LIB_OBJS := $(LIB_SRCS:%.c=$(B)/obj/%.o) $(GEN_SRCS:$(B)/gen/%.c=$(B)/obj/gen/%.o)
SAN_OBJS := $(LIB_SRCS:%.c=$(B)/san/%.o) $(GEN_SRCS:$(B)/gen/%.c=$(B)/san/gen/%.o)

# Unit tests: one Criterion binary per tests/unit/test_*.c, on the sanitized objects
# plus the test helpers of tests/support/ (a float64 reference interpreter, ...).
SUPPORT_SRCS := $(sort $(wildcard tests/support/*.c))
SUPPORT_OBJS := $(SUPPORT_SRCS:%.c=$(B)/san/%.o)
UNIT_SRCS := $(sort $(wildcard tests/unit/test_*.c))
UNIT_BINS := $(UNIT_SRCS:tests/unit/%.c=$(B)/unit/%)

# Fuzzers: libFuzzer harnesses, with the compiler sources built again by clang.
FUZZ_CC := clang
FUZZ_SAN := -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
FUZZ_CFLAGS := -O1 -g $(FUZZ_SAN) $(filter-out -Werror,$(BASEFLAGS))
FUZZ_OBJS := $(LIB_SRCS:%.c=$(B)/fuzz/obj/%.o) $(GEN_SRCS:$(B)/gen/%.c=$(B)/fuzz/obj/gen/%.o)
FUZZ_BINS := $(B)/fuzz/fuzz_tdl $(B)/fuzz/fuzz_ir $(B)/fuzz/fuzz_plan $(B)/fuzz/fuzz_npy
# The .npy loader's harness links its runtime files besides.
FUZZ_NPY_OBJS := $(B)/fuzz/obj/runtime/npy.o $(B)/fuzz/obj/runtime/data.o

# Installs what is missing, once per clone (again when the script changes).
DEPS := $(B)/.deps-ok

all: tcc

# tcc links the executables it builds against the runtime library here.
$(B)/obj/codegen/binary.o $(B)/san/codegen/binary.o: BASEFLAGS += -DTCC_LIBDIR=\"$(abspath $(B))\" \
    -DTCC_MPI_LIBS="\"$(MPI_LIBS)\"" -DTCC_CUDA_LIBS="\"$(CUDA_LIBS)\""

$(DEPS): scripts/deps.sh
	@mkdir -p $(B)
	@bash scripts/deps.sh
	@touch $@

# tcc links the runtime for --verify (it runs the plans it builds); runtime.mk builds it.
RT_LIB := $(B)/libtccrt.a
RT_SAN_LIB := $(B)/libtccrt-san.a
tcc: $(LIB_OBJS) $(DRV_SRCS:%.c=$(B)/obj/%.o) $(B)/obj/tcc.o $(RT_LIB)
	$(CC) $(CFLAGS) -o $@ $^ $(LIB_LIBS) $(RT_LIBS)

$(B)/tcc-san: $(SAN_OBJS) $(DRV_SRCS:%.c=$(B)/san/%.o) $(B)/san/tcc.o $(RT_SAN_LIB)
	$(CC) $(CFLAGS) $(SANFLAGS) -o $@ $^ $(LIB_LIBS) $(RT_LIBS)

$(B)/gen/parser.c $(B)/gen/parser.h &: frontend/parser.y | $(DEPS)
	@mkdir -p $(B)/gen
	bison -Wall -Werror --defines=$(B)/gen/parser.h -o $(B)/gen/parser.c $<

$(B)/gen/lexer.c $(B)/gen/lexer.h &: frontend/lexer.l $(B)/gen/parser.h | $(DEPS)
	@mkdir -p $(B)/gen
	flex --header-file=$(B)/gen/lexer.h -o $(B)/gen/lexer.c $<

HDRS := $(wildcard common/*.h plan/*.h ir/*.h ir/*.def frontend/*.h passes/*.h model/*.h codegen/*.h \
          runtime/*.h driver/*.h explain/*.h planner/*.h tests/support/*.h) \
        $(B)/gen/parser.h $(B)/gen/lexer.h

$(B)/obj/gen/%.o: $(B)/gen/%.c $(HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(BASEFLAGS) $(GENFLAGS) -c -o $@ $<
$(B)/san/gen/%.o: $(B)/gen/%.c $(HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(SANFLAGS) $(BASEFLAGS) $(GENFLAGS) -c -o $@ $<
$(B)/fuzz/obj/gen/%.o: $(B)/gen/%.c $(HDRS)
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) $(GENFLAGS) -fsanitize=fuzzer-no-link -c -o $@ $<
$(B)/obj/%.o: %.c $(HDRS) | $(DEPS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(BASEFLAGS) -c -o $@ $<
$(B)/san/%.o: %.c $(HDRS) | $(DEPS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(SANFLAGS) $(BASEFLAGS) -c -o $@ $<
$(B)/fuzz/obj/%.o: %.c $(HDRS) | $(DEPS)
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link -c -o $@ $<

# A test that no longer builds must not leave its old binary behind to pass.
DRV_SAN_OBJS := $(DRV_SRCS:%.c=$(B)/san/%.o)
$(B)/unit/%: tests/unit/%.c $(SAN_OBJS) $(DRV_SAN_OBJS) $(SUPPORT_OBJS) $(HDRS)
	@mkdir -p $(dir $@) && rm -f $@
	$(CC) $(CFLAGS) $(SANFLAGS) $(BASEFLAGS) -o $@ $< $(SAN_OBJS) $(DRV_SAN_OBJS) $(SUPPORT_OBJS) \
	    $(RT_SAN_LIB) -lcriterion $(RT_LIBS) $(LIB_LIBS)

# The check of every kernel's C and OpenCL renderings against a float64
# reference under PoCL (tests/kernels/oclcheck.c); on the plain objects, as
# PoCL's compiler does not run under the sanitizers.
$(B)/oclcheck: tests/kernels/oclcheck.c $(LIB_OBJS) $(HDRS)
	@mkdir -p $(dir $@) && rm -f $@
	$(CC) $(CFLAGS) $(BASEFLAGS) -o $@ $< $(LIB_OBJS) $(LIB_LIBS) -lOpenCL -ldl

$(B)/fuzz/fuzz_npy: tests/fuzz/fuzz_npy.c $(FUZZ_OBJS) $(FUZZ_NPY_OBJS) $(HDRS)
	@mkdir -p $(dir $@) && rm -f $@
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer -o $@ $< $(FUZZ_OBJS) $(FUZZ_NPY_OBJS) $(LIB_LIBS)

$(B)/fuzz/%: tests/fuzz/%.c $(FUZZ_OBJS) $(HDRS)
	@mkdir -p $(dir $@) && rm -f $@
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer -o $@ $< $(FUZZ_OBJS) $(LIB_LIBS)

# ---- tests ----
# The builds run in sub-makes so that they are parallel even under a plain `make test`.
# The compiler must build; a test binary that does not build counts as a failed test
# (tests/run_suites.py reports it) and the other suites still run.
test: $(DEPS)
	@$(MAKE) --no-print-directory -j$(JOBS) tcc $(B)/tcc-san
	@$(MAKE) --no-print-directory -j$(JOBS) -k $(UNIT_BINS) $(FUZZ_BINS) $(B)/oclcheck || \
	    echo "tcc: some test binaries did not build; each counts as a failed test"
	@$(PYTHON) tests/run_suites.py --fuzz-seconds=$(FUZZ_SHORT)

fuzz: $(DEPS)
	@$(MAKE) --no-print-directory -j$(JOBS) tcc $(FUZZ_BINS)
	@$(PYTHON) tests/run_suites.py --suites=fuzz --fuzz-seconds=$(FUZZ_SECONDS)

demo: $(DEPS) all
	@bash scripts/demo.sh

# ---- style ----
format-check: $(DEPS)
	@bash scripts/format.sh check

format: $(DEPS)
	@bash scripts/format.sh fix

clean:
	rm -rf $(B) tcc

.PHONY: all test fuzz demo format format-check clean
# Objects of a failed compile must not survive to a later link.
.DELETE_ON_ERROR:
# Only pattern rules ask for these; keep them between runs all the same.
.SECONDARY: $(FUZZ_OBJS) $(SUPPORT_OBJS)

include runtime/runtime.mk

# ---- benchmarks ----
# CPU training throughput against the sgemm peak, two OpenBLAS settings (bench/README.md).
bench:
	@bash bench/cpu_train.sh

# Training throughput on meshes of the threads backend against one device (bench/README.md).
bench-mesh:
	@bash bench/mesh_train.sh

# On a machine with a GPU: tcc's GPT-2 124M step against llm.c's on the same GPU,
# where its time goes, and a Llama-style 1B (bench/README.md, "GPU").
bench-gpu:
	@bash bench/gpu.sh

# The cost model's CPU prediction against the measured step (bench/README.md).
bench-cost:
	@bash bench/cost_cpu.sh

# tcc against PyTorch on this CPU, the same model and shapes (bench/README.md).
bench-peer:
	@bash bench/peer.sh

# The contract on every sample, both --verify modes, three meshes (minutes).
verify-matrix: tcc
	@python3 tests/contract/verify_matrix.py ./tcc samples

# Compiling cluster-scale plans: wall time and memory as the microbatches grow (bench/README.md).
bench-compile:
	@bash bench/compile_scale.sh

# What the ranks' agreements (non-finite step, stop signal) cost a step (bench/README.md).
bench-agree:
	@bash bench/agree.sh

.PHONY: bench bench-mesh bench-gpu bench-cost bench-peer bench-agree bench-compile verify-matrix
