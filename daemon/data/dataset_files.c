/*
 * dataset_files.c — a dataset's files: opening them as regular files only,
 * never blocking and never through a link a shard pattern's matches should
 * not follow, and telling when a served file changed on disk (dataset.c,
 * "Files that are not what they seem", says why).
 *
 * DESIGN: called by ds_load on the loop thread; ds_files_changed also by
 * reader threads after a failed read, which only read the shard table and
 * ask the kernel.
 */
#include "data/dataset_int.h"

#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "conf/config.h"
#include "util.h"

/* ---- opening files, and telling when they changed --------------------------- */

/* "a FIFO", "a directory", ... for a file that is not a regular one. */
static const char *file_kind(mode_t mode)
{
	switch (mode & S_IFMT) {
	case S_IFLNK: return "a symbolic link";
	case S_IFIFO: return "a FIFO";
	case S_IFSOCK: return "a socket";
	case S_IFDIR: return "a directory";
	case S_IFCHR: return "a character device";
	case S_IFBLK: return "a block device";
	default: return "not a regular file";
	}
}

static int not_regular(const char *path, mode_t mode, char *err, size_t len)
{
	if (S_ISLNK(mode))
		set_err(err, len,
			"%s is a symbolic link: shard patterns match regular files only, never "
			"links (name the file itself in the pattern's directory)",
			path);
	else
		set_err(err, len,
			"%s is %s, not a regular file: dataset files must be regular files", path,
			file_kind(mode));
	return -EINVAL;
}

/* dataset_int.h */
int ds_open_regular(int dirfd, const char *name, bool follow, const char *path, int *out, char *err,
		    size_t len)
{
	struct stat st;
	int fd, fl, rc;

	if (fstatat(dirfd, name, &st, follow ? 0 : AT_SYMLINK_NOFOLLOW) == 0 &&
	    !S_ISREG(st.st_mode))
		return not_regular(path, st.st_mode, err, len);
	fd = openat(dirfd, name, O_RDONLY | O_CLOEXEC | O_NONBLOCK | (follow ? 0 : O_NOFOLLOW));
	if (fd < 0) {
		rc = -errno;
		if (rc == -ELOOP && !follow)
			return not_regular(path, S_IFLNK, err, len);
		set_err(err, len, "%s: %s", path, strerror(-rc));
		return rc;
	}
	if (fstat(fd, &st) != 0) {
		rc = -errno;
		set_err(err, len, "%s: fstat: %s", path, strerror(-rc));
		goto fail;
	}
	if (!S_ISREG(st.st_mode)) {
		rc = not_regular(path, st.st_mode, err, len);
		goto fail;
	}
	fl = fcntl(fd, F_GETFL);
	if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0) {
		rc = -errno;
		set_err(err, len, "%s: fcntl: %s", path, strerror(-rc));
		goto fail;
	}
	*out = fd;
	return 0;
fail:
	close(fd);
	return rc;
}

/* Where the fixed part of a shard pattern ends: just after the last '/'
 * before its first glob character.  The operator chose those directories;
 * below them is whatever a user who can write there put there. */
static size_t fixed_prefix(const char *pattern)
{
	size_t meta = strcspn(pattern, "*?[\\"), end = 0;

	for (size_t i = 0; i < meta; i++)
		if (pattern[i] == '/')
			end = i + 1;
	return end;
}

