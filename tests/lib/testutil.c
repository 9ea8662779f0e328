/*
 * testutil.c — a real daemon on a temporary socket, known .npy bytes,
 * status over the real protocol, and the benches' plumbing (see
 * testutil.h).
 *
 * DESIGN: called from one thread, the test's or the bench's; no locks.
 * td_interrupted is the one value written elsewhere, by the signal handler.
 */
#include "testutil.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "npygen.h"
#include "client_int.h"
#include "prefetch.h"
#include "wire.h"

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TD_ASAN 1
#endif
#if __has_feature(thread_sanitizer)
#define TD_TSAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define TD_ASAN 1
#endif
#if defined(__SANITIZE_THREAD__)
#define TD_TSAN 1
#endif

const char *td_sanitizer(void)
{
#if defined(TD_ASAN)
	return "ASan";
#elif defined(TD_TSAN)
	return "TSan";
#else
	return NULL;
#endif
}

double td_status_limit_ms(void)
{
#if defined(TD_TSAN)
	return 0;
#elif defined(TD_ASAN)
	return 5 * TD_STATUS_MAX_MS;
#else
	return TD_STATUS_MAX_MS;
#endif
}

double td_patience(void)
{
#if defined(TD_TSAN)
	return 20;
#elif defined(TD_ASAN)
	return 4;
#else
	return 1;
#endif
}

double td_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

int td_init(struct tdaemon *t, const char *tag)
{
	memset(t, 0, sizeof(*t));
	snprintf(t->dir, sizeof(t->dir), "/tmp/pf-%s-XXXXXX", tag);
	if (!mkdtemp(t->dir)) {
		int rc = -errno;

		t->dir[0] = '\0';
		return rc;
	}
	snprintf(t->sock, sizeof(t->sock), "%s/prefetchd.sock", t->dir);
	snprintf(t->conf, sizeof(t->conf), "%s/prefetchd.conf", t->dir);
	snprintf(t->log, sizeof(t->log), "%s/daemon.log", t->dir);
	return 0;
}

void td_path(const struct tdaemon *t, const char *name, char *out, size_t len)
{
	snprintf(out, len, "%s/%s", t->dir, name);
}

bool td_log_has(const struct tdaemon *t, const char *a, const char *b)
{
	return td_log_count(t, a, b, 1) > 0;
}

unsigned td_log_count(const struct tdaemon *t, const char *a, const char *b, unsigned most)
{
	char line[4096];
	unsigned n = 0;
	FILE *f = fopen(t->log, "r");

	if (!f)
		return 0;
	while (n < most && fgets(line, sizeof(line), f))
		n += a ? strstr(line, a) && (!b || strstr(line, b)) : strchr(line, '\n') != NULL;
	fclose(f);
	return n;
}

long td_rss_kb(pid_t pid)
{
	char path[64], line[256];
	long kb = -1;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	f = fopen(path, "r");
	while (f && fgets(line, sizeof(line), f))
		if (sscanf(line, "VmRSS: %ld kB", &kb) == 1)
			break;
	if (f)
		fclose(f);
	return kb;
}

long td_fd_count(pid_t pid)
{
	char path[64];
	struct dirent *e;
	long n = 0;
	DIR *d;

	snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
	d = opendir(path);
	if (!d)
		return -1;
	while ((e = readdir(d)))
		n += e->d_name[0] != '.';
	closedir(d);
	return n;
}

int td_capture(const char *cmd, char *out, size_t len)
{
	FILE *p = popen(cmd, "r");
	size_t got;
	int st;

	out[0] = '\0';
	if (!p)
		return -1;
	got = fread(out, 1, len - 1, p);
	out[got] = '\0';
	st = pclose(p);
	return st >= 0 && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

int td_as_user(uid_t uid, int (*fn)(void *arg), void *arg)
{
	pid_t pid = fork();
	int st;

	if (pid < 0)
		return -1;
	if (pid == 0) {
		if (setgroups(0, NULL) || setgid((gid_t)uid) || setuid(uid))
			_exit(99);
		_exit(fn(arg));
	}
	if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st))
		return -1;
	return WEXITSTATUS(st);
}

