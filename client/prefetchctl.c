/*
 * prefetchctl.c — the command-line tool of prefetchd: status, datasets,
 * depth, bench.
 *
 * It is an ordinary client: it links libprefetch (the public API for depth
 * and bench) and its internal header for the one request the public API has
 * no call for (StatusRequest), the way ntpctl shares ntpd's protocol header.
 * Output for people is a table; --json prints one JSON object written by the
 * small writer in ctl_print.c (no dependency).  This file holds the
 * commands and main.
 *
 * DESIGN: single-threaded; one connection per run.  Exit status: 0 done,
 * 1 an error (one "prefetchctl: ..." line on stderr), 2 bad usage.
 */
#include "client_int.h"
#include "ctl_print.h"
#include "util.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifndef PF_VERSION
#define PF_VERSION "unknown"
#endif

#define EXIT_USAGE 2
/* A bench that gets no batch for this long reports the daemon as stuck. */
#define BENCH_NEXT_TIMEOUT_MS 30000

static const char usage_text[] =
	"Usage: prefetchctl [-s SOCKET] COMMAND [ARGS]\n"
	"\n"
	"Talks to prefetchd, the node-local data-prefetch daemon.\n"
	"\n"
	"Commands:\n"
	"  status [--json]           the daemon, its sessions, datasets and VRAM pools\n"
	"  datasets [--json]         the datasets the daemon serves\n"
	"  depth SESSION N|auto      set a session's prefetch depth (auto: let the\n"
	"                            daemon size it again)\n"
	"  pool DATASET on|off|drop  the dataset's VRAM sample pools: on, off (stop\n"
	"                            using them and free their memory) or drop\n"
	"                            (empty them now; they fill again)\n"
	"  bench DATASET [OPTIONS]   consume epochs as fast as possible; print\n"
	"                            delivered GB/s, batches/s, samples/s and stall\n"
	"      --batch-size N        samples per batch (default 256)\n"
	"      --order shuffle|sequential|block_shuffle\n"
	"                            sample order (default shuffle)\n"
	"      --block-rows R        block_shuffle: R samples a block\n"
	"      --block-bytes BYTES   block_shuffle: blocks of BYTES of samples, rounded\n"
	"                            down (default: 4 MiB; one of the two only)\n"
	"      --window W            block_shuffle: W blocks shuffled together\n"
	"                            (default 16)\n"
	"      --seed S              seed of the first epoch; epoch e uses S + e\n"
	"                            (default 0)\n"
	"      --epochs E            epochs to run (default 1)\n"
	"      --device host|cuda:N  where batches are delivered (default host)\n"
	"\n"
	"Options:\n"
	"  -s, --socket SOCKET       the daemon's socket (default $" PF_SOCKET_ENV ",\n"
	"                            else " PF_DEFAULT_SOCKET ")\n"
	"  -h, --help                show this help\n"
	"  -V, --version             show the version\n"
	"\n"
	"Exit status: 0 success, 1 error, 2 usage error.\n";

/* ctl_errorf's message, then where to look; the status of a bad command
 * line. */
#define usage_error(...)                                                                           \
	(ctl_errorf(__VA_ARGS__), fputs("Try 'prefetchctl --help'.\n", stderr), EXIT_USAGE)

static int parse_u64(const char *s, uint64_t *out)
{
	char *end;
	unsigned long long v;

	if (!s || !*s || *s == '-' || *s == '+')
		return -EINVAL;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno || *end)
		return -EINVAL;
	*out = v;
	return 0;
}

static double mono_s(void)
{
	return now_ns() / 1e9;
}

/* ---- commands ------------------------------------------------------------------ */

static int connect_daemon(const char *socket_path, struct pf_client **c)
{
	int rc = pf_connect(socket_path, c);

	if (rc) {
		ctl_errorf("%s", pf_errmsg(*c));
		pf_close(*c);
		*c = NULL;
	}
	return rc;
}

