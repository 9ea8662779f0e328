# tests/sanitize.mk — the sanitizer builds and the leak soak; -included at
# the end of the top Makefile, so every variable and rule of it is in scope.
#
#   make check-asan   the whole host suite (unit, integration, Python) built
#                     into build-asan with AddressSanitizer + UBSan and run
#                     with LeakSanitizer on
#   make check-tsan   the same in build-tsan under ThreadSanitizer
#   make soak         build/tests/soak: 2000 cycles of clients that end
#                     cleanly or not against one daemon, then its fd count
#                     and RSS against their baselines (SOAK_CYCLES, SOAK_SEED)
#   make soak-asan    the same soak with the ASan daemon and client (and
#   make soak-tsan    with TSan's): RSS reported, not judged
#
# A sanitized build is this same Makefile run again with B=build-asan (or
# build-tsan) and the sanitizer flags in CC, so that they reach every compile
# and every link line (the top Makefile has no LDFLAGS), the shared library's
# included.  The CUDA setting is the plain build's: gpu.c is instrumented too
# and takes its no-GPU path here; nvcc's gather kernel object is not
# instrumented.
#
# The compilers differ, each for a reason found on Debian 12:
#  - ASan + UBSan build with clang (SAN_ASAN_CC): with gcc 12's separate
#    libasan and libubsan, UBSan ignores log_path and writes to stderr, and a
#    daemon's stderr is a log file that its test deletes.  clang's runtime
#    (Debian: clang, libclang-rt-14-dev) honours it.
#  - TSan builds with gcc (SAN_TSAN_CC): the Python interpreter must preload
#    the TSan runtime, and clang 14's shared one crashes at startup when
#    preloaded (even into /bin/true); gcc's libtsan.so works.
#
# Every sanitizer report of every process (test binaries, the daemons they
# start, prefetchctl, the Python interpreter) goes to a file under
# $(B)/san-logs through log_path, for that reason: a report in a daemon must
# fail the run even where its test would not notice.  After tests/run.sh the
# target prints each report and fails if there is one, whatever the tests
# counted.
#
# No suppressions at all: none for our code, and none turned out necessary
# for libuv, protobuf-c, cmocka or Python.  The Python interpreter runs with
# LeakSanitizer off (see SAN_PY_ASAN below); nothing else does.

ASAN_B := build-asan
TSAN_B := build-tsan

SAN_ASAN_CC ?= clang
SAN_TSAN_CC ?= gcc
SAN_CFLAGS := -O1 -g -fno-omit-frame-pointer
# Warnings stay on but do not fail a sanitized build: clang warns where gcc
# (the plain build, which -Werror checks in CI) does not, and a warning is not
# what these targets look for.
SAN_WARN = $(filter-out -Werror,$(WARN))
ASAN_CC := $(SAN_ASAN_CC) -fsanitize=address,undefined -fno-sanitize-recover=undefined
TSAN_CC := $(SAN_TSAN_CC) -fsanitize=thread

# The runtimes the Python interpreter (not instrumented) preloads: a
# sanitizer's runtime must be in a process before libc's malloc is first
# used, so the sanitized libprefetch.so does not load into a plain python3
# otherwise.  clang's ASan runtime includes UBSan's handlers.
ASAN_RT = $(shell $(SAN_ASAN_CC) -print-file-name=libclang_rt.asan-$(shell uname -m).so)
TSAN_RT = $(shell $(SAN_TSAN_CC) -print-file-name=libtsan.so)

# halt_on_error: the first report ends the process (with UBSan's
# -fno-sanitize-recover, a UB report too), so that a report cannot scroll by
# in a passing run.  detect_stack_use_after_return and the init-order checks
# are off by default and cheap here.
san_empty :=
san_colons = $(subst $(san_empty) $(san_empty),:,$(strip $(1)))
SAN_ASAN_OPTS = $(call san_colons,halt_on_error=1 detect_leaks=1 detect_stack_use_after_return=1 \
	check_initialization_order=1 strict_init_order=1 log_path=$(CURDIR)/$(ASAN_B)/san-logs/asan)
