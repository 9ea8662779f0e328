/*
 * testutil.h — what integration tests and benchmarks share: a real
 * prefetchd started on a temporary socket, .npy files whose every byte is
 * known (tools/npygen.h), and status read through the real protocol; for
 * the benchmarks also their plumbing: messages, signals, arguments, the
 * dataset they write and warm before timing, and their cleanup.
 */
#ifndef PF_TESTUTIL_H
#define PF_TESTUTIL_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "prefetch.pb-c.h"

struct pf_client;
struct pf_batch;

struct tdaemon {
	char dir[256]; /* temporary directory, removed by td_cleanup */
	char sock[320];
	char conf[320];
	char log[320];
	pid_t pid;
};

/* A fresh temporary directory in t->dir.  0 or -errno; on failure t->dir
 * is empty, so td_cleanup removes nothing. */
int td_init(struct tdaemon *t, const char *tag);
/* Writes t->conf: a [daemon] section with the socket in t->dir plus
 * `daemon_extra` lines, then `datasets` verbatim; starts build/prefetchd
 * (or $PREFETCHD_BIN) with stderr to t->log and waits up to 10 s until it
 * answers.  0 or -errno. */
int td_start(struct tdaemon *t, const char *daemon_extra, const char *datasets);
/* The prefetchctl the tests run: $PREFETCHCTL_BIN (the sanitized builds
 * set it, as they set $PREFETCHD_BIN), else build/prefetchctl. */
const char *td_prefetchctl(void);
/* SIGTERM and wait (at most timeout_ms, then SIGKILL).  Returns the exit
 * status, or -1 if it had to be killed or died of a signal. */
int td_stop(struct tdaemon *t, int timeout_ms);
/* SIGKILL, as a crash or the OOM killer would end it, and reap it: t->pid
 * is 0 afterwards, and td_start with the same arguments starts a new
 * daemon on the same socket and config.  0, or -ESRCH when none ran. */
int td_kill(struct tdaemon *t);
/* Removes t->dir and everything in it. */
void td_cleanup(struct tdaemon *t);
/* Path of a file inside t->dir (static buffer per call site is the caller's). */
void td_path(const struct tdaemon *t, const char *name, char *out, size_t len);
/* True when a line of the daemon's log (t->log) holds a, and b too unless
 * b is NULL. */
bool td_log_has(const struct tdaemon *t, const char *a, const char *b);
/* Lines of the log holding a (and b unless NULL), counted up to `most`;
 * a NULL: every line. */
unsigned td_log_count(const struct tdaemon *t, const char *a, const char *b, unsigned most);
/* VmRSS of pid in kB, or -1. */
long td_rss_kb(pid_t pid);
/* Descriptors pid has open (/proc/PID/fd), or -1. */
long td_fd_count(pid_t pid);
/* Runs cmd (sh -c) and puts what it writes on stdout, NUL-terminated and
 * cut to len - 1 bytes, in out.  Its exit status, or -1. */
int td_capture(const char *cmd, char *out, size_t len);
/* Runs fn(arg) in a child that has dropped to uid (its gid the same number,
 * no supplementary groups): its exit status, 99 when the drop failed, -1
 * when the child died.  Needs root. */
int td_as_user(uid_t uid, int (*fn)(void *arg), void *arg);

/* Writes a C-order little-endian .npy of `rows` rows whose row r (counted
 * from first_row) holds npygen's random bytes under seed.  descr like "<f4";
 * sample_shape/ndim describe one row.  0 or -errno. */
int td_write_npy(const char *path, unsigned version, const char *descr, size_t itemsize,
		 uint64_t rows, const uint64_t *sample_shape, int sample_ndim, uint64_t seed,
		 uint64_t first_row);
/* Writes an llm.c / modded-nanogpt token shard: 256 little-endian int32s
 * (magic 20240520, version 1, the count), then `tokens` little-endian
 * uint16s, token k of the shard being td_token(seed, first + k).  magic and
 * version other than those, or a header count other than `tokens`
 * (count_override != 0), make bad shards for tests.  0 or -errno. */
