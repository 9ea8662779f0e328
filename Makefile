# prefetchd — one non-recursive Makefile.  Objects go under build/, the
# protobuf-c code is generated from proto/*.proto at build time.
#
#   make            build everything (CUDA=1 when nvcc/the toolkit is found)
#   make CUDA=0     build without the CUDA toolkit
#   make run        build, generate a demo dataset, serve it, bench one epoch
#   make serve / make stop   the demo daemon in the background, and its stop
#   make check      the whole test suite, Python's included (CUDA tests skip
#                   without a GPU)
#   make check-cuda the CUDA tests, C and torch (needs a GPU)
#   make bench-host / bench-cuda / bench-train / bench-linger / bench-cold / bench-multi /
#   bench-node
#   make install PREFIX=/usr/local DESTDIR=   (builds only what it installs;
#                   PYTHONDIR=DIR puts the Python package there too)
#   make uninstall PREFIX=/usr/local DESTDIR=
#   make deps       install every package any target needs (tools/deps.sh)
#   NO_DEPS=1       skip tools/deps.sh (a system it does not know, with the
#                   packages installed by hand)
#   V=1             show the commands

PREFIX  ?= /usr/local
DESTDIR ?=
BINDIR  ?= $(PREFIX)/bin
LIBDIR  ?= $(PREFIX)/lib
INCDIR  ?= $(PREFIX)/include
UNITDIR ?= $(PREFIX)/lib/systemd/system
MANDIR  ?= $(PREFIX)/share/man
DOCDIR  ?= $(PREFIX)/share/doc/prefetchd
# The Python package is installed only into a directory named here (e.g.
# PYTHONDIR=/usr/local/lib/python3.11/dist-packages); left empty, `make
# install` prints how to pip-install it.  Debian's own pip refuses to install
# into the system's Python (PEP 668), and a venv is where a trainer's
# packages belong, so nothing is put into a Python behind the user's back.
PYTHONDIR ?=
PY_FILES := $(sort $(wildcard python/prefetch/*.py))
B       := build
VERSION := 0.1.0

CUDA_HOME ?= /usr/local/cuda
ifeq ($(origin CUDA),undefined)
CUDA := $(shell test -f $(CUDA_HOME)/include/cuda_runtime.h && test -f $(CUDA_HOME)/lib64/libcudart_static.a && echo 1 || echo 0)
endif

ifeq ($(V),1)
Q :=
say :=
else
Q := @
say = @printf '  %-7s %s\n' $(1) $(2);
endif

CC      ?= cc
PKGS    := libuv libprotobuf-c inih libsystemd liburing
PKG_CFLAGS := $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS   := $(shell pkg-config --libs $(PKGS) 2>/dev/null)
CMOCKA_LIBS := $(shell pkg-config --libs cmocka 2>/dev/null || echo -lcmocka)

WARN    := -Wall -Wextra -Wshadow -Wstrict-prototypes -Wmissing-prototypes \
           -Wno-unused-parameter
ifneq ($(CI),)
WARN    += -Werror
endif
CFLAGS  ?= -O2 -g
ALL_CFLAGS := -std=gnu11 $(WARN) $(CFLAGS) -fPIC -fvisibility=hidden \
           -D_GNU_SOURCE -DPF_VERSION='"$(VERSION)"' -MMD -MP \
           -I$(B)/gen -Iproto -Idaemon -Iclient $(PKG_CFLAGS)
LDLIBS  := -lpthread -lm

# The gather kernel: sm_90 code for Hopper, plus compute_90 PTX that newer
# GPUs compile at load.  No exceptions or thread-safe statics, so that the
# object links with cc and needs no libstdc++.
NVCC    ?= $(CUDA_HOME)/bin/nvcc
NVCC_GENCODE ?= -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90
NVCC_FLAGS := -O3 -std=c++17 $(NVCC_GENCODE) -Xcompiler -fPIC,-fno-exceptions,-fno-threadsafe-statics \
           -Idaemon -Iproto -MMD -MP

ifeq ($(CUDA),1)
CUDA_CFLAGS := -DPF_CUDA=1 -I$(CUDA_HOME)/include
CUDA_LIBS   := -L$(CUDA_HOME)/lib64 -lcudart_static -ldl -lrt
GPU_SRC     := daemon/gpu/gpu.c
GATHER_OBJ  := $(B)/daemon/gpu/gather.o
else
CUDA_CFLAGS := -DPF_CUDA=0
CUDA_LIBS   :=
GPU_SRC     := daemon/gpu/gpu_none.c
GATHER_OBJ  :=
endif

# ---- sources -------------------------------------------------------------
PROTO_SRC   := $(wildcard proto/*.proto)
GEN_C       := $(patsubst proto/%.proto,$(B)/gen/%.pb-c.c,$(PROTO_SRC))
GEN_H       := $(GEN_C:.c=.h)
WIRE_OBJ    := $(B)/gen/prefetch.pb-c.o $(B)/proto/wire.o

# Every daemon/*/*.c is part of the daemon core except the entry point and the
# two interchangeable GPU back ends (real, none); the third, the fake GPU
# of the unit tests, is tests/mocks/gpu_fake.c.
DAEMON_CORE := $(filter-out daemon/server/main.c daemon/gpu/gpu.c daemon/gpu/gpu_none.c,\
                 $(wildcard daemon/*/*.c))
DAEMON_OBJ  := $(DAEMON_CORE:%.c=$(B)/%.o)
GPU_OBJ     := $(GPU_SRC:%.c=$(B)/%.o) $(GATHER_OBJ)
# prefetchctl is its main file and client/ctl_*.c, linked with the library
# but not part of it.
CLIENT_SRC  := $(filter-out client/prefetchctl.c client/ctl_%.c,$(wildcard client/*.c))
CLIENT_OBJ  := $(CLIENT_SRC:%.c=$(B)/%.o)
# The client's gather kernel (daemon/gpu/gather.cu built as a module), embedded
# in the library as a byte array.
ifeq ($(CUDA),1)
CLIENT_OBJ  += $(B)/client/gather_fatbin.o
endif
CTL_OBJ     := $(patsubst %.c,$(B)/%.o,client/prefetchctl.c $(wildcard client/ctl_*.c))

# Tests by kind, each binary at build/tests/NAME:
#   tests/unit/         one module (or a few) linked with the fake GPU
#   tests/integration/  a real prefetchd driven through libprefetch
#   tests/cuda/         the same on a real GPU (they skip without one)
#   tests/mocks/        the fake GPU (gpu_fake.c) and the client's fake CUDA
#                       side (pfcuda_fake.c);  tests/lib/  testutil, shared with bench/
UNIT_TESTS  := $(patsubst tests/unit/%.c,$(B)/tests/%,$(wildcard tests/unit/test_*.c))
INTEG_TESTS := $(patsubst tests/integration/%.c,$(B)/tests/%,$(wildcard tests/integration/test_*.c))
CUDA_TESTS  := $(patsubst tests/cuda/%.c,$(B)/tests/%,$(wildcard tests/cuda/test_*.c))
# The one CUDA test of the GPU layer itself, linked with it, not with a daemon.
GPU_TESTS   := $(filter $(B)/tests/test_cuda_gather,$(CUDA_TESTS))
TEST_UTIL   := $(patsubst %.c,$(B)/%.o,$(wildcard tests/lib/*.c))
GPU_FAKE    := $(B)/tests/mocks/gpu_fake.o
# The client's side of the same: libprefetch's objects with the fake CUDA
# side (tests/mocks/pfcuda_fake.c) in place of client/cuda*.c (cuda.c,
# cuda_ipc.c, cuda_gather.c: every CUDA call of the library, pfcuda.h's
# whole interface) and the embedded kernel, for the unit tests of the
# client's device paths, which link it instead of libprefetch.a and no
# daemon.
PFCUDA_FAKE := $(B)/tests/mocks/pfcuda_fake.o
CLIENT_CUDA_OBJ := $(filter $(B)/client/cuda%.o,$(CLIENT_OBJ)) $(B)/client/gather_fatbin.o
CLIENT_FAKE_OBJ := $(filter-out $(CLIENT_CUDA_OBJ),$(CLIENT_OBJ)) $(PFCUDA_FAKE)
CLIENT_FAKE_TESTS := $(B)/tests/test_client_cuda $(B)/tests/test_pfcuda_fake
# Programs the tests run, not tests (run.sh is not given them):
# build/tests/bystander is tests/lib/bystander.c from the command line, for
# the Python tests (tests/integration/bystander_main.c).
TEST_PROGS  := $(B)/tests/bystander
BENCHES     := $(patsubst bench/%.c,$(B)/bench/%,$(wildcard bench/*.c))
TOOLS       := $(patsubst tools/%.c,$(B)/%,$(wildcard tools/*.c))

PROGS := $(B)/prefetchd $(B)/prefetchctl $(B)/libprefetch.so $(B)/libprefetch.a \
         $(B)/libprefetch.pc $(TOOLS)

.SECONDARY:
.PHONY: all run serve stop check check-unit check-integration check-cuda bench-host bench-cuda bench-train bench-linger bench-cold bench-multi bench-node \
        install uninstall clean deps format
all: $(PROGS) $(UNIT_TESTS) $(INTEG_TESTS) $(CUDA_TESTS) $(TEST_PROGS) $(BENCHES)

# ---- generated protocol code ---------------------------------------------
$(B)/gen/%.pb-c.c $(B)/gen/%.pb-c.h: proto/%.proto
	$(call say,PROTOC,$<)mkdir -p $(B)/gen && protoc-c --proto_path=proto --c_out=$(B)/gen $<

# Everything that includes the generated header must wait for it.
$(DAEMON_OBJ) $(filter-out $(GATHER_OBJ),$(GPU_OBJ)) $(CLIENT_OBJ) $(B)/daemon/server/main.o $(CTL_OBJ) \
$(B)/proto/wire.o $(TEST_UTIL): $(GEN_H)
$(B)/tests/%.o $(B)/bench/%.o $(B)/tools/%.o: $(GEN_H)
# Tests and benches share tests/lib and tools/npygen.h; tests the fakes'
# own hooks (tests/mocks/*.h).
$(B)/tests/%.o $(B)/bench/%.o: ALL_CFLAGS += -Itests/lib -Itools
$(B)/tests/%.o: ALL_CFLAGS += -Itests/mocks

# ---- compile ---------------------------------------------------------------
$(B)/gen/%.o: $(B)/gen/%.c
	$(call say,CC,$<)$(CC) $(ALL_CFLAGS) -Wno-missing-prototypes -c -o $@ $<
$(B)/daemon/gpu/gpu.o: daemon/gpu/gpu.c
	@mkdir -p $(@D)
	$(call say,CC,$<)$(CC) $(ALL_CFLAGS) $(CUDA_CFLAGS) -c -o $@ $<
$(B)/%.o: %.c
	@mkdir -p $(@D)
	$(call say,CC,$<)$(CC) $(ALL_CFLAGS) $(CUDA_CFLAGS) -c -o $@ $<
$(B)/daemon/gpu/gather.o: daemon/gpu/gather.cu
	@mkdir -p $(@D)
	$(call say,NVCC,$<)$(NVCC) $(NVCC_FLAGS) -MF $(@:.o=.d) -c -o $@ $<

$(B)/client/gather.fatbin: daemon/gpu/gather.cu
	@mkdir -p $(@D)
	$(call say,NVCC,$@)$(NVCC) $(NVCC_FLAGS) -DGATHER_MODULE -MF $(@:.fatbin=.fatbin.d) -fatbin -o $@ $<
$(B)/client/gather_fatbin.c: $(B)/client/gather.fatbin
	$(call say,GEN,$@){ echo '/* generated from $< */'; \
	  echo '__attribute__((aligned(8), visibility("hidden"))) extern const unsigned char pf_gather_fatbin[];'; \
	  echo '__attribute__((aligned(8))) const unsigned char pf_gather_fatbin[] = {'; \
	  od -An -v -tx1 $< | sed 's/\([0-9a-f][0-9a-f]\)/0x\1,/g'; echo '};'; } > $@.tmp && mv $@.tmp $@
$(B)/client/gather_fatbin.o: $(B)/client/gather_fatbin.c
	$(call say,CC,$<)$(CC) $(ALL_CFLAGS) -c -o $@ $<
-include $(B)/client/gather.fatbin.d

# ---- link ------------------------------------------------------------------
$(B)/prefetchd: $(B)/daemon/server/main.o $(DAEMON_OBJ) $(GPU_OBJ) $(WIRE_OBJ)
	$(call say,LD,$@)$(CC) -o $@ $^ $(PKG_LIBS) $(CUDA_LIBS) $(LDLIBS)
$(B)/libprefetch.so: $(CLIENT_OBJ) $(WIRE_OBJ)
	$(call say,LD,$@)$(CC) -shared -Wl,-soname,libprefetch.so.0 -o $@ $^ \
	  $(shell pkg-config --libs libprotobuf-c) -ldl $(LDLIBS)
$(B)/libprefetch.a: $(CLIENT_OBJ) $(WIRE_OBJ)
	$(call say,AR,$@)rm -f $@ && ar rcs $@ $^
$(B)/prefetchctl: $(CTL_OBJ) $(B)/libprefetch.a
	$(call say,LD,$@)$(CC) -o $@ $^ $(shell pkg-config --libs libprotobuf-c) -ldl $(LDLIBS)
# pforder prints the daemon's own orders (daemon/order/order.c), for checking
# other implementations against it.
$(B)/pforder: $(B)/tools/pforder.o $(B)/daemon/order/order.o
	$(call say,LD,$@)$(CC) -o $@ $^ $(LDLIBS)
$(B)/%: $(B)/tools/%.o
	$(call say,LD,$@)$(CC) -o $@ $^ $(LDLIBS)
# The .pc names its directories relative to ${prefix} where they lie under
# PREFIX (pkg-config --define-prefix then finds a relocated tree).  It is
# made again whenever PREFIX, LIBDIR or INCDIR differ from the ones it holds
# (FORCE, then replaced only when it changed): `make` then `make install
# PREFIX=/usr` must not install the first one's paths.
pc_rel = $(patsubst $(PREFIX)/%,$${prefix}/%,$(1))
$(B)/libprefetch.pc: client/libprefetch.pc.in Makefile FORCE
	$(Q)mkdir -p $(B) && sed -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@LIBDIR@|$(call pc_rel,$(LIBDIR))|g' \
	  -e 's|@INCDIR@|$(call pc_rel,$(INCDIR))|g' -e 's|@VERSION@|$(VERSION)|g' $< > $@.tmp
	$(Q)if cmp -s $@.tmp $@; then rm -f $@.tmp; else mv $@.tmp $@ && printf '  %-7s %s\n' GEN $@; fi
.PHONY: FORCE
FORCE:

# Unit tests link the daemon core against the fake GPU; integration and CUDA
# tests drive the real daemon through libprefetch.  (Static pattern rules: a
# plain `test_integration%` would not match test_integration itself.)
$(filter-out $(CLIENT_FAKE_TESTS),$(UNIT_TESTS)): $(B)/tests/%: $(B)/tests/unit/%.o $(DAEMON_OBJ) $(GPU_FAKE) \
		$(WIRE_OBJ) $(TEST_UTIL) $(B)/libprefetch.a
	$(call say,LD,$@)$(CC) -o $@ $(filter %.o,$^) $(B)/libprefetch.a $(PKG_LIBS) $(CMOCKA_LIBS) -ldl $(LDLIBS)
# ... except the client's device paths, on the fake CUDA side (no daemon, no
# driver to load, and the same with CUDA=0).
$(CLIENT_FAKE_TESTS): $(B)/tests/%: $(B)/tests/unit/%.o $(CLIENT_FAKE_OBJ) $(WIRE_OBJ)
	$(call say,LD,$@)$(CC) -o $@ $(filter %.o,$^) $(shell pkg-config --libs libprotobuf-c) \
	  $(CMOCKA_LIBS) $(LDLIBS)
$(INTEG_TESTS): $(B)/tests/%: $(B)/tests/integration/%.o $(TEST_UTIL) $(B)/libprefetch.a $(B)/prefetchd
	$(call say,LD,$@)$(CC) -o $@ $(filter %.o,$^) $(B)/libprefetch.a $(PKG_LIBS) $(CMOCKA_LIBS) -ldl $(LDLIBS)
# The block_shuffle test compares what the daemon delivers with the order
# the daemon's own order.c builds for the same request.
$(B)/tests/test_integration_block: $(B)/daemon/order/order.o
$(B)/tests/bystander: $(B)/tests/integration/bystander_main.o $(TEST_UTIL) $(B)/libprefetch.a
	$(call say,LD,$@)$(CC) -o $@ $(filter %.o,$^) $(B)/libprefetch.a \
	  $(shell pkg-config --libs libprotobuf-c) -ldl $(LDLIBS)
# CUDA tests' trainers also queue GPU work of their own through the runtime.
$(filter-out $(GPU_TESTS),$(CUDA_TESTS)): $(B)/tests/%: $(B)/tests/cuda/%.o $(TEST_UTIL) $(B)/libprefetch.a $(B)/prefetchd
	$(call say,LD,$@)$(CC) -o $@ $(filter %.o,$^) $(B)/libprefetch.a $(PKG_LIBS) $(CMOCKA_LIBS) $(CUDA_LIBS) -ldl $(LDLIBS)
# ... except the GPU layer's own: the real back end and kernel (gpu_none.o
# with CUDA=0, where it skips), with no daemon around them.
$(GPU_TESTS): $(B)/tests/%: $(B)/tests/cuda/%.o $(GPU_OBJ) $(B)/daemon/base/log.o
	$(call say,LD,$@)$(CC) -o $@ $^ $(CMOCKA_LIBS) $(CUDA_LIBS) -ldl $(LDLIBS)
# Benches get the CUDA runtime (static) for their raw-copy references; one
# that never calls it pulls nothing from the archive.
$(B)/bench/%: $(B)/bench/%.o $(B)/libprefetch.a $(TEST_UTIL)
	$(call say,LD,$@)$(CC) -o $@ $(filter %.o,$^) $(B)/libprefetch.a $(shell pkg-config --libs libprotobuf-c) $(CUDA_LIBS) -ldl $(LDLIBS)

# ---- Python tests -------------------------------------------------------------
# tests/python/test_*.py run through tests/python/run.py, which reports as
# cmocka does, from wrapper scripts in build/tests that run.sh runs like the
# test binaries.  Each runs under the first of PY_CANDIDATES that imports
# what it needs and what it would like (torch: without it the CUDA cases
# skip, saying so), else the first that imports what it needs, looked up
# whenever a check target runs (so a module installed since is found); with
# none, plain python3, and the test says what is missing.
PY_CANDIDATES := python3 /usr/bin/python3
py_imports = for p in $(PY_CANDIDATES); do \
  $$p -c 'import sys; [__import__(m) for m in sys.argv[1:]]' $(1) >/dev/null 2>&1 && \
  { command -v $$p; exit 0; }; done
find_python = $(shell $(call py_imports,$(1) $(2)); $(call py_imports,$(1)); echo python3)
PY_HOST := $(B)/tests/py_host
PY_CUDA := $(B)/tests/py_torch_cuda
UNITS_TEST := $(B)/tests/units
PY_ORDER := $(B)/tests/py_order
DEPS_TEST := $(B)/tests/deps
PY_INSTALL := $(B)/tests/py_install
PY_README := $(B)/tests/py_readme

# $(1): the modules the test needs, $(2): the test file, $(3): modules it
# would like.
define py_wrapper
	@mkdir -p $(@D)
	$(call say,GEN,$@)printf '#!/bin/sh\nexec %s -B %s %s "$$@"\n' '$(call find_python,$(1),$(3))' \
	  '$(CURDIR)/tests/python/run.py' '$(CURDIR)/tests/python/$(2)' > $@.tmp && \
	  chmod +x $@.tmp && mv $@.tmp $@
endef

# What `make install` and deploy/ give, checked by shell scripts
# (tests/install/test_NAME.sh, run as build/tests/sh_NAME): the installed
# tree and its .pc, the man pages, the example configuration, the container
# recipe.  They get the repository, the build directory and this build's
# CUDA setting, for the scripts that run make themselves.
SH_TESTS := $(patsubst tests/install/test_%.sh,$(B)/tests/sh_%,$(wildcard tests/install/test_*.sh))
.PHONY: $(SH_TESTS)
$(SH_TESTS): $(B)/tests/sh_%:
	@mkdir -p $(@D)
	$(call say,GEN,$@)printf '#!/bin/sh\nexec sh %s %s %s CUDA=%s\n' '$(CURDIR)/tests/install/test_$*.sh' \
	  '$(CURDIR)' '$(abspath $(B))' '$(CUDA)' > $@.tmp && chmod +x $@.tmp && mv $@.tmp $@

.PHONY: $(PY_HOST) $(PY_CUDA) $(UNITS_TEST) $(PY_ORDER) $(DEPS_TEST) $(PY_INSTALL) $(PY_README)
$(PY_ORDER):
	$(call py_wrapper,numpy,test_order.py)
# The systemd units, checked with systemd-analyze (tests/units.sh).
$(UNITS_TEST):
	@mkdir -p $(@D)
	$(call say,GEN,$@)printf '#!/bin/sh\nexec sh %s %s %s\n' '$(CURDIR)/tests/units.sh' '$(CURDIR)' \
	  '$(abspath $(B))' > $@.tmp && chmod +x $@.tmp && mv $@.tmp $@
# tools/deps.sh's choice of packages on the os-release files of the systems
# it knows and of some it does not (tests/deps.sh); it installs nothing.
$(DEPS_TEST):
	@mkdir -p $(@D)
	$(call say,GEN,$@)printf '#!/bin/sh\nexec sh %s %s\n' '$(CURDIR)/tests/deps.sh' '$(CURDIR)' \
	  > $@.tmp && chmod +x $@.tmp && mv $@.tmp $@
# torch is welcome (the torch.DataLoader adapter's case skips without it).
$(PY_HOST):
	$(call py_wrapper,numpy,test_host.py,torch)
$(PY_CUDA):
	$(call py_wrapper,numpy,test_torch_cuda.py,torch)
# make install and the venv + pip install of python/ (python3-venv,
# python3-pip): under a Python that has venv's ensurepip.
$(PY_INSTALL):
	$(call py_wrapper,numpy venv ensurepip,test_install.py)
# README.md's quick start, run as written in a copy of the checkout.
$(PY_README):
	$(call py_wrapper,numpy,test_readme.py)

# ---- user targets -----------------------------------------------------------
# Each target that builds or tests first runs tools/deps.sh with the groups
# of packages it needs (build, test, clang: the script says which packages
# each is on this system), then builds in a new make, whose pkg-config
# flags are read after the install.
ifeq ($(NO_DEPS),)
INSTALL_DEPS := sh tools/deps.sh
else
INSTALL_DEPS := :
endif

deps:
	@$(INSTALL_DEPS) build test clang

# The demo needs the programs, not the tests (nor cmocka to link them).
run:
	@$(INSTALL_DEPS) build
	@$(MAKE) --no-print-directory $(PROGS)
	@sh tools/demo.sh

# The demo daemon in the background, for a trainer of one's own (README's
# quick start), and its stop.
serve:
	@$(INSTALL_DEPS) build
	@$(MAKE) --no-print-directory $(PROGS)
	@sh tools/demo.sh serve

stop:
	@sh tools/demo.sh stop

check:
	@$(INSTALL_DEPS) build test
	@$(MAKE) --no-print-directory all $(PY_HOST) $(PY_CUDA) $(UNITS_TEST) $(PY_ORDER) $(DEPS_TEST) \
	  $(SH_TESTS) $(PY_INSTALL) $(PY_README)
	@sh tests/run.sh $(UNIT_TESTS) $(INTEG_TESTS) $(CUDA_TESTS) $(PY_HOST) $(PY_CUDA) \
	  $(UNITS_TEST) $(PY_ORDER) $(DEPS_TEST) $(SH_TESTS) $(PY_INSTALL) $(PY_README)

check-cuda: all $(PY_CUDA)
	@PF_REQUIRE_GPU=1 sh tests/run.sh $(CUDA_TESTS) $(PY_CUDA)

bench-host: all
	@$(B)/bench/host_throughput

bench-cuda: all
	@$(B)/bench/cuda_throughput

# A compute-bound PyTorch training step fed by prefetchd (pool off and on),
# by the DataLoader, and in a tight loop; with the readers x ring_bytes
# sweep next to the default configuration (GPU machine, torch).  Then eager
# training steps (MLPs, small GPTs on token shards, a CUDA-graph step) whose
# CPU runs ahead of the GPU, against the same steps on batches already there.
bench-train: all
	@python3 bench/train_step.py
	@python3 bench/eager_step.py

# Trainers that come back (a new process and Loader each epoch) with the
# pool lingering and without it; a dataset twice its pool budget.
bench-linger: all
	@python3 bench/pool_linger.py

# One daemon, a trainer per GPU: one alone, then two at once (rate, and the
# step overhead on both), against the host's own gather limit (2 GPUs).
bench-multi: all
	@python3 bench/multi_gpu.py

# A node's worth of trainers on one GPU: N = 1, 2, 4, 8, 16 processes, each
# its own Loader and seed, default configuration, pool off and on: aggregate
# GB/s against the pinned limit, first batches, the daemon's CPU per GB, and
# the eager MLP step in every process against the same N compute-only.
# Then a sweep's trainers (one seed) as independent sessions and as one
# share: aggregate batches/s, the daemon's CPU and bytes, the step.
bench-node: all
	@python3 bench/node.py
	@python3 bench/share.py

# A 16 GiB dataset read with read = direct: the disk's own sequential and
# random rates, and prefetchd's with shuffle and block_shuffle (GPU machine).
bench-cold: all
	@python3 bench/cold.py

# What `make install` puts in place, and all it builds.
INSTALLED := $(B)/prefetchd $(B)/prefetchctl $(B)/libprefetch.so $(B)/libprefetch.a \
             $(B)/libprefetch.pc
MAN_PAGES := man/prefetchctl.1 man/prefetchd.conf.5 man/prefetchd.8
# The documents go to DOCDIR in the tree's own layout, so that the links
# between them (README -> docs/SHUFFLE.md) still lead somewhere; the
# example configuration sits at the top, next to the README.
DOCS      := README.md docs/DESIGN.md docs/SHUFFLE.md proto/PROTOCOL.md
EXAMPLE_CONF := deploy/prefetchd.conf.example
# The units name the installed paths: the daemon, and the documents.
unit_sed  = sed -e 's|@BINDIR@|$(BINDIR)|g' -e 's|@DOCDIR@|$(DOCDIR)|g'

install: $(INSTALLED)
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(LIBDIR)/pkgconfig $(DESTDIR)$(INCDIR) $(DESTDIR)$(UNITDIR) \
	  $(addprefix $(DESTDIR)$(MANDIR)/man,1 5 8)
	install -m 0755 $(B)/prefetchd $(B)/prefetchctl $(DESTDIR)$(BINDIR)/
	install -m 0755 $(B)/libprefetch.so $(DESTDIR)$(LIBDIR)/libprefetch.so.0
	ln -sf libprefetch.so.0 $(DESTDIR)$(LIBDIR)/libprefetch.so
	install -m 0644 $(B)/libprefetch.a $(DESTDIR)$(LIBDIR)/
	install -m 0644 client/prefetch.h $(DESTDIR)$(INCDIR)/
	install -m 0644 $(B)/libprefetch.pc $(DESTDIR)$(LIBDIR)/pkgconfig/
	$(unit_sed) systemd/prefetchd.service > $(DESTDIR)$(UNITDIR)/prefetchd.service
	$(unit_sed) systemd/prefetchd.socket > $(DESTDIR)$(UNITDIR)/prefetchd.socket
	for m in $(MAN_PAGES); do install -m 0644 $$m $(DESTDIR)$(MANDIR)/man$${m##*.}/ || exit; done
	for f in $(DOCS); do install -D -m 0644 $$f $(DESTDIR)$(DOCDIR)/$$f || exit; done
	install -m 0644 $(EXAMPLE_CONF) $(DESTDIR)$(DOCDIR)/
ifneq ($(PYTHONDIR),)
	install -d $(DESTDIR)$(PYTHONDIR)/prefetch
	install -m 0644 $(PY_FILES) $(DESTDIR)$(PYTHONDIR)/prefetch/
	ln -sf $(LIBDIR)/libprefetch.so.0 $(DESTDIR)$(PYTHONDIR)/prefetch/libprefetch.so
else
	@echo "python: not installed; into a venv: python3 -m venv --system-site-packages VENV && VENV/bin/pip install --no-build-isolation ./python (or make install PYTHONDIR=DIR)"
endif

# Removes exactly what install put there (same PREFIX and DESTDIR), and
# DOCDIR, which is prefetchd's alone.
uninstall:
	rm -f $(DESTDIR)$(BINDIR)/prefetchd $(DESTDIR)$(BINDIR)/prefetchctl \
	  $(DESTDIR)$(LIBDIR)/libprefetch.so.0 $(DESTDIR)$(LIBDIR)/libprefetch.so \
	  $(DESTDIR)$(LIBDIR)/libprefetch.a $(DESTDIR)$(INCDIR)/prefetch.h \
	  $(DESTDIR)$(LIBDIR)/pkgconfig/libprefetch.pc \
	  $(DESTDIR)$(UNITDIR)/prefetchd.service $(DESTDIR)$(UNITDIR)/prefetchd.socket \
	  $(foreach m,$(MAN_PAGES),$(DESTDIR)$(MANDIR)/man$(subst .,,$(suffix $(m)))/$(notdir $(m))) \
	  $(addprefix $(DESTDIR)$(DOCDIR)/,$(DOCS) $(notdir $(EXAMPLE_CONF)))
	rmdir $(DESTDIR)$(DOCDIR)/docs $(DESTDIR)$(DOCDIR)/proto $(DESTDIR)$(DOCDIR) 2>/dev/null || true
ifneq ($(PYTHONDIR),)
	rm -f $(addprefix $(DESTDIR)$(PYTHONDIR)/prefetch/,$(notdir $(PY_FILES)) libprefetch.so)
	rm -rf $(DESTDIR)$(PYTHONDIR)/prefetch/__pycache__
	-rmdir $(DESTDIR)$(PYTHONDIR)/prefetch
endif

format:
	clang-format -i $(wildcard daemon/*/*.[ch] daemon/*/*.cu client/*.[ch] proto/*.[ch] tests/*/*.[ch] bench/*.[ch] tools/*.[ch])

clean:
	rm -rf $(B) run

# Fuzzing (make fuzz-smoke) and the sanitizer builds (make check-asan,
# check-tsan) and the leak soak (make soak) live in their own files.
-include tests/fuzz/fuzz.mk
-include tests/sanitize.mk

-include $(shell find $(B) -name '*.d' 2>/dev/null)