/* Parses the only option of status and datasets. */
static int parse_json_flag(int argc, char **argv, bool *json)
{
	static const struct option opts[] = {
		{"json", no_argument, NULL, 'j'},
		{"help", no_argument, NULL, 'h'},
		{0},
	};
	int ch;

	optind = 0; /* glibc: rescan a new argument vector from scratch */
	while ((ch = getopt_long(argc, argv, "+h", opts, NULL)) != -1) {
		switch (ch) {
		case 'j': *json = true; break;
		case 'h': fputs(usage_text, stdout); return 1;
		default: return -1;
		}
	}
	if (optind < argc)
		return -2;
	return 0;
}

static int cmd_status(const char *socket_path, int argc, char **argv, bool sessions)
{
	Pf__Envelope req = PF__ENVELOPE__INIT;
	Pf__StatusRequest msg = PF__STATUS_REQUEST__INIT;
	Pf__Envelope *reply = NULL;
	struct pf_client *c;
	bool json = false;
	int rc;

	rc = parse_json_flag(argc, argv, &json);
	if (rc == 1)
		return 0;
	if (rc == -2)
		return usage_error("%s: unexpected argument '%s'", argv[0], argv[optind]);
	if (rc)
		return usage_error("%s takes only --json", argv[0]);
	if (connect_daemon(socket_path, &c))
		return EXIT_FAILURE;
	req.msg_case = PF__ENVELOPE__MSG_STATUS;
	req.status = &msg;
	rc = pfc_call(c, &req, PF__ENVELOPE__MSG_STATUS_REPLY, &reply);
	if (rc) {
		rc = ctl_errorf("%s", pf_errmsg(c));
		goto out;
	}
	if (json)
		ctl_json_status(stdout, reply->status_reply, sessions);
	else if (sessions)
		rc = ctl_print_status(reply->status_reply);
	else
		rc = ctl_print_datasets(reply->status_reply);
	if (!rc && (fflush(stdout) || ferror(stdout)))
		rc = ctl_errorf("cannot write the output: %s", strerror(errno));
out:
	if (reply)
		pf__envelope__free_unpacked(reply, NULL);
	pf_close(c);
	return rc;
}

static int cmd_depth(const char *socket_path, int argc, char **argv)
{
	struct pf_client *c;
	uint64_t session, target = 0;
	int rc;

	if (argc == 2 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) {
		fputs(usage_text, stdout);
		return 0;
	}
	if (argc != 3)
		return usage_error("usage: depth SESSION N|auto");
	if (parse_u64(argv[1], &session) || session == 0)
		return usage_error("depth: '%s' is not a session id (see prefetchctl status)",
				   argv[1]);
	if (strcmp(argv[2], "auto") &&
	    (parse_u64(argv[2], &target) || target == 0 || target > UINT32_MAX))
		return usage_error("depth: '%s' is neither a depth of 1 or more nor 'auto'",
				   argv[2]);
	if (connect_daemon(socket_path, &c))
		return EXIT_FAILURE;
	rc = pf_set_depth(c, session, (uint32_t)target);
	if (rc)
		rc = ctl_errorf("%s", pf_errmsg(c));
	else if (target)
		printf("session %" PRIu64 ": target depth %" PRIu64 "\n", session, target);
	else
		printf("session %" PRIu64 ": target depth automatic\n", session);
	pf_close(c);
	return rc;
}

static int cmd_pool(const char *socket_path, int argc, char **argv)
{
	Pf__Envelope req = PF__ENVELOPE__INIT;
	Pf__PoolControl msg = PF__POOL_CONTROL__INIT;
	Pf__Envelope *reply = NULL;
	struct pf_client *c;
	int rc;

	if (argc == 2 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) {
		fputs(usage_text, stdout);
		return 0;
	}
	if (argc != 3)
		return usage_error("usage: pool DATASET on|off|drop");
	if (!strcmp(argv[2], "on"))
		msg.action = PF__POOL_ACTION__POOL_ON;
	else if (!strcmp(argv[2], "off"))
		msg.action = PF__POOL_ACTION__POOL_OFF;
	else if (!strcmp(argv[2], "drop"))
		msg.action = PF__POOL_ACTION__POOL_DROP;
	else
		return usage_error("pool: '%s' is not on, off or drop", argv[2]);
	msg.dataset = argv[1];
	if (connect_daemon(socket_path, &c))
		return EXIT_FAILURE;
	req.msg_case = PF__ENVELOPE__MSG_POOL;
	req.pool = &msg;
	rc = pfc_call(c, &req, PF__ENVELOPE__MSG_POOL_REPLY, &reply);
	if (rc) {
		rc = ctl_errorf("%s", pf_errmsg(c));
	} else {
		char freed[32];

		ctl_human_bytes(freed, sizeof(freed), reply->pool_reply->bytes_freed);
		printf("pool %s: %s on %" PRIu32 " GPU(s), %s freed\n", argv[1], argv[2],
		       reply->pool_reply->pools, freed);
	}
	if (reply)
		pf__envelope__free_unpacked(reply, NULL);
	pf_close(c);
	return rc;
}