SAN_UBSAN_OPTS = halt_on_error=1:print_stacktrace=1:log_path=$(CURDIR)/$(ASAN_B)/san-logs/ubsan
SAN_TSAN_OPTS = halt_on_error=1:second_deadlock_stack=1:log_path=$(CURDIR)/$(TSAN_B)/san-logs/tsan
# The interpreter itself runs with LeakSanitizer off: CPython does not free
# its interned objects, type caches and arenas at exit (by design), and
# those would be reported as leaks of a third-party program.  Every process
# it starts (the daemon, prefetchctl) gets SAN_ASAN_OPTS, leaks included;
# libprefetch's own leaks are covered by the C tests (test_client,
# test_integration*), which run it in an instrumented process with LSan on.
SAN_PY_ASAN = $(SAN_ASAN_OPTS):detect_leaks=0

.PHONY: check-asan check-tsan soak soak-asan soak-tsan san-build san-run san-soak

# $(1): build dir, $(2): its compiler and flags.  Objects record no compiler,
# so a build dir made with other flags (SAN_ASAN_CC=gcc, an older version of
# this file) starts afresh rather than mixing runtimes.
san_fresh = @if [ "$$(cat $(1)/.san-cc 2>/dev/null)" != '$(2)' ]; then \
	  rm -rf $(1) && mkdir -p $(1) && echo '$(2)' > $(1)/.san-cc; fi

# The sanitized makes, ready for a target.
ASAN_MAKE = $(MAKE) --no-print-directory B=$(ASAN_B) CC='$(ASAN_CC)' CFLAGS='$(SAN_CFLAGS)' \
	WARN='$(SAN_WARN)' SAN=asan \
	SAN_ENV='ASAN_OPTIONS=$(SAN_ASAN_OPTS) UBSAN_OPTIONS=$(SAN_UBSAN_OPTS)' \
	SAN_PY_ENV='LD_PRELOAD=$(ASAN_RT) ASAN_OPTIONS=$(SAN_PY_ASAN) \
	PF_SAN_CHILD_ASAN_OPTIONS=$(SAN_ASAN_OPTS) UBSAN_OPTIONS=$(SAN_UBSAN_OPTS)'
TSAN_MAKE = $(MAKE) --no-print-directory B=$(TSAN_B) CC='$(TSAN_CC)' CFLAGS='$(SAN_CFLAGS)' \
	WARN='$(SAN_WARN)' SAN=tsan \
	SAN_ENV='TSAN_OPTIONS=$(SAN_TSAN_OPTS)' \
	SAN_PY_ENV='LD_PRELOAD=$(TSAN_RT) TSAN_OPTIONS=$(SAN_TSAN_OPTS)'

# The packages first (tools/deps.sh: the host suite's, and clang for ASan;
# gcc's TSan runtime comes with the build group), then, since the Python
# tests also load the plain build/libprefetch.so (the library search test
# copies it), that library, as `make check` would build it.
check-asan:
	@$(INSTALL_DEPS) build test clang
	@$(MAKE) --no-print-directory $(B)/libprefetch.so
	$(call san_fresh,$(ASAN_B),$(ASAN_CC) $(SAN_CFLAGS))
	@$(ASAN_MAKE) san-build
	@$(ASAN_MAKE) san-run

check-tsan:
	@$(INSTALL_DEPS) build test
	@$(MAKE) --no-print-directory $(B)/libprefetch.so
	$(call san_fresh,$(TSAN_B),$(TSAN_CC) $(SAN_CFLAGS))
	@$(TSAN_MAKE) san-build
	@$(TSAN_MAKE) san-run

# ---- inside the sanitized make (B=build-asan or build-tsan) ------------------
SAN_PY := $(B)/tests/py_host_$(SAN)

san-build: all $(B)/tests/soak

# The variables given to this make on its command line are in its recipes'
# environment; CC there would be taken for a compiler's name by a test that
# compiles a program.  Then the sanitizer's options, and the sanitized
# binaries in place of build/'s: td_start and pfutil take the daemon from
# $PREFETCHD_BIN, the tests that run prefetchctl take $PREFETCHCTL_BIN,
# Python loads $PREFETCH_LIB and runs its bystander from $PF_BYSTANDER_BIN.
SAN_RUN_ENV = env -u CC -u CFLAGS -u WARN -u SAN_ENV -u SAN_PY_ENV $(SAN_ENV) \
	PREFETCHD_BIN=$(CURDIR)/$(B)/prefetchd PREFETCHCTL_BIN=$(CURDIR)/$(B)/prefetchctl \
	PREFETCH_LIB=$(CURDIR)/$(B)/libprefetch.so PF_BYSTANDER_BIN=$(CURDIR)/$(B)/tests/bystander