int td_start(struct tdaemon *t, const char *daemon_extra, const char *datasets)
{
	const char *bin = getenv("PREFETCHD_BIN") ? getenv("PREFETCHD_BIN") : "build/prefetchd";
	FILE *f = fopen(t->conf, "w");
	double deadline;

	if (!f)
		return -errno;
	/* Two readers unless the caller says otherwise: the config refuses a
	 * key given twice. */
	fprintf(f, "[daemon]\nsocket = %s\n%s%s\n%s\n", t->sock,
		daemon_extra && strstr(daemon_extra, "readers") ? "" : "readers = 2\n",
		daemon_extra ? daemon_extra : "", datasets ? datasets : "");
	fclose(f);
	t->pid = fork();
	if (t->pid < 0)
		return -errno;
	if (t->pid == 0) {
		int fd = open(t->log, O_WRONLY | O_CREAT | O_APPEND, 0644);

		/* The daemon dies with its test (a crashed test must not leave
		 * it running, holding the test's stdout open for a pipe). */
		prctl(PR_SET_PDEATHSIG, SIGTERM);
		if (fd >= 0) {
			dup2(fd, 1);
			dup2(fd, 2);
			close(fd);
		}
		execl(bin, bin, "-v", "-c", t->conf, (char *)NULL);
		fprintf(stderr, "exec %s: %s\n", bin, strerror(errno));
		_exit(127);
	}
	deadline = td_now() + 10;
	while (td_now() < deadline) {
		struct pf_client *c = NULL;
		int status;

		if (waitpid(t->pid, &status, WNOHANG) == t->pid) {
			t->pid = 0;
			return -ECHILD;
		}
		if (pf_connect(t->sock, &c) == 0) {
			pf_close(c);
			return 0;
		}
		pf_close(c);
		usleep(10000);
	}
	return -ETIMEDOUT;
}

const char *td_prefetchctl(void)
{
	const char *bin = getenv("PREFETCHCTL_BIN");

	return bin && *bin ? bin : "build/prefetchctl";
}

int td_stop(struct tdaemon *t, int timeout_ms)
{
	double deadline = td_now() + timeout_ms / 1000.0;
	int status;

	if (t->pid <= 0)
		return -1;
	kill(t->pid, SIGTERM);
	while (td_now() < deadline) {
		if (waitpid(t->pid, &status, WNOHANG) == t->pid) {
			t->pid = 0;
			return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
		}
		usleep(5000);
	}
	kill(t->pid, SIGKILL);
	waitpid(t->pid, &status, 0);
	t->pid = 0;
	return -1;
}

int td_kill(struct tdaemon *t)
{
	if (t->pid <= 0)
		return -ESRCH;
	kill(t->pid, SIGKILL);
	waitpid(t->pid, NULL, 0);
	t->pid = 0;
	return 0;
}

void td_cleanup(struct tdaemon *t)
{
	char cmd[300];

	if (t->pid > 0)
		td_stop(t, 5000);
	if (t->dir[0] && !getenv("PF_KEEP_TMP")) {
		snprintf(cmd, sizeof(cmd), "rm -rf '%s'", t->dir);
		if (system(cmd) != 0)
			fprintf(stderr, "could not remove %s\n", t->dir);
	}
}