struct bench_opts {
	const char *dataset;
	const char *device;
	uint32_t batch_size;
	enum pf_order order;
	uint64_t seed;
	uint64_t epochs;
	uint64_t block_rows, block_bytes, window_blocks; /* 0: not given */
};

/* Progress on stderr: a bar redrawn at most ten times a second on a
 * terminal, else one line per tenth of the run (logs stay short). */
struct progress {
	bool tty;
	double t0;
	double last_draw;
	int last_tenth;
};

static void progress_show(struct progress *p, uint64_t epoch, uint64_t epochs, uint64_t done,
			  uint64_t total, uint64_t bytes, bool final)
{
	double now = mono_s();
	double gbps = now > p->t0 ? bytes / (now - p->t0) / 1e9 : 0;
	double frac = total ? (double)done / (double)total : 1;

	if (p->tty) {
		char bar[31];
		int fill = (int)(frac * 30);

		if (!final && now - p->last_draw < 0.1)
			return;
		p->last_draw = now;
		memset(bar, '#', (size_t)fill);
		memset(bar + fill, '.', (size_t)(30 - fill));
		bar[30] = 0;
		fprintf(stderr,
			"\r  epoch %" PRIu64 " (%" PRIu64 "/%" PRIu64 ") [%s] %3.0f%%  %" PRIu64
			"/%" PRIu64 " batches  %.2f GB/s ",
			epoch, epoch + 1, epochs, bar, 100 * frac, done, total, gbps);
		if (final)
			fputc('\n', stderr);
		return;
	}
	if ((int)(frac * 10) > p->last_tenth || (final && p->last_tenth < 10)) {
		p->last_tenth = (int)(frac * 10);
		fprintf(stderr,
			"epoch %" PRIu64 " (%" PRIu64 "/%" PRIu64 "): %3.0f%% (%" PRIu64 "/%" PRIu64
			" batches, %.2f GB/s)\n",
			epoch, epoch + 1, epochs, 100 * frac, done, total, gbps);
	}
}

/* Reads one byte per page of every field, as a consumer that uses the data
 * would fault it in; the sum keeps the compiler from dropping the reads. */
static uint64_t touch(struct pf_client *c, const struct pf_batch *b)
{
	uint64_t sum = 0;

	if (b->on_device)
		return 0;
	for (uint32_t f = 0; f < b->nfields; f++) {
		struct pf_field fi;
		const volatile uint8_t *p = b->data[f];
		uint64_t len;

		if (pf_field_info(c, f, &fi))
			continue;
		len = fi.sample_bytes * b->count;
		for (uint64_t off = 0; off < len; off += 4096)
			sum += p[off];
	}
	return sum;
}

