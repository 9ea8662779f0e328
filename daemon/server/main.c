/*
 * main.c — prefetchd's entry point: options, configuration, datasets, the
 * GPU layer, the reader pool, the listener, signals, systemd notification.
 *
 * DESIGN: the main thread becomes the loop thread.  Shutdown (SIGTERM or
 * SIGINT) closes the listener and every connection without waiting for any
 * peer to read, stops the readers, and lets the loop run out: a consumer
 * that stopped draining cannot hold the daemon up.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <malloc.h>
#include <sys/resource.h>
#include <systemd/sd-daemon.h>
#include <time.h>

#include "base/bigmem.h"
#include "server/closer.h"
#include "state/daemon.h"
#include "gpu/gpu.h"
#include "sess/linger.h"
#include "base/log.h"
#include "data/reader.h"
#include "server/server.h"
#include "gpu/pool.h"
#include "sess/sess.h"
#include "util.h"
#include "gpu/xfer.h"

#define DEFAULT_CONFIG "/etc/prefetchd/prefetchd.conf"

static void usage(FILE *f)
{
	fprintf(f, "usage: prefetchd [-c CONFIG] [-s SOCKET] [-v] [--check]\n"
		   "  -c, --config FILE   configuration (default " DEFAULT_CONFIG ")\n"
		   "  -s, --socket PATH   listen here instead of the configured socket\n"
		   "  -v, --verbose       log debug messages too\n"
		   "      --check         load the configuration and datasets, report, exit\n"
		   "  -V, --version\n");
}

static void on_signal(uv_signal_t *h, int signum)
{
	struct daemon *d = h->data;

	if (d->stopping)
		return;
	d->stopping = true;
	log_info("%s: shutting down (%u connection(s), %u session(s))", strsignal(signum),
		 d->nconns, d->nsessions);
	sd_notify(0, "STOPPING=1");
	server_stop(d);
	reader_stop(d->readers);
	d->readers = NULL;
	/* After the readers: their last completions may still queue copies
	 * (of dead sessions: none), and sessions freed now release arenas. */
	for (int g = 0; d->xfers && g < d->ngpus; g++)
		if (d->xfers[g])
			xfer_stop(d->xfers[g]);
	linger_stop(d); /* after the transfer threads' last probes */
	uv_timer_stop(&d->tick);
	uv_close((uv_handle_t *)&d->tick, NULL);
	if (d->watchdog_live)
		uv_close((uv_handle_t *)&d->watchdog, NULL);
	uv_close((uv_handle_t *)&d->sig_term, NULL);
	uv_close((uv_handle_t *)&d->sig_int, NULL);
	uv_close((uv_handle_t *)&d->sig_hup, NULL);
}

/* SIGHUP (systemctl reload): the configuration again, datasets added or
 * removed, live sessions untouched.  systemd hears RELOADING=1 first and
 * READY=1 when it is done (with the outcome in STATUS). */
static void on_reload(uv_signal_t *h, int signum)
{
	struct daemon *d = h->data;
	char summary[600], err[512];
	int rc;

	if (d->stopping)
		return;
	sd_notify(0, "RELOADING=1");
	rc = daemon_reload(d, summary, sizeof(summary), err, sizeof(err));
	if (rc) {
		log_err("reload of %s failed, the running configuration stays: %s", d->config_path,
			err);
		sd_notifyf(0, "READY=1\nSTATUS=reload failed: %.200s", err);
		return;
	}
	log_info("reloaded %s: %s", d->config_path, summary);
	sd_notifyf(0, "READY=1\nSTATUS=serving %zu dataset(s); reloaded: %.200s", d->ndatasets,
		   summary);
}

/* WATCHDOG=1 comes from the loop itself: a loop wedged for longer than
 * WatchdogSec= stops feeding it and systemd restarts the daemon. */
static void on_watchdog(uv_timer_t *t)
{
	sd_notify(0, "WATCHDOG=1");
}

/* Descriptors: the soft limit goes up to the hard one (the usual 1024 is
 * a default for select(), which we do not use).  Each connection holds one,
 * each session's host arenas a few, each dataset shard one: if
 * max_conns does not fit, accept() would fail with EMFILE (the listener
 * then pauses) before max_conns refuses anyone, so say so. */
