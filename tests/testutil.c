/*
 * testutil.c — a real daemon on a temporary socket, known .npy bytes, and
 * status over the real protocol (see testutil.h).
 */
#include "testutil.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../tools/npygen.h"
#include "client_int.h"
#include "prefetch.h"

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
	if (!mkdtemp(t->dir))
		return -errno;
	snprintf(t->sock, sizeof(t->sock), "%s/prefetchd.sock", t->dir);
	snprintf(t->conf, sizeof(t->conf), "%s/prefetchd.conf", t->dir);
	snprintf(t->log, sizeof(t->log), "%s/daemon.log", t->dir);
	return 0;
}

void td_path(const struct tdaemon *t, const char *name, char *out, size_t len)
{
	snprintf(out, len, "%s/%s", t->dir, name);
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

Pf__SessionStatus *td_session(Pf__Envelope *status, uint64_t session)
{
	Pf__StatusReply *r = status ? status->status_reply : NULL;

	for (size_t i = 0; r && i < r->n_sessions; i++)
		if (r->sessions[i]->session == session)
			return r->sessions[i];
	return NULL;
}
