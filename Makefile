# quill — build with `make`, test with `make test`.
# The core engine needs only libc, libm and pthreads; the tokenizer's pre-tokenizers use PCRE2, the CLI
# and tests also use cJSON and libedit.

# (the prerequisite rules below would otherwise make their first object the default goal)
.DEFAULT_GOAL := all

# Every target builds on all online cores unless told otherwise: an explicit -jN (or -j1) on the
# command line wins, and a sub-make that already shares a jobserver adds nothing.
ifeq ($(filter -j%,$(MAKEFLAGS)),)
  MAKEFLAGS += -j$(shell nproc 2>/dev/null || echo 1)
endif

CC      ?= cc
BUILD   ?= build
OPT     ?= -O2
# -Werror is for development and CI. `make install` builds without it (a user's newer compiler may
# warn where ours does not); WERROR=0 does the same for any target.
WERROR  ?= 1
WERROR_FLAG = $(if $(filter 1,$(WERROR)),-Werror)
CFLAGS  := -std=c11 $(OPT) -g -Wall -Wextra -D_DEFAULT_SOURCE \
           -D_FILE_OFFSET_BITS=64 -Iinclude -Isrc -pthread -fPIC -MMD -MP $(EXTRA_CFLAGS)
LDLIBS  := -lpcre2-8 -lm -pthread
SAN_FLAGS := -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer

ifeq ($(SAN),1)
  BUILD  := build-san
  OBJ_SAN := $(SAN_FLAGS)
  LDFLAGS += $(SAN_FLAGS)
endif

