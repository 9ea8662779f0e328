/*
 * listen.c — the daemon's listening socket (see listen.h): made in a
 * runtime directory the daemon checks first, or taken from systemd.
 *
 * DESIGN: main thread, before the loop runs (and listen_unlink after it).
 * Every file operation is relative to the runtime directory's descriptor,
 * opened without following a symlink, so nothing a user swaps in along the
 * path is followed.
 */
#include "server/listen.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include "base/log.h"

/* What a file at the socket path is, for the message that refuses it. */
static const char *file_kind(mode_t mode)
{
	switch (mode & S_IFMT) {
	case S_IFREG: return "a regular file";
	case S_IFDIR: return "a directory";
	case S_IFLNK: return "a symbolic link";
	case S_IFIFO: return "a FIFO";
	case S_IFCHR: return "a character device";
	case S_IFBLK: return "a block device";
	default: return "a file of unknown type";
	}
}

/* The name of uid for a message: the user's, or "uid N" without one. */
static const char *user_name(uid_t uid, char *buf, size_t len)
{
	struct passwd *pw = getpwuid(uid);

	if (pw)
		snprintf(buf, len, "%s", pw->pw_name);
	else
		snprintf(buf, len, "uid %u", (unsigned)uid);
	return buf;
}

/* The socket's directory may hold the socket only if no one but the daemon's
 * user (or root) can change what is in it: whoever can write there can
 * rename a socket of their own over the daemon's, so that prefetchctl and
 * trainers talk to an impostor, or swap the socket for a symlink while the
 * daemon sets it up.  Its owner can always make it writable, so the owner
 * must be trusted too.  Only the directory itself is checked, not those
 * above it.  0, or -EPERM after saying what is wrong and how to fix it. */
static int check_runtime_dir(const char *dir, const struct stat *st)
{
	char owner[64], self[64], fix[3 * sizeof(struct sockaddr_un) + 64];
	uid_t me = geteuid();
	bool owner_ok = st->st_uid == me || st->st_uid == 0;
	bool mode_ok = !(st->st_mode & (S_IWGRP | S_IWOTH));

	if (owner_ok && mode_ok)
		return 0;
	if (!owner_ok)
		snprintf(fix, sizeof(fix), "`chown %u %s%s%s`", (unsigned)me, dir,
			 mode_ok ? "" : " && chmod go-w ", mode_ok ? "" : dir);
	else
		snprintf(fix, sizeof(fix), "`chmod go-w %s`", dir);
	log_err("runtime directory %s is owned by %s with mode %04o, so another user could "
		"replace the socket: prefetchd (running as %s) keeps it only in a directory "
		"that it or root owns and that group and others cannot write; run %s, or set "
		"socket to a path in such a directory",
		dir, user_name(st->st_uid, owner, sizeof(owner)), (unsigned)(st->st_mode & 07777),
		user_name(me, self, sizeof(self)), fix);
	return -EPERM;
}

/* The runtime directory, opened and checked (check_runtime_dir): created
 * 0750 in socket_group when missing, left as it is when it exists
 * (systemd's RuntimeDirectory= made it, or the admin did).  It must be a
 * directory, not a symlink to one: a link planted where the daemon would
 * create its directory could send the socket (and, after a mkdir that lost
 * the race, its mode and group) to any directory root owns.  The mode and
 * group are set through the descriptor, never a path.  A descriptor or
 * -errno. */
static int open_runtime_dir(const struct config *cfg, const char *dir)
{
	bool created = false;
	struct stat st;
	int dfd, rc;

	if (mkdir(dir, 0750) == 0)
		created = true;
	else if (errno != EEXIST) {
		rc = -errno;
		log_err("cannot create runtime directory %s: %s", dir, strerror(errno));
		return rc;
	}
	dfd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (dfd < 0 && (errno == ENOTDIR || errno == ELOOP) && lstat(dir, &st) == 0) {
		log_err("runtime directory %s is %s, not a directory: set socket to a path in a "
			"directory itself (a link there could point anywhere)",
			dir, file_kind(st.st_mode));
		return -ENOTDIR;
	}
	if (dfd < 0 || fstat(dfd, &st) < 0) {
		rc = -errno;
		log_err("cannot open runtime directory %s: %s", dir, strerror(errno));
		goto fail;
	}
	rc = check_runtime_dir(dir, &st);
	if (rc)
		goto fail;
	if (created) {
		/* Ours: the configured group may enter it to reach the
		 * socket, nobody else may (0750 whatever the umask). */
		struct group *gr = cfg->socket_group ? getgrnam(cfg->socket_group) : NULL;

		if (fchmod(dfd, 0750) < 0)
			log_warn("cannot make %s 0750: %s", dir, strerror(errno));
		if (gr && fchown(dfd, (uid_t)-1, gr->gr_gid) < 0)
			log_warn("cannot give %s to group %s: %s", dir, cfg->socket_group,
				 strerror(errno));
	}
	return dfd;
fail:
	if (dfd >= 0)
		close(dfd);
	return rc;
}

/* Makes room for the socket at name in dfd (addr names the same file, for
 * connect and messages).  Only a socket is removed, and only one nobody
 * answers on (left by a daemon that died): two daemons never steal each
 * other's socket, and a file given as -s by mistake (a config file, a
 * symlink to one) is refused, never deleted.  0 or -errno. */