/* dataset_int.h */
int ds_open_match(const char *pattern, const char *path, int *out, char *err, size_t len)
{
	size_t fixed = fixed_prefix(pattern);
	char dir[PATH_MAX];
	const char *p = path + fixed;
	int dirfd, rc;

	if (fixed >= sizeof(dir) || strncmp(path, pattern, fixed) != 0) {
		set_err(err, len, "%s: not under %.*s, where its pattern %s looks", path,
			(int)fixed, pattern, pattern);
		return -EINVAL;
	}
	memcpy(dir, pattern, fixed);
	dir[fixed] = '\0';
	dirfd = open(fixed ? dir : ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dirfd < 0) {
		rc = -errno;
		set_err(err, len, "%s: %s", fixed ? dir : ".", strerror(-rc));
		return rc;
	}
	for (;;) {
		size_t n = strcspn(p, "/");
		char name[NAME_MAX + 1];
		struct stat st;
		bool dots;
		int next;

		if (n > NAME_MAX) {
			rc = -ENAMETOOLONG;
			set_err(err, len, "%s: %s", path, strerror(-rc));
			break;
		}
		memcpy(name, p, n);
		name[n] = '\0';
		if (!p[n]) {
			rc = ds_open_regular(dirfd, name, false, path, out, err, len);
			break;
		}
		p += n + 1;
		if (n == 0)
			continue; /* "a//b" */
		dots = !strcmp(name, ".") || !strcmp(name, "..");
		if (dots ||
		    (fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(st.st_mode))) {
			rc = -EINVAL;
			set_err(err, len,
				"%.*s is %s: below %s, shard patterns follow no link and stay "
				"in the directories they match",
				(int)(p - 1 - path), path, dots ? "'.' or '..'" : "a symbolic link",
				fixed ? dir : ".");
			break;
		}
		next = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		if (next < 0) {
			rc = -errno;
			set_err(err, len, "%.*s: %s", (int)(p - 1 - path), path, strerror(-rc));
			break;
		}
		close(dirfd);
		dirfd = next;
	}
	close(dirfd);
	return rc;
}

/* FNV-1a of the file's first len bytes (a shard's header), read with
 * pread a page at a time.  0, or -errno when they cannot all be read. */
static int hash_head(int fd, uint64_t len, uint64_t *out)
{
	uint8_t buf[4096];
	uint64_t h = 0xcbf29ce484222325ull, off = 0;

	while (off < len) {
		size_t want = len - off < sizeof(buf) ? (size_t)(len - off) : sizeof(buf);
		ssize_t got = pread(fd, buf, want, (off_t)off);

		if (got < 0 && errno == EINTR)
			continue;
		if (got <= 0)
			return got < 0 ? -errno : -EIO;
		for (ssize_t i = 0; i < got; i++)
			h = (h ^ buf[i]) * 0x100000001b3ull;
		off += (uint64_t)got;
	}
	*out = h;
	return 0;
}

/* dataset_int.h */
int ds_take_id(struct ds_shard *shard, char *err, size_t len)
{
	struct stat st;
	int rc;

	if (fstat(shard->fd, &st) != 0) {
		rc = -errno;
		set_err(err, len, "%s: fstat: %s", shard->path, strerror(-rc));
		return rc;
	}
	shard->id.dev = (uint64_t)st.st_dev;
	shard->id.ino = (uint64_t)st.st_ino;
	shard->id.size = (uint64_t)st.st_size;
	shard->id.mtime_sec = (int64_t)st.st_mtim.tv_sec;
	shard->id.mtime_nsec = st.st_mtim.tv_nsec;
	rc = hash_head(shard->fd, shard->data_offset, &shard->id.head_hash);
	if (rc)
		set_err(err, len, "%s: reading its header: %s", shard->path, strerror(-rc));
	return rc;
}

/* Whether shard's file changed since take_id, with why saying how. */
static bool shard_changed(const struct ds_shard *shard, char *why, size_t len)
{
	const struct ds_file_id *was = &shard->id;
	struct stat st;
	uint64_t hash;

	if (stat(shard->path, &st) != 0) {
		set_err(why, len, "%s changed on disk (%s)", shard->path,
			errno == ENOENT ? "removed" : strerror(errno));
		return true;
	}
	if ((uint64_t)st.st_dev != was->dev || (uint64_t)st.st_ino != was->ino) {
		set_err(why, len, "%s changed on disk (inode %llu -> %llu%s)", shard->path,
			(unsigned long long)was->ino, (unsigned long long)st.st_ino,
			(uint64_t)st.st_dev != was->dev ? ", on another device" : "");
		return true;
	}
	/* The open file now: the one that is read.  If even fstat fails, the
	 * caller's own error stands. */
	if (fstat(shard->fd, &st) != 0)
		return false;
	if ((uint64_t)st.st_size != was->size) {
		set_err(why, len, "%s changed on disk (size %llu -> %llu bytes)", shard->path,
			(unsigned long long)was->size, (unsigned long long)st.st_size);
		return true;
	}
	if ((int64_t)st.st_mtim.tv_sec != was->mtime_sec || st.st_mtim.tv_nsec != was->mtime_nsec) {
		set_err(why, len, "%s changed on disk (mtime %lld.%09ld -> %lld.%09ld)",
			shard->path, (long long)was->mtime_sec, was->mtime_nsec,
			(long long)st.st_mtim.tv_sec, st.st_mtim.tv_nsec);
		return true;
	}
	/* Same size and mtime (a writer may set them back): the header. */
	if (hash_head(shard->fd, shard->data_offset, &hash) == 0 && hash != was->head_hash) {
		set_err(why, len, "%s changed on disk (its header was rewritten)", shard->path);
		return true;
	}
	return false;
}