int td_write_npy(const char *path, unsigned version, const char *descr, size_t itemsize,
		 uint64_t rows, const uint64_t *sample_shape, int sample_ndim, uint64_t seed,
		 uint64_t first_row)
{
	uint8_t hdr[4096];
	uint64_t row_bytes = itemsize;
	size_t off =
		npygen_header(hdr, sizeof(hdr), version, descr, rows, sample_shape, sample_ndim);
	uint8_t *row;
	FILE *f;
	int rc = 0;

	for (int i = 0; i < sample_ndim; i++)
		row_bytes *= sample_shape[i];
	if (!off)
		return -EINVAL;
	f = fopen(path, "wb");
	if (!f)
		return -errno;
	row = malloc(row_bytes);
	if (!row || fwrite(hdr, 1, off, f) != off)
		rc = -EIO;
	for (uint64_t r = 0; r < rows && !rc; r++) {
		uint64_t key = npygen_row_key(seed, first_row + r);

		for (uint64_t p = 0; p < row_bytes; p++)
			row[p] = (uint8_t)(npygen_word(key, p / 8) >> (8 * (p % 8)));
		if (fwrite(row, 1, row_bytes, f) != row_bytes)
			rc = -EIO;
	}
	free(row);
	if (fclose(f) != 0 && !rc)
		rc = -EIO;
	return rc;
}

bool td_row_ok(const uint8_t *p, uint64_t row_bytes, uint64_t seed, uint64_t row)
{
	uint64_t key = npygen_row_key(seed, row);

	for (uint64_t i = 0; i < row_bytes; i++)
		if (p[i] != (uint8_t)(npygen_word(key, i / 8) >> (8 * (i % 8))))
			return false;
	return true;
}

bool td_batch_ok(struct pf_client *c, const struct pf_batch *b,
		 uint64_t (*seed_of)(const char *field), char *why, size_t len)
{
	uint64_t n = pf_num_samples(c);

	for (uint32_t f = 0; f < b->nfields; f++) {
		const uint8_t *base = b->data[f];
		struct pf_field fi;

		if (pf_field_info(c, f, &fi)) {
			snprintf(why, len, "pf_field_info %u: %s", f, pf_errmsg(c));
			return false;
		}
		for (uint32_t k = 0; k < b->count; k++)
			if (!td_row_ok(base + k * fi.sample_bytes, fi.sample_bytes,
				       seed_of(fi.name), b->picks[k] % n)) {
				snprintf(why, len,
					 "field %s of pick %" PRIu64 " (batch %" PRIu64
					 ", position %u) has wrong bytes",
					 fi.name, b->picks[k], b->seq, k);
				return false;
			}
	}
	return true;
}

Pf__Envelope *td_status(const char *sock)
{
	struct pf_client *c = NULL;
	Pf__Envelope req = PF__ENVELOPE__INIT, *reply = NULL;
	Pf__StatusRequest st = PF__STATUS_REQUEST__INIT;

	if (pf_connect(sock, &c) != 0) {
		pf_close(c);
		return NULL;
	}
	req.msg_case = PF__ENVELOPE__MSG_STATUS;
	req.status = &st;
	if (pfc_call(c, &req, PF__ENVELOPE__MSG_STATUS_REPLY, &reply) != 0)
		reply = NULL;
	pf_close(c);
	return reply;
}

int td_raw_connect(const char *sock)
{
	struct sockaddr_un a = {.sun_family = AF_UNIX};
	int fd;

	if (strlen(sock) >= sizeof(a.sun_path))
		return -ENAMETOOLONG;
	memcpy(a.sun_path, sock, strlen(sock) + 1);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	if (connect(fd, (struct sockaddr *)&a, sizeof(a)) < 0) {
		int rc = -errno;

		close(fd);
		return rc;
	}
	return fd;
}

int td_send_env(int fd, const Pf__Envelope *env, int pass_fd)
{
	uint8_t *buf;
	size_t len;
	int rc = wire_encode(env, &buf, &len);

	if (!rc)
		rc = wire_send_all(fd, buf, len, pass_fd);
	free(buf);
	return rc;
}

int td_send_hello(int fd, const char *client)
{
	Pf__Envelope env = PF__ENVELOPE__INIT;
	Pf__Hello h = PF__HELLO__INIT;

	h.version = WIRE_VERSION;
	h.client = (char *)client;
	env.id = 1;
	env.msg_case = PF__ENVELOPE__MSG_HELLO;
	env.hello = &h;
	return td_send_env(fd, &env, -1);
}

