/*
 * test_integration_files.c — dataset files that change or are not what they
 * seem, against a real prefetchd (issue 15, findings 12 and 13), while a
 * bystander (tests/lib/bystander.c) runs byte-checked epochs of another
 * dataset and times status every 20 ms.
 *
 * Finding 12, files that change on disk: a .npy rewritten in place with a
 * longer header, a file renamed over a served one, and a file cut short
 * with no reload.  Each time the reading session gets one -ESTALE error
 * batch naming the file and how it changed, its epoch ends there and its
 * later epochs are refused; new sessions read the new file (after the
 * reload, which now says what changed).
 *
 * Finding 13, shard patterns: a symlink to a file elsewhere, a FIFO, a
 * symlinked directory matched by a wildcard, and an npy field that is a
 * FIFO are refused by name at startup, which does not hang; links in the
 * pattern's fixed directories are followed.  A reload expands the
 * patterns again: a new shard reaches new sessions while a running epoch
 * goes on, and a FIFO or a link turning up is refused without a hang.
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

/* Dataset x: '<u1' rows of 64 bytes, under seeds that change with it. */
#define X_ROWS	600
#define X_BYTES 64
#define X_BATCH 20

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

/* Lines of the daemon's log that hold every one of the (up to two) words. */
static int log_count(const char *w1, const char *w2)
{
	char line[2048];
	int n = 0;
	FILE *f = fopen(td.log, "r");

	assert_non_null(f);
	while (fgets(line, sizeof(line), f))
		n += strstr(line, w1) && (!w2 || strstr(line, w2));
	fclose(f);
	return n;
}

/* SIGHUP, and wait (5 s at most) for the daemon to log that it reloaded;
 * the reload's summary line must then hold `says`. */
