/*
 * prefetchctl.c — the command-line tool of prefetchd: status, datasets,
 * depth, bench.
 *
 * It is an ordinary client: it links libprefetch (the public API for depth
 * and bench) and its internal header for the one request the public API has
 * no call for (StatusRequest), the way ntpctl shares ntpd's protocol header.
 * Output for people is a table; --json prints one JSON object written by the
 * small writer below (no dependency).
 *
 * DESIGN: single-threaded; one connection per run.  Exit status: 0 done,
 * 1 an error (one "prefetchctl: ..." line on stderr), 2 bad usage.
 */
#include "client_int.h"
#include "util.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
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
	"      --order shuffle|sequential\n"
	"                            sample order (default shuffle)\n"
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

static int __attribute__((format(printf, 1, 2))) usage_error(const char *fmt, ...)
{
	va_list ap;

	fputs("prefetchctl: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputs("\nTry 'prefetchctl --help'.\n", stderr);
	return EXIT_USAGE;
}

static int __attribute__((format(printf, 1, 2))) errorf(const char *fmt, ...)
{
	va_list ap;

	fputs("prefetchctl: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	return EXIT_FAILURE;
}

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

static void human_bytes(char *buf, size_t len, uint64_t bytes)
{
	static const char *const unit[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
	double v = (double)bytes;
	int u = 0;

	while (v >= 1024 && u < 5) {
		v /= 1024;
		u++;
	}
	if (u == 0)
		snprintf(buf, len, "%" PRIu64 " B", bytes);
	else
		snprintf(buf, len, "%.1f %s", v, unit[u]);
}

static void human_duration(char *buf, size_t len, double s)
{
	uint64_t t = s > 0 ? (uint64_t)s : 0;

	if (t >= 86400)
		snprintf(buf, len, "%" PRIu64 "d%02" PRIu64 "h", t / 86400, t % 86400 / 3600);
	else if (t >= 3600)
		snprintf(buf, len, "%" PRIu64 "h%02" PRIu64 "m", t / 3600, t % 3600 / 60);
	else if (t >= 60)
		snprintf(buf, len, "%" PRIu64 "m%02" PRIu64 "s", t / 60, t % 60);
	else
		snprintf(buf, len, "%" PRIu64 "s", t);
}

/* ---- JSON writer ------------------------------------------------------------ */

/* Writes s as a JSON string.  Bytes that are not valid UTF-8 become U+FFFD,
 * so the output parses whatever a dataset or session was named. */
static void json_str(FILE *out, const char *s)
{
	const unsigned char *p = (const unsigned char *)(s ? s : "");

	fputc('"', out);
	while (*p) {
		unsigned char ch = *p;
		int n = ch < 0x80	      ? 1
			: (ch & 0xE0) == 0xC0 ? 2
			: (ch & 0xF0) == 0xE0 ? 3
			: (ch & 0xF8) == 0xF0 ? 4
					      : 0;
		bool ok = n > 0 && !(n == 2 && ch < 0xC2) && !(n == 4 && ch > 0xF4);

		for (int i = 1; ok && i < n; i++)
			ok = (p[i] & 0xC0) == 0x80;
		/* Overlong forms, UTF-16 surrogates, and code points past
		 * U+10FFFF are not UTF-8 either. */
		if (ok && ((ch == 0xE0 && p[1] < 0xA0) || (ch == 0xED && p[1] >= 0xA0) ||
			   (ch == 0xF0 && p[1] < 0x90) || (ch == 0xF4 && p[1] >= 0x90)))
			ok = false;
		if (!ok) {
			fputs("\\ufffd", out);
			p++;
			continue;
		}
		if (n > 1) {
			fwrite(p, 1, (size_t)n, out);
			p += n;
			continue;
		}
		switch (ch) {
		case '"': fputs("\\\"", out); break;
		case '\\': fputs("\\\\", out); break;
		case '\n': fputs("\\n", out); break;
		case '\r': fputs("\\r", out); break;
		case '\t': fputs("\\t", out); break;
		case '\b': fputs("\\b", out); break;
		case '\f': fputs("\\f", out); break;
		default:
			if (ch < 0x20 || ch == 0x7f)
				fprintf(out, "\\u%04x", ch);
			else
				fputc(ch, out);
		}
		p++;
	}
	fputc('"', out);
}

/* JSON has no NaN or infinity: those print as null. */
static void json_num(FILE *out, double v)
{
	if (isfinite(v))
		fprintf(out, "%.6g", v);
	else
		fputs("null", out);
}

static void json_key(FILE *out, bool *first, const char *key)
{
	if (!*first)
		fputc(',', out);
	*first = false;
	json_str(out, key);
	fputc(':', out);
}

static void jk_str(FILE *out, bool *first, const char *key, const char *v)
{
	json_key(out, first, key);
	json_str(out, v);
}

static void jk_u64(FILE *out, bool *first, const char *key, uint64_t v)
{
	json_key(out, first, key);
	fprintf(out, "%" PRIu64, v);
}

static void jk_i64(FILE *out, bool *first, const char *key, int64_t v)
{
	json_key(out, first, key);
	fprintf(out, "%" PRId64, v);
}

static void jk_num(FILE *out, bool *first, const char *key, double v)
{
	json_key(out, first, key);
	json_num(out, v);
}

static void json_field(FILE *out, const Pf__Field *f)
{
	bool first = true;

	fputc('{', out);
	jk_str(out, &first, "name", f->name);
	jk_str(out, &first, "dtype", f->dtype);
	json_key(out, &first, "shape");
	fputc('[', out);
	for (size_t i = 0; i < f->n_shape; i++)
		fprintf(out, "%s%" PRIu64, i ? "," : "", f->shape[i]);
	fputc(']', out);
	jk_u64(out, &first, "sample_bytes", f->sample_bytes);
	fputc('}', out);
}

static void json_dataset(FILE *out, const Pf__DatasetStatus *d)
{
	bool first = true;

	fputc('{', out);
	jk_str(out, &first, "name", d->name);
	jk_str(out, &first, "format", d->format);
	jk_u64(out, &first, "samples", d->samples);
	jk_u64(out, &first, "bytes", d->bytes);
	json_key(out, &first, "fields");
	fputc('[', out);
	for (size_t i = 0; i < d->n_fields; i++) {
		if (i)
			fputc(',', out);
		json_field(out, d->fields[i]);
	}
	fputc(']', out);
	json_key(out, &first, "error");
	if (d->error && *d->error)
		json_str(out, d->error);
	else
		fputs("null", out);
	fputc('}', out);
}

static void json_session(FILE *out, const Pf__SessionStatus *s)
{
	bool first = true;

	fputc('{', out);
	jk_u64(out, &first, "session", s->session);
	jk_str(out, &first, "name", s->name);
	jk_str(out, &first, "dataset", s->dataset);
	jk_str(out, &first, "device", s->device);
	jk_u64(out, &first, "uid", s->uid);
	jk_i64(out, &first, "pid", s->pid);
	jk_u64(out, &first, "epoch", s->epoch);
	jk_str(out, &first, "state", s->state);
	jk_u64(out, &first, "batches", s->batches);
	jk_u64(out, &first, "sent", s->sent);
	jk_u64(out, &first, "consumed", s->consumed);
	jk_u64(out, &first, "held", s->held);
	jk_u64(out, &first, "target", s->target);
	jk_str(out, &first, "target_reason", s->target_reason);
	jk_u64(out, &first, "min_depth", s->min_depth);
	jk_u64(out, &first, "max_depth", s->max_depth);
	jk_u64(out, &first, "slots", s->slots);
	jk_u64(out, &first, "ring_fill", s->ring_fill);
	jk_u64(out, &first, "arenas", s->arenas);
	jk_u64(out, &first, "arena_bytes", s->arena_bytes);
	jk_u64(out, &first, "bytes_sent", s->bytes_sent);
	jk_num(out, &first, "copy_gbps", s->copy_gbps);
	jk_num(out, &first, "wait_s", s->wait_s);
	jk_num(out, &first, "busy_s", s->busy_s);
	jk_num(out, &first, "stall_fraction", s->stall_fraction);
	jk_u64(out, &first, "errors", s->errors);
	jk_num(out, &first, "age_s", s->age_s);
	jk_u64(out, &first, "probe_free", s->probe_free);
	jk_u64(out, &first, "probe_total", s->probe_total);
	jk_u64(out, &first, "h2d_bytes", s->h2d_bytes);
	jk_u64(out, &first, "pool_hits", s->pool_hits);
	jk_u64(out, &first, "index_bytes", s->index_bytes);
	fputc('}', out);
}

static void json_pool(FILE *out, const Pf__PoolStatus *p)
{
	bool first = true;

	fputc('{', out);
	jk_str(out, &first, "dataset", p->dataset);
	jk_str(out, &first, "device", p->device);
	json_key(out, &first, "enabled");
	fputs(p->enabled ? "true" : "false", out);
	jk_u64(out, &first, "bytes", p->bytes);
	jk_u64(out, &first, "rows", p->rows);
	jk_u64(out, &first, "samples", p->samples);
	jk_u64(out, &first, "budget", p->budget);
	jk_str(out, &first, "budget_reason", p->budget_reason);
	jk_u64(out, &first, "slabs", p->slabs);
	jk_u64(out, &first, "slab_bytes", p->slab_bytes);
	jk_u64(out, &first, "epoch", p->epoch);
	jk_num(out, &first, "hit_rate", p->hit_rate);
	json_key(out, &first, "last_hit_rate");
	if (p->last_hit_rate < 0)
		fputs("null", out);
	else
		fprintf(out, "%.6g", p->last_hit_rate);
	jk_u64(out, &first, "hits", p->hits);
	jk_u64(out, &first, "lookups", p->lookups);
	jk_u64(out, &first, "h2d_saved", p->h2d_saved);
	jk_u64(out, &first, "slabs_dropped", p->slabs_dropped);
	jk_u64(out, &first, "sessions", p->sessions);
	fputc('}', out);
}

static void json_status(FILE *out, const Pf__StatusReply *st, bool sessions)
{
	bool first = true;

	fputc('{', out);
	if (sessions) {
		jk_str(out, &first, "daemon", st->daemon);
		jk_num(out, &first, "uptime_s", st->uptime_s);
		jk_u64(out, &first, "readers", st->readers);
		jk_u64(out, &first, "ring_bytes", st->ring_bytes);
		jk_str(out, &first, "gpu", st->gpu);
		json_key(out, &first, "sessions");
		fputc('[', out);
		for (size_t i = 0; i < st->n_sessions; i++) {
			if (i)
				fputc(',', out);
			json_session(out, st->sessions[i]);
		}
		fputc(']', out);
		json_key(out, &first, "pools");
		fputc('[', out);
		for (size_t i = 0; i < st->n_pools; i++) {
			if (i)
				fputc(',', out);
			json_pool(out, st->pools[i]);
		}
		fputc(']', out);
	}
	json_key(out, &first, "datasets");
	fputc('[', out);
	for (size_t i = 0; i < st->n_datasets; i++) {
		if (i)
			fputc(',', out);
		json_dataset(out, st->datasets[i]);
	}
	fputs("]}\n", out);
}

/* ---- tables ------------------------------------------------------------------- */

#define TABLE_MAX_COLS 16

/* Rows of cells, printed with each column as wide as its widest cell.
 * Columns whose header starts with '>' are right-aligned (numbers). */
struct table {
	int ncols;
	const char *head[TABLE_MAX_COLS];
	char **cells; /* owned: rows * ncols strings, each owned */
	size_t rows;
	size_t cap;
};

static int table_add(struct table *t, ...)
{
	va_list ap;
	char **row;

	if (t->rows == t->cap) {
		size_t cap = t->cap ? t->cap * 2 : 16;
		char **cells = realloc(t->cells, cap * (size_t)t->ncols * sizeof(char *));

		if (!cells)
			return -ENOMEM;
		t->cells = cells;
		t->cap = cap;
	}
	row = t->cells + t->rows * (size_t)t->ncols;
	va_start(ap, t);
	for (int i = 0; i < t->ncols; i++) {
		const char *s = va_arg(ap, const char *);

		row[i] = strdup(s ? s : "");
		if (!row[i]) {
			while (i--)
				free(row[i]);
			va_end(ap);
			return -ENOMEM;
		}
	}
	va_end(ap);
	t->rows++;
	return 0;
}

static void table_print(struct table *t, FILE *out)
{
	size_t width[TABLE_MAX_COLS];

	for (int c = 0; c < t->ncols; c++) {
		width[c] = strlen(t->head[c] + (t->head[c][0] == '>'));
		for (size_t r = 0; r < t->rows; r++) {
			size_t w = strlen(t->cells[r * (size_t)t->ncols + (size_t)c]);

			if (w > width[c])
				width[c] = w;
		}
	}
	for (size_t r = 0; r <= t->rows; r++) {
		for (int c = 0; c < t->ncols; c++) {
			bool right = t->head[c][0] == '>';
			const char *s = r == 0 ? t->head[c] + right
					       : t->cells[(r - 1) * (size_t)t->ncols + (size_t)c];
			bool last = c == t->ncols - 1;

			if (right)
				fprintf(out, "%*s", (int)width[c], s);
			else if (last)
				fputs(s, out);
			else
				fprintf(out, "%-*s", (int)width[c], s);
			fputs(last ? "\n" : "  ", out);
		}
	}
}

static void table_free(struct table *t)
{
	for (size_t i = 0; i < t->rows * (size_t)t->ncols; i++)
		free(t->cells[i]);
	free(t->cells);
}

static void field_text(char *buf, size_t len, const Pf__Field *f)
{
	int n = snprintf(buf, len, "%s %s[", f->name, f->dtype);

	for (size_t i = 0; i < f->n_shape && n >= 0 && (size_t)n < len; i++)
		n += snprintf(buf + n, len - (size_t)n, "%s%" PRIu64, i ? "," : "", f->shape[i]);
	if (n >= 0 && (size_t)n < len)
		snprintf(buf + n, len - (size_t)n, "]");
}

static int print_datasets(const Pf__StatusReply *st)
{
	struct table t = {.ncols = 5,
			  .head = {"DATASET", "FORMAT", ">SAMPLES", ">BYTES", "FIELDS"}};
	int rc = 0;

	for (size_t i = 0; i < st->n_datasets && !rc; i++) {
		const Pf__DatasetStatus *d = st->datasets[i];
		char samples[32], bytes[32], fields[1024] = "";
		size_t n = 0;

		if (d->error && *d->error) {
			snprintf(fields, sizeof(fields), "error: %s", d->error);
			rc = table_add(&t, d->name, d->format, "-", "-", fields);
			continue;
		}
		for (size_t f = 0; f < d->n_fields && n < sizeof(fields); f++) {
			char one[256];

			field_text(one, sizeof(one), d->fields[f]);
			n += (size_t)snprintf(fields + n, sizeof(fields) - n, "%s%s", f ? ", " : "",
					      one);
		}
		snprintf(samples, sizeof(samples), "%" PRIu64, d->samples);
		human_bytes(bytes, sizeof(bytes), d->bytes);
		rc = table_add(&t, d->name, d->format, samples, bytes, fields);
	}
	if (!rc) {
		if (st->n_datasets)
			table_print(&t, stdout);
		else
			puts("no datasets");
	}
	table_free(&t);
	return rc ? errorf("out of memory") : 0;
}

/* Hit rates as percentages; "-" where there is no figure yet. */
static void rate_text(char *buf, size_t len, double rate, bool have)
{
	if (have)
		snprintf(buf, len, "%.1f%%", 100 * rate);
	else
		snprintf(buf, len, "-");
}

static int print_pools(const Pf__StatusReply *st)
{
	struct table t = {.ncols = 10,
			  .head = {"POOL", "DEVICE", "STATE", ">BYTES", ">ROWS", ">HIT",
				   ">LAST_HIT", ">SAVED", ">BUDGET", "WHY"}};
	int rc = 0;

	putchar('\n');
	for (size_t i = 0; i < st->n_pools && !rc; i++) {
		const Pf__PoolStatus *p = st->pools[i];
		char bytes[32], rows[48], hit[16], last[16], saved[32], budget[32];

		human_bytes(bytes, sizeof(bytes), p->bytes);
		snprintf(rows, sizeof(rows), "%" PRIu64 "/%" PRIu64, p->rows, p->samples);
		rate_text(hit, sizeof(hit), p->hit_rate, p->epoch > 0);
		rate_text(last, sizeof(last), p->last_hit_rate, p->last_hit_rate >= 0);
		human_bytes(saved, sizeof(saved), p->h2d_saved);
		human_bytes(budget, sizeof(budget), p->budget);
		rc = table_add(&t, p->dataset, p->device, p->enabled ? "on" : "off", bytes, rows,
			       hit, last, saved, budget, p->budget_reason);
	}
	if (!rc)
		table_print(&t, stdout);
	table_free(&t);
	return rc;
}

static int print_status(const Pf__StatusReply *st)
{
	struct table t = {.ncols = 15,
			  .head = {">SESSION", "NAME", "DATASET", "DEVICE", ">EPOCH", "STATE",
				   ">SENT", ">CONSUMED", ">HELD", ">TARGET", ">RING", ">WAIT_S",
				   ">STALL", ">GB/S", "WHY"}};
	char up[32], ring[32];
	int rc = 0;

	human_duration(up, sizeof(up), st->uptime_s);
	human_bytes(ring, sizeof(ring), st->ring_bytes);
	/* The daemon's version string names the program already
	 * ("prefetchd 0.1.0"); an older one may send just the number. */
	printf("%s%s, up %s, %" PRIu32 " reader%s, ring %s%s%s\n",
	       strncmp(st->daemon, "prefetchd", 9) ? "prefetchd " : "", st->daemon, up, st->readers,
	       st->readers == 1 ? "" : "s", ring, st->gpu && *st->gpu ? ", gpu: " : "",
	       st->gpu ? st->gpu : "");
	for (size_t i = 0; i < st->n_sessions && !rc; i++) {
		const Pf__SessionStatus *s = st->sessions[i];
		char id[24], epoch[24], sent[24], consumed[24], held[24], target[24], fill[32];
		char wait[32], stall[16], gbps[16];

		snprintf(id, sizeof(id), "%" PRIu64, s->session);
		snprintf(epoch, sizeof(epoch), "%" PRIu64, s->epoch);
		snprintf(sent, sizeof(sent), "%" PRIu64, s->sent);
		snprintf(consumed, sizeof(consumed), "%" PRIu64, s->consumed);
		snprintf(held, sizeof(held), "%" PRIu64, s->held);
		snprintf(target, sizeof(target), "%" PRIu32, s->target);
		snprintf(fill, sizeof(fill), "%" PRIu32 "/%" PRIu32, s->ring_fill, s->slots);
		snprintf(wait, sizeof(wait), "%.2f", s->wait_s);
		snprintf(stall, sizeof(stall), "%.1f%%", 100 * s->stall_fraction);
		snprintf(gbps, sizeof(gbps), "%.2f", s->copy_gbps);
		rc = table_add(&t, id, s->name, s->dataset, s->device, epoch, s->state, sent,
			       consumed, held, target, fill, wait, stall, gbps, s->target_reason);
	}
	if (!rc) {
		if (st->n_sessions)
			table_print(&t, stdout);
		else
			puts("no sessions");
	}
	table_free(&t);
	if (!rc && st->n_pools)
		rc = print_pools(st);
	return rc ? errorf("out of memory") : 0;
}

/* ---- commands ------------------------------------------------------------------ */

static int connect_daemon(const char *socket_path, struct pf_client **c)
{
	int rc = pf_connect(socket_path, c);

	if (rc) {
		errorf("%s", pf_errmsg(*c));
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
		rc = errorf("%s", pf_errmsg(c));
		goto out;
	}
	if (json)
		json_status(stdout, reply->status_reply, sessions);
	else if (sessions)
		rc = print_status(reply->status_reply);
	else
		rc = print_datasets(reply->status_reply);
	if (!rc && (fflush(stdout) || ferror(stdout)))
		rc = errorf("cannot write the output: %s", strerror(errno));
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
		rc = errorf("%s", pf_errmsg(c));
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
		rc = errorf("%s", pf_errmsg(c));
	} else {
		char freed[32];

		human_bytes(freed, sizeof(freed), reply->pool_reply->bytes_freed);
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
			"\r  epoch %" PRIu64 "/%" PRIu64 " [%s] %3.0f%%  %" PRIu64 "/%" PRIu64
			" batches  %.2f GB/s ",
			epoch, epochs, bar, 100 * frac, done, total, gbps);
		if (final)
			fputc('\n', stderr);
		return;
	}
	if ((int)(frac * 10) > p->last_tenth || (final && p->last_tenth < 10)) {
		p->last_tenth = (int)(frac * 10);
		fprintf(stderr,
			"epoch %" PRIu64 "/%" PRIu64 ": %3.0f%% (%" PRIu64 "/%" PRIu64
			" batches, %.2f GB/s)\n",
			epoch, epochs, 100 * frac, done, total, gbps);
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
		return errorf("cannot open dataset %s: %s", o->dataset, pf_errmsg(c));
	t0 = mono_s();
	prog.t0 = t0;
	for (uint64_t e = 0; e < o->epochs; e++) {
		struct pf_epoch_opts eo = {.order = o->order, .seed = o->seed + e};
		uint64_t total = 0, done = 0;

		rc = pf_start_epoch(c, &eo, &total);
		if (rc)
			return errorf("cannot start epoch %" PRIu64 ": %s", e + 1, pf_errmsg(c));
		prog.last_tenth = 0;
		for (;;) {
			struct pf_batch *b;

			rc = pf_next(c, BENCH_NEXT_TIMEOUT_MS, &b);
			if (rc == -ETIMEDOUT || (rc && pfc_broken(c))) {
				if (prog.tty)
					fputc('\n', stderr);
				return errorf("%s", pf_errmsg(c));
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
				return errorf("%s", pf_errmsg(c));
			pf_stats(c, &st);
			bytes = st.bytes;
			progress_show(&prog, e + 1, o->epochs, done, total, bytes, false);
		}
		progress_show(&prog, e + 1, o->epochs, done, total, bytes, true);
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
		return errorf("cannot write the output: %s", strerror(errno));
	return errors ? errorf("%" PRIu64 " error batch%s", errors, errors == 1 ? "" : "es") : 0;
}

static int cmd_bench(const char *socket_path, int argc, char **argv)
{
	static const struct option opts[] = {
		{"batch-size", required_argument, NULL, 'b'},
		{"order", required_argument, NULL, 'o'},
		{"seed", required_argument, NULL, 's'},
		{"epochs", required_argument, NULL, 'e'},
		{"device", required_argument, NULL, 'd'},
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
			else
				return usage_error(
					"bench: --order is shuffle or sequential, not '%s'",
					optarg);
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
