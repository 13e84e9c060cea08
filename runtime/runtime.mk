# runtime.mk: the runtime, included by the Makefile.
# Builds build/libtccrt.a (and build/libtccrt-san.a, sanitized) from runtime/*.c
# except the commands, and the commands ./tccrun and ./tccdata. Unit tests link
# $(RT_SAN_LIB) $(RT_LIBS). The objects come from the Makefile's pattern rules
# ($(B)/obj/%.o, $(B)/san/%.o).

# Files with a main(): not in the library.
RT_CMD_SRCS := runtime/tccrun.c runtime/tccdata.c
RT_SRCS := $(filter-out $(RT_CMD_SRCS),$(sort $(wildcard runtime/*.c)))
RT_OBJS := $(RT_SRCS:%.c=$(B)/obj/%.o)
RT_SAN_OBJS := $(RT_SRCS:%.c=$(B)/san/%.o)
RT_HDRS := $(wildcard runtime/*.h)
RT_LIB := $(B)/libtccrt.a
RT_SAN_LIB := $(B)/libtccrt-san.a
# OpenBLAS for GEMMs, cJSON for plans, dlopen for kernels, OpenMP for the kernels.
RT_LIBS := -lopenblas -lcjson -ldl -fopenmp -lm

$(RT_OBJS) $(RT_SAN_OBJS) $(RT_SRCS:%.c=$(B)/fuzz/obj/%.o) \
    $(RT_CMD_SRCS:%.c=$(B)/obj/%.o): $(RT_HDRS)

$(RT_LIB): $(RT_OBJS)
	@mkdir -p $(dir $@) && rm -f $@
	$(AR) rcs $@ $^

$(RT_SAN_LIB): $(RT_SAN_OBJS)
	@mkdir -p $(dir $@) && rm -f $@
	$(AR) rcs $@ $^

tccrun: $(B)/obj/runtime/tccrun.o $(RT_LIB)
	$(CC) $(CFLAGS) -o $@ $^ $(RT_LIBS)

tccdata: $(B)/obj/runtime/tccdata.o $(RT_LIB)
	$(CC) $(CFLAGS) -o $@ $^ $(RT_LIBS)

all: tccrun tccdata $(RT_LIB)

# Unit tests link $(RT_SAN_LIB) $(RT_LIBS): build it first, relink when it changes.
$(UNIT_BINS): $(RT_SAN_LIB) $(RT_HDRS)

clean: clean-runtime
clean-runtime:
	rm -f tccrun tccdata

.PHONY: clean-runtime

# test_runtime also runs ./tccrun.
$(B)/unit/test_runtime: | tccrun
# tests/lit/tools/tccdata.test runs ./tccdata: built with the unit tests, it is there for lit.
$(B)/unit/test_data: | tccdata
