/*
 * test_integration_bad.c — bad input of every kind gets a clear error that
 * names the problem, and the daemon goes on serving a good dataset
 * correctly afterwards.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "client_int.h"
#include "prefetch.h"
#include "testutil.h"
#include "prefetch.pb-c.h"
#include "wire.h"

#define SEED 5
#define N_OK 200

static struct tdaemon td;

static void write_file(const char *name, const void *buf, size_t len)
{
	char p[400];
	FILE *f;

	td_path(&td, name, p, sizeof(p));
	f = fopen(p, "wb");
	assert_non_null(f);
	assert_int_equal(fwrite(buf, 1, len, f), len);
	fclose(f);
}

/* A v1 .npy with a literal header dict and `data_bytes` zero bytes. */
static void write_npy_raw(const char *name, const char *dict, size_t data_bytes)
{
	size_t dlen = strlen(dict);
	size_t total = (10 + dlen + 1 + 63) / 64 * 64;
	uint8_t *buf = calloc(1, total + data_bytes);

	memcpy(buf, "\x93NUMPY\x01\x00", 8);
	buf[8] = (uint8_t)(total - 10);
	buf[9] = (uint8_t)((total - 10) >> 8);
	memcpy(buf + 10, dict, dlen);
	memset(buf + 10 + dlen, ' ', total - 10 - dlen - 1);
	buf[total - 1] = '\n';
	write_file(name, buf, total + data_bytes);
	free(buf);
}

static int setup(void **state)
{
	char p[400];
	uint64_t shape[1] = {16};

	if (td_init(&td, "bad"))
		return -1;
	td_path(&td, "ok.npy", p, sizeof(p));
	td_write_npy(p, 1, "<f4", 4, N_OK, shape, 1, SEED, 0);
	td_path(&td, "late.npy", p, sizeof(p));
	td_write_npy(p, 1, "<f4", 4, N_OK, shape, 1, SEED, 0);
	td_path(&td, "short9.npy", p, sizeof(p));
	td_write_npy(p, 1, "<f4", 4, N_OK - 1, shape, 1, SEED, 0);
	/* Claims 100 rows of 64 bytes, holds 50. */
	write_npy_raw("truncated.npy",
		      "{'descr': '<f4', 'fortran_order': False, 'shape': (100, 16), }", 50 * 64);
	write_file("badmagic.npy", "\x93NUMPZ\x01\x00\x10\x00{'descr': '<f4'}", 26);
	write_npy_raw("fortran.npy", "{'descr': '<f4', 'fortran_order': True, 'shape': (10, 4), }",
		      160);
	write_npy_raw("bigendian.npy",
		      "{'descr': '>f4', 'fortran_order': False, 'shape': (10, 4), }", 160);
	write_npy_raw("complex.npy", "{'descr': '<c8', 'fortran_order': False, 'shape': (10, 4), }",
		      320);
	if (td_start(&td, "max_frame = 1M\nmax_epoch_picks = 1000",
		     "[dataset.ok]\nfield.x = ok.npy\n"
		     "[dataset.late]\nfield.x = late.npy\n"
		     "[dataset.truncated]\nfield.x = truncated.npy\n"
		     "[dataset.badmagic]\nfield.x = badmagic.npy\n"
		     "[dataset.fortran]\nfield.x = fortran.npy\n"
		     "[dataset.bigendian]\nfield.x = bigendian.npy\n"
		     "[dataset.complex]\nfield.x = complex.npy\n"
		     "[dataset.mismatch]\nfield.x = ok.npy\nfield.y = short9.npy\n"))
		return -1;
	(void)state;
	return 0;
}

static int teardown(void **state)
{
	int rc = td_stop(&td, 5000);

	td_cleanup(&td);
	(void)state;
	return rc == 0 ? 0 : -1;
}

/* A full shuffled epoch of `ok` opened with this augment: every pick below
 * augment x N exactly once, each row's bytes right. */