int td_write_tokens(const char *path, uint64_t tokens, uint64_t seed, uint64_t first, int32_t magic,
		    int32_t version, uint64_t count_override);
/* The token at global position `pos` of a stream under seed. */
uint16_t td_token(uint64_t seed, uint64_t pos);
/* True when p holds row `row`'s bytes under seed.  */
bool td_row_ok(const uint8_t *p, uint64_t row_bytes, uint64_t seed, uint64_t row);
/* Every row of every field of host batch b (of client c) holds npygen's
 * bytes for sample pick % N, field f's seed being seed_of(its name); false
 * with why naming the first that does not (field, pick, batch, position). */
bool td_batch_ok(struct pf_client *c, const struct pf_batch *b,
		 uint64_t (*seed_of)(const char *field), char *why, size_t len);

/* StatusReply from the daemon at sock, through libprefetch's own call path.
 * Free with pf__envelope__free_unpacked(env, NULL); NULL on failure. */
Pf__Envelope *td_status(const char *sock);
/* The status entry of a session, or NULL. */
Pf__SessionStatus *td_session(Pf__Envelope *status, uint64_t session);
/* The first VRAM pool of dataset in status (tests use one GPU), or NULL. */
Pf__PoolStatus *td_pool(Pf__Envelope *status, const char *dataset);
/* The same, on device ("cuda:N") only. */
Pf__PoolStatus *td_pool_on(Pf__Envelope *status, const char *dataset, const char *device);
/* prefetchctl pool DATASET on|off|drop through the protocol.  0 or -errno. */
int td_pool_control(const char *sock, const char *dataset, Pf__PoolAction action,
		    uint64_t *bytes_freed);

double td_now(void);

/* The raw protocol, for tests that speak it as a hostile client would: a
 * blocking connection to sock (fd, or -errno); one frame of env on it,
 * with pass_fd attached when >= 0 (0 or -errno); a Hello saying `client`. */
int td_raw_connect(const char *sock);
int td_send_env(int fd, const Pf__Envelope *env, int pass_fd);
int td_send_hello(int fd, const char *client);
/* An empty frame (a zero length) with fds[0..n) attached: a client that
 * sends the daemon descriptors.  0 or -errno. */
int td_send_fds(int fd, const int *fds, int n);

/*
 * A bystander (bystander.c): while a test abuses the daemon at sock, an
 * innocent trainer on threads of its own runs shuffled host epochs of
 * `dataset` (one '<u1' field of row_bytes, written by td_write_npy under
 * seed) in batches of `batch`, checking every row and that every sample
 * comes once, and asks for status every 20 ms over a connection it keeps.
 * td_bystander_stop waits for at least one whole epoch (20 s at most),
 * stops both threads and fills the report; it returns 0 when every epoch
 * was byte-exact and every status answered within TD_STATUS_MAX_MS, else
 * -1 with report.error saying what went wrong first.
 */
/* Only starvation fails here: the loop held from the bystander for a whole
 * second.  An unloaded host answers in well under 10 ms, but a test cannot
 * tell a slow loop from a busy host: with a second `make check` beside it a
 * status took 158 ms.  How fast status answers under load is a bench's to
 * say; the worst figure is printed by every case that judges it. */
#define TD_STATUS_MAX_MS 1000
/* The sanitizer this build has ("ASan", "TSan") or NULL.  Under one, RSS
 * is not judged (ASan's quarantine keeps freed blocks, TSan its shadow: RSS
 * grows by design) and the bystander's status limit is td_status_limit_ms:
 * TD_STATUS_MAX_MS in the plain build, whose figure it is; 5 times that
 * under ASan; none under TSan, which instruments every byte the loop
 * copies (a 32 MiB batch takes it a second) and is there for races. */
const char *td_sanitizer(void);
double td_status_limit_ms(void); /* 0: not judged */
/* What a wait that only catches a hang ("the batch never came") is
 * multiplied by: 1 in the plain build, 4 under ASan, 20 under TSan.  On an
 * idle 2-core host the kept-orders case took 5.4 s plain, 13.5 s under ASan
 * and 79 s under TSan, whose 9M-pick orders, with a second build beside
 * the run, were not built within the 30 s that wait allowed. */
