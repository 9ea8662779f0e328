/*
 * daemon/data/ — the data sources and the threads that read them:
 * datasets loaded from .npy fields or token shards (dataset.c,
 * dataset_files.c, npy.c, tokens.c), the reads that gather rows out of them
 * (dataset_read.c; direct.c for `read = direct`, blocks.c its block cache),
 * and the reader threads that run those reads as jobs (reader.c).  The loop
 * thread loads, reloads and submits; reader threads read, with no lock on
 * a dataset (immutable once loaded).  Calls base/ only (and reads the
 * declarations of conf/).
 *
 * dataset.h — a named dataset as the daemon serves it.
 *
 * Format `npy`: one or more fields, each one .npy file or an ordered list of
 * shards concatenated on axis 0.  All fields have the same number of rows N;
 * sample i is row i of every field.  Shards of a field must agree on dtype
 * and row shape.
 *
 * Files are opened as regular files only, never blocking (a FIFO would hang
 * open() for ever); shard patterns (`shards =`) also follow no symbolic link
 * below their fixed directories.  Each file's identity is kept
 * (ds_file_id), so that a reload, or a reader whose read failed, can tell
 * that it changed on disk (ds_files_changed).
 *
 * DESIGN: loaded by the loop thread at startup and at reload; afterwards
 * immutable but for the loop thread's bookkeeping (`users`, `retired`,
 * `changed`), which reader threads never read, so they read it with no
 * lock.  By default (`read = mmap`) each
 * shard is mapped read-only at load and rows are copied out of the mapping
 * with memcpy: a shuffled 4 KiB row costs no system call.  A file truncated
 * after load still gives -EIO with a message naming it (an error batch),
 * never a crash: ds_read_field catches the SIGBUS of a page past the end and
 * checks the file's size after its copies (dataset.c says how).  `read =
 * pread`, or an mmap that failed at load, reads a shard with pread instead.
 */
#ifndef PF_DATASET_H
#define PF_DATASET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "data/npy.h"

struct config_dataset;

/* A dataset file as it was at load: the device and inode its path named,
 * and the open file's size, mtime and a hash of its header bytes (those
 * before data_offset), which ds_files_changed compares with the file as it
 * is now. */
struct ds_file_id {
	uint64_t dev, ino, size;
	int64_t mtime_sec;
	long mtime_nsec;
	uint64_t head_hash;
};

struct ds_shard {
	char *path; /* owned */
	int fd;	    /* owned, -1 when not open */
	int dfd;    /* owned: the same file opened O_DIRECT (read = direct), else -1 */
	struct ds_file_id id;
	uint64_t first_row; /* row of the field where this shard begins */
	uint64_t rows;
	uint64_t data_offset; /* of row 0 within the file */
	/* PROT_READ, MAP_SHARED mapping of the file's first map_len bytes
	 * (data_offset + rows * row_bytes: all a read can touch); NULL when
	 * the shard is read with pread. */
	const uint8_t *map; /* owned */
	uint64_t map_len;
	int map_rc; /* -errno of the mmap that failed at load, or 0 */
};

struct ds_field {
	char *name; /* owned */
	enum npy_dtype dtype;
	size_t itemsize;
	int sample_ndim; /* ndim - 1 */
	uint64_t sample_shape[NPY_MAX_DIMS];
	uint64_t sample_bytes; /* row_bytes */
	/* Bytes from one row's start to the next's in a shard: sample_bytes
	 * for .npy; for token windows, which overlap by one token, less. */
	uint64_t row_stride;
	struct ds_shard *shards; /* owned */
	size_t nshards;
	size_t nmapped; /* shards with a mapping */
	bool direct;	/* read = direct: every shard has its dfd */
};