static void assert_epoch_served(uint32_t augment)
{
	struct pf_client *c = NULL;
	struct pf_batch *b;
	uint8_t *seen = calloc((size_t)augment * N_OK, 1);
	uint64_t n = 0;
	int rc;

	assert_non_null(seen);
	assert_int_equal(pf_connect(td.sock, &c), 0);
	assert_int_equal(pf_open(c, &(struct pf_open_opts){.dataset = "ok",
							   .batch_size = 32,
							   .augment = augment}),
			 0);
	assert_int_equal(
		pf_start_epoch(c, &(struct pf_epoch_opts){.order = PF_ORDER_SHUFFLE, .seed = 2},
			       NULL),
		0);
	while ((rc = pf_next(c, 10000, &b)) == 0 && b) {
		for (uint32_t k = 0; k < b->count; k++) {
			assert_true(b->picks[k] < (uint64_t)augment * N_OK);
			assert_false(seen[b->picks[k]]);
			seen[b->picks[k]] = 1;
			assert_true(td_row_ok((const uint8_t *)b->data[0] + k * 64, 64, SEED,
					      b->picks[k] % N_OK));
			n++;
		}
		pf_release(c, b, NULL);
	}
	assert_int_equal(rc, 0);
	assert_int_equal(n, (uint64_t)augment * N_OK);
	pf_close(c);
	free(seen);
}

/* The daemon still serves: a full shuffled epoch of `ok`, every byte right. */
static void assert_still_serving(void)
{
	assert_epoch_served(1);
}

static void assert_open_refused(const char *dataset, int code, const char *w1, const char *w2)
{
	struct pf_client *c = NULL;
	int rc;

	assert_int_equal(pf_connect(td.sock, &c), 0);
	rc = pf_open(c, &(struct pf_open_opts){.dataset = dataset, .batch_size = 4});
	print_message("open %s: %d %s\n", dataset, rc, pf_errmsg(c));
	assert_int_equal(rc, code);
	if (!strstr(pf_errmsg(c), w1) || (w2 && !strstr(pf_errmsg(c), w2)))
		fail_msg("error for %s does not say '%s'/'%s': %s", dataset, w1, w2 ? w2 : "",
			 pf_errmsg(c));
	pf_close(c);
	assert_still_serving();
}

static void truncated_npy_is_refused_naming_the_file(void **state)
{
	assert_open_refused("truncated", -EIO, "truncated.npy", "truncated");
}

static void bad_magic_is_refused_naming_the_file(void **state)
{
	assert_open_refused("badmagic", -EIO, "badmagic.npy", "magic");
}

static void fortran_order_is_refused_naming_the_file(void **state)
{
	assert_open_refused("fortran", -EIO, "fortran.npy", "Fortran");
}

static void big_endian_is_refused_naming_the_file(void **state)
{
	assert_open_refused("bigendian", -EIO, "bigendian.npy", "big-endian");
}

static void unknown_dtype_is_refused_naming_the_file(void **state)
{
	assert_open_refused("complex", -EIO, "complex.npy", "c8");
}

static void mismatched_field_lengths_are_refused(void **state)
{
	assert_open_refused("mismatch", -EIO, "199", "200");
}

static void unknown_dataset_is_refused(void **state)
{
	assert_open_refused("no-such-set", -ENOENT, "unknown dataset 'no-such-set'", NULL);
}

/* The order of an epoch is N x augment picks of 8 bytes, built by the
 * daemon: max_epoch_picks (1000 here, N = 200) bounds what a client can
 * make it take.  augment 5 is served whole; 6 and 2^32 - 1 (a 6.4 TB
 * order) are refused, naming the key, and nothing else is disturbed. */
