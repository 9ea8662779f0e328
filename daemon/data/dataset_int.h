/*
 * dataset_int.h — what dataset.c (loading), dataset_read.c (reading),
 * dataset_files.c (opening files, and telling when they changed) and
 * direct.c (`read = direct`) share.  Calls go one way: dataset.c ->
 * dataset_read.c -> direct.c, and every one of them -> dataset_files.c.  Not for the rest
 * of the daemon: dataset.h is its interface.
 */
#ifndef PF_DATASET_INT_H
#define PF_DATASET_INT_H

#include <glob.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "data/dataset.h"

/*
 * Opens name (under dirfd) read-only as a regular file, or refuses it
 * naming path.  Never blocks: open() of a FIFO waits for a writer, for ever
 * if none comes, and the loop thread with it (a FIFO in a shard directory
 * hung startup), so the open is O_NONBLOCK, which changes nothing for a
 * regular file and is cleared again so that no read can see EAGAIN.  The
 * type is looked at before the open (no device is opened, with whatever
 * that does) and checked again on the open file, so nothing swapped in
 * between gets through.  follow false: a symbolic link is refused
 * (O_NOFOLLOW), not followed.
 */
int ds_open_regular(int dirfd, const char *name, bool follow, const char *path, int *out, char *err,
		    size_t len);
/*
 * Opens path, a match of pattern, following no symbolic link below the
 * pattern's fixed directories: each directory a wildcard matched is opened
 * with O_NOFOLLOW from the one above it, so a link there (to a root-only
 * directory, say) is refused and none can be swapped in while we walk, and
 * the file itself is a regular file that is no link (open_regular).  Links
 * among the fixed directories are the operator's and followed.
 */
int ds_open_match(const char *pattern, const char *path, int *out, char *err, size_t len);
/* Takes shard's identity (its fd open, data_offset known) at load. */
int ds_take_id(struct ds_shard *shard, char *err, size_t len);
/* The shard of field holding row s (s < the field's rows): a binary search
 * of the shard table, here so that every reader of a field (dataset_read.c,
 * direct.c) finds shards the same way without calling each other. */
static inline const struct ds_shard *ds_find_shard(const struct ds_field *field, uint64_t s)
{
	size_t lo = 0, hi = field->nshards;

	/* Invariant: shards[lo].first_row <= s < shards[hi].first_row. */
	while (hi - lo > 1) {
		size_t mid = lo + (hi - lo) / 2;

		if (field->shards[mid].first_row <= s)
			lo = mid;
		else
			hi = mid;
	}
	return &field->shards[lo];
}
/* Bytes from the start of a shard's row 0 to the end of rows
 * row .. row + run - 1 (rows overlap when row_stride < sample_bytes). */
static inline uint64_t ds_row_end(const struct ds_field *field, uint64_t row, uint64_t run)
{
	return (row + run - 1) * field->row_stride + field->sample_bytes;
}
/* Makes the process's SIGBUS handler the one that turns a fault inside a
 * guarded copy into -EIO (dataset_read.c); ds_load calls it before it maps. */
int ds_install_sigbus(void);
/* glob(3) of one shard pattern, in name order.  0, or -errno with err. */
int ds_glob_shards(const char *pattern, glob_t *gl, char *err, size_t len);

#endif
