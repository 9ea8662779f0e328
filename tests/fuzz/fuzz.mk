# tests/fuzz/fuzz.mk — libFuzzer harnesses; included by the top Makefile,
# whose variables (B, WARN, PKG_*, DAEMON_CORE, GEN_*, WIRE_OBJ) it uses.
#
#   make fuzz-smoke              every harness for FUZZ_TIME seconds (60) on
#                                its seeds, one after another; prints one line
#                                per harness with its executions; fails on any
#                                crash, leak or timeout
#   make fuzz-long FUZZ_RUNS=N   every harness for N executions (default 10
#                                million), FUZZ_JOBS (nproc) at a time
#   make fuzz-smoke FUZZ_NAMES=npy   only some harnesses
#   make fuzz-long FUZZ_NAMES=sess FUZZ_WORKERS=2
#                                one harness as 2 processes on a shared
#                                corpus, FUZZ_RUNS split between them; the
#                                line printed sums their executions
#
# Harnesses: wire (the frame reader), sess (client requests through the
# server and sessions), npy (the .npy header), tokens (the token-shard
# header).  They and the code under test are built with clang under
# libFuzzer, ASan and UBSan (UBSan fatal), objects in build/fuzz/obj.
# Seeds are written at build time by mkcorpus from the real encoder, so they
# follow the proto, into build/fuzz/seeds/NAME; inputs committed in
# tests/fuzz/corpus/NAME (regressions) join them.  Every run starts from a
# scratch copy of both in build/fuzz/corpus/NAME: the tree is never written.
# A crash leaves its input in build/fuzz/artifacts/NAME/ and the log in
# build/fuzz/log/NAME.log; `build/fuzz/fuzz_NAME FILE` replays it.
#
# A machine with more cores and no clang (the lent GPU machine) runs the
# binary built here: copy build/fuzz/fuzz_NAME and build/fuzz/seeds into a
# folder DIR, then `tests/fuzz/run.sh -w 16 DIR -runs=10000000 NAME` there,
# with FUZZ_FLAGS=-max_total_time=S below the machine's command limit, and
# copy DIR/artifacts and the failing DIR/log files back in the same command.
# A second such run gets new worker seeds with FUZZ_SEED_BASE=16 (then 32,
# ...); start it from the first one's DIR/corpus (archive it into the
# command's output) to go on where that one stopped.

FUZZ_CC    ?= clang
FUZZ_TIME  ?= 60
FUZZ_RUNS  ?= 10000000
FUZZ_JOBS  ?= $(shell nproc 2>/dev/null || echo 1)
FUZZ_WORKERS ?= 1
FUZZ_NAMES ?= wire sess npy tokens
FZ         := $(B)/fuzz

FUZZ_SAN    := -fsanitize=address,undefined -fno-sanitize-recover=undefined
FUZZ_CFLAGS := -std=gnu11 $(WARN) -g -O1 -fno-omit-frame-pointer $(FUZZ_SAN) \
               -fsanitize=fuzzer-no-link -D_GNU_SOURCE -DPF_VERSION='"$(VERSION)"' -DPF_CUDA=0 \
               -MMD -MP -I$(B)/gen -Iproto -Idaemon -Itools -Itests/fuzz $(PKG_CFLAGS)
FUZZ_LDFLAGS := -fsanitize=fuzzer $(FUZZ_SAN)

fz_obj      = $(patsubst %.c,$(FZ)/obj/%.o,$(1))
FZ_WIRE     := $(call fz_obj,proto/wire.c $(GEN_C))
# The daemon core with no GPU: the session harness refuses CUDA sessions.
FZ_CORE     := $(call fz_obj,$(DAEMON_CORE) daemon/gpu/gpu_none.c) $(FZ_WIRE)
FUZZ_BINS   := $(patsubst %,$(FZ)/fuzz_%,$(FUZZ_NAMES))