static void augment_beyond_max_epoch_picks_is_refused(void **state)
{
	static const uint32_t too_big[] = {6, UINT32_MAX};
	struct pf_client *c = NULL;
	int rc;

	for (size_t i = 0; i < sizeof(too_big) / sizeof(too_big[0]); i++) {
		assert_int_equal(pf_connect(td.sock, &c), 0);
		rc = pf_open(c, &(struct pf_open_opts){
					.dataset = "ok", .batch_size = 32, .augment = too_big[i]});
		print_message("augment %u: %d %s\n", too_big[i], rc, pf_errmsg(c));
		assert_int_equal(rc, -E2BIG);
		assert_non_null(strstr(pf_errmsg(c), "max_epoch_picks = 1000"));
		pf_close(c);
	}
	assert_epoch_served(5);
	assert_still_serving();
	(void)state;
}

static void out_of_range_explicit_index_is_refused(void **state)
{
	struct pf_client *c = NULL;
	uint64_t idx[3] = {1, N_OK, 2};
	struct pf_batch *b;
	int rc;

	assert_int_equal(pf_connect(td.sock, &c), 0);
	assert_int_equal(pf_open(c, &(struct pf_open_opts){.dataset = "ok", .batch_size = 2}), 0);
	rc = pf_start_epoch(
		c,
		&(struct pf_epoch_opts){.order = PF_ORDER_EXPLICIT, .indices = idx, .nindices = 3},
		NULL);
	assert_int_equal(rc, -ERANGE);
	assert_non_null(strstr(pf_errmsg(c), "200"));
	assert_non_null(strstr(pf_errmsg(c), "position 1"));
	/* The same session goes on with a good list. */
	idx[1] = 7;
	assert_int_equal(pf_start_epoch(c,
					&(struct pf_epoch_opts){.order = PF_ORDER_EXPLICIT,
								.indices = idx,
								.nindices = 3},
					NULL),
			 0);
	assert_int_equal(pf_next(c, 10000, &b), 0);
	assert_non_null(b);
	assert_int_equal(b->picks[0], 1);
	assert_int_equal(b->picks[1], 7);
	pf_release(c, b, NULL);
	pf_close(c);
	assert_still_serving();
}

static int raw_connect(void)
{
	struct sockaddr_un a = {.sun_family = AF_UNIX};
	int fd = socket(AF_UNIX, SOCK_STREAM, 0);

	memcpy(a.sun_path, td.sock, strnlen(td.sock, sizeof(a.sun_path) - 1));
	assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
	return fd;
}

/* Reads until EOF (the daemon closed us) or 2 s; true on EOF. */
static bool closed_by_daemon(int fd)
{
	struct timeval tv = {.tv_sec = 2};
	char buf[4096];

	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	for (;;) {
		ssize_t n = recv(fd, buf, sizeof(buf), 0);

		if (n == 0 || (n < 0 && errno == ECONNRESET))
			return true;
		if (n < 0)
			return false;
	}
}

static bool log_says(const char *what)
{
	char buf[1 << 16];
	FILE *f = fopen(td.log, "r");
	size_t n;

	assert_non_null(f);
	n = fread(buf, 1, sizeof(buf) - 1, f);
	buf[n] = '\0';
	fclose(f);
	return strstr(buf, what) != NULL;
}

static void oversized_frame_closes_only_that_connection(void **state)
{
	int fd = raw_connect();
	uint8_t hdr[4] = {0xff, 0xff, 0xff, 0x7f}; /* 2 GiB announced */
	struct pf_client *other = NULL;

	/* A second client connected before the bad one stays usable. */
	assert_int_equal(pf_connect(td.sock, &other), 0);
	assert_int_equal(send(fd, hdr, 4, 0), 4);
	assert_true(closed_by_daemon(fd));
	close(fd);
	assert_true(log_says("oversized frame"));
	assert_int_equal(pf_open(other, &(struct pf_open_opts){.dataset = "ok", .batch_size = 8}),
			 0);
	pf_close(other);
	assert_still_serving();
}

