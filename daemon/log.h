/*
 * log.h — the daemon's logging: one line per event on stderr, each with a
 * journald/sd-daemon priority prefix ("<3>" error .. "<7>" debug) so that
 * systemd files it at the right level.  Thread-safe: one fprintf per line.
 */
#ifndef PF_LOG_H
#define PF_LOG_H

void log_init(const char *ident, int verbose);
void log_err(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void log_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void log_info(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void log_debug(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Logs at error level and exits with status 1 (startup failures only). */
void fatal(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

#endif