int td_send_fds(int fd, const int *fds, int n)
{
	union {
		struct cmsghdr h;
		char space[CMSG_SPACE(sizeof(int) * 253)];
	} ctl;
	uint8_t hdr[WIRE_HDR] = {0};
	struct iovec iov = {.iov_base = hdr, .iov_len = sizeof(hdr)};
	struct msghdr msg = {.msg_iov = &iov,
			     .msg_iovlen = 1,
			     .msg_control = ctl.space,
			     .msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)n)};
	struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);

	if (n < 1 || n > 253) /* the kernel's SCM_MAX_FD */
		return -EINVAL;
	cm->cmsg_level = SOL_SOCKET;
	cm->cmsg_type = SCM_RIGHTS;
	cm->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)n);
	memcpy(CMSG_DATA(cm), fds, sizeof(int) * (size_t)n);
	return sendmsg(fd, &msg, MSG_NOSIGNAL) == (ssize_t)sizeof(hdr) ? 0 : -errno;
}

Pf__SessionStatus *td_session(Pf__Envelope *status, uint64_t session)
{
	Pf__StatusReply *r = status ? status->status_reply : NULL;

	for (size_t i = 0; r && i < r->n_sessions; i++)
		if (r->sessions[i]->session == session)
			return r->sessions[i];
	return NULL;
}

uint16_t td_token(uint64_t seed, uint64_t pos)
{
	uint64_t x = (pos + 1) * 0x9E3779B97F4A7C15ull ^ seed * 0xBF58476D1CE4E5B9ull;

	x ^= x >> 31;
	return (uint16_t)(x * 0x94D049BB133111EBull >> 48);
}

int td_write_tokens(const char *path, uint64_t tokens, uint64_t seed, uint64_t first, int32_t magic,
		    int32_t version, uint64_t count_override)
{
	int32_t head[256] = {0};
	FILE *f = fopen(path, "wb");
	int rc = 0;

	if (!f)
		return -errno;
	/* x86 and arm64 are little-endian, as the format is. */
	head[0] = magic;
	head[1] = version;
	head[2] = (int32_t)(count_override ? count_override : tokens);
	if (fwrite(head, sizeof(head), 1, f) != 1)
		rc = -EIO;
	for (uint64_t k = 0; k < tokens && !rc; k++) {
		uint16_t t = td_token(seed, first + k);

		if (fwrite(&t, sizeof(t), 1, f) != 1)
			rc = -EIO;
	}
	if (fclose(f) && !rc)
		rc = -EIO;
	return rc;
}

Pf__PoolStatus *td_pool(Pf__Envelope *status, const char *dataset)
{
	return td_pool_on(status, dataset, NULL);
}

Pf__PoolStatus *td_pool_on(Pf__Envelope *status, const char *dataset, const char *device)
{
	Pf__StatusReply *r = status ? status->status_reply : NULL;

	for (size_t i = 0; r && i < r->n_pools; i++)
		if (!strcmp(r->pools[i]->dataset, dataset) &&
		    (!device || !strcmp(r->pools[i]->device, device)))
			return r->pools[i];
	return NULL;
}

int td_pool_control(const char *sock, const char *dataset, Pf__PoolAction action,
		    uint64_t *bytes_freed)
{
	struct pf_client *c = NULL;
	Pf__Envelope req = PF__ENVELOPE__INIT, *reply = NULL;
	Pf__PoolControl msg = PF__POOL_CONTROL__INIT;
	int rc;

	rc = pf_connect(sock, &c);
	if (rc == 0) {
		msg.dataset = (char *)dataset;
		msg.action = action;
		req.msg_case = PF__ENVELOPE__MSG_POOL;
		req.pool = &msg;
		rc = pfc_call(c, &req, PF__ENVELOPE__MSG_POOL_REPLY, &reply);
	}
	if (rc == 0 && bytes_freed)
		*bytes_freed = reply->pool_reply->bytes_freed;
	if (reply)
		pf__envelope__free_unpacked(reply, NULL);
	pf_close(c);
	return rc;
}