# After a run whose status is in $$rc: prints every report in san-logs and
# fails if there is one, or if the run failed.
define san_verdict
	n=0; for f in $(B)/san-logs/*; do [ -f "$$f" ] || continue; n=$$((n + 1)); \
	  echo "==== $$f"; cat "$$f"; done; \
	echo "$(SAN) reports: $$n (logs in $(B)/san-logs)"; \
	[ "$$rc" -eq 0 ] && [ "$$n" -eq 0 ]
endef

san-run: $(SAN_PY)
	@rm -rf $(B)/san-logs && mkdir -p $(B)/san-logs
	@$(SAN_RUN_ENV) sh tests/run.sh $(UNIT_TESTS) $(INTEG_TESTS) $(CUDA_TESTS) $(SAN_PY); \
	rc=$$?; $(san_verdict)

# The Python host tests, as $(PY_HOST) runs them, with the sanitizer's
# runtime preloaded into the interpreter; tests/python/san_run.py takes the
# preload out of the environment its children inherit (a compiler or a
# plain python3 started by a test must not run under the sanitizer) and
# gives them the options of the instrumented programs.
.PHONY: $(SAN_PY)
$(SAN_PY):
	@mkdir -p $(@D)
	$(call say,GEN,$@)printf '#!/bin/sh\nexec env %s %s -B %s %s %s "$$@"\n' \
	  "$(SAN_PY_ENV)" '$(call find_python,numpy)' '$(CURDIR)/tests/python/san_run.py' \
	  '$(CURDIR)/tests/python/run.py' '$(CURDIR)/tests/python/test_host.py' > $@.tmp && \
	  chmod +x $@.tmp && mv $@.tmp $@

# ---- the leak soak -----------------------------------------------------------
# Not a test_* file: `make check` does not run it; `make soak` does.
$(B)/tests/soakobj/%.o: tests/soak/%.c $(GEN_H)
	@mkdir -p $(@D)
	$(call say,CC,$<)$(CC) $(ALL_CFLAGS) $(CUDA_CFLAGS) -c -o $@ $<
$(B)/tests/soak: $(B)/tests/soakobj/soak.o $(B)/tests/soakobj/hostile.o $(TEST_UTIL) $(B)/libprefetch.a \
		 $(B)/prefetchd
	$(call say,LD,$@)$(CC) -o $@ $(filter %.o,$^) $(B)/libprefetch.a $(PKG_LIBS) -ldl $(LDLIBS)

soak:
	@$(INSTALL_DEPS) build
	@$(MAKE) --no-print-directory $(B)/tests/soak
	@PREFETCHD_BIN=$(CURDIR)/$(B)/prefetchd $(B)/tests/soak

# Under a sanitizer the RSS is not judged: ASan keeps freed blocks in a
# quarantine of up to 256 MiB and TSan keeps shadow memory and histories,
# so RSS grows by design; LeakSanitizer at the daemon's exit (its status
# must be 0) and the exact fd count are the leak checks there.
soak-asan:
	@$(INSTALL_DEPS) build clang
	$(call san_fresh,$(ASAN_B),$(ASAN_CC) $(SAN_CFLAGS))
	@$(ASAN_MAKE) $(ASAN_B)/tests/soak
	@$(ASAN_MAKE) san-soak

soak-tsan:
	@$(INSTALL_DEPS) build
	$(call san_fresh,$(TSAN_B),$(TSAN_CC) $(SAN_CFLAGS))
	@$(TSAN_MAKE) $(TSAN_B)/tests/soak
	@$(TSAN_MAKE) san-soak

san-soak:
	@rm -rf $(B)/san-logs && mkdir -p $(B)/san-logs
	@$(SAN_RUN_ENV) SOAK_RSS_LIMIT=off $(B)/tests/soak; rc=$$?; $(san_verdict)