static void reload(const char *says)
{
	int before = log_count("reloaded ", NULL);
	double deadline = td_now() + 5;

	assert_int_equal(kill(td.pid, SIGHUP), 0);
	while (log_count("reloaded ", NULL) == before) {
		if (td_now() > deadline)
			fail_msg("no reload within 5 s");
		usleep(10000);
	}
	if (says && log_count("reloaded ", says) == 0)
		fail_msg("the reload's summary does not say '%s'", says);
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

static void start_seq(struct pf_client *c)
{
	assert_int_equal(
		pf_start_epoch(c, &(struct pf_epoch_opts){.order = PF_ORDER_SEQUENTIAL}, NULL), 0);
}

/* Takes n batches of x's running sequential epoch, every row checked
 * against seed. */
static void take_rows(struct pf_client *c, int n, uint64_t seed)
{
	struct pf_batch *b;

	for (int i = 0; i < n; i++) {
		assert_int_equal(pf_next(c, NEXT_MS, &b), 0);
		assert_non_null(b);
		for (uint32_t k = 0; k < b->count; k++)
			assert_true(td_row_ok((const uint8_t *)b->data[0] + k * X_BYTES, X_BYTES,
					      seed, b->picks[k]));
		assert_int_equal(pf_release(c, b, NULL), 0);
	}
}

/* A whole sequential epoch of x, every row checked against seed. */
static void whole_epoch_of_rows(struct pf_client *c, uint64_t rows, uint64_t seed)
{
	struct pf_batch *b;
	uint64_t got = 0;

	start_seq(c);
	while (pf_next(c, NEXT_MS, &b) == 0 && b) {
		for (uint32_t k = 0; k < b->count; k++)
			assert_true(td_row_ok((const uint8_t *)b->data[0] + k * X_BYTES, X_BYTES,
					      seed, b->picks[k]));
		got += b->count;
		assert_int_equal(pf_release(c, b, NULL), 0);
	}
	assert_int_equal(got, rows);
}

/*
 * The rest of c's epoch after x changed: batches read before the change was
 * found may still come (their bytes are not checked: the file may have
 * changed under them), then one -ESTALE error batch whose message holds
 * `how`, then the end of the epoch.  A new epoch is refused the same way.
 */
static void assert_epoch_ends_changed(struct pf_client *c, const char *how)
{
	struct pf_batch *b;
	int rc, before = 0;

	while ((rc = pf_next(c, NEXT_MS, &b)) == 0 && b) {
		assert_int_equal(pf_release(c, b, NULL), 0);
		before++;
	}
	print_message("after %d more batch(es): %d %s\n", before, rc, pf_errmsg(c));
	assert_int_equal(rc, -ESTALE);
	if (!strstr(pf_errmsg(c), "x.npy changed on disk (") || !strstr(pf_errmsg(c), how) ||
	    !strstr(pf_errmsg(c), "epochs reading it end here"))
		fail_msg("error batch does not say x.npy changed (%s): %s", how, pf_errmsg(c));
	assert_int_equal(pf_next(c, NEXT_MS, &b), 0);
	assert_null(b); /* the epoch ended with it */
	rc = pf_start_epoch(c, &(struct pf_epoch_opts){.order = PF_ORDER_SEQUENTIAL}, NULL);
	print_message("next epoch: %d %s\n", rc, pf_errmsg(c));
	assert_int_equal(rc, -ESTALE);
	assert_non_null(strstr(pf_errmsg(c), "x.npy changed on disk"));
}

/* Rewrites x.npy in place (same inode) with rows under seed behind a
 * header 64 bytes longer than NumPy's, as another writer may pad it: every
 * row moves by 64 bytes. */
static void rewrite_with_longer_header(uint64_t rows, uint64_t seed)
{
	char p[400], tmp[400];
	struct stat before, after;
	uint8_t *img;
	size_t hlen, n;
	FILE *f;

	path_of("x.npy", p, sizeof(p));
	path_of("x-image.npy", tmp, sizeof(tmp));
	write_rows("x-image.npy", rows, seed);
	f = fopen(tmp, "rb");
	assert_non_null(f);
	img = malloc(128 + rows * X_BYTES + 64);
	assert_non_null(img);
	n = fread(img, 1, 128 + rows * X_BYTES, f);
	fclose(f);
	assert_int_equal(n, 128 + rows * X_BYTES); /* a 1.0 header of 128 bytes */
	hlen = (size_t)img[8] | (size_t)img[9] << 8;
	assert_int_equal(hlen, 118);
	/* 64 more spaces before the header's final newline. */
	memmove(img + 128 + 64, img + 128, rows * X_BYTES);
	memset(img + 127, ' ', 64);
	img[127 + 64] = '\n';
	img[8] = (uint8_t)(hlen + 64);
	img[9] = (uint8_t)((hlen + 64) >> 8);
	assert_int_equal(stat(p, &before), 0);
	f = fopen(p, "r+b");
	assert_non_null(f);
	assert_int_equal(fwrite(img, 1, 192 + rows * X_BYTES, f), 192 + rows * X_BYTES);
	assert_int_equal(fclose(f), 0);
	assert_int_equal(stat(p, &after), 0);
	assert_int_equal(before.st_ino, after.st_ino); /* in place */
	free(img);
}

/* ---- finding 12: files that change on disk ----------------------------------- */

/* A daemon serving x (X_ROWS rows under seed) beside the bystander's
 * dataset, and a session on x that has taken `taken` batches of a
 * sequential epoch, byte-checked, into *a. */
static struct td_bystander *read_x(const char *tag, uint64_t seed, int taken, struct pf_client **a)
{
	struct td_bystander *by;

	prepare(tag);
	write_rows("x.npy", X_ROWS, seed);
	by = launch("[dataset.x]\nfield.x = x.npy\n");
	*a = open_set("x", X_BATCH);
	start_seq(*a);
	take_rows(*a, taken, seed);
	return by;
}

static void npy_rewritten_in_place_with_a_longer_header_ends_the_epoch(void **state)
{
	struct td_bystander *by;
	struct pf_client *a, *b;

	by = read_x("files-inplace", 21, 5, &a);

	rewrite_with_longer_header(X_ROWS, 22);
	reload("dataset x reloaded: ");
	/* Said once, however many sessions read it. */
	assert_int_equal(log_count("dataset x: ", "x.npy changed on disk (size"), 1);
	assert_epoch_ends_changed(a, "size");
	pf_close(a);

	/* New sessions read the new file: its rows behind the longer header. */
	b = open_set("x", X_BATCH);
	assert_int_equal(pf_num_samples(b), X_ROWS);
	whole_epoch_of_rows(b, X_ROWS, 22);
	pf_close(b);
	finish(by);
	(void)state;
}

static void rename_over_a_served_file_is_seen_at_reload(void **state)
{
	struct td_bystander *by;
	struct pf_client *a, *b, *c;
	char p[400], q[400];
	struct stat was, now;

	by = read_x("files-rename", 31, 3, &a);

	path_of("x.npy", p, sizeof(p));
	path_of("x-new.npy", q, sizeof(q));
	assert_int_equal(stat(p, &was), 0);
	write_rows("x-new.npy", 400, 32);
	assert_int_equal(rename(q, p), 0);
	assert_int_equal(stat(p, &now), 0);
	/* Before the reload a new session still gets the old file (what a
	 * reload is for); after it, the new one. */
	c = open_set("x", X_BATCH);
	assert_int_equal(pf_num_samples(c), X_ROWS);
	pf_close(c);
	{
		char inode[100];

		snprintf(inode, sizeof(inode), "(inode %llu -> %llu)",
			 (unsigned long long)was.st_ino, (unsigned long long)now.st_ino);
		reload(inode);
	}
	/* The old file is intact, but it is not x.npy any more. */
	assert_epoch_ends_changed(a, "inode");
	pf_close(a);
	b = open_set("x", X_BATCH);
	assert_int_equal(pf_num_samples(b), 400);
	whole_epoch_of_rows(b, 400, 32);
	pf_close(b);
	/* A reload with nothing changed keeps x as it is. */
	reload("no dataset changed");
	finish(by);
	(void)state;
}

static void file_cut_short_is_found_changed_by_the_failed_read(void **state)
{
	struct td_bystander *by;
	struct pf_client *a, *b;

	by = read_x("files-cut", 41, 2, &a);

	/* Rewritten in place with 100 rows, no reload: rows 100.. are past
	 * the end, and the read that fails finds the file changed. */
	write_rows("x.npy", 100, 41);
	assert_epoch_ends_changed(a, "size");
	pf_close(a);
	assert_int_equal(log_count("dataset x: ", "x.npy changed on disk (size"), 1);
	/* Until a reload, x is not served: nothing would say which file. */
	assert_open_refused("x", -ESTALE,
			    "dataset 'x' is not available: ", "x.npy changed on disk (size");
	reload("dataset x reloaded: ");
	b = open_set("x", X_BATCH);
	assert_int_equal(pf_num_samples(b), 100);
	whole_epoch_of_rows(b, 100, 41);
	pf_close(b);
	finish(by);
	(void)state;
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

static void remove_file(const char *name)
{
	char p[400];

	path_of(name, p, sizeof(p));
	assert_int_equal(unlink(p), 0);
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

static void reload_expands_shard_patterns_again_and_never_blocks(void **state)
{
	static const uint64_t tokens[] = {641, 321};
	char decl[600];
	struct td_bystander *by;
	struct pf_client *s, *c;
	struct pf_batch *b;
	uint64_t got = 0;

	prepare("files-glob");
	make_dir("grow");
	write_shard("grow/g-0.bin", tokens[0], 0);
	make_dir("secret");
	write_shard("secret/s.bin", 321, 0);
	snprintf(decl, sizeof(decl), tokens_decl, "grow", "grow/g-*.bin");
	by = launch(decl);
	s = open_set("grow", TOK_BATCH);
	assert_int_equal(pf_num_samples(s), 20);
	start_seq(s);
	assert_int_equal(pf_next(s, NEXT_MS, &b), 0);
	assert_non_null(b);
	got += b->count;
	assert_int_equal(pf_release(s, b, NULL), 0);

	/* A new shard: the reload says so and new sessions get it. */
	write_shard("grow/g-1.bin", tokens[1], tokens[0]);
	reload("g-1.bin is new");
	c = open_set("grow", TOK_BATCH);
	whole_epoch_of_windows(c, tokens, 2);
	pf_close(c);
	/* The running epoch reads what it opened, which did not change. */
	while (pf_next(s, NEXT_MS, &b) == 0 && b) {
		got += b->count;
		assert_int_equal(pf_release(s, b, NULL), 0);
	}
	assert_int_equal(got, 20);
	pf_close(s);

	/* A FIFO turns up: the reload neither hangs nor serves it. */
	make_fifo("grow/g-2.bin");
	reload("dataset grow reloaded: shards: ");
	assert_int_equal(log_count("dataset grow is not available: ", "g-2.bin is a FIFO"), 1);
	assert_open_refused("grow", -EIO, "g-2.bin is a FIFO, not a regular file", NULL);
	/* Then a link to a file the trainer could not read. */
	remove_file("grow/g-2.bin");
	make_link("../secret/s.bin", "grow/g-2.bin");
	reload("dataset grow reloaded");
	assert_open_refused("grow", -EIO, "g-2.bin is a symbolic link", NULL);
	/* Gone again: served again. */
	remove_file("grow/g-2.bin");
	reload("dataset grow reloaded");
	c = open_set("grow", TOK_BATCH);
	whole_epoch_of_windows(c, tokens, 2);
	pf_close(c);
	finish(by);
	(void)state;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(npy_rewritten_in_place_with_a_longer_header_ends_the_epoch),
		cmocka_unit_test(rename_over_a_served_file_is_seen_at_reload),
		cmocka_unit_test(file_cut_short_is_found_changed_by_the_failed_read),
		cmocka_unit_test(links_fifos_and_linked_dirs_in_shard_patterns_are_refused),
		cmocka_unit_test(reload_expands_shard_patterns_again_and_never_blocks),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