static void garbage_frame_closes_only_that_connection(void **state)
{
	int fd = raw_connect();
	uint8_t junk[4 + 24] = {24, 0, 0, 0};

	memset(junk + 4, 0xff, 24);
	assert_int_equal(send(fd, junk, sizeof(junk), 0), sizeof(junk));
	assert_true(closed_by_daemon(fd));
	close(fd);
	assert_true(log_says("malformed frame"));
	assert_still_serving();
}

static void release_of_foreign_slot_is_refused(void **state)
{
	struct pf_client *a = NULL, *b = NULL;
	struct pf_open_opts oo = {.dataset = "ok", .batch_size = 10, .max_depth = 2};
	struct pf_epoch_opts eo = {.order = PF_ORDER_SEQUENTIAL};
	Pf__Envelope env = PF__ENVELOPE__INIT;
	Pf__Release rel = PF__RELEASE__INIT;
	struct pf_batch *ba, *bb;
	uint64_t got = 0;
	int rc;

	assert_int_equal(pf_connect(td.sock, &a), 0);
	assert_int_equal(pf_connect(td.sock, &b), 0);
	assert_int_equal(pf_open(a, &oo), 0);
	assert_int_equal(pf_open(b, &oo), 0);
	assert_int_equal(pf_start_epoch(a, &eo, NULL), 0);
	assert_int_equal(pf_start_epoch(b, &eo, NULL), 0);
	assert_int_equal(pf_next(a, 10000, &ba), 0);
	assert_int_equal(pf_next(b, 10000, &bb), 0);

	/* b releases a batch it never received: batch 5 of its own epoch 0
	 * in slot 3 (with max_depth 2 and one batch taken, batch 5 cannot
	 * have been sent).  Epoch 0 is b's real epoch now that epochs are
	 * numbered from 0, so the refusal rests on the slot and seq alone. */
	rel.epoch = 0;
	rel.seq = 5;
	rel.slot = 3;
	env.msg_case = PF__ENVELOPE__MSG_RELEASE;
	env.release = &rel;
	assert_int_equal(pfc_send(b, &env), 0);
	/* and a slot that does not exist at all */
	rel.slot = 9999;
	assert_int_equal(pfc_send(b, &env), 0);

	/* The refusals arrive as pushes; batches already queued come first. */
	pf_release(b, bb, NULL);
	while ((rc = pf_next(b, 10000, &bb)) == 0 && bb)
		pf_release(b, bb, NULL);
	print_message("foreign release: %d %s\n", rc, pf_errmsg(b));
	assert_int_equal(rc, -EPERM);
	assert_non_null(strstr(pf_errmsg(b), "refused"));
	while ((rc = pf_next(b, 10000, &bb)) == 0 && bb)
		pf_release(b, bb, NULL);
	assert_int_equal(rc, -EINVAL);
	assert_non_null(strstr(pf_errmsg(b), "9999"));
	pf_close(b);

	/* a is undisturbed: its whole epoch arrives, right bytes. */
	do {
		got += ba->count;
		for (uint32_t k = 0; k < ba->count; k++)
			assert_true(td_row_ok((const uint8_t *)ba->data[0] + k * 64, 64, SEED,
					      ba->picks[k]));
		pf_release(a, ba, NULL);
		assert_int_equal(pf_next(a, 10000, &ba), 0);
	} while (ba);
	assert_int_equal(got, N_OK);
	pf_close(a);
}

