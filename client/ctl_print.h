/*
 * ctl_print.h — what prefetchctl's commands print with (ctl_print.c).
 *
 * DESIGN: single-threaded, no state; the status reply passed in stays the
 * caller's.
 */
#ifndef PF_CTL_PRINT_H
#define PF_CTL_PRINT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "prefetch.pb-c.h"

/* "prefetchctl: MESSAGE" on stderr; returns EXIT_FAILURE. */
int ctl_errorf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* bytes for people: "512 B", "1.5 GiB". */
void ctl_human_bytes(char *buf, size_t len, uint64_t bytes);

/* The reply as one JSON object and a newline: the daemon, its sessions,
 * pools and datasets (status), or only the datasets (datasets). */
void ctl_json_status(FILE *out, const Pf__StatusReply *st, bool sessions);

/* The reply as tables on stdout: the daemon, its sessions and pools; or
 * its datasets.  0, or EXIT_FAILURE after saying why. */
int ctl_print_status(const Pf__StatusReply *st);
int ctl_print_datasets(const Pf__StatusReply *st);

#endif