# Sources are found by folder: src/<layer>/*.c is the library (docs/library.md's layout table), and
# src/kernels/<architecture>/*.c its kernel sets for one architecture.
LIB_SRC  := $(wildcard src/*/*.c src/kernels/*/*.c)
# the quill tool: cli/ (one file per command) and server/ (quill serve)
CLI_SRC  := $(wildcard cli/*.c server/*.c)
TEST_SRC := $(wildcard tests/*.c)
# The Vulkan backend (src/gpu/vulkan/, docs/gpu.md): built when pkg-config finds Vulkan and glslc is on
# the PATH, for the machine itself (a cross build leaves it out); VULKAN=0 leaves it out, VULKAN=1
# insists. Its GLSL compute shaders become SPIR-V at build time, as C arrays in the build folder.
ifeq ($(origin VULKAN),undefined)
  VULKAN := $(if $(and $(filter $(shell uname -m),$(firstword $(subst -, ,$(shell $(CC) -dumpmachine 2>/dev/null)))),$(shell pkg-config --exists vulkan 2>/dev/null && command -v glslc 2>/dev/null)),1,0)
endif
ifeq ($(VULKAN),1)
  LIB_SRC += $(wildcard src/gpu/vulkan/*.c)
  LDLIBS  += $(shell pkg-config --libs vulkan)
  VULKAN_SHADERS := $(wildcard src/gpu/vulkan/shaders/*.comp)
  VULKAN_SPV     := $(VULKAN_SHADERS:src/gpu/vulkan/%=$(BUILD)/gpu/%.inc)
endif
LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/%.o)
CLI_OBJ  := $(CLI_SRC:%.c=$(BUILD)/%.o)
TEST_OBJ := $(TEST_SRC:%.c=$(BUILD)/%.o)

# libquill.so exports only what the public headers mark QUILL_API. The CLI and the tests link the
# static library, where hidden symbols stay visible to the linker, so they may call internals.
$(LIB_OBJ): CFLAGS += -fvisibility=hidden
# The library's flags are set here, so a change here rebuilds it.
$(LIB_OBJ): Makefile

# The version is stated once, in include/quill.h; the SONAME follows the major version.
quill_version_part = $(shell sed -n 's/^\#define QUILL_VERSION_$(1) *\([0-9][0-9]*\).*/\1/p' include/quill.h)
VERSION_MAJOR := $(call quill_version_part,MAJOR)
VERSION       := $(VERSION_MAJOR).$(call quill_version_part,MINOR).$(call quill_version_part,PATCH)
SONAME        := libquill.so.$(VERSION_MAJOR)

# The x86 SIMD kernel sets' files (src/kernels/x86/), compiled with their ISA flags below.
SIMD_OBJ := $(filter $(BUILD)/src/kernels/x86/%.o,$(LIB_OBJ))
# The kernel sets' files (src/kernels/<architecture>/) keep line tables only (-g1: functions and
# lines, for perf annotate and backtraces, without variables): gcc's variable tracking through their
# inlined intrinsics took a third of their compile time (kernels_avx2_exact.c 19.0 s with -g, 12.5 s
# with -g1, 11.3 s without; kernels_vnni_pack.c 34.8, 23.1 and 22.2 s; the gcc build 180 -> 156 s
# of CPU).
KERNEL_SET_OBJ := $(filter $(BUILD)/src/kernels/x86/%.o $(BUILD)/src/kernels/arm/%.o,$(LIB_OBJ))
$(KERNEL_SET_OBJ): CFLAGS += -g1
# Under SAN=1 everything gets ASan and UBSan except the SIMD kernel files, which are compiled
# without either and without debug information (the fuzz build below links the main build's): clang
# needs minutes to instrument their inlined intrinsics (ASan alone: 181 s of CPU for the 8 files
# against 48 s plain, kernels_vnni_pack.c 87 s; UBSan as well: kernels_avx512.c 375 s), which kept
# the suite over its 10 minutes on 2 cores. What a sanitizer could find there, a read or write past
# a buffer, the kernel tests find instead, for every set and in both runs: their matrices,
# activations, outputs and scratch end at a page the process may not touch (test_guarded,
# tests/test.h). Their arithmetic is checked against the scalar kernels, which stay instrumented.
ifeq ($(SAN),1)
$(SIMD_OBJ): OBJ_SAN := -g0
endif

# SIMD kernels live in their own files, compiled for their instruction set and chosen at run time.
# Only those files get ISA flags, and only when the target is x86-64: elsewhere they compile to
# nothing and the scalar kernels run. Code that any CPU may run (the dispatcher, the scalar exact
# model) must stay out of them: tests/test_isa_objects.c checks every other object with objdump.
TARGET_ARCH_NAME := $(shell $(CC) -dumpmachine 2>/dev/null)
ifneq ($(findstring x86_64,$(TARGET_ARCH_NAME)),)
$(BUILD)/src/kernels/x86/kernels_avx2.o:       CFLAGS += -mavx2 -mfma -mf16c
$(BUILD)/src/kernels/x86/kernels_avx2_exact.o: CFLAGS += -mavx2 -mfma -mf16c
$(BUILD)/src/kernels/x86/kernels_avxvnni_exact.o: CFLAGS += -mavx2 -mfma -mf16c -mavxvnni
$(BUILD)/src/kernels/x86/kernels_recurrent_avx2.o: CFLAGS += -mavx2 -mfma
$(BUILD)/src/kernels/x86/kernels_avx512.o:     CFLAGS += -mavx512f -mavx512bw -mavx512vl -mavx512dq -mfma -mf16c
VNNI_FLAGS := -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512vbmi -mavx512vnni -mfma -mf16c
$(BUILD)/src/kernels/x86/kernels_vnni.o:      CFLAGS += $(VNNI_FLAGS)
$(BUILD)/src/kernels/x86/kernels_vnni_pack.o: CFLAGS += $(VNNI_FLAGS)
$(BUILD)/src/kernels/x86/kernels_amx.o:       CFLAGS += $(VNNI_FLAGS) -mamx-tile -mamx-int8 -mamx-bf16
endif
# The same on aarch64 for src/kernels/arm/: NEON is baseline there; the exact products' files get
# the byte products of their set (sdot: ARMv8.2's dotprod; smmla: i8mm).
ifneq ($(findstring aarch64,$(TARGET_ARCH_NAME)),)
$(BUILD)/src/kernels/arm/kernels_dotprod.o: CFLAGS += -march=armv8.2-a+dotprod
$(BUILD)/src/kernels/arm/kernels_i8mm.o:    CFLAGS += -march=armv8.2-a+dotprod+i8mm
# Debian 12's aarch64 gcc 12.2 stops with an internal error vectorising a reduction in this test
$(BUILD)/tests/test_embed.o: CFLAGS += -fno-tree-vectorize
endif

.PHONY: all test test-san fuzz clean run bench-probe bench-batched deps cross cross-test install uninstall examples
all: $(BUILD)/libquill.a $(BUILD)/libquill.so $(BUILD)/quill $(BUILD)/quill_test

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(OBJ_SAN) $(WERROR_FLAG) -c $< -o $@

ifeq ($(VULKAN),1)
$(BUILD)/gpu/shaders/%.comp.inc: src/gpu/vulkan/shaders/%.comp $(wildcard src/gpu/vulkan/shaders/*.glsl) Makefile
	@mkdir -p $(dir $@)
	glslc -O --target-env=vulkan1.0 -mfmt=c $< -o $@
$(filter $(BUILD)/src/gpu/%,$(LIB_OBJ)): CFLAGS += -DQUILL_VULKAN -I$(BUILD)/gpu $(shell pkg-config --cflags vulkan)
$(BUILD)/src/gpu/vulkan/vulkan.o: $(VULKAN_SPV)
endif
# A build made before Vulkan was installed (or with VULKAN=0) holds gpu/absent.o compiled as the
# stand-in; the stamp changes with the choice, so the GPU objects are rebuilt when it does.
VULKAN_STAMP := $(BUILD)/vulkan-$(VULKAN).stamp
$(VULKAN_STAMP):
	@mkdir -p $(dir $@) && rm -f $(BUILD)/vulkan-*.stamp && touch $@
$(filter $(BUILD)/src/gpu/%,$(LIB_OBJ)): $(VULKAN_STAMP)

$(BUILD)/libquill.a: $(LIB_OBJ)
	rm -f $@ && ar rcs $@ $^

$(BUILD)/libquill.so: $(LIB_OBJ)
	$(CC) -shared $(LDFLAGS) -Wl,-soname,$(SONAME) -o $@ $^ $(LDLIBS)

$(BUILD)/quill: $(CLI_OBJ) $(BUILD)/libquill.a
	$(CC) $(LDFLAGS) -o $@ $^ -lmicrohttpd -lcjson -ledit $(LDLIBS)

$(BUILD)/quill_test: $(TEST_OBJ) $(BUILD)/libquill.a
	$(CC) $(LDFLAGS) -o $@ $^ -lcjson $(LDLIBS)

# The kernel tests alone, which make cross-test runs under qemu (the rest of the suite's aarch64
# build would only cost it minutes).
KERNEL_TEST_OBJ := $(addprefix $(BUILD)/tests/,test_main.o test_kernels.o test_kernels_exact.o test_kernels_arm.o \
                     test_kernel_choice.o)
$(BUILD)/quill_kernel_test: $(KERNEL_TEST_OBJ) $(BUILD)/libquill.a
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

# The whole suite: the normal build, then the same tests under ASan + UBSan, and the rest
# (tests/run_all.sh builds them all: the sanitizer build starts beside the normal one).
# Scripts that run make themselves get MAKEFLAGS without this make's jobserver, which they cannot
# reach (a plain recipe, not $(MAKE)): their own -j then applies without a warning.
SCRIPT_MAKEFLAGS = MAKEFLAGS='$(filter-out -j% --jobserver%,$(MAKEFLAGS))'
test:
	@$(SCRIPT_MAKEFLAGS) ./tests/run_all.sh

# The Debian packages of the build, tests and CI (the list: scripts/debian-packages.txt).
deps:
	./scripts/install-deps.sh

# The main job needs only the CLI (not the test suite).
run: $(BUILD)/quill
	./$(BUILD)/quill run -m ../shared/models/stories260K.gguf -p "Once upon a time" -n 64 --temp 0

# Batched decoding measured as the reference's llama-batched-bench does it (bench/vs_ref.sh).
bench-batched: $(BUILD)/quill_batched
$(BUILD)/quill_batched: $(BUILD)/bench/batched.o $(BUILD)/libquill.a
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

# ---------------------------------------------------------------- install (docs/library.md)
PREFIX       ?= /usr/local
BINDIR       ?= $(PREFIX)/bin
LIBDIR       ?= $(PREFIX)/lib
INCLUDEDIR   ?= $(PREFIX)/include
MANDIR       ?= $(PREFIX)/share/man
PKGCONFIGDIR ?= $(LIBDIR)/pkgconfig
PUBLIC_HEADERS := $(wildcard include/*.h)

install: WERROR = 0
install: $(BUILD)/libquill.a $(BUILD)/libquill.so $(BUILD)/quill
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(LIBDIR) $(DESTDIR)$(INCLUDEDIR) $(DESTDIR)$(MANDIR)/man1 \
	    $(DESTDIR)$(PKGCONFIGDIR)
	install -m 755 $(BUILD)/quill $(DESTDIR)$(BINDIR)/quill
	install -m 644 $(BUILD)/libquill.a $(DESTDIR)$(LIBDIR)/libquill.a
	install -m 755 $(BUILD)/libquill.so $(DESTDIR)$(LIBDIR)/libquill.so.$(VERSION)
	ln -sf libquill.so.$(VERSION) $(DESTDIR)$(LIBDIR)/$(SONAME)
	ln -sf $(SONAME) $(DESTDIR)$(LIBDIR)/libquill.so
	install -m 644 $(PUBLIC_HEADERS) $(DESTDIR)$(INCLUDEDIR)/
	install -m 644 packaging/quill.1 $(DESTDIR)$(MANDIR)/man1/quill.1
	sed -e 's|@PREFIX@|$(PREFIX)|; s|@LIBDIR@|$(LIBDIR)|; s|@INCLUDEDIR@|$(INCLUDEDIR)|' \
	    -e 's|@VERSION@|$(VERSION)|; s|@LIBS_PRIVATE@|$(LDLIBS)|' packaging/quill.pc.in > $(DESTDIR)$(PKGCONFIGDIR)/quill.pc

uninstall:
	rm -f $(DESTDIR)$(BINDIR)/quill $(DESTDIR)$(LIBDIR)/libquill.a $(DESTDIR)$(LIBDIR)/libquill.so \
	    $(DESTDIR)$(LIBDIR)/$(SONAME) $(DESTDIR)$(LIBDIR)/libquill.so.$(VERSION) \
	    $(addprefix $(DESTDIR)$(INCLUDEDIR)/,$(notdir $(PUBLIC_HEADERS))) $(DESTDIR)$(MANDIR)/man1/quill.1 \
	    $(DESTDIR)$(PKGCONFIGDIR)/quill.pc

# The examples, built against this tree (the suite also builds them against an installed copy).
EXAMPLES := $(patsubst examples/%.c,$(BUILD)/examples/%,$(wildcard examples/*.c))
examples: $(EXAMPLES)
$(BUILD)/examples/%: examples/%.c $(BUILD)/libquill.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(WERROR_FLAG) $(LDFLAGS) -o $@ $< $(BUILD)/libquill.a $(LDLIBS)

# The tile unit's costs on this machine, apart from quill (see bench/amx_probe.c and bench/README.md),
# the vnni set's one-token product on one matrix, apart from the model (bench/decode_probe.c), a
# set's one-token product of an unpacked type from the file's rows (bench/unpack_probe.c), and
# what a streaming loop with a product's work per line keeps of a plain read (bench/stream_probe.c).
bench-probe: $(BUILD)/amx_probe $(BUILD)/decode_probe $(BUILD)/stream_probe $(BUILD)/unpack_probe
$(BUILD)/stream_probe: bench/stream_probe.c cli/plain_read.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(WERROR_FLAG) $(LDFLAGS) -o $@ $< $(LDLIBS)
$(BUILD)/decode_probe: bench/decode_probe.c $(BUILD)/libquill.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(WERROR_FLAG) $(LDFLAGS) -o $@ $< $(BUILD)/libquill.a $(LDLIBS)
$(BUILD)/unpack_probe: bench/unpack_probe.c $(BUILD)/libquill.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(WERROR_FLAG) $(LDFLAGS) -o $@ $< $(BUILD)/libquill.a $(LDLIBS)
# The instructions of one exact product under qemu, for the aarch64 sets (bench/arm_insns.sh builds it
# with the cross compiler: BUILD=build-arm64-test).
$(BUILD)/insn_probe: bench/insn_probe.c $(BUILD)/libquill.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(WERROR_FLAG) $(LDFLAGS) -o $@ $< $(BUILD)/libquill.a $(LDLIBS)
$(BUILD)/amx_probe: bench/amx_probe.c
	@mkdir -p $(dir $@)
	$(CC) -std=c11 -D_DEFAULT_SOURCE $(OPT) -Wall -Wextra -Werror -mavx512f -mamx-tile -mamx-bf16 -o $@ $<

# Compile-only check that the library builds for a 64-bit target other than x86-64, with the scalar
# kernels alone (tests/run_all.sh runs it where the cross compiler is installed; CI installs it).
CROSS_CC ?= aarch64-linux-gnu-gcc
cross:
	$(MAKE) -s CC=$(CROSS_CC) BUILD=build-arm64 build-arm64/libquill.a

# The aarch64 build run under qemu-user: the kernel tests of the dotprod, i8mm and scalar sets and
# two models' logits against this build's, bit for bit (tests/cross_test.sh; tests/run_all.sh runs
# it where qemu-aarch64 is installed).
CROSS_BUILD ?= build-arm64-test
cross-test: $(BUILD)/quill
	CROSS_CC=$(CROSS_CC) HOST_BUILD=$(BUILD) ARM_BUILD=$(CROSS_BUILD) ./tests/cross_test.sh

# libFuzzer targets (clang): every fuzz/fuzz_*.c is one (a new target is a new file; see
# fuzz/README.md). They link the whole library, the CLI's option parser and the server's request
# parser, compiled again by clang into build-fuzz/ with coverage and sanitizers, so a target never
# lists the sources it reaches. The SIMD kernel files are the main build's objects, copied: no
# parser runs in them, clang needs minutes per file to instrument their intrinsics, and compiling
# them again uninstrumented took 39 s of the fuzz build's CPU. `make fuzz-smoke` builds
# the targets and runs each for FUZZ_RUNS inputs from a fixed seed (the suite does, through fuzz/smoke.sh).
FUZZ_BUILD   := build-fuzz
FUZZ_SAN     := -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
FUZZ_TARGETS := $(patsubst fuzz/%.c,$(FUZZ_BUILD)/%,$(wildcard fuzz/fuzz_*.c))
FUZZ_SUPPORT := $(addprefix $(FUZZ_BUILD)/,cli/options.o cli/util.o server/request.o server/translate.o server/util.o)
FUZZ_RUNS ?= 60000
ifeq ($(BUILD),$(FUZZ_BUILD))
$(filter-out $(SIMD_OBJ),$(LIB_OBJ)) $(FUZZ_SUPPORT): CFLAGS += $(FUZZ_SAN)
endif
ifneq ($(SIMD_FROM),)
$(SIMD_OBJ): $(BUILD)/src/kernels/x86/%.o: $(SIMD_FROM)/src/kernels/x86/%.o
	@mkdir -p $(@D)
	cp $< $@
endif
.PHONY: fuzz-targets fuzz-smoke
fuzz: $(SIMD_OBJ)
	$(MAKE) CC=clang BUILD=$(FUZZ_BUILD) OPT=-O1 SIMD_FROM=$(BUILD) fuzz-targets
fuzz-targets: $(FUZZ_TARGETS)
$(FUZZ_BUILD)/fuzz_%: fuzz/fuzz_%.c $(FUZZ_SUPPORT) $(FUZZ_BUILD)/libquill.a
	$(CC) $(CFLAGS) $(FUZZ_SAN) -fsanitize=fuzzer $(WERROR_FLAG) -I. -Icli -o $@ $^ -lcjson $(LDLIBS)
fuzz-smoke: fuzz
	FUZZ_RUNS=$(FUZZ_RUNS) ./fuzz/smoke.sh

-include $(wildcard $(BUILD)/*/*.d $(BUILD)/*/*/*.d $(BUILD)/*/*/*/*.d)

clean:
	rm -rf build build-san $(FUZZ_BUILD) build-arm64 build-arm64-test
