/*
 * test_integration_files.c — dataset files that are not what they seem,
 * against a real prefetchd (issue 15, finding 13), while a bystander
 * (tests/lib/bystander.c) runs byte-checked epochs of another dataset and
 * times status every 20 ms.
 *
 * Shard patterns: a symlink to a file elsewhere, a FIFO, a symlinked
 * directory matched by a wildcard, and an npy field that is a FIFO are
 * refused by name at startup, which does not hang; links in the pattern's
 * fixed directories are followed.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "prefetch.h"
#include "testutil.h"

#define NEXT_MS 10000

/* The bystander's dataset: one '<u1' field of 64-byte rows. */
#define BY_ROWS	 2000
#define BY_BYTES 64
#define BY_SEED	 11
#define BY_BATCH 32
#define BY_DECL	 "[dataset.by]\nfield.x = by.npy\n"

/* '<u1' rows of 64 bytes. */
#define X_BYTES 64

/* Token shards: windows of SEQ + 1 tokens at stride SEQ. */
#define SEQ	  32
#define TOK_SEED  2024
#define TOK_BATCH 4
#define TOK_MAGIC 20240520

static struct tdaemon td;

static void path_of(const char *name, char *out, size_t len)
{
	td_path(&td, name, out, len);
}

static void write_rows(const char *name, uint64_t rows, uint64_t seed)
{
	char p[400];
	uint64_t shape[1] = {X_BYTES};

	path_of(name, p, sizeof(p));
	assert_int_equal(td_write_npy(p, 1, "<u1", 1, rows, shape, 1, seed, 0), 0);
}

/* A fresh directory with the bystander's dataset in it. */
static void prepare(const char *tag)
{
	assert_int_equal(td_init(&td, tag), 0);
	write_rows("by.npy", BY_ROWS, BY_SEED);
}

/* Starts the daemon on the bystander's dataset and `datasets`, then the
 * bystander. */
static struct td_bystander *launch(const char *datasets)
{
	char decl[4096];
	struct td_bystander *by;

	snprintf(decl, sizeof(decl), "%s%s", BY_DECL, datasets);
	assert_int_equal(td_start(&td, NULL, decl), 0);
	by = td_bystander_start(td.sock, "by", BY_BATCH, BY_BYTES, BY_SEED);
	assert_non_null(by);
	return by;
}

/* The bystander's epochs stayed byte-exact and status answered in time
 * throughout; then the daemon is stopped cleanly. */
static void finish(struct td_bystander *by)
{
	struct td_bystander_report r;
	int rc = td_bystander_stop(by, &r);

	print_message("bystander: %llu epochs, %llu batches, %llu statuses, worst %.1f ms%s%s\n",
		      (unsigned long long)r.epochs, (unsigned long long)r.batches,
		      (unsigned long long)r.statuses, r.max_status_ms, r.error[0] ? ": " : "",
		      r.error);
	assert_int_equal(rc, 0);
	assert_int_equal(td_stop(&td, 5000), 0);
	td_cleanup(&td);
}

/* pf_open of `name` on a new connection, which *c holds either way. */
static int try_open(const char *name, uint32_t batch, struct pf_client **c)
{
	*c = NULL;
	assert_int_equal(pf_connect(td.sock, c), 0);
	return pf_open(*c, &(struct pf_open_opts){.dataset = name, .batch_size = batch});
}

static struct pf_client *open_set(const char *name, uint32_t batch)
{
	struct pf_client *c;

	if (try_open(name, batch, &c))
		fail_msg("open %s: %s", name, pf_errmsg(c));
	return c;
}

/* Opening `name` is refused with code, the message holding w1 and w2. */
static void assert_open_refused(const char *name, int code, const char *w1, const char *w2)
{
	struct pf_client *c;
	int rc = try_open(name, 4, &c);
	const char *msg = pf_errmsg(c);

	print_message("open %s: %d %s\n", name, rc, msg);
	if (rc != code || !strstr(msg, w1) || (w2 && !strstr(msg, w2)))
		fail_msg("open %s is not refused with %d saying '%s' and '%s'", name, code, w1,
			 w2 ? w2 : "");
	pf_close(c);
}

/* ---- finding 13: shard patterns ------------------------------------------------ */

/* A token shard of `tokens` tokens, stream positions first.. under TOK_SEED. */
static void write_shard(const char *name, uint64_t tokens, uint64_t first)
{
	char p[400];

	path_of(name, p, sizeof(p));
	assert_int_equal(td_write_tokens(p, tokens, TOK_SEED, first, TOK_MAGIC, 1, 0), 0);
}

static void make_dir(const char *name)
{
	char p[400];

	path_of(name, p, sizeof(p));
	assert_int_equal(mkdir(p, 0755), 0);
}

