/*
 * log.c — stderr logging with sd-daemon priority prefixes.
 *
 * Clients choose some of what goes into lines (their names, the datasets
 * and epochs they ask for) and how often lines come (each refused request
 * logs one).  So every line is made printable, with no control character
 * to forge a line or move a terminal's cursor, and lines below error level
 * pass a daemon-wide rate limit (LOG_PER_S a second after a burst of
 * LOG_BURST); what it drops is counted and said on the next line that
 * passes.  Callers that log per client request keep a limit of their own
 * per client too (log_limit_pass), so that one client's flood does not
 * take the others' lines.
 *
 * DESIGN: any thread may log.  Each line is formatted into a local buffer and
 * written with one fputs under stdio's own stream lock, so lines from the
 * loop, reader and transfer threads never interleave; the global limit is
 * under its own mutex.
 */
#include "log.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "util.h"

#define LOG_PER_S 200.0
#define LOG_BURST 2000.0

static const char *log_ident = "prefetchd";
static int log_verbose;
static pthread_mutex_t limit_lock = PTHREAD_MUTEX_INITIALIZER;
static struct log_limit limit;

bool log_limit_pass(struct log_limit *l, double per_s, double burst, uint64_t *dropped)
{
	uint64_t now = now_ns();

	if (!l->last_ns)
		l->tokens = burst;
	else
		l->tokens += (now - l->last_ns) / 1e9 * per_s;
	if (l->tokens > burst)
		l->tokens = burst;
	l->last_ns = now;
	if (l->tokens < 1) {
		l->dropped++;
		return false;
	}
	l->tokens -= 1;
	*dropped = l->dropped;
	l->dropped = 0;
	return true;
}

void log_init(const char *ident, int verbose)
{
	log_ident = ident;
	log_verbose = verbose;
}

static void vlog(int prio, const char *fmt, va_list ap)
{
	char line[1024];
	uint64_t dropped = 0;
	int n;

	if (prio >= 7 && !log_verbose)
		return;
	if (prio > 3) {
		bool pass;

		pthread_mutex_lock(&limit_lock);
		pass = log_limit_pass(&limit, LOG_PER_S, LOG_BURST, &dropped);
		pthread_mutex_unlock(&limit_lock);
		if (!pass)
			return;
	}
	if (dropped)
		fprintf(stderr, "<4>%s: %llu log line(s) dropped (more than %.0f a second)\n",
			log_ident, (unsigned long long)dropped, LOG_PER_S);
	n = snprintf(line, sizeof(line), "<%d>%s: ", prio, log_ident);
	if (n < 0 || (size_t)n >= sizeof(line))
		return;
	vsnprintf(line + n, sizeof(line) - (size_t)n - 1, fmt, ap);
	util_printable(line + n);
	fprintf(stderr, "%s\n", line);
}

#define LOG_AT(name, prio)                                                                         \
	void name(const char *fmt, ...)                                                            \
	{                                                                                          \
		va_list ap;                                                                        \
		va_start(ap, fmt);                                                                 \
		vlog(prio, fmt, ap);                                                               \
		va_end(ap);                                                                        \
	}

LOG_AT(log_err, 3)
LOG_AT(log_warn, 4)
LOG_AT(log_info, 6)
LOG_AT(log_debug, 7)

void fatal(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vlog(3, fmt, ap);
	va_end(ap);
	exit(1);
}
