/*
 * cuda_smoke.c — a by-hand check of the real GPU paths on a machine with a
 * GPU: the daemon side (daemon/gpu/gpu.c) allocates an arena, fills it with
 * gpu_copy_h2d from a registered host buffer and passes it to a forked
 * child, which imports it with the client side (client/cuda_ipc.c) and
 * reads it back.  Once for each kind: FD (cuMemCreate + SCM_RIGHTS) and legacy
 * (cudaIpcGetMemHandle), and an FD arena the daemon frees while its fd is
 * still in flight.  The child also reads through the CUDA runtime, as
 * PyTorch would.  Prints PASS/FAIL per check; exit 0 when all pass,
 * 1 on a failure, 77 when there is no GPU.
 *
 * Not named test_*: the Makefile does not build it.  By hand, after make:
 *   gcc -std=gnu11 -O2 -g -Wall -Wextra -D_GNU_SOURCE -DPF_CUDA=1 \
 *       -I/usr/local/cuda/include -Idaemon -Iproto -Iclient -o build/cuda_smoke \
 *       tests/cuda/cuda_smoke.c daemon/gpu/gpu.c daemon/base/log.c client/cuda.c \
 *       client/cuda_ipc.c build/daemon/gpu/gather.o \
 *       -L/usr/local/cuda/lib64 -lcudart_static -ldl -lrt -lpthread
 *
 * DESIGN: two processes, one socketpair.  The child is forked before the
 * parent touches CUDA, because a CUDA-initialised process cannot hand a
 * working driver to a forked child.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cuda_runtime_api.h> /* only to prove the runtime sees the mapping */

#include "gpu/gpu.h"
#include "base/log.h"
#include "pfcuda.h"

#define MiB (1ull << 20)
/* Deliberately not a multiple of 2 MiB: the arena is rounded up. */
#define WANT_BYTES (8 * MiB + 12345)

struct offer {
	int kind; /* enum gpu_ipc */
	int dev;
	uint64_t arena_bytes;
	uint64_t want_bytes;
	uint8_t seed;
	uint8_t legacy_handle[GPU_IPC_HANDLE_BYTES];
};

struct verdict {
	int rc;
	char msg[240];
	char bus_id[32];
	uint64_t free_bytes, total_bytes;
};

static uint8_t pattern(uint64_t i, uint8_t seed)
{
	return (uint8_t)((i * 2654435761u) >> 13) ^ seed;
}

static int send_with_fd(int sock, const void *buf, size_t len, int fd)
{
	union {
		struct cmsghdr h;
		char buf[CMSG_SPACE(sizeof(int))];
	} ctl;
	struct iovec iov = {(void *)buf, len};
	struct msghdr mh = {0};
	struct cmsghdr *cm;

	mh.msg_iov = &iov;
	mh.msg_iovlen = 1;
	if (fd >= 0) {
		memset(&ctl, 0, sizeof(ctl));
		mh.msg_control = ctl.buf;
		mh.msg_controllen = sizeof(ctl.buf);
		cm = CMSG_FIRSTHDR(&mh);
		cm->cmsg_level = SOL_SOCKET;
		cm->cmsg_type = SCM_RIGHTS;
		cm->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(cm), &fd, sizeof(int));
	}
	return sendmsg(sock, &mh, MSG_NOSIGNAL) == (ssize_t)len ? 0 : -1;
}

/* Returns bytes received (0 on EOF) and the passed fd or -1. */
static ssize_t recv_with_fd(int sock, void *buf, size_t len, int *fd)
{
	union {
		struct cmsghdr h;
		char buf[CMSG_SPACE(sizeof(int))];
	} ctl;
	struct iovec iov = {buf, len};
	struct msghdr mh = {0};
	struct cmsghdr *cm;
	ssize_t n;

	*fd = -1;
	mh.msg_iov = &iov;
	mh.msg_iovlen = 1;
	mh.msg_control = ctl.buf;
	mh.msg_controllen = sizeof(ctl.buf);
	n = recvmsg(sock, &mh, MSG_WAITALL | MSG_CMSG_CLOEXEC);
	for (cm = CMSG_FIRSTHDR(&mh); n > 0 && cm; cm = CMSG_NXTHDR(&mh, cm))
		if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS)
			memcpy(fd, CMSG_DATA(cm), sizeof(int));
	return n;
}

