# runtime.mk: the runtime, included by the Makefile.
# Builds build/libtccrt.a (and build/libtccrt-san.a, sanitized) from runtime/*.c,
# from runtime/comm/*.c (the collectives: threads and OpenMPI backends), from
# runtime/gpu/ (the cuda device) and from plan/*.c (the plan format, which the
# compiler also links), and the commands of tools/: ./tccrun, ./tccdata and (with
# the CUDA toolkit) ./tccnvrtc, built in the repository's root. Unit tests link
# $(RT_SAN_LIB) $(RT_LIBS). The objects come from the Makefile's pattern rules
# ($(B)/obj/%.o, $(B)/san/%.o).

# The commands, each a file with a main(): not in the library.
RT_CMD_SRCS := tools/tccrun.c tools/tccdata.c tools/tccnvrtc.c
RT_SRCS := $(sort $(wildcard plan/*.c runtime/*.c runtime/comm/*.c))
# The GPU parts (NVRTC, the cuda backend) need the CUDA toolkit's headers and libraries.
# Without the toolkit, runtime/gpu/no_cuda.c stands in for them: the cuda device's
# calls fail with "built without CUDA".
RT_NO_CUDA_SRCS := runtime/gpu/no_cuda.c
ifeq ($(HAVE_CUDA),1)
RT_GPU_SRCS := $(filter-out $(RT_NO_CUDA_SRCS),$(sort $(wildcard runtime/gpu/*.c)))
$(RT_GPU_SRCS:%.c=$(B)/obj/%.o) $(RT_GPU_SRCS:%.c=$(B)/san/%.o) \
    $(RT_GPU_SRCS:%.c=$(B)/fuzz/obj/%.o): BASEFLAGS += $(CUDA_CFLAGS)
else
RT_GPU_SRCS := $(RT_NO_CUDA_SRCS)
endif
RT_SRCS += $(RT_GPU_SRCS)
RT_OBJS := $(RT_SRCS:%.c=$(B)/obj/%.o)
RT_SAN_OBJS := $(RT_SRCS:%.c=$(B)/san/%.o)
RT_HDRS := $(wildcard plan/*.h runtime/*.h runtime/comm/*.h runtime/gpu/*.h)
RT_LIB := $(B)/libtccrt.a
RT_SAN_LIB := $(B)/libtccrt-san.a
# OpenMPI's flags as its compiler wrapper gives them, asked once and only when a recipe
# needs them (scripts/deps.sh installs OpenMPI before the first object is built).
# Its headers are system headers: our warnings are not theirs to pass.
MPI_INCLUDES = $(patsubst -I%,-isystem %,$(shell mpicc --showme:compile))
MPI_CFLAGS = $(eval MPI_CFLAGS := $(MPI_INCLUDES))$(MPI_CFLAGS)
MPI_LIBS = $(eval MPI_LIBS := $(shell mpicc --showme:link))$(MPI_LIBS)
RT_BASEFLAGS := $(BASEFLAGS)
$(B)/obj/runtime/comm/mpi.o $(B)/san/runtime/comm/mpi.o: BASEFLAGS = $(RT_BASEFLAGS) $(MPI_CFLAGS)
# OpenBLAS for GEMMs, cJSON for plans, dlopen for kernels, OpenMP for the kernels,
# OpenMPI and pthreads for the collectives.
RT_LIBS = -lopenblas -lcjson -ldl -fopenmp -lm $(MPI_LIBS) -pthread $(CUDA_LIBS)

$(RT_OBJS) $(RT_SAN_OBJS) $(RT_SRCS:%.c=$(B)/fuzz/obj/%.o) \
    $(RT_CMD_SRCS:%.c=$(B)/obj/%.o): $(RT_HDRS)

$(RT_LIB): $(RT_OBJS)
	@mkdir -p $(dir $@) && rm -f $@
	$(AR) rcs $@ $^

$(RT_SAN_LIB): $(RT_SAN_OBJS)
	@mkdir -p $(dir $@) && rm -f $@
	$(AR) rcs $@ $^

tccrun: $(B)/obj/tools/tccrun.o $(RT_LIB)
	$(CC) $(CFLAGS) -o $@ $^ $(RT_LIBS)

tccdata: $(B)/obj/tools/tccdata.o $(RT_LIB)
	$(CC) $(CFLAGS) -o $@ $^ $(RT_LIBS)

all: tccrun tccdata $(RT_LIB)

# ./tccnvrtc compiles a plan's CUDA kernels with NVRTC and reports their registers and
# spills: only with the CUDA toolkit. tests/unit/test_nvrtc needs it there, for lit.
ifeq ($(HAVE_CUDA),1)
tccnvrtc: $(B)/obj/tools/tccnvrtc.o $(RT_LIB)
	$(CC) $(CFLAGS) -o $@ $^ $(RT_LIBS)

all: tccnvrtc
$(B)/unit/test_nvrtc: | tccnvrtc
endif

# Unit tests link $(RT_SAN_LIB) $(RT_LIBS): build it first, relink when it changes.
$(UNIT_BINS): $(RT_SAN_LIB) $(RT_HDRS)

clean: clean-runtime
clean-runtime:
	rm -f tccrun tccdata tccnvrtc

.PHONY: clean-runtime

# test_runtime and test_match also run ./tccrun.
$(B)/unit/test_runtime $(B)/unit/test_match: | tccrun
# tests/lit/tools/tccdata.test runs ./tccdata: built with the unit tests, it is there for lit.
$(B)/unit/test_data: | tccdata

# tests/lit/comm runs the mpi backend's check under mpirun: built with test_comm, for lit.
# Sanitized, like the unit tests. It checks verdicts with plain MPI, so it includes mpi.h.
$(B)/comm/mpi_check: tests/comm/mpi_check.c $(RT_SAN_LIB) $(RT_HDRS)
	@mkdir -p $(dir $@) && rm -f $@
	$(CC) $(CFLAGS) $(SANFLAGS) $(BASEFLAGS) $(MPI_CFLAGS) -o $@ $< $(RT_SAN_LIB) $(RT_LIBS)
$(B)/unit/test_comm: | $(B)/comm/mpi_check

# The library's loops run in every training step: optimized whatever CFLAGS says
# (the sanitized copy keeps CFLAGS), and the GEMM wrapper's loops on OpenMP's threads.
$(RT_OBJS): CFLAGS += -O2
$(B)/obj/runtime/cpu.o $(B)/san/runtime/cpu.o: BASEFLAGS += -fopenmp
