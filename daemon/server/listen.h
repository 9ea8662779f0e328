/*
 * listen.h — the daemon's listening socket.
 *
 * Without socket activation the socket is made in its runtime directory,
 * which must be a real directory (not a symlink) owned by the daemon's
 * user or root and writable by nobody else; a directory that is missing is
 * made 0750 in socket_group.  Only a stale socket at the path is removed
 * (one that answers means another daemon); any other file there is refused
 * and left as it is.  The socket is born with exactly socket_mode and its
 * group is set without following a symlink.  Under socket activation the
 * daemon makes and removes nothing, but the passed socket's directory must
 * pass the same check.
 *
 * DESIGN: main thread, before the loop starts and after it ends.
 */
#ifndef PF_LISTEN_H
#define PF_LISTEN_H

#include <stdbool.h>

#include "conf/config.h"

/* The listening socket's descriptor (non-blocking), or -errno after a
 * logged reason.  *activated: it came from systemd. */
int listen_open(const struct config *cfg, bool *activated);
/* At shutdown: the socket goes, but never a file that took its place. */
void listen_unlink(const char *path);

#endif