/* The trainer's side: import, read back, compare, release-event round trip. */
static void check_offer(struct pfcuda_dev **dev, const struct offer *o, int fd, struct verdict *v)
{
	struct pfcuda_arena a;
	uint8_t *back = NULL, rt[4096];
	uint64_t off = o->want_bytes - sizeof(rt);
	cudaError_t ce;
	void *ev = NULL;
	uint64_t i;
	int rc, polls = 0;

	if (!*dev) {
		rc = pfcuda_open(o->dev, dev, v->msg, sizeof(v->msg));
		if (rc < 0) {
			if (fd >= 0)
				close(fd);
			v->rc = rc;
			return;
		}
	}
	if (o->kind == GPU_IPC_FD)
		rc = pfcuda_import_fd(*dev, fd, o->arena_bytes, &a, v->msg, sizeof(v->msg));
	else
		rc = pfcuda_import_legacy(*dev, o->legacy_handle, o->arena_bytes, &a, v->msg,
					  sizeof(v->msg));
	if (rc < 0)
		goto out;
	back = malloc(o->arena_bytes);
	if (!back) {
		rc = -ENOMEM;
		goto unmap;
	}
	rc = pfcuda_copy_dtoh(*dev, back, a.base, o->arena_bytes, v->msg, sizeof(v->msg));
	if (rc < 0)
		goto unmap;
	for (i = 0; i < o->want_bytes; i++) {
		if (back[i] != pattern(i, o->seed)) {
			snprintf(v->msg, sizeof(v->msg), "byte %llu is %#x, want %#x",
				 (unsigned long long)i, back[i], pattern(i, o->seed));
			rc = -EBADMSG;
			goto unmap;
		}
	}
	/* The trainer's framework uses the runtime, hence the primary
	 * context: the pointer must be valid there too. */
	ce = cudaSetDevice(o->dev);
	if (ce == cudaSuccess)
		ce = cudaMemcpy(rt, (const void *)(uintptr_t)(a.base + off), sizeof(rt),
				cudaMemcpyDeviceToHost);
	if (ce != cudaSuccess) {
		snprintf(v->msg, sizeof(v->msg), "runtime read: %s", cudaGetErrorString(ce));
		rc = -EIO;
		goto unmap;
	}
	for (i = 0; i < sizeof(rt); i++) {
		if (rt[i] != pattern(off + i, o->seed)) {
			snprintf(v->msg, sizeof(v->msg), "runtime read: byte %llu differs",
				 (unsigned long long)(off + i));
			rc = -EBADMSG;
			goto unmap;
		}
	}
	/* The release path: an event on the legacy default stream, polled. */
	rc = pfcuda_event_create(*dev, &ev, v->msg, sizeof(v->msg));
	if (rc < 0)
		goto unmap;
	rc = pfcuda_event_record(*dev, ev, NULL, v->msg, sizeof(v->msg));
	while (rc == 0 && (rc = pfcuda_event_query(*dev, ev, v->msg, sizeof(v->msg))) == -EAGAIN &&
	       polls++ < 1000000)
		usleep(10);
	if (rc < 0)
		goto unmap;
	rc = pfcuda_mem_info(*dev, &v->free_bytes, &v->total_bytes, v->msg, sizeof(v->msg));
	if (rc < 0)
		goto unmap;
	rc = pfcuda_pci_bus_id(*dev, v->bus_id, sizeof(v->bus_id), v->msg, sizeof(v->msg));
	if (rc < 0)
		goto unmap;
	snprintf(v->msg, sizeof(v->msg), "%llu bytes match at %#llx",
		 (unsigned long long)o->want_bytes, (unsigned long long)a.base);
unmap:
	pfcuda_event_destroy(*dev, ev);
	if (pfcuda_unmap(*dev, &a, rc < 0 ? NULL : v->msg, sizeof(v->msg)) < 0 && rc == 0)
		rc = -EIO;
out:
	free(back);
	v->rc = rc;
}

static int child_main(int sock)
{
	struct pfcuda_dev *dev = NULL;
	struct offer o;
	struct verdict v;
	int fd;

	while (recv_with_fd(sock, &o, sizeof(o), &fd) == (ssize_t)sizeof(o)) {
		memset(&v, 0, sizeof(v));
		check_offer(&dev, &o, fd, &v);
		if (send_with_fd(sock, &v, sizeof(v), -1) < 0)
			break;
	}
	pfcuda_close(dev);
	return 0;
}

static bool report(const char *what, bool ok, const char *detail)
{
	printf("%s %s%s%s\n", ok ? "PASS" : "FAIL", what, detail ? ": " : "", detail ? detail : "");
	fflush(stdout);
	return ok;
}

/* free_early: the daemon frees its side as soon as the fd is in flight,
 * before the child has imported it; the kernel's reference on the fd must
 * keep the memory (and its bytes) alive. */
static bool run_kind(int sock, struct gpu_stream *s, struct gpu_event *e, uint8_t *host,
		     enum gpu_ipc kind, bool free_early, const char *name)
{
	struct gpu_mem a;
	struct offer o;
	struct verdict v;
	char what[96], detail[512];
	uint64_t i;
	int rc, fd;