static void file_truncated_after_load_gives_error_batches_in_order(void **state)
{
	struct pf_client *c = NULL;
	struct pf_batch *b;
	char p[400];
	int errors = 0, good = 0, rc;
	uint64_t seq = 0;

	td_path(&td, "late.npy", p, sizeof(p));
	assert_int_equal(pf_connect(td.sock, &c), 0);
	assert_int_equal(pf_open(c, &(struct pf_open_opts){.dataset = "late", .batch_size = 50}),
			 0);
	/* Rows 150.. vanish: the header is 128 bytes, rows are 64. */
	assert_int_equal(truncate(p, 128 + 150 * 64), 0);
	assert_int_equal(
		pf_start_epoch(c, &(struct pf_epoch_opts){.order = PF_ORDER_SEQUENTIAL}, NULL), 0);
	for (;;) {
		rc = pf_next(c, 10000, &b);
		if (rc == 0 && !b)
			break;
		if (rc) {
			print_message("batch %llu: %s\n", (unsigned long long)seq, pf_errmsg(c));
			/* Cut short is changed on disk: the reader that
			 * failed found it so (size), and the epoch ends. */
			assert_int_equal(rc, -ESTALE);
			assert_non_null(strstr(pf_errmsg(c), "late.npy changed on disk (size"));
			assert_int_equal(seq, 3); /* rows 150..199 */
			errors++;
		} else {
			assert_int_equal(b->seq, seq);
			for (uint32_t k = 0; k < b->count; k++)
				assert_true(td_row_ok((const uint8_t *)b->data[0] + k * 64, 64,
						      SEED, b->picks[k]));
			good++;
			pf_release(c, b, NULL);
		}
		seq++;
	}
	assert_int_equal(good, 3);
	assert_int_equal(errors, 1);
	pf_close(c);
	assert_still_serving();
}

/* prefetchctl pool with nothing to act on says what is wrong, through the
 * real CLI, and the daemon goes on serving. */
static void pool_control_without_a_pool_is_refused_with_the_reason(void **state)
{
	static const struct {
		const char *args;
		int status;
		const char *says;
	} cases[] = {
		{"pool ok drop", 1, "dataset 'ok' has no VRAM pool yet"},
		{"pool nosuch off", 1, "unknown dataset 'nosuch'"},
		{"pool ok sideways", 2, "'sideways' is not on, off or drop"},
		{"pool ok", 2, "usage: pool DATASET on|off|drop"},
	};

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		char cmd[700], out[1024] = "";
		FILE *f;
		size_t n;
		int st;

		snprintf(cmd, sizeof(cmd), "%s -s %s %s 2>&1", td_prefetchctl(), td.sock,
			 cases[i].args);
		f = popen(cmd, "r");
		assert_non_null(f);
		n = fread(out, 1, sizeof(out) - 1, f);
		out[n] = '\0';
		st = pclose(f);
		print_message("prefetchctl %s -> %d: %s", cases[i].args, WEXITSTATUS(st), out);
		assert_true(WIFEXITED(st));
		assert_int_equal(WEXITSTATUS(st), cases[i].status);
		if (!strstr(out, cases[i].says))
			fail_msg("prefetchctl %s says \"%s\", want \"%s\"", cases[i].args, out,
				 cases[i].says);
	}
	assert_still_serving();
	(void)state;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(truncated_npy_is_refused_naming_the_file),
		cmocka_unit_test(bad_magic_is_refused_naming_the_file),
		cmocka_unit_test(fortran_order_is_refused_naming_the_file),
		cmocka_unit_test(big_endian_is_refused_naming_the_file),
		cmocka_unit_test(unknown_dtype_is_refused_naming_the_file),
		cmocka_unit_test(mismatched_field_lengths_are_refused),
		cmocka_unit_test(unknown_dataset_is_refused),
		cmocka_unit_test(out_of_range_explicit_index_is_refused),
		cmocka_unit_test(augment_beyond_max_epoch_picks_is_refused),
		cmocka_unit_test(oversized_frame_closes_only_that_connection),
		cmocka_unit_test(garbage_frame_closes_only_that_connection),
		cmocka_unit_test(release_of_foreign_slot_is_refused),
		cmocka_unit_test(file_truncated_after_load_gives_error_batches_in_order),
		cmocka_unit_test(pool_control_without_a_pool_is_refused_with_the_reason),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}