/* name becomes a symbolic link to target (as written, relative to name). */
static void make_link(const char *target, const char *name)
{
	char p[400];

	path_of(name, p, sizeof(p));
	assert_int_equal(symlink(target, p), 0);
}

static void make_fifo(const char *name)
{
	char p[400];

	path_of(name, p, sizeof(p));
	assert_int_equal(mkfifo(p, 0644), 0);
}

/* A whole shuffled epoch of a tokens dataset of shards with tokens[i]
 * tokens each, written back to back from stream position 0: every window
 * once, every token right.  Returns the windows seen. */
static uint64_t whole_epoch_of_windows(struct pf_client *c, const uint64_t *tokens, int nshards)
{
	uint64_t pos[1024], n = 0, start = 0, got = 0;
	uint8_t seen[1024] = {0};
	struct pf_batch *b;

	for (int i = 0; i < nshards; i++) {
		for (uint64_t w = 0; w < (tokens[i] - 1) / SEQ; w++)
			pos[n++] = start + w * SEQ;
		start += tokens[i];
	}
	assert_int_equal(pf_num_samples(c), n);
	assert_int_equal(
		pf_start_epoch(c, &(struct pf_epoch_opts){.order = PF_ORDER_SHUFFLE, .seed = 5},
			       NULL),
		0);
	while (pf_next(c, NEXT_MS, &b) == 0 && b) {
		for (uint32_t k = 0; k < b->count; k++) {
			const uint16_t *row = (const uint16_t *)b->data[0] + k * (SEQ + 1);
			uint64_t w = b->picks[k];

			assert_true(w < n);
			assert_false(seen[w]);
			seen[w] = 1;
			for (int t = 0; t <= SEQ; t++)
				assert_int_equal(row[t], td_token(TOK_SEED, pos[w] + (uint64_t)t));
		}
		got += b->count;
		assert_int_equal(pf_release(c, b, NULL), 0);
	}
	assert_int_equal(got, n);
	return got;
}

static const char tokens_decl[] = "[dataset.%s]\nformat = tokens\nshards = %s\nseq_len = 32\n";

static void links_fifos_and_linked_dirs_in_shard_patterns_are_refused(void **state)
{
	static const uint64_t one[] = {321};
	char decl[4096] = "", *d = decl;
	struct td_bystander *by;
	struct pf_client *c;
	double t0;

	prepare("files-shards");
	/* A shard a user could not read, outside the shard directories. */
	make_dir("secret");
	write_shard("secret/s.bin", 321, 0);
	make_dir("secret/sub");
	write_shard("secret/sub/t.bin", 321, 0);
	make_dir("ok");
	write_shard("ok/ok-0.bin", 321, 0);
	make_dir("link");
	write_shard("link/l-0.bin", 321, 0);
	make_link("../secret/s.bin", "link/l-1.bin");
	make_dir("fifo");
	write_shard("fifo/f-0.bin", 321, 0);
	make_fifo("fifo/f-1.bin");
	make_dir("dirs");
	make_dir("dirs/a");
	write_shard("dirs/a/t.bin", 321, 0);
	make_link("../secret/sub", "dirs/b");
	make_link("ok", "fixed"); /* the operator's own link, in the fixed part */
	make_fifo("pipe.npy");
	d += sprintf(d, tokens_decl, "ok", "ok/ok-*.bin");
	d += sprintf(d, tokens_decl, "linked", "link/l-*.bin");
	d += sprintf(d, tokens_decl, "fifo", "fifo/f-*.bin");
	d += sprintf(d, tokens_decl, "dirs", "dirs/*/t.bin");
	d += sprintf(d, tokens_decl, "fixed", "fixed/ok-*.bin");
	sprintf(d, "[dataset.pipe]\nfield.x = pipe.npy\n");
	/* The FIFOs have no writer: an open() that blocked would hang here
	 * for ever (td_start gives up after 10 s). */
	t0 = td_now();
	by = launch(decl);
	print_message("started in %.2f s\n", td_now() - t0);
	assert_true(td_now() - t0 < 5);

	assert_open_refused("linked", -EIO, "link/l-1.bin is a symbolic link",
			    "shard patterns match regular files only");
	assert_open_refused("fifo", -EIO, "fifo/f-1.bin is a FIFO, not a regular file", NULL);
	assert_open_refused("dirs", -EIO, "dirs/b is a symbolic link: below ",
			    "shard patterns follow no link");
	assert_open_refused("pipe", -EIO, "pipe.npy is a FIFO, not a regular file", NULL);
	c = open_set("ok", TOK_BATCH);
	whole_epoch_of_windows(c, one, 1);
	pf_close(c);
	c = open_set("fixed", TOK_BATCH);
	whole_epoch_of_windows(c, one, 1);
	pf_close(c);
	finish(by);
	(void)state;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(links_fifos_and_linked_dirs_in_shard_patterns_are_refused),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