static int run_bench(struct pf_client *c, const struct bench_opts *o)
{
	struct progress prog = {.tty = isatty(STDERR_FILENO) == 1};
	uint64_t batches = 0, samples = 0, bytes = 0, errors = 0, sink = 0;
	struct pf_stats st;
	double t0, elapsed;
	int rc;

	rc = pf_open(c, &(struct pf_open_opts){.dataset = o->dataset,
					       .device = o->device,
					       .batch_size = o->batch_size,
					       .name = "prefetchctl bench"});
	if (rc)
		return ctl_errorf("cannot open dataset %s: %s", o->dataset, pf_errmsg(c));
	t0 = mono_s();
	prog.t0 = t0;
	for (uint64_t e = 0; e < o->epochs; e++) {
		struct pf_epoch_opts eo = {.order = o->order,
					   .seed = o->seed + e,
					   .block_rows = o->block_rows,
					   .block_bytes = o->block_bytes,
					   .window_blocks = o->window_blocks};
		uint64_t total = 0, done = 0;

		rc = pf_start_epoch(c, &eo, &total);
		if (rc)
			return ctl_errorf("cannot start epoch %" PRIu64 ": %s", e, pf_errmsg(c));
		prog.last_tenth = 0;
		for (;;) {
			struct pf_batch *b;

			rc = pf_next(c, BENCH_NEXT_TIMEOUT_MS, &b);
			if (rc == -ETIMEDOUT || (rc && pfc_broken(c))) {
				if (prog.tty)
					fputc('\n', stderr);
				return ctl_errorf("%s", pf_errmsg(c));
			}
			if (rc) {
				/* An error batch: the epoch goes on without it. */
				if (prog.tty)
					fputc('\n', stderr);
				fprintf(stderr, "prefetchctl: %s (skipped)\n", pf_errmsg(c));
				errors++;
				done++;
				continue;
			}
			if (!b)
				break;
			sink += touch(c, b);
			batches++;
			samples += b->count;
			done++;
			rc = pf_release(c, b, NULL);
			if (rc)
				return ctl_errorf("%s", pf_errmsg(c));
			pf_stats(c, &st);
			bytes = st.bytes;
			progress_show(&prog, e, o->epochs, done, total, bytes, false);
		}
		progress_show(&prog, e, o->epochs, done, total, bytes, true);
	}
	elapsed = mono_s() - t0;
	pf_stats(c, &st);
	if (elapsed <= 0)
		elapsed = 1e-9;
	printf("dataset      %s (%s, batch size %" PRIu32 ", %" PRIu64 " epoch%s)\n", o->dataset,
	       o->device, o->batch_size, o->epochs, o->epochs == 1 ? "" : "s");
	printf("delivered    %.3f GB/s (%" PRIu64 " bytes in %.3f s)\n", st.bytes / elapsed / 1e9,
	       st.bytes, elapsed);
	printf("batches/s    %.1f (%" PRIu64 " batches)\n", batches / elapsed, batches);
	printf("samples/s    %.0f (%" PRIu64 " samples)\n", samples / elapsed, samples);
	printf("stall        %.1f%% (waited %.3f s, busy %.3f s)\n", 100 * st.stall_fraction,
	       st.wait_s, st.busy_s);
	if (errors)
		printf("errors       %" PRIu64 " batch%s skipped\n", errors,
		       errors == 1 ? "" : "es");
	/* sink is printed nowhere but must stay live. */
	__asm__ volatile("" : : "r"(sink));
	if (fflush(stdout) || ferror(stdout))
		return ctl_errorf("cannot write the output: %s", strerror(errno));
	return errors ? ctl_errorf("%" PRIu64 " error batch%s", errors, errors == 1 ? "" : "es")
		      : 0;
}

/* A block_shuffle option: a positive number.  0 would mean "not set" on
 * the wire; here it can be told apart, so it is refused. */
static int parse_block_opt(const char *name, const char *arg, uint64_t *out)
{
	if (parse_u64(arg, out) || *out == 0)
		return usage_error("bench: --%s needs a positive number, not '%s'", name, arg);
	return 0;
}