struct dataset {
	char *name;   /* owned */
	char *format; /* owned: "npy" or "tokens" */
	uint64_t num_samples;
	struct ds_field *fields; /* owned */
	size_t nfields;
	uint64_t sample_bytes; /* sum of the fields' sample_bytes */
	/* Non-empty when the dataset could not be loaded: the daemon keeps
	 * serving the others, and opening this one returns this message. */
	char error[512];
	/* tokens: every path the shard patterns matched at load, in order,
	 * shards too short for a window included, so that a reload can tell
	 * when the patterns match other files (ds_matches_changed). */
	char **matched; /* owned */
	size_t nmatched;
	/* Non-empty once a file it reads changed on disk: "PATH changed on
	 * disk (...)" and DS_CHANGED_FIX.  Set on the loop thread only, by a
	 * reload or from a reader job that found the change after a failed
	 * read (daemon_dataset_changed); reader threads never read it.  Its
	 * sessions end their epochs with this message, and it is not opened
	 * again: a reload loads the files anew for new sessions. */
	char changed[512];
	/* The daemon's bookkeeping (daemon.c): sessions reading it, and
	 * whether a reload took it out of the configuration (it then lives
	 * until its last session is gone). */
	unsigned users;
	bool retired;
};

/* What a changed file's message goes on to say (after "PATH changed on disk
 * (...)"): what happens to the epochs that read it, and how to read the new
 * file.  True at once after a reload, and after a failed read, when new
 * sessions are refused until the reload. */
#define DS_CHANGED_FIX                                                                             \
	": epochs reading it end here; sessions opened after a reload of prefetchd (SIGHUP) "      \
	"read the file as it is now"

/* Builds and opens a dataset from its config declaration.  Always fills
 * *ds (so that status can list it); returns 0 or -errno, with ds->error
 * set to a message naming the file and the problem.  With decl->read ==
 * CONFIG_READ_MMAP it maps every shard and installs the process's SIGBUS
 * handler (see dataset.c); a shard whose mmap fails is read with pread and
 * keeps the error in map_rc, which is not a load failure. */
int ds_load(struct dataset *ds, const struct config_dataset *decl);
void ds_close(struct dataset *ds);
/* The invariants of a dataset after ds_load, for asserts and tests: true
 * when shards tile each field from row 0, every field has num_samples rows
 * and sample_bytes is their sum (or, after a failed load, no fields). */
bool ds_check(const struct dataset *ds);

/* Reads field `field` of samples[0..n) into dst, packed: sample k lands at
 * dst + k * sample_bytes.  Consecutive sample numbers within one shard are
 * copied with one memcpy (or read with one pread).  Returns 0, -ERANGE for
 * a sample out of range (before anything is read), or -EIO/-errno with err
 * naming the file, e.g. "x.npy: short read at row 17 (file truncated?)" or
 * "x.npy: row 17 is past the end: the file is shorter than when it was
 * loaded (truncated?)", rows counted within that file.  dst may have been
 * written in part on error.  Thread-safe. */
int ds_read_field(const struct dataset *ds, size_t field, const uint64_t *samples, size_t n,
		  uint8_t *dst, char *err, size_t errlen);

/* Who reads dst next.  DS_FOR_DMA (a slot a copy engine reads next, whose
 * lines would not stay cached until then; the session layer decides):
 * mapped rows are copied with streaming stores (streamcopy.h), which
 * neither read the slot's lines first nor fill the L3 with them.
 * DS_FOR_CPU: plain memcpy. */
enum ds_reader { DS_FOR_CPU, DS_FOR_DMA };

/* ds_read_field, for the reader `next` names; ds_read_field is DS_FOR_CPU. */
int ds_read_field_for(const struct dataset *ds, size_t field, const uint64_t *samples, size_t n,
		      uint8_t *dst, enum ds_reader next, char *err, size_t errlen);

/* Whether a file of ds is no longer the one it loaded: its path names
 * another inode (a rename over it) or nothing, or the open file's size,
 * mtime or header bytes differ (rewritten in place).  False when none
 * changed; true with why = "PATH changed on disk (inode 12 -> 34)" for the
 * first that did.  A stat, an fstat and a pread of the header per file.
 * Thread-safe: a reload calls it on the loop thread, a reader thread after
 * a read failed (reader.c). */
bool ds_files_changed(const struct dataset *ds, char *why, size_t len);
/* tokens datasets: whether decl's shard patterns match other files now
 * than at load, with why naming the first new or vanished one (or the
 * pattern that no longer expands).  False for npy datasets.  Loop thread,
 * at reload. */
bool ds_matches_changed(const struct dataset *ds, const struct config_dataset *decl, char *why,
			size_t len);

#endif