# The session harness runs reader jobs and libuv's pool work itself, when
# its script says, turns the daemon's poll and idle handles by hand, refuses
# timers (only GPU sessions have one), notes who wrote, and keeps the
# daemon's log quiet (fuzz_sess.c says how).
FUZZ_LINK_sess := $(foreach f,reader_submit uv_queue_work uv_poll_init uv_poll_start uv_poll_stop \
                    uv_idle_init uv_idle_start uv_idle_stop \
                    uv_close uv_timer_init wire_send_some \
                    log_err log_warn log_info log_debug,-Wl,--wrap=$(f))

.PHONY: fuzz fuzz-smoke fuzz-long fuzz-need-clang
fuzz: $(FUZZ_BINS) $(FZ)/seeds/.stamp

# Before anything is compiled: clang, with libFuzzer's runtime.
fuzz-need-clang:
	@command -v $(FUZZ_CC) >/dev/null 2>&1 || { \
	  echo "fuzz: $(FUZZ_CC) not found; the harnesses need clang with libFuzzer" \
	       "(make fuzz-smoke installs it: tools/deps.sh build clang)" >&2; exit 1; }
	@printf 'int LLVMFuzzerTestOneInput(const unsigned char *d, unsigned long n) { return 0; }\n' | \
	  $(FUZZ_CC) -fsanitize=fuzzer -x c -o /dev/null - 2>/dev/null || { \
	  echo "fuzz: $(FUZZ_CC) cannot link -fsanitize=fuzzer (is compiler-rt/libFuzzer installed?)" >&2; \
	  exit 1; }

$(FZ)/obj/%.o: %.c $(GEN_H) | fuzz-need-clang
	@mkdir -p $(@D)
	$(call say,FUZZCC,$<)$(FUZZ_CC) $(FUZZ_CFLAGS) -c -o $@ $<
$(FZ)/obj/$(B)/gen/%.o: FUZZ_CFLAGS += -Wno-missing-prototypes

$(FZ)/fuzz_wire: $(FZ_WIRE)
$(FZ)/fuzz_sess: $(FZ_CORE)
$(FZ)/fuzz_npy: $(call fz_obj,daemon/data/npy.c)
$(FZ)/fuzz_tokens: $(call fz_obj,daemon/data/tokens.c)
$(FUZZ_BINS): $(FZ)/fuzz_%: $(FZ)/obj/tests/fuzz/fuzz_%.o
	$(call say,FUZZLD,$@)$(FUZZ_CC) $(FUZZ_LDFLAGS) -o $@ $(filter %.o,$^) $(FUZZ_LINK_$*) \
	  $(PKG_LIBS) $(LDLIBS)

# mkcorpus is an ordinary program of the normal build: it encodes with the
# same wire.o the daemon and the client use.
$(B)/tests/fuzz/mkcorpus.o: ALL_CFLAGS += -Itools -Itests/fuzz
$(FZ)/mkcorpus: $(B)/tests/fuzz/mkcorpus.o $(WIRE_OBJ)
	$(call say,LD,$@)$(CC) -o $@ $^ $(shell pkg-config --libs libprotobuf-c) $(LDLIBS)
$(FZ)/seeds/.stamp: $(FZ)/mkcorpus
	$(call say,GEN,$(FZ)/seeds)rm -rf $(FZ)/seeds && $(FZ)/mkcorpus $(FZ)/seeds && touch $@

# The packages first (tools/deps.sh: the build's and clang's), then the
# harnesses in a new make, clang checked before anything is compiled.
fuzz-smoke:
	@$(INSTALL_DEPS) build clang
	@$(MAKE) --no-print-directory fuzz-need-clang
	@$(MAKE) --no-print-directory fuzz
	@sh tests/fuzz/run.sh -j 1 -w $(FUZZ_WORKERS) $(FZ) -max_total_time=$(FUZZ_TIME) $(FUZZ_NAMES)

fuzz-long:
	@$(INSTALL_DEPS) build clang
	@$(MAKE) --no-print-directory fuzz-need-clang
	@$(MAKE) --no-print-directory fuzz
	@sh tests/fuzz/run.sh -j $(FUZZ_JOBS) -w $(FUZZ_WORKERS) $(FZ) -runs=$(FUZZ_RUNS) $(FUZZ_NAMES)
