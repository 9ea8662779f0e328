/*
 * log.c — the daemon's log on stderr, in the form its reader wants.
 *
 * Under systemd, stderr is a stream to journald, which takes a leading
 * "<N>" (sd-daemon(3)) as the line's priority and stamps the time itself:
 * lines are "<6>prefetchd: ...".  Anywhere else (a terminal, a file, a
 * container runtime's log, a test's capture) the "<6>" would be noise and
 * nothing else would say when a line was written: lines are
 * "2026-12-02 03:40:11.123 info prefetchd: ...", local time to the
 * millisecond and a level word.  Which one is decided once, at log_init:
 * systemd sets $JOURNAL_STREAM to the device and inode of the stream it
 * connected, and stderr is that stream only when fstat(2) of it says the
 * same.  The variable alone proves nothing, since children inherit it: a
 * daemon started from a shell of a unit that logs to the journal, with
 * stderr sent to a file, must stamp its lines.
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
 * written with one fprintf under stdio's own stream lock, so lines from the
 * loop, reader and transfer threads never interleave; the global limit is
 * under its own mutex.  log_init runs on the main thread before any other
 * thread starts, and is the only writer of the settings below.
 */
#include "base/log.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "util.h"

#define LOG_PER_S 200.0
#define LOG_BURST 2000.0

static const char *log_ident = "prefetchd";
static int log_verbose;
static bool log_journal; /* stderr is journald's stream: "<N>", no time */
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

bool log_stderr_is_journal(void)
{
	const char *v = getenv("JOURNAL_STREAM");
	uintmax_t dev, ino;
	struct stat st;
	int end = 0;

	/* "DEVICE:INODE", both decimal (systemd.exec(5)); anything else is
	 * not systemd's. */
	if (!v || sscanf(v, "%ju:%ju%n", &dev, &ino, &end) != 2 || v[end] != '\0')
		return false;
	if (fstat(STDERR_FILENO, &st) < 0)
		return false;
	return (uintmax_t)st.st_dev == dev && (uintmax_t)st.st_ino == ino;
}

void log_init(const char *ident, int verbose)
{
	log_ident = ident;
	log_verbose = verbose;
	log_journal = log_stderr_is_journal();
}

/* What a line starts with: "<4>prefetchd: " for journald, else
 * "2026-12-02 03:40:11.123 warn prefetchd: ".  Its length, or -1. */
static int line_prefix(char *buf, size_t len, int prio)
{
	static const char *const word[8] = {"emerg", "alert",  "crit", "error",
					    "warn",  "notice", "info", "debug"};
	struct timespec ts;
	struct tm tm;
	char when[32];
	int n;

	if (prio < 0 || prio > 7)
		prio = 3;
	if (log_journal) {
		n = snprintf(buf, len, "<%d>%s: ", prio, log_ident);
	} else {
		clock_gettime(CLOCK_REALTIME, &ts);
		if (!localtime_r(&ts.tv_sec, &tm) ||
		    !strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S", &tm))
			snprintf(when, sizeof(when), "%lld", (long long)ts.tv_sec);
		n = snprintf(buf, len, "%s.%03ld %s %s: ", when, ts.tv_nsec / 1000000, word[prio],
			     log_ident);
	}
	return n < 0 || (size_t)n >= len ? -1 : n;
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
	if (dropped && line_prefix(line, sizeof(line), 4) >= 0)
		fprintf(stderr, "%s%llu log line(s) dropped (more than %.0f a second)\n", line,
			(unsigned long long)dropped, LOG_PER_S);
	n = line_prefix(line, sizeof(line), prio);
	if (n < 0)
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
