/*
 * ctl_print.c — prefetchctl's output: the daemon's status reply as tables
 * for people or as one JSON object (a small writer of its own: no
 * dependency), sizes and durations for people, and the one-line error.
 *
 * DESIGN: single-threaded and stateless.  Each call writes what it is
 * given and frees what it allocated (a table's cells) before it returns;
 * the status reply stays the caller's.
 */
#include "ctl_print.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

int __attribute__((format(printf, 1, 2))) ctl_errorf(const char *fmt, ...)
{
	va_list ap;

	fputs("prefetchctl: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	return EXIT_FAILURE;
}

void ctl_human_bytes(char *buf, size_t len, uint64_t bytes)
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

/* Whether the session has started an epoch: the daemon's state is "open"
 * until it has (daemon/server/status.c). */
static bool session_has_epoch(const Pf__SessionStatus *s)
{
	return !s->state || strcmp(s->state, "open") != 0;
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
	/* Epoch numbers are the trainer's own and start at 0, so a session
	 * that has started none says null rather than a number. */
	if (session_has_epoch(s)) {
		jk_u64(out, &first, "epoch", s->epoch);
	} else {
		json_key(out, &first, "epoch");
		fputs("null", out);
	}
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
	jk_u64(out, &first, "ring_slots", s->ring_slots);
	jk_u64(out, &first, "ring_min", s->ring_min);
	jk_u64(out, &first, "ring_held", s->ring_held);
	jk_u64(out, &first, "arenas", s->arenas);
	jk_u64(out, &first, "arena_bytes", s->arena_bytes);
	jk_u64(out, &first, "device_bytes", s->device_bytes);
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
	jk_u64(out, &first, "blocks_read", s->blocks_read);
	jk_u64(out, &first, "block_cache_bytes", s->block_cache_bytes);
	jk_u64(out, &first, "block_cache_peak", s->block_cache_peak);
	jk_u64(out, &first, "order_bytes", s->order_bytes);
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
	json_key(out, &first, "lingering");
	fputs(p->lingering ? "true" : "false", out);
	jk_num(out, &first, "linger_age_s", p->linger_age_s);
	jk_num(out, &first, "linger_left_s", p->linger_left_s);
	jk_str(out, &first, "linger_reason", p->linger_reason);
	json_key(out, &first, "probe_age_s");
	if (p->probe_age_s < 0)
		fputs("null", out);
	else
		fprintf(out, "%.6g", p->probe_age_s);
	jk_u64(out, &first, "slabs_dropped", p->slabs_dropped);
	jk_u64(out, &first, "sessions", p->sessions);
	fputc('}', out);
}

static void json_share(FILE *out, const Pf__ShareStatus *sh)
{
	bool first = true;

	fputc('{', out);
	jk_str(out, &first, "name", sh->name);
	jk_u64(out, &first, "uid", sh->uid);
	jk_str(out, &first, "dataset", sh->dataset);
	jk_str(out, &first, "device", sh->device);
	jk_u64(out, &first, "session", sh->session);
	jk_u64(out, &first, "epoch", sh->epoch);
	jk_u64(out, &first, "lag", sh->lag);
	json_key(out, &first, "members");
	fputc('[', out);
	for (size_t i = 0; i < sh->n_members; i++) {
		const Pf__ShareMember *m = sh->members[i];
		bool mf = true;

		fputs(i ? ",{" : "{", out);
		jk_u64(out, &mf, "session", m->session);
		jk_str(out, &mf, "name", m->name);
		jk_i64(out, &mf, "pid", m->pid);
		jk_u64(out, &mf, "epoch", m->epoch);
		jk_str(out, &mf, "state", m->state);
		jk_u64(out, &mf, "delivered", m->delivered);
		jk_u64(out, &mf, "consumed", m->consumed);
		jk_u64(out, &mf, "held", m->held);
		jk_u64(out, &mf, "behind", m->behind);
		jk_u64(out, &mf, "own_batches", m->own_batches);
		jk_u64(out, &mf, "dropped", m->dropped);
		fputc('}', out);
	}
	fputs("]}", out);
}

void ctl_json_status(FILE *out, const Pf__StatusReply *st, bool sessions)
{
	bool first = true;

	fputc('{', out);
	if (sessions) {
		jk_str(out, &first, "daemon", st->daemon);
		jk_num(out, &first, "uptime_s", st->uptime_s);
		jk_u64(out, &first, "readers", st->readers);
		jk_u64(out, &first, "ring_bytes", st->ring_bytes);
		jk_u64(out, &first, "ring_used", st->ring_used);
		jk_u64(out, &first, "ring_reserved", st->ring_reserved);
		jk_u64(out, &first, "ring_waits", st->ring_waits);
		jk_str(out, &first, "gpu", st->gpu);
		jk_u64(out, &first, "kept_orders", st->kept_orders);
		jk_u64(out, &first, "kept_order_bytes", st->kept_order_bytes);
		jk_u64(out, &first, "kept_order_cap", st->kept_order_cap);
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
		json_key(out, &first, "shares");
		fputc('[', out);
		for (size_t i = 0; i < st->n_shares; i++) {
			if (i)
				fputc(',', out);
			json_share(out, st->shares[i]);
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
		/* Names come from clients and files: nothing of theirs may
		 * reach the terminal as a control sequence. */
		util_printable(row[i]);
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

int ctl_print_datasets(const Pf__StatusReply *st)
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
		ctl_human_bytes(bytes, sizeof(bytes), d->bytes);
		rc = table_add(&t, d->name, d->format, samples, bytes, fields);
	}
	if (!rc) {
		if (st->n_datasets)
			table_print(&t, stdout);
		else
			puts("no datasets");
	}
	table_free(&t);
	return rc ? ctl_errorf("out of memory") : 0;
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
		char bytes[32], rows[48], hit[16], last[16], saved[32], budget[32], why[400];
		char age[32], left[32];

		ctl_human_bytes(bytes, sizeof(bytes), p->bytes);
		snprintf(rows, sizeof(rows), "%" PRIu64 "/%" PRIu64, p->rows, p->samples);
		/* Known once a row was looked up (epoch 0 is an epoch too). */
		rate_text(hit, sizeof(hit), p->hit_rate, p->lookups > 0);
		rate_text(last, sizeof(last), p->last_hit_rate, p->last_hit_rate >= 0);
		ctl_human_bytes(saved, sizeof(saved), p->h2d_saved);
		ctl_human_bytes(budget, sizeof(budget), p->budget);
		snprintf(why, sizeof(why), "%s", p->budget_reason);
		if (p->lingering) {
			/* What a user asks of a lingering pool: since when, for
			 * how much longer, and whether it yielded to anyone. */
			human_duration(age, sizeof(age), p->linger_age_s);
			human_duration(left, sizeof(left), p->linger_left_s);
			snprintf(why, sizeof(why), "no session for %s, %s left%s%s", age, left,
				 p->linger_reason[0] ? "; " : "", p->linger_reason);
		}
		rc = table_add(&t, p->dataset, p->device,
			       p->lingering ? "lingering"
			       : p->enabled ? "on"
					    : "off",
			       bytes, rows, hit, last, saved, budget, why);
	}
	if (!rc)
		table_print(&t, stdout);
	table_free(&t);
	return rc;
}

/* Shares: a line for each, then its members. */
static int print_shares(const Pf__StatusReply *st)
{
	struct table t = {.ncols = 10,
			  .head = {"SHARE", ">SESSION", "NAME", ">PID", ">EPOCH", "STATE",
				   ">DELIVERED", ">CONSUMED", ">HELD", ">BEHIND"}};
	int rc = 0;

	putchar('\n');
	for (size_t i = 0; i < st->n_shares && !rc; i++) {
		const Pf__ShareStatus *sh = st->shares[i];
		char name[96], id[24], epoch[24], what[160];

		snprintf(name, sizeof(name), "%s", sh->name);
		util_printable(name);
		snprintf(id, sizeof(id), "%" PRIu64, sh->session);
		snprintf(epoch, sizeof(epoch), "%" PRIu64, sh->epoch);
		snprintf(what, sizeof(what), "uid %u, %s on %s, share_lag %u", sh->uid, sh->dataset,
			 sh->device, sh->lag);
		rc = table_add(&t, name, id, what, "-", epoch, "producer", "-", "-", "-", "-");
		for (size_t j = 0; j < sh->n_members && !rc; j++) {
			const Pf__ShareMember *m = sh->members[j];
			char mid[24], pid[24], mep[24], del[48], con[24], held[24], behind[48];

			snprintf(mid, sizeof(mid), "%" PRIu64, m->session);
			snprintf(pid, sizeof(pid), "%d", m->pid);
			snprintf(mep, sizeof(mep), "%" PRIu64, m->epoch);
			if (m->own_batches)
				snprintf(del, sizeof(del), "%" PRIu64 " (%" PRIu64 " alone)",
					 m->delivered, m->own_batches);
			else
				snprintf(del, sizeof(del), "%" PRIu64, m->delivered);
			snprintf(con, sizeof(con), "%" PRIu64, m->consumed);
			snprintf(held, sizeof(held), "%" PRIu32, m->held);
			if (m->dropped)
				snprintf(behind, sizeof(behind),
					 "%" PRIu64 " (dropped %" PRIu64 "x)", m->behind,
					 m->dropped);
			else
				snprintf(behind, sizeof(behind), "%" PRIu64, m->behind);
			rc = table_add(&t, "", mid, m->name, pid, mep, m->state, del, con, held,
				       behind);
		}
	}
	if (!rc)
		table_print(&t, stdout);
	table_free(&t);
	return rc;
}

int ctl_print_status(const Pf__StatusReply *st)
{
	struct table t = {.ncols = 15,
			  .head = {">SESSION", "NAME", "DATASET", "DEVICE", ">EPOCH", "STATE",
				   ">SENT", ">CONSUMED", ">HELD", ">TARGET", ">RING", ">WAIT_S",
				   ">STALL", ">GB/S", "WHY"}};
	char up[32], ring[160], daemon[64], gpu[256], kept[32], kept_cap[32], rkept[32], used[32];
	int rc = 0;

	human_duration(up, sizeof(up), st->uptime_s);
	ctl_human_bytes(ring, sizeof(ring), st->ring_bytes);
	if (st->ring_reserved) {
		/* How full the ring is for the next session: what the open
		 * ones keep, what is busy now, and whether batches queued. */
		size_t n = strlen(ring);

		ctl_human_bytes(rkept, sizeof(rkept), st->ring_reserved);
		ctl_human_bytes(used, sizeof(used), st->ring_used);
		snprintf(ring + n, sizeof(ring) - n,
			 " (%s reserved for sessions, %s in use, %" PRIu64 " wait%s)", rkept, used,
			 st->ring_waits, st->ring_waits == 1 ? "" : "s");
	}
	ctl_human_bytes(kept, sizeof(kept), st->kept_order_bytes);
	ctl_human_bytes(kept_cap, sizeof(kept_cap), st->kept_order_cap);
	/* The daemon's version string names the program already
	 * ("prefetchd 0.1.0"); an older one may send just the number. */
	snprintf(daemon, sizeof(daemon), "%s", st->daemon);
	snprintf(gpu, sizeof(gpu), "%s", st->gpu ? st->gpu : "");
	util_printable(daemon);
	util_printable(gpu);
	printf("%s%s, up %s, %" PRIu32 " reader%s, ring %s%s%s\n",
	       strncmp(daemon, "prefetchd", 9) ? "prefetchd " : "", daemon, up, st->readers,
	       st->readers == 1 ? "" : "s", ring, gpu[0] ? ", gpu: " : "", gpu);
	/* Memory that no session holds and no quota counts: its own line. */
	printf("kept orders: %" PRIu32 ", %s of %s\n", st->kept_orders, kept, kept_cap);
	for (size_t i = 0; i < st->n_sessions && !rc; i++) {
		const Pf__SessionStatus *s = st->sessions[i];
		char id[24], epoch[24], sent[24], consumed[24], held[24], target[24], fill[32];
		char wait[32], stall[16], gbps[16];

		snprintf(id, sizeof(id), "%" PRIu64, s->session);
		if (session_has_epoch(s))
			snprintf(epoch, sizeof(epoch), "%" PRIu64, s->epoch);
		else
			snprintf(epoch, sizeof(epoch), "-");
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
	if (!rc && st->n_shares)
		rc = print_shares(st);
	if (!rc && st->n_pools)
		rc = print_pools(st);
	return rc ? ctl_errorf("out of memory") : 0;
}
