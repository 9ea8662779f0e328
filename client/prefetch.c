/*
 * prefetch.c — libprefetch: the trainer's end of the prefetchd protocol
 * (proto/PROTOCOL.md) and the consumer side of the depth governor.
 *
 * This file and epoch.c are the public API (prefetch.h), each call built
 * from the library's other files, which client_int.h lists in the order
 * they call each other.  Here: a client's life, from connecting and
 * opening its session, through what the session serves, its depth and
 * its totals, to pf_close, which gives back every batch, waits for the
 * release lanes and unmaps every arena.  epoch.c: epochs and the batches
 * in them.
 *
 * DESIGN: no threads, no locks.  A struct pf_client belongs to the thread
 * that calls it, one at a time (prefetch.h says so); its lists, arena
 * mappings and receive buffer have no other owner.  pf_close is the one
 * call that stops the release lanes' threads (settle.c).
 */
#include "client_int.h"
#include "pfcuda.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

/* ---- connecting ---------------------------------------------------------- */

PF_API int pf_connect(const char *path, struct pf_client **out)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	int64_t deadline = pfc_deadline_after(PFC_HELLO_TIMEOUT_MS);
	struct pf_client *c;
	char where[sizeof(sa.sun_path) + 32];
	int sock;

	if (!out)
		return -EINVAL;
	if (!path || !*path)
		path = getenv(PF_SOCKET_ENV);
	if (!path || !*path)
		path = PF_DEFAULT_SOCKET;
	snprintf(where, sizeof(where), "prefetchd at %.*s", (int)sizeof(sa.sun_path), path);
	c = pfc_client_new(where);
	*out = c;
	if (!c)
		return -ENOMEM;
	if (strlen(path) >= sizeof(sa.sun_path))
		return pfc_conn_fail(c, -ENAMETOOLONG,
				     "socket path %s is too long (at most %zu bytes)", path,
				     sizeof(sa.sun_path) - 1);
	memcpy(sa.sun_path, path, strlen(path) + 1);
	/* Kept for reconnection: the restarted daemon listens on the same path. */
	c->path = strdup(path);
	if (!c->path)
		return pfc_conn_fail(c, -ENOMEM, "out of memory");
	sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (sock < 0)
		return pfc_conn_fail(c, -errno, "cannot create a socket: %s", strerror(errno));
	c->sock = sock;
	/* A non-blocking connect on a Unix socket fails with EAGAIN while the
	 * daemon's listen backlog is full; retry until the hello deadline
	 * rather than block inside connect() for ever. */
	while (connect(sock, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		int e = errno;

		if (e == EINTR)
			continue;
		if (e == EAGAIN && pfc_ms_left(deadline) > 0) {
			usleep(10000);
			continue;
		}
		return pfc_conn_fail(c, -e, "cannot connect to prefetchd at %s: %s%s", path,
				     strerror(e),
				     e == ENOENT || e == ECONNREFUSED ? " (is the daemon running?)"
				     : e == EACCES ? " (is this user allowed to use the socket?)"
						   : "");
	}
	return pfc_hello(c, PFC_HELLO_TIMEOUT_MS);
}

/* ---- session ------------------------------------------------------------- */