double td_patience(void);
struct td_bystander;
struct td_bystander_report {
	uint64_t epochs, batches, statuses;
	double max_status_ms;
	double max_status_at; /* td_now() when the slowest status was asked */
	char error[256];
};
struct td_bystander *td_bystander_start(const char *sock, const char *dataset, uint32_t batch,
					uint64_t row_bytes, uint64_t seed);
int td_bystander_stop(struct td_bystander *b, struct td_bystander_report *report);
/* The soak judges the epochs only: its attackers saturate the machine's
 * CPUs, which no daemon can answer for.  The slowest status is reported. */
void td_bystander_status_not_judged(struct td_bystander *b);

/*
 * Benchmarks.  They run on one thread; messages go to stderr behind the
 * program's name (program_invocation_short_name, as err(3) does).
 */

/* Set to the signal's number by SIGINT or SIGTERM once td_catch_signals has
 * run: a bench's loops check it and leave through their cleanup, which
 * stops the daemon. */
extern volatile sig_atomic_t td_interrupted;
/* SIGINT and SIGTERM set td_interrupted; SIGPIPE is ignored, so a daemon
 * that died is an EPIPE from the client library, not the bench's death. */
void td_catch_signals(void);
/* Prints "<program>: <message>" on stderr; returns -1 so that callers can
 * `return td_fail(...)`. */
int td_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Parses option opt's decimal argument s into *out if it lies in lo..hi.
 * 0, or -1 after td_fail said why. */
int td_parse_uint(const char *opt, const char *s, unsigned lo, unsigned hi, unsigned *out);
/* Prints the "machine: N online CPUs, <model>" line on stdout (the model
 * from /proc/cpuinfo, "unknown" without one). */
void td_print_machine(long online);

/* At most one progress line a second on stderr, so that a timed loop pays
 * for one fprintf a second and nothing else. */
struct td_progress {
	const char *what; /* borrowed: valid while the progress is reported; NULL: silent */
	double last;	  /* td_now() of the last line */
};

/* Prints "<program>: <what> ..." and starts the clock; what NULL: p stays
 * silent. */
void td_progress_start(struct td_progress *p, const char *what);
/* "<what>: done/total <unit> (P%)" (total 0: "<what>: done <unit>") when a
 * second has passed since the last line. */
void td_progress(struct td_progress *p, uint64_t done, uint64_t total, const char *unit);

/* A bench's dataset: `rows` rows of one '<u1' field, row_bytes each (a
 * multiple of 8 that divides 4 MiB), holding the bytes td_write_npy writes
 * under seed. */
struct td_rows {
	uint64_t rows;
	unsigned row_bytes;
	uint64_t seed;
	bool progress; /* a td_progress line a second while writing and reading */
};

/*
 * What a bench does before it starts the daemon: td_init(t, "bench"),
 * writes d's rows to rows.npy in t->dir (its path into path/len) and
 * fsyncs it, so that no writeback lands inside a timed phase; then reads
 * the whole file once, which puts it in the page cache, and asks mincore
 * how much is resident.  Rows 0, rows/2 and rows-1 are checked against
 * the formula on the way, so that a writer bug cannot hide behind the
 * bench's own checks.  The first copy_bytes of the rows (a multiple of
 * 4 MiB, or all of them; header skipped) land in copy.  Prints the
 * "wrote" and "page cache" lines with their times on stdout.  0, or -1
 * after td_fail said why.
 */
int td_bench_dataset(struct tdaemon *t, const struct td_rows *d, char *path, size_t len,
		     uint8_t *copy, uint64_t copy_bytes);
/* True when every row 0..rows-1 appears exactly once among picks[0..n). */
bool td_is_permutation(const uint64_t *picks, uint64_t n, uint64_t rows);
/* A bench's last word: stops the daemon if it runs, prints the tail of its
 * log on stderr when show_log (whatever went wrong after it started, the
 * log says its side), and removes t->dir (td_cleanup). */
void td_bench_end(struct tdaemon *t, bool show_log);

#endif
