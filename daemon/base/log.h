/*
 * daemon/base/ — what every stage uses and that knows nothing of datasets,
 * sessions or GPUs: the log (log.c), the worker -> loop hand-back
 * (handback.c), big buffers in huge pages (bigmem.c), copies with
 * streaming stores (streamcopy.c).  Any thread may call them; each file
 * names the locks it takes.  They call nothing else of the daemon's.
 *
 * log.h — the daemon's logging: one line per event on stderr.  When stderr
 * is journald's stream each line starts with its sd-daemon priority ("<3>"
 * error .. "<7>" debug) so that systemd files it at the right level;
 * anywhere else with the local time to the millisecond and a level word
 * ("2026-12-02 03:40:11.123 info prefetchd: ...").  Thread-safe: one
 * fprintf per line.  Lines are made printable and rate-limited below error
 * level (log.c).
 */
#ifndef PF_LOG_H
#define PF_LOG_H

#include <stdbool.h>
#include <stdint.h>

/* Sets the name lines carry and whether debug lines are written, and
 * chooses the form of the lines from what stderr is now (log_init runs
 * before any other thread logs; again in tests). */
void log_init(const char *ident, int verbose);
/* True when stderr is the journal stream systemd named in $JOURNAL_STREAM
 * ("DEVICE:INODE", compared with fstat of stderr). */
bool log_stderr_is_journal(void);
void log_err(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void log_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void log_info(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void log_debug(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* A rate limit: at most `burst` lines at once, then per_s a second.  True
 * when this line may go, with *dropped the lines refused since the last
 * one that went (say so in it).  Not thread-safe: one owner per limit. */
struct log_limit {
	double tokens;
	uint64_t last_ns, dropped;
};
bool log_limit_pass(struct log_limit *l, double per_s, double burst, uint64_t *dropped);

/* Logs at error level and exits with status 1 (startup failures only). */
void fatal(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

#endif