static int keep_session(struct pf_client *c, const Pf__SessionOpened *so)
{
	if (so->slots > PFC_MAX_SLOTS)
		return pfc_conn_fail(c, -EPROTO,
				     "session with %" PRIu32 " slots is over this client's %u",
				     so->slots, PFC_MAX_SLOTS);
	if (so->n_fields > 4096)
		return pfc_conn_fail(c, -EPROTO, "session with %zu fields", so->n_fields);
	c->fields = calloc(so->n_fields ? so->n_fields : 1, sizeof(*c->fields));
	c->slot_mine = calloc(so->slots ? so->slots : 1, 1);
	c->device = strdup(so->device && *so->device ? so->device : "host");
	if (!c->fields || !c->slot_mine || !c->device)
		return pfc_conn_fail(c, -ENOMEM, "out of memory");
	c->nfields = (uint32_t)so->n_fields;
	for (size_t f = 0; f < so->n_fields; f++) {
		const Pf__Field *in = so->fields[f];
		struct pfc_field *out = &c->fields[f];

		out->name = strdup(in->name ? in->name : "");
		out->dtype = strdup(in->dtype ? in->dtype : "");
		out->shape = calloc(in->n_shape ? in->n_shape : 1, sizeof(uint64_t));
		if (!out->name || !out->dtype || !out->shape)
			return pfc_conn_fail(c, -ENOMEM, "out of memory");
		if (in->n_shape > 32)
			return pfc_conn_fail(c, -EPROTO, "field %s has %zu dimensions", out->name,
					     in->n_shape);
		/* A scalar field has no shape, and in->shape is NULL then. */
		if (in->n_shape)
			memcpy(out->shape, in->shape, in->n_shape * sizeof(uint64_t));
		out->ndim = (int)in->n_shape;
		out->sample_bytes = in->sample_bytes;
		out->offset = in->offset;
	}
	c->session = so->session;
	c->num_samples = so->num_samples;
	c->slot_bytes = so->slot_bytes;
	c->slots = so->slots;
	c->probe_interval_s = so->probe_interval_s;
	c->opened = true;
	c->ccopy = so->client_copy;
	if (c->ccopy && !c->gather)
		return pfc_conn_fail(c, -EPROTO,
				     "%s sent host arenas to copy to a client that "
				     "cannot",
				     c->where);
	return pfc_keep_pool(c, so);
}

static void free_open_opts(struct pf_client *c)
{
	free((char *)c->open_opts.dataset);
	free((char *)c->open_opts.device);
	free((char *)c->open_opts.name);
	free((char *)c->open_opts.share);
	memset(&c->open_opts, 0, sizeof(c->open_opts));
}

/* pf_open's options, kept for opening the session again after a restart. */
static int keep_open_opts(struct pf_client *c, const struct pf_open_opts *opts)
{
	struct pf_open_opts *k = &c->open_opts;

	*k = *opts;
	k->dataset = strdup(opts->dataset);
	k->device = strdup(opts->device ? opts->device : "host");
	k->name = strdup(opts->name ? opts->name : c->hello_name);
	k->share = strdup(opts->share ? opts->share : "");
	if (!k->dataset || !k->device || !k->name || !k->share) {
		free_open_opts(c);
		return pfc_set_err(c, -ENOMEM, "out of memory");
	}
	return 0;
}

PF_API int pf_open(struct pf_client *c, const struct pf_open_opts *opts)
{
	Pf__Envelope *reply;
	char why[256];
	int rc;

	if (!c)
		return -EINVAL;
	if (c->dead)
		return pfc_fail_dead(c);
	if (!opts || !opts->dataset || !*opts->dataset)
		return pfc_set_err(c, -EINVAL, "pf_open: no dataset named");
	if (c->opened)
		return pfc_set_err(c, -EBUSY, "pf_open: this client already has session %" PRIu64,
				   c->session);
	/* The negation also refuses NaN. */
	if (!(opts->reconnect_s >= 0 && opts->reconnect_s <= 1e9))
		return pfc_set_err(c, -EINVAL, "pf_open: reconnect_s %g is not a number of seconds",
				   opts->reconnect_s);
	if (opts->reconnect_s > 0 && !c->path)
		return pfc_set_err(
			c, -EINVAL,
			"pf_open: reconnect_s needs a client made by pf_connect (a socket "
			"path to connect to again)");
	if (opts->device && strncmp(opts->device, "cuda:", 5) == 0) {
		char *end;
		long n;

		errno = 0;
		n = strtol(opts->device + 5, &end, 10);
		if (end == opts->device + 5 || *end || n < 0 || n > INT_MAX || errno)
			return pfc_set_err(
				c, -EINVAL,
				"pf_open: unknown device '%s' (use \"host\" or \"cuda:N\")",
				opts->device);
		/* The driver is loaded here, on the first CUDA session. */
		rc = pfcuda_open((int)n, &c->cuda, why, sizeof(why));
		if (rc)
			return pfc_set_err(c, rc, "pf_open: %s: %s", opts->device, why);
		if (pfcuda_pci_bus_id(c->cuda, c->pci_bus_id, sizeof(c->pci_bus_id), NULL, 0) != 0)
			c->pci_bus_id[0] = '\0';
		/* Pool hits are gathered here, in the trainer's context, when
		 * the kernel loads ($PREFETCH_CLIENT_GATHER=0: never; then, or
		 * when it does not load, the daemon gathers). */
		if (!pfc_env_says_no("PREFETCH_CLIENT_GATHER"))
			pfcuda_gather_open(c->cuda, &c->gather, NULL, 0);
	}
	rc = keep_open_opts(c, opts);
	if (!rc)
		rc = pfc_send_open(c, &reply);
	if (rc) {
		free_open_opts(c);
		pfcuda_gather_close(c->gather);
		c->gather = NULL;
		pfcuda_close(c->cuda);
		c->cuda = NULL;
		c->pci_bus_id[0] = '\0';
		return rc;
	}
	rc = keep_session(c, reply->opened);
	pf__envelope__free_unpacked(reply, NULL);
	return rc;
}