bool ds_files_changed(const struct dataset *ds, char *why, size_t len)
{
	for (size_t f = 0; f < ds->nfields; f++)
		for (size_t k = 0; k < ds->fields[f].nshards; k++)
			if (shard_changed(&ds->fields[f].shards[k], why, len))
				return true;
	return false;
}

/* The directory glob could not read, and why: GLOB_ABORTED alone would
 * only say "read error" of a pattern whose directory is missing or
 * unreadable.  Per thread, since glob's callback takes no argument. */
static __thread struct {
	char path[256];
	int err;
} glob_failed;

static int note_glob_error(const char *path, int err)
{
	snprintf(glob_failed.path, sizeof(glob_failed.path), "%s", path);
	glob_failed.err = err;
	return 1; /* stop: GLOB_ERR would anyway */
}

/* dataset_int.h */
int ds_glob_shards(const char *pattern, glob_t *gl, char *err, size_t len)
{
	int g;

	glob_failed.err = 0;
	g = glob(pattern, GLOB_ERR, note_glob_error, gl);
	if (g == 0)
		return 0;
	globfree(gl);
	if (g == GLOB_NOMATCH) {
		set_err(err, len, "shards: %s matches no file", pattern);
		return -ENOENT;
	}
	if (g == GLOB_ABORTED && glob_failed.err) {
		set_err(err, len, "shards: cannot expand %s: %s: %s", pattern, glob_failed.path,
			strerror(glob_failed.err));
		return -glob_failed.err;
	}
	set_err(err, len, "shards: cannot expand %s: %s", pattern,
		g == GLOB_NOSPACE ? "out of memory" : "read error");
	return g == GLOB_NOSPACE ? -ENOMEM : -EIO;
}

static bool listed(char *const *list, size_t n, const char *s)
{
	for (size_t i = 0; i < n; i++)
		if (!strcmp(list[i], s))
			return true;
	return false;
}

bool ds_matches_changed(const struct dataset *ds, const struct config_dataset *decl, char *why,
			size_t len)
{
	const struct config_field *patterns = &decl->fields[0];
	size_t m = 0;

	if (strcmp(ds->format, "tokens") != 0 || decl->nfields != 1)
		return false;
	for (size_t p = 0; p < patterns->npaths; p++) {
		glob_t gl;

		if (ds_glob_shards(patterns->paths[p], &gl, why, len))
			return true;
		for (size_t k = 0; k < gl.gl_pathc; k++, m++) {
			const char *now = gl.gl_pathv[k];

			if (m < ds->nmatched && !strcmp(now, ds->matched[m]))
				continue;
			/* The first difference: a match that is new, else the
			 * one loaded here has gone. */
			if (!listed(ds->matched, ds->nmatched, now))
				set_err(why, len, "shards: %s is new (%s matches it)", now,
					patterns->paths[p]);
			else
				set_err(why, len, "shards: %s is gone", ds->matched[m]);
			globfree(&gl);
			return true;
		}
		globfree(&gl);
	}
	if (m < ds->nmatched) {
		set_err(why, len, "shards: %s is gone", ds->matched[m]);
		return true;
	}
	return false;
}