static void fit_descriptors(const struct daemon *d)
{
	struct rlimit rl;
	uint64_t need = (uint64_t)d->cfg.max_conns + 4ull * d->cfg.max_sessions + 64;

	if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
		return;
	if (rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		setrlimit(RLIMIT_NOFILE, &rl);
		getrlimit(RLIMIT_NOFILE, &rl);
	}
	for (size_t i = 0; i < d->ndatasets; i++)
		for (size_t f = 0; f < d->datasets[i]->nfields; f++)
			need += d->datasets[i]->fields[f].nshards;
	if (rl.rlim_cur != RLIM_INFINITY && need > rl.rlim_cur)
		log_warn("max_conns = %u and max_sessions = %u need about %" PRIu64
			 " descriptors, but the limit is %llu: raise LimitNOFILE= or lower "
			 "max_conns",
			 d->cfg.max_conns, d->cfg.max_sessions, need,
			 (unsigned long long)rl.rlim_cur);
}

static void on_tick(uv_timer_t *t)
{
	struct daemon *d = t->data;
	char status[128];

	snprintf(status, sizeof(status), "STATUS=%u session(s), %u connection(s)", d->nsessions,
		 d->nconns);
	sd_notify(0, status);
	daemon_collect(d);
	server_tick(d);
	order_keep_purge(&d->kept, now_ns());
	big_trim(0);
	/* Freed memory goes back to the system: after a client that queued
	 * 96 MiB of replies it never read, the heap would keep those pages
	 * (they are rarely at its top, where free() alone gives back). */
	malloc_trim(0);
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{"config", required_argument, NULL, 'c'},
		{"socket", required_argument, NULL, 's'},
		{"verbose", no_argument, NULL, 'v'},
		{"check", no_argument, NULL, 'C'},
		{"version", no_argument, NULL, 'V'},
		{"help", no_argument, NULL, 'h'},
		{0},
	};
	struct daemon d = {.listen_fd = -1};
	const char *config_path = DEFAULT_CONFIG, *socket_path = NULL;
	int verbose = 0, check = 0, opt, rc;
	char err[512];

	while ((opt = getopt_long(argc, argv, "c:s:vVh", opts, NULL)) != -1) {
		switch (opt) {
		case 'c': config_path = optarg; break;
		case 's': socket_path = optarg; break;
		case 'v': verbose = 1; break;
		case 'C': check = 1; break;
		case 'V': printf("prefetchd %s\n", PF_VERSION); return 0;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
	}
	if (optind != argc) {
		usage(stderr);
		return 2;
	}
	log_init("prefetchd", verbose);
	signal(SIGPIPE, SIG_IGN);

	d.config_path = config_path;
	if (config_load(config_path, &d.cfg, err, sizeof(err)) < 0)
		fatal("%s", err);
	if (socket_path) {
		free(d.cfg.socket_path);
		d.cfg.socket_path = strdup(socket_path);
		d.socket_override = true;
	}
	daemon_config_machine(&d.cfg, d.machine_why, sizeof(d.machine_why));
	if (d.machine_why[0])
		log_info("%s", d.machine_why);
	daemon_load_datasets(&d);
	daemon_config_pools(&d);
	daemon_config_quota(&d);
	if (check) {
		int bad = 0;

		for (size_t i = 0; i < d.ndatasets; i++) {
			const struct dataset *ds = d.datasets[i];

			if (ds->error[0])
				printf("dataset %s: ERROR %s\n", ds->name, ds->error), bad = 1;
			else
				printf("dataset %s: %" PRIu64 " samples, %zu field(s), %.1f MiB\n",
				       ds->name, ds->num_samples, ds->nfields,
				       ds->num_samples * ds->sample_bytes / 1048576.0);
		}
		printf("config %s: %s\n", config_path, bad ? "has unusable datasets" : "ok");
		return bad;
	}

	d.ngpus = gpu_init(d.gpu_desc, sizeof(d.gpu_desc));
	if (d.ngpus > 0) {
		log_info("GPU: %s", d.gpu_desc);
		d.xfers = calloc((size_t)d.ngpus, sizeof(*d.xfers));
		if (!d.xfers)
			fatal("out of memory");
		/* The ring is page-locked once, here, never per batch. */
		rc = ring_init(&d.ring, d.cfg.ring_bytes, d.ring_err, sizeof(d.ring_err));
		if (rc)
			log_err("CUDA sessions are off: %s", d.ring_err);
		else
			log_info("pinned reader ring: %.0f MiB", d.ring.bytes / 1048576.0);
	} else {
		log_info("serving host sessions only: %s", d.gpu_desc);
	}
	if (getenv("PREFETCHD_TEST_FAIL_ALLOCS")) {
		d.test_fail_allocs = atoi(getenv("PREFETCHD_TEST_FAIL_ALLOCS"));
		log_warn("test hook: the next %d device arena allocation(s) will fail",
			 d.test_fail_allocs);
	}

	fit_descriptors(&d);
	rc = closer_start();
	if (rc)
		log_warn("no closer thread (%s): descriptors clients send are closed on the loop",
			 strerror(-rc));
	d.loop = uv_default_loop();
	d.started_ns = now_ns();
	rc = reader_start(&d.readers, d.cfg.readers, d.loop, sess_job_done, &d);
	if (rc)
		fatal("cannot start %u reader threads: %s", d.cfg.readers, strerror(-rc));
	rc = linger_init(&d);
	if (rc)
		fatal("out of memory");
	rc = server_listen(&d);
	if (rc)
		fatal("cannot listen: %s", strerror(-rc));
	uv_signal_init(d.loop, &d.sig_term);
	uv_signal_init(d.loop, &d.sig_int);
	d.sig_term.data = d.sig_int.data = &d;
	uv_signal_start(&d.sig_term, on_signal, SIGTERM);
	uv_signal_start(&d.sig_int, on_signal, SIGINT);
	uv_signal_init(d.loop, &d.sig_hup);
	d.sig_hup.data = &d;
	uv_signal_start(&d.sig_hup, on_reload, SIGHUP);
	{
		uint64_t usec = 0;

		/* Fed at a third of the interval: two missed beats still
		 * leave a margin before systemd acts. */
		if (sd_watchdog_enabled(0, &usec) > 0 && usec >= 3000) {
			uv_timer_init(d.loop, &d.watchdog);
			d.watchdog.data = &d;
			uv_timer_start(&d.watchdog, on_watchdog, 0, usec / 3000);
			d.watchdog_live = true;
			log_info("systemd watchdog: fed every %" PRIu64 " ms from the loop",
				 usec / 3000);
		}
	}
	uv_timer_init(d.loop, &d.tick);
	d.tick.data = &d;
	uv_timer_start(&d.tick, on_tick, 1000, 1000);

	/* READY only now: the listener exists, so a client started after
	 * systemd reports us up can connect at once. */
	sd_notifyf(0, "READY=1\nSTATUS=serving %zu dataset(s)\nMAINPID=%d", d.ndatasets,
		   (int)getpid());
	log_info("prefetchd %s ready: %zu dataset(s), %u reader(s); clients may hold %.1f GiB "
		 "(%s), %.1f GiB per uid",
		 PF_VERSION, d.ndatasets, d.cfg.readers,
		 d.quota.lim.all[QUOTA_MEMORY] / 1073741824.0, d.quota_why,
		 d.quota.lim.per_uid[QUOTA_MEMORY] / 1073741824.0);

	uv_run(d.loop, UV_RUN_DEFAULT);

	rc = uv_loop_close(d.loop);
	if (rc)
		log_warn("loop closed with handles still open: %s", uv_strerror(rc));
	pool_destroy_all(&d.pools); /* slab frees run inline: the threads are gone */
	for (int g = 0; d.xfers && g < d.ngpus; g++)
		xfer_free(d.xfers[g]);
	free(d.xfers);
	free(d.linger);
	ring_destroy(&d.ring);
	daemon_free_datasets(&d);
	quota_free(&d.quota);
	order_keep_purge(&d.kept, INT64_MAX);
	config_free(&d.cfg);
	big_trim(1);
	log_info("stopped");
	return 0;
}