volatile sig_atomic_t td_interrupted;

static void on_signal(int sig)
{
	td_interrupted = sig;
}

void td_catch_signals(void)
{
	struct sigaction sa = {.sa_handler = on_signal};

	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	signal(SIGPIPE, SIG_IGN);
}

int td_fail(const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "%s: ", program_invocation_short_name);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	return -1;
}

int td_parse_uint(const char *opt, const char *s, unsigned lo, unsigned hi, unsigned *out)
{
	char *end;
	unsigned long v;

	errno = 0;
	v = strtoul(s, &end, 10);
	if (errno || end == s || *end || v < lo || v > hi)
		return td_fail("%s: expected an integer in %u..%u, got '%s'", opt, lo, hi, s);
	*out = (unsigned)v;
	return 0;
}

void td_print_machine(long online)
{
	FILE *f = fopen("/proc/cpuinfo", "r");
	char line[512], model[256] = "unknown";

	while (f && fgets(line, sizeof(line), f)) {
		char *colon = strchr(line, ':');

		if (strncmp(line, "model name", 10) != 0 || !colon)
			continue;
		colon++;
		colon += strspn(colon, " \t");
		colon[strcspn(colon, "\n")] = '\0';
		snprintf(model, sizeof(model), "%s", colon);
		break;
	}
	if (f)
		fclose(f);
	printf("machine: %ld online CPUs, %s\n", online, model);
}

void td_progress_start(struct td_progress *p, const char *what)
{
	p->what = what;
	p->last = td_now();
	if (what)
		fprintf(stderr, "%s: %s ...\n", program_invocation_short_name, what);
}

void td_progress(struct td_progress *p, uint64_t done, uint64_t total, const char *unit)
{
	double now;

	if (!p->what)
		return;
	now = td_now();
	if (now - p->last < 1.0)
		return;
	p->last = now;
	if (total)
		fprintf(stderr, "%s: %s: %" PRIu64 "/%" PRIu64 " %s (%.0f%%)\n",
			program_invocation_short_name, p->what, done, total, unit,
			100.0 * (double)done / (double)total);
	else
		fprintf(stderr, "%s: %s: %" PRIu64 " %s\n", program_invocation_short_name, p->what,
			done, unit);
}

/* The bench datasets' unit of writing and reading: a batch of 4 KiB rows. */
#define CHUNK_BYTES (4u << 20)