	snprintf(what, sizeof(what), "%s arena", name);
	memset(&o, 0, sizeof(o));
	o.seed = (uint8_t)(kind == GPU_IPC_FD ? 0x11 : 0x77) + free_early;
	for (i = 0; i < WANT_BYTES; i++)
		host[i] = pattern(i, o.seed);

	rc = gpu_mem_alloc(0, WANT_BYTES, kind, &a);
	if (rc < 0) {
		snprintf(detail, sizeof(detail), "gpu_mem_alloc: %s", strerror(-rc));
		return report(what, false, detail);
	}
	if (a.bytes < WANT_BYTES || a.bytes % (2 * MiB) ||
	    (kind == GPU_IPC_FD) != (a.export_fd >= 0)) {
		snprintf(detail, sizeof(detail), "bad arena: %llu bytes, fd %d",
			 (unsigned long long)a.bytes, a.export_fd);
		gpu_mem_free(&a);
		return report(what, false, detail);
	}
	rc = gpu_copy_h2d(s, a.base, host, WANT_BYTES);
	if (rc == 0)
		rc = gpu_event_record(e, s);
	if (rc == 0)
		rc = gpu_event_sync(e);
	if (rc == 0)
		rc = gpu_event_query(e);
	if (rc < 0) {
		snprintf(detail, sizeof(detail), "copy: %s", strerror(-rc));
		gpu_mem_free(&a);
		return report(what, false, detail);
	}

	o.kind = kind;
	o.dev = 0;
	o.arena_bytes = a.bytes;
	o.want_bytes = WANT_BYTES;
	memcpy(o.legacy_handle, a.legacy_handle, sizeof(o.legacy_handle));
	rc = send_with_fd(sock, &o, sizeof(o), a.export_fd);
	/* Sent: the fd is in flight in the kernel, our copy can go. */
	if (a.export_fd >= 0) {
		close(a.export_fd);
		a.export_fd = -1;
	}
	if (free_early)
		gpu_mem_free(&a);
	if (rc < 0 || recv_with_fd(sock, &v, sizeof(v), &fd) != (ssize_t)sizeof(v)) {
		gpu_mem_free(&a);
		return report(what, false, "lost the child");
	}
	gpu_mem_free(&a);
	if (v.rc < 0) {
		snprintf(detail, sizeof(detail), "child: %s (%s)", v.msg, strerror(-v.rc));
		return report(what, false, detail);
	}
	snprintf(detail, sizeof(detail), "%s; child sees %.1f of %.1f GiB free on %s", v.msg,
		 v.free_bytes / 1073741824.0, v.total_bytes / 1073741824.0, v.bus_id);
	report(what, true, detail);
	snprintf(what, sizeof(what), "%s: child's bus id maps to daemon device 0", name);
	return report(what, gpu_device_by_pci_bus_id(v.bus_id) == 0, v.bus_id);
}

/* A D2D copy moves bytes inside an arena, and an event recorded behind
 * a long queue reports pending (-EAGAIN) before it completes. */
static bool check_d2d_and_pending(struct gpu_stream *s, struct gpu_event *e, uint8_t *host)
{
	struct gpu_mem a;
	uint8_t back[4096];
	bool ok = true, saw_pending;
	cudaError_t ce;
	uint64_t i;
	int rc, k;

	rc = gpu_mem_alloc(0, 64 * MiB, GPU_IPC_FD, &a);
	if (rc < 0)
		return report("d2d arena", false, strerror(-rc));
	for (i = 0; i < WANT_BYTES; i++)
		host[i] = pattern(i, 0x42);
	rc = gpu_copy_h2d(s, a.base, host, WANT_BYTES);
	if (rc == 0)
		rc = gpu_copy_d2d(s, a.base + 32 * MiB, a.base + 4096, sizeof(back));
	for (k = 0; rc == 0 && k < 64; k++)
		rc = gpu_copy_h2d(s, a.base + 40 * MiB, host, WANT_BYTES);
	if (rc == 0)
		rc = gpu_event_record(e, s);
	saw_pending = rc == 0 && gpu_event_query(e) == -EAGAIN;
	if (rc == 0)
		rc = gpu_event_sync(e);
	if (rc == 0)
		rc = gpu_event_query(e);
	ok &= report("event pending, then done", rc == 0 && saw_pending,
		     saw_pending ? NULL : "never saw -EAGAIN");
	ce = cudaMemcpy(back, (const void *)(uintptr_t)(a.base + 32 * MiB), sizeof(back),
			cudaMemcpyDeviceToHost);
	ok &= report("gpu_copy_d2d moves bytes",
		     ce == cudaSuccess && memcmp(back, host + 4096, sizeof(back)) == 0, NULL);
	gpu_mem_free(&a);
	return ok;
}