PF_API uint64_t pf_num_samples(const struct pf_client *c)
{
	return c && c->opened ? c->num_samples : 0;
}

PF_API uint32_t pf_num_fields(const struct pf_client *c)
{
	return c && c->opened ? c->nfields : 0;
}

PF_API int pf_field_info(const struct pf_client *c, uint32_t i, struct pf_field *out)
{
	if (!c || !out || !c->opened || i >= c->nfields)
		return -EINVAL;
	out->name = c->fields[i].name;
	out->dtype = c->fields[i].dtype;
	out->ndim = c->fields[i].ndim;
	out->shape = c->fields[i].shape;
	out->sample_bytes = c->fields[i].sample_bytes;
	return 0;
}

/* ---- depth and totals ---------------------------------------------------- */

PF_API int pf_set_depth(struct pf_client *c, uint64_t session, uint32_t target)
{
	Pf__Envelope env = PF__ENVELOPE__INIT;
	Pf__SetDepth msg = PF__SET_DEPTH__INIT;
	int revived = 0, rc;

	if (!c)
		return -EINVAL;
	msg.session = session;
	msg.target = target;
	msg.automatic = target == 0;
	env.msg_case = PF__ENVELOPE__MSG_SET_DEPTH;
	env.set_depth = &msg;
	for (;;) {
		rc = pfc_revive(c, -1);
		if (rc)
			return rc;
		rc = pfc_call(c, &env, PF__ENVELOPE__MSG_OK, NULL);
		if (!rc || !c->dead || !pfc_reconnecting(c) || ++revived > RECONNECTS_PER_CALL)
			break;
	}
	/* The session's own depth is set again on a restarted daemon. */
	if (!rc && c->opened && (session == 0 || session == c->session)) {
		c->own_target_set = true;
		c->own_target = target;
	}
	return rc;
}

PF_API int pf_stats(const struct pf_client *c, struct pf_stats *out)
{
	double total;

	if (!c || !out)
		return -EINVAL;
	memset(out, 0, sizeof(*out));
	out->session = c->session;
	out->batches = c->batches;
	out->bytes = c->bytes;
	out->held = c->nheld;
	out->wait_s = c->wait_s;
	out->busy_s = c->busy_s;
	total = c->wait_s + c->busy_s;
	out->stall_fraction = total > 0 ? c->wait_s / total : 0;
	out->reconnects = c->reconnects;
	out->resume_batch = c->resume_seq;
	return 0;
}

/* ---- closing ------------------------------------------------------------- */

/* $PREFETCH_CLIENT_COUNTERS: what this client did, per batch taken, on
 * stderr at pf_close. */