static int cmd_bench(const char *socket_path, int argc, char **argv)
{
	static const struct option opts[] = {
		{"batch-size", required_argument, NULL, 'b'},
		{"order", required_argument, NULL, 'o'},
		{"seed", required_argument, NULL, 's'},
		{"epochs", required_argument, NULL, 'e'},
		{"device", required_argument, NULL, 'd'},
		{"block-rows", required_argument, NULL, 'R'},
		{"block-bytes", required_argument, NULL, 'B'},
		{"window", required_argument, NULL, 'W'},
		{"help", no_argument, NULL, 'h'},
		{0},
	};
	struct bench_opts o = {
		.device = "host", .batch_size = 256, .order = PF_ORDER_SHUFFLE, .epochs = 1};
	struct pf_client *c;
	uint64_t v;
	int ch, rc;

	optind = 0; /* glibc: rescan a new argument vector from scratch */
	while ((ch = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (ch) {
		case 'b':
			if (parse_u64(optarg, &v) || v == 0 || v > UINT32_MAX)
				return usage_error("bench: --batch-size needs a positive number, "
						   "not '%s'",
						   optarg);
			o.batch_size = (uint32_t)v;
			break;
		case 'o':
			if (!strcmp(optarg, "shuffle"))
				o.order = PF_ORDER_SHUFFLE;
			else if (!strcmp(optarg, "sequential"))
				o.order = PF_ORDER_SEQUENTIAL;
			else if (!strcmp(optarg, "block_shuffle"))
				o.order = PF_ORDER_BLOCK_SHUFFLE;
			else
				return usage_error("bench: --order is shuffle, sequential or "
						   "block_shuffle, not '%s'",
						   optarg);
			break;
		case 'R':
			if (parse_block_opt("block-rows", optarg, &o.block_rows))
				return EXIT_USAGE;
			break;
		case 'B':
			if (parse_block_opt("block-bytes", optarg, &o.block_bytes))
				return EXIT_USAGE;
			break;
		case 'W':
			if (parse_block_opt("window", optarg, &o.window_blocks))
				return EXIT_USAGE;
			break;
		case 's':
			if (parse_u64(optarg, &o.seed))
				return usage_error("bench: --seed needs a number, not '%s'",
						   optarg);
			break;
		case 'e':
			if (parse_u64(optarg, &o.epochs) || o.epochs == 0)
				return usage_error(
					"bench: --epochs needs a positive number, not '%s'",
					optarg);
			break;
		case 'd':
			if (strcmp(optarg, "host") && strncmp(optarg, "cuda:", 5))
				return usage_error("bench: --device is host or cuda:N, not '%s'",
						   optarg);
			if (!strncmp(optarg, "cuda:", 5) && parse_u64(optarg + 5, &v))
				return usage_error("bench: --device is host or cuda:N, not '%s'",
						   optarg);
			o.device = optarg;
			break;
		case 'h': fputs(usage_text, stdout); return 0;
		default: return usage_error("bench: bad option");
		}
	}
	if (optind != argc - 1)
		return usage_error(optind >= argc
					   ? "bench: which dataset? (see prefetchctl datasets)"
					   : "bench: one dataset only");
	if (o.block_rows && o.block_bytes)
		return usage_error("bench: --block-rows and --block-bytes exclude each other");
	if ((o.block_rows || o.block_bytes || o.window_blocks) && o.order != PF_ORDER_BLOCK_SHUFFLE)
		return usage_error("bench: --block-rows, --block-bytes and --window are for "
				   "--order block_shuffle");
	o.dataset = argv[optind];
	if (connect_daemon(socket_path, &c))
		return EXIT_FAILURE;
	rc = run_bench(c, &o);
	pf_close(c);
	return rc;
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{"socket", required_argument, NULL, 's'},
		{"help", no_argument, NULL, 'h'},
		{"version", no_argument, NULL, 'V'},
		{0},
	};
	const char *socket_path = NULL;
	const char *cmd;
	int ch;

	/* '+': stop at the command, whose options are its own. */
	while ((ch = getopt_long(argc, argv, "+s:hV", opts, NULL)) != -1) {
		switch (ch) {
		case 's': socket_path = optarg; break;
		case 'h': fputs(usage_text, stdout); return 0;
		case 'V':
			printf("prefetchctl %s (protocol %d)\n", PF_VERSION, WIRE_VERSION);
			return 0;
		default: return usage_error("bad option");
		}
	}
	if (optind >= argc)
		return usage_error("which command? status, datasets, depth, pool or bench");
	cmd = argv[optind];
	argc -= optind;
	argv += optind;
	if (!strcmp(cmd, "status"))
		return cmd_status(socket_path, argc, argv, true);
	if (!strcmp(cmd, "datasets"))
		return cmd_status(socket_path, argc, argv, false);
	if (!strcmp(cmd, "depth"))
		return cmd_depth(socket_path, argc, argv);
	if (!strcmp(cmd, "pool"))
		return cmd_pool(socket_path, argc, argv);
	if (!strcmp(cmd, "bench"))
		return cmd_bench(socket_path, argc, argv);
	if (!strcmp(cmd, "help"))
		return fputs(usage_text, stdout) < 0;
	return usage_error("unknown command '%s'", cmd);
}