int main(void)
{
	struct gpu_stream *s = NULL;
	struct gpu_event *e = NULL;
	struct gpu_mem huge;
	uint8_t *host = NULL;
	uint64_t f = 0, t = 0;
	char desc[256], name[128], bus[32], detail[300];
	bool ok = true;
	int sv[2], status, rc, n;
	pid_t pid;

	log_init("cuda_smoke", 1);
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0) {
		perror("socketpair");
		return 1;
	}
	pid = fork();
	if (pid < 0) {
		perror("fork");
		return 1;
	}
	if (pid == 0) {
		close(sv[0]);
		_exit(child_main(sv[1]));
	}
	close(sv[1]);

	n = gpu_init(desc, sizeof(desc));
	printf("gpu_init: %d: %s\n", n, desc);
	if (n <= 0) {
		/* Everything else must now refuse politely. */
		ok &= report("no-GPU calls refuse with -ENODEV",
			     gpu_stream_create(0, &s) == -ENODEV &&
				     gpu_mem_alloc(0, MiB, GPU_IPC_FD, &huge) == -ENODEV &&
				     gpu_mem_info(0, &f, &t) == -ENODEV && gpu_device_count() == 0,
			     NULL);
		/* So must the client side, with a reason. */
		{
			struct pfcuda_dev *d = NULL;
			char msg[256] = "";

			rc = pfcuda_open(0, &d, msg, sizeof(msg));
			ok &= report("pfcuda_open without a GPU fails with a reason",
				     rc < 0 && !d && msg[0], msg);
		}
		close(sv[0]);
		waitpid(pid, &status, 0);
		printf("SKIP: no GPU\n");
		return ok ? 77 : 1;
	}
	if (gpu_device_name(0, name, sizeof(name)) == 0 &&
	    gpu_device_pci_bus_id(0, bus, sizeof(bus)) == 0 && gpu_mem_info(0, &f, &t) == 0)
		printf("device 0: %s at %s, %.1f of %.1f GiB free\n", name, bus, f / 1073741824.0,
		       t / 1073741824.0);
	else
		ok = report("device info", false, NULL);

	host = aligned_alloc(4096, (WANT_BYTES + 4095) / 4096 * 4096);
	rc = host ? gpu_host_register(host, (WANT_BYTES + 4095) / 4096 * 4096) : -ENOMEM;
	ok &= report("gpu_host_register", rc == 0, rc ? strerror(-rc) : NULL);
	rc = gpu_host_register(host, 4096);
	ok &= report("second registration is -EEXIST", rc == -EEXIST, strerror(-rc));
	rc = gpu_stream_create(0, &s);
	if (rc == 0)
		rc = gpu_event_create(0, &e);
	ok &= report("stream and event", rc == 0, rc ? strerror(-rc) : NULL);
	if (rc == 0) {
		ok &= run_kind(sv[0], s, e, host, GPU_IPC_FD, false, "fd");
		ok &= run_kind(sv[0], s, e, host, GPU_IPC_LEGACY, false, "legacy");
		ok &= run_kind(sv[0], s, e, host, GPU_IPC_FD, true, "fd freed while in flight");
	}

	if (rc == 0)
		ok &= check_d2d_and_pending(s, e, host);

	/* Twice the card cannot exist: the governor relies on -ENOMEM here. */
	rc = gpu_mem_alloc(0, 2 * t, GPU_IPC_FD, &huge);
	snprintf(detail, sizeof(detail), "got %d (%s)", rc, strerror(-rc));
	ok &= report("oversized fd arena is -ENOMEM", rc == -ENOMEM, detail);
	gpu_mem_free(&huge);
	rc = gpu_mem_alloc(0, 2 * t, GPU_IPC_LEGACY, &huge);
	snprintf(detail, sizeof(detail), "got %d (%s)", rc, strerror(-rc));
	ok &= report("oversized legacy arena is -ENOMEM", rc == -ENOMEM, detail);
	gpu_mem_free(&huge);

	close(sv[0]);
	waitpid(pid, &status, 0);
	ok &= report("child exited cleanly", WIFEXITED(status) && WEXITSTATUS(status) == 0, NULL);
	gpu_event_destroy(e);
	gpu_stream_destroy(s);
	if (host)
		ok &= report("gpu_host_unregister", gpu_host_unregister(host) == 0, NULL);
	free(host);
	printf("%s\n", ok ? "ALL PASS" : "SOME FAILED");
	return ok ? 0 : 1;
}