static int clear_socket_path(int dfd, const char *name, const struct sockaddr_un *addr)
{
	struct stat st;
	int fd, rc;

	if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
		if (errno == ENOENT)
			return 0;
		rc = -errno;
		log_err("cannot inspect %s: %s", addr->sun_path, strerror(errno));
		return rc;
	}
	if (!S_ISSOCK(st.st_mode)) {
		log_err("%s is %s (mode %04o), not a socket: prefetchd removes only a socket left "
			"by a daemon that died; set socket (-s) to another path, or move that file "
			"away",
			addr->sun_path, file_kind(st.st_mode), (unsigned)(st.st_mode & 07777));
		return -EEXIST;
	}
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	rc = connect(fd, (const struct sockaddr *)addr, sizeof(*addr));
	close(fd);
	if (rc == 0) {
		log_err("another daemon is already serving %s", addr->sun_path);
		return -EADDRINUSE;
	}
	if (unlinkat(dfd, name, 0) < 0 && errno != ENOENT) {
		rc = -errno;
		log_err("cannot remove the stale socket %s: %s", addr->sun_path, strerror(errno));
		return rc;
	}
	return 0;
}

/* The directory part of a socket path into dir ("." for a bare name, "/"
 * for "/x.sock"); returns the name inside it (empty for "dir/"). */
static const char *split_socket_path(const char *path, char *dir, size_t len)
{
	const char *slash = strrchr(path, '/');

	if (!slash) {
		snprintf(dir, len, ".");
		return path;
	}
	snprintf(dir, len, "%.*s", slash == path ? 1 : (int)(slash - path), path);
	return slash + 1;
}

/* Under socket activation systemd made the directory and the socket and
 * the daemon touches neither, but an impostor's socket renamed over the
 * passed one would still take prefetchctl's and new trainers' connections:
 * the same directory rule applies.  A directory that cannot be seen from
 * here (another mount namespace) is only warned about.  0 or -errno. */
static int check_activated_dir(int fd)
{
	struct sockaddr_un addr = {0};
	socklen_t len = sizeof(addr) - 1; /* room for the terminating NUL */
	char dir[sizeof(addr.sun_path)];
	struct stat st;

	/* An abstract or unnamed socket has no directory to trust. */
	if (getsockname(fd, (struct sockaddr *)&addr, &len) < 0 ||
	    len <= offsetof(struct sockaddr_un, sun_path) || !addr.sun_path[0])
		return 0;
	split_socket_path(addr.sun_path, dir, sizeof(dir));
	if (stat(dir, &st) < 0) {
		log_warn("cannot check the directory %s of the socket systemd passed: %s", dir,
			 strerror(errno));
		return 0;
	}
	return check_runtime_dir(dir, &st);
}

static int make_listener(const struct config *cfg)
{
	struct sockaddr_un addr = {.sun_family = AF_UNIX};
	char dir[sizeof(addr.sun_path)];
	const char *name;
	int dfd, fd = -1, rc;

	if (strlen(cfg->socket_path) >= sizeof(addr.sun_path)) {
		log_err("socket path %s is longer than %zu bytes", cfg->socket_path,
			sizeof(addr.sun_path) - 1);
		return -ENAMETOOLONG;
	}
	strcpy(addr.sun_path, cfg->socket_path);
	name = split_socket_path(cfg->socket_path, dir, sizeof(dir));
	if (!*name) {
		log_err("socket path %s names a directory, not a socket", cfg->socket_path);
		return -EISDIR;
	}
	dfd = open_runtime_dir(cfg, dir);
	if (dfd < 0)
		return dfd;
	rc = clear_socket_path(dfd, name, &addr);
	if (rc)
		goto out;
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		rc = -errno;
		goto out;
	}
	/* The socket is born with exactly socket_mode's bits (0777 less the
	 * umask), so there is no moment at which anyone else may connect, and
	 * no chmod by path afterwards that a symlink could redirect. */
	{
		mode_t old = umask(~cfg->socket_mode & 0777);

		rc = bind(fd, (struct sockaddr *)&addr, sizeof(addr));
		umask(old);
	}
	if (rc < 0) {
		rc = -errno;
		log_err("cannot bind %s: %s", cfg->socket_path, strerror(errno));
		goto out;
	}
	if (cfg->socket_group) {
		struct group *gr = getgrnam(cfg->socket_group);

		if (!gr || fchownat(dfd, name, (uid_t)-1, gr->gr_gid, AT_SYMLINK_NOFOLLOW) < 0)
			log_warn("cannot give %s to group %s: %s", cfg->socket_path,
				 cfg->socket_group, gr ? strerror(errno) : "no such group");
	}
	if (listen(fd, 128) < 0) {
		rc = -errno;
		goto out;
	}
	rc = fd;
	fd = -1;
out:
	if (fd >= 0)
		close(fd);
	close(dfd);
	return rc;
}

void listen_unlink(const char *path)
{
	struct stat st;

	if (lstat(path, &st) == 0 && S_ISSOCK(st.st_mode))
		unlink(path);
}

int listen_open(const struct config *cfg, bool *activated)
{
	int n = sd_listen_fds(1), fd, rc;

	*activated = false;
	if (n > 1) {
		log_err("systemd passed %d sockets; prefetchd takes exactly one", n);
		return -EINVAL;
	}
	if (n == 0) {
		fd = make_listener(cfg);
		if (fd >= 0)
			log_info("listening on %s (mode %04o)", cfg->socket_path,
				 (unsigned)cfg->socket_mode);
		return fd;
	}
	fd = SD_LISTEN_FDS_START;
	*activated = true;
	if (sd_is_socket_unix(fd, SOCK_STREAM, 1, NULL, 0) <= 0) {
		log_err("the socket systemd passed is not a listening Unix stream socket");
		return -EINVAL;
	}
	rc = check_activated_dir(fd);
	if (rc)
		return rc;
	fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
	fcntl(fd, F_SETFD, FD_CLOEXEC);
	log_info("listening on the socket systemd passed (socket activation)");
	return fd;
}