static void print_counts(const struct pf_client *c)
{
	const struct pfc_counts *k = &c->counts;
	double n = c->batches ? (double)c->batches : 1.0;
	/* The lanes may still be settling: their counts are read as they add. */
	uint64_t settled = __atomic_load_n(&k->settled, __ATOMIC_RELAXED);
	uint64_t settle_ns = __atomic_load_n(&k->settle_ns, __ATOMIC_RELAXED);

	if (!c->timing)
		return;
	fprintf(stderr,
		"libprefetch: %" PRIu64 " batches taken; per batch: %.2f sends (%.2f us), "
		"%.2f reads (%.2f empty; %.2f us), %.2f polls, %.2f frames (decoded in %.2f us, "
		"handled in %.2f us), %.2f gather launches (%.2f batches a launch; %.2f us), "
		"%.2f copies, %.2f event records, %.2f stream waits, %.2f event queries "
		"(events %.2f us), %.2f us waiting for the daemon; %" PRIu64 " releases settled "
		"by the lanes, %.2f us each from queued to sent\n",
		c->batches, k->sends / n, k->send_ns / n / 1e3, k->reads / n, k->empty_reads / n,
		k->read_ns / n / 1e3, k->polls / n, k->frames / n, k->decode_ns / n / 1e3,
		k->batch_ns / n / 1e3, k->launches / n,
		k->launches ? (double)k->grouped / k->launches : 0.0, k->launch_ns / n / 1e3,
		k->copies / n, k->records / n, k->waits / n, k->queries / n, k->event_ns / n / 1e3,
		k->wait_ns / n / 1e3, settled, settled ? settle_ns / (double)settled / 1e3 : 0.0);
}

PF_API void pf_close(struct pf_client *c)
{
	if (!c)
		return;
	print_counts(c);
	/* Closing the socket returns every slot anyway; the explicit releases
	 * keep the daemon's accounting exact until then.  Pending device
	 * releases get a bounded wait so that the daemon does not rewrite a
	 * slot the trainer's GPU work still reads. */
	pfc_release_queue(c);
	while (c->held) {
		struct pfc_batch *b = c->held;

		c->held = b->next;
		/* A batch of a broken connection has no slot to give back; its
		 * arenas are unmapped below with the rest. */
		if (b->gen != c->gen) {
			pfc_free_batch(b);
			continue;
		}
		/* A device batch still held may be read by queued work on a
		 * stream we do not know: wait for the legacy default stream,
		 * which waits for every blocking stream. */
		if (b->pub.on_device && !c->dead && pfc_release_after(c, b, NULL) == 0) {
			pfc_free_batch(b);
			continue;
		}
		/* (A batch this client copied gave its slot back already.) */
		if (!c->dead && b->dbuf < 0)
			pfc_send_release(c, b->pub.epoch, b->pub.seq, b->slot);
		pfc_free_batch(b);
	}
	/* The lanes send what the device finishes within the request
	 * timeout (blocked, not polling); work that has not retired by then
	 * gets its release dropped (the socket is closing, which returns
	 * every slot), and everything is unmapped only after the device has
	 * finished with it (pfc_unmap_arenas): a queued kernel must not
	 * fault. */
	if (pfc_settle_drain(c, c->timeout_ms))
		pfc_settle_forget(c);
	if (c->nreleases)
		pfcuda_sync(c->cuda, NULL, 0);
	pfc_settle_close(c);
	pfc_free_dbufs(c);
	pfc_unmap_slabs(c);
	pfc_unmap_arenas(c, c->arenas, c->narenas);
	while (c->retired) {
		struct pfc_retired *r = c->retired;

		c->retired = r->next;
		pfc_unmap_arenas(c, r->arenas, r->narenas);
		free(r);
	}
	pfcuda_gather_close(c->gather);
	while (c->events) {
		struct pfc_event *e = c->events;

		c->events = e->next;
		pfcuda_event_destroy(c->cuda, e->ev);
		free(e);
	}
	pfcuda_close(c->cuda);
	if (c->sock >= 0)
		close(c->sock);
	wire_rx_free(&c->rx);
	for (uint32_t f = 0; f < c->nfields; f++) {
		free(c->fields[f].name);
		free(c->fields[f].dtype);
		free(c->fields[f].shape);
	}
	free(c->fields);
	free(c->slot_mine);
	free(c->device);
	free(c->epoch_indices);
	free_open_opts(c);
	free(c->path);
	free(c->where);
	free(c->out);
	pthread_mutex_destroy(&c->send_lock);
	free(c);
}

PF_API const char *pf_errmsg(const struct pf_client *c)
{
	return c ? c->err : "out of memory";
}
