/*
 * log.c — stderr logging with sd-daemon priority prefixes.
 *
 * DESIGN: any thread may log.  Each line is formatted into a local buffer and
 * written with one fputs under stdio's own stream lock, so lines from the
 * loop, reader and transfer threads never interleave.
 */
#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

static const char *log_ident = "prefetchd";
static int log_verbose;

void log_init(const char *ident, int verbose)
{
	log_ident = ident;
	log_verbose = verbose;
}

static void vlog(int prio, const char *fmt, va_list ap)
{
	char line[1024];
	int n;

	if (prio >= 7 && !log_verbose)
		return;
	n = snprintf(line, sizeof(line), "<%d>%s: ", prio, log_ident);
	if (n < 0 || (size_t)n >= sizeof(line))
		return;
	vsnprintf(line + n, sizeof(line) - (size_t)n - 1, fmt, ap);
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