static int write_all(int fd, const void *buf, size_t len)
{
	const uint8_t *p = buf;

	while (len) {
		ssize_t n = write(fd, p, len);

		if (n < 0 && errno == EINTR && !td_interrupted)
			continue;
		if (n <= 0)
			return n < 0 ? -errno : -EIO;
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

/*
 * The bytes td_write_npy would write (row r, byte p = npygen_byte(seed, r, p);
 * checked identical with cmp), produced a word at a time: td_write_npy
 * hashes once per byte, 2.4 s of CPU per GiB against 0.3 s here on the
 * CI-class machine (2 vCPU EPYC, 2026-12-01).  The fsync leaves no dirty
 * pages whose writeback could land inside a timed phase.
 */
static int write_rows(const char *path, const struct td_rows *d)
{
	const uint64_t shape[1] = {d->row_bytes};
	const uint64_t chunk_rows = CHUNK_BYTES / d->row_bytes, row_words = d->row_bytes / 8;
	uint8_t hdr[256];
	size_t hlen = npygen_header(hdr, sizeof(hdr), 1, "<u1", d->rows, shape, 1);
	struct td_progress pg;
	uint64_t *chunk = NULL;
	int fd = -1, rc;

	if (!hlen)
		return td_fail("npygen_header: header does not fit");
	chunk = malloc(CHUNK_BYTES);
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (!chunk || fd < 0) {
		rc = td_fail("%s: %s", path, strerror(chunk ? errno : ENOMEM));
		goto out;
	}
	td_progress_start(&pg, d->progress ? "writing the dataset" : NULL);
	rc = write_all(fd, hdr, hlen);
	for (uint64_t r0 = 0; r0 < d->rows && !rc && !td_interrupted; r0 += chunk_rows) {
		uint64_t n = d->rows - r0 < chunk_rows ? d->rows - r0 : chunk_rows;

		for (uint64_t r = 0; r < n; r++) {
			uint64_t key = npygen_row_key(d->seed, r0 + r);
			uint64_t *row = chunk + r * row_words;

			/* npygen's words are little-endian; so is every host this
			 * daemon serves (it refuses big-endian dtypes too). */
			for (uint64_t w = 0; w < row_words; w++)
				row[w] = npygen_word(key, w);
		}
		rc = write_all(fd, chunk, n * d->row_bytes);
		td_progress(&pg, r0 + n, d->rows, "rows");
	}
	if (rc)
		rc = td_fail("%s: write: %s", path, strerror(-rc));
	else if (td_interrupted)
		rc = td_fail("interrupted");
	else if (fsync(fd) != 0)
		rc = td_fail("%s: fsync: %s", path, strerror(errno));
out:
	if (fd >= 0 && close(fd) != 0 && !rc)
		rc = td_fail("%s: close: %s", path, strerror(errno));
	free(chunk);
	return rc;
}

/*
 * Reads the whole file once (see td_bench_dataset): the first copy_bytes
 * of rows land in copy, the rest pass through a chunk of our own.  Then
 * mincore says how much of the file is resident, so the output can say a
 * phase was timed from memory rather than assume it.
 */
static int warm_rows(const char *path, const struct td_rows *d, uint8_t *copy, uint64_t copy_bytes,
		     double *resident)
{
	const uint64_t probe_rows[3] = {0, d->rows / 2, d->rows - 1};
	const uint64_t row_bytes = d->row_bytes, bytes = d->rows * row_bytes;
	struct stat st;
	uint64_t data_off, done = 0, pages, in = 0;
	long page = sysconf(_SC_PAGESIZE);
	unsigned char *vec = NULL;
	uint8_t *chunk = NULL;
	void *map = MAP_FAILED;
	struct td_progress pg;
	int fd, rc = 0;

	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0 || fstat(fd, &st) != 0) {
		rc = td_fail("%s: %s", path, strerror(errno));
		goto out;
	}
	if ((uint64_t)st.st_size < bytes) {
		rc = td_fail("%s: %lld bytes, expected at least %" PRIu64, path,
			     (long long)st.st_size, bytes);
		goto out;
	}
	if (copy_bytes < bytes && !(chunk = malloc(CHUNK_BYTES))) {
		rc = td_fail("out of memory");
		goto out;
	}
	data_off = (uint64_t)st.st_size - bytes;
	td_progress_start(&pg, d->progress ? "reading the dataset into the page cache" : NULL);
	while (done < bytes && !td_interrupted) {
		uint64_t want = bytes - done < CHUNK_BYTES ? bytes - done : CHUNK_BYTES;
		uint8_t *dst = done < copy_bytes ? copy + done : chunk;
		ssize_t n;

		/* copy_bytes is a multiple of CHUNK_BYTES or all of it, and
		 * CHUNK_BYTES of whole rows: a read never straddles the two, nor
		 * a row two reads. */
		n = pread(fd, dst, want, (off_t)(data_off + done));
		if (n < 0 && errno == EINTR)
			continue;
		if (n != (ssize_t)want) {
			rc = td_fail("%s: read: %s", path, n < 0 ? strerror(errno) : "short read");
			goto out;
		}
		for (int i = 0; i < 3; i++) {
			uint64_t r = probe_rows[i];

			if (r * row_bytes < done || r * row_bytes >= done + want)
				continue;
			if (!td_row_ok(dst + (r * row_bytes - done), row_bytes, d->seed, r)) {
				rc = td_fail("row %" PRIu64 " of %s does not hold npygen's bytes",
					     r, path);
				goto out;
			}
		}
		done += want;
		td_progress(&pg, done >> 20, bytes >> 20, "MiB");
	}
	if (td_interrupted) {
		rc = td_fail("interrupted");
		goto out;
	}
	pages = ((uint64_t)st.st_size + (uint64_t)page - 1) / (uint64_t)page;
	map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
	vec = malloc(pages);
	if (map == MAP_FAILED || !vec || mincore(map, (size_t)st.st_size, vec) != 0) {
		rc = td_fail("%s: mincore: %s", path, strerror(vec ? errno : ENOMEM));
		goto out;
	}
	for (uint64_t i = 0; i < pages; i++)
		in += vec[i] & 1;
	*resident = (double)in / (double)pages;
out:
	if (map != MAP_FAILED)
		munmap(map, (size_t)st.st_size);
	free(vec);
	free(chunk);
	if (fd >= 0)
		close(fd);
	return rc;
}

int td_bench_dataset(struct tdaemon *t, const struct td_rows *d, char *path, size_t len,
		     uint8_t *copy, uint64_t copy_bytes)
{
	double t0, resident = 0;
	int rc;

	if (d->rows == 0 || d->row_bytes % 8 || CHUNK_BYTES % d->row_bytes ||
	    (copy_bytes % CHUNK_BYTES && copy_bytes < d->rows * d->row_bytes))
		return td_fail("td_bench_dataset: %" PRIu64 " rows of %u B, copy of %" PRIu64
			       " B: not a layout it reads",
			       d->rows, d->row_bytes, copy_bytes);
	rc = td_init(t, "bench");
	if (rc)
		return td_fail("td_init: %s", strerror(-rc));
	td_path(t, "rows.npy", path, len);
	t0 = td_now();
	if (write_rows(path, d))
		return -1;
	printf("wrote %s in %.2f s\n", path, td_now() - t0);
	t0 = td_now();
	if (warm_rows(path, d, copy, copy_bytes, &resident))
		return -1;
	printf("page cache: read the whole file once before timing (%.2f s); mincore: %.1f%% "
	       "resident\n",
	       td_now() - t0, resident * 100);
	return 0;
}

bool td_is_permutation(const uint64_t *picks, uint64_t n, uint64_t rows)
{
	uint8_t *seen = calloc((rows + 7) / 8, 1);
	bool ok = seen && n == rows;

	for (uint64_t i = 0; ok && i < n; i++) {
		uint64_t r = picks[i];

		ok = r < rows && !(seen[r / 8] & (1u << (r % 8)));
		if (ok)
			seen[r / 8] |= (uint8_t)(1u << (r % 8));
	}
	free(seen);
	return ok;
}

static void print_log_tail(const struct tdaemon *t)
{
	char line[512];
	FILE *f = fopen(t->log, "r");
	long size;

	if (!f)
		return;
	/* The last few KiB say why; a verbose log of a long run is mostly noise. */
	fseek(f, 0, SEEK_END);
	size = ftell(f);
	fseek(f, size > 4096 ? size - 4096 : 0, SEEK_SET);
	fprintf(stderr, "---- tail of %s ----\n", t->log);
	while (fgets(line, sizeof(line), f))
		fputs(line, stderr);
	fprintf(stderr, "----\n");
	fclose(f);
}

void td_bench_end(struct tdaemon *t, bool show_log)
{
	if (t->pid > 0)
		td_stop(t, 5000);
	if (show_log)
		print_log_tail(t);
	td_cleanup(t);
}
