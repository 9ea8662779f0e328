/*
 * test_tokens.c — the llm.c token-shard header parser.
 *
 * Headers are built here byte by byte in the layout llm.c's
 * write_datafile produces (256 little-endian int32s), so the parser is
 * checked against the format, not against itself; one shard goes through a
 * real file and fstat, as the dataset loader will use it.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data/tokens.h"

/* A header with the given magic, version and count; the other 253 ints are
 * zero, as llm.c leaves them. */
static void make_header(uint8_t *h, int32_t magic, int32_t version, int32_t count)
{
	const int32_t v[3] = {magic, version, count};

	memset(h, 0, TOKENS_HEADER_BYTES);
	for (int i = 0; i < 3; i++)
		for (int b = 0; b < 4; b++)
			h[4 * i + b] = (uint8_t)((uint32_t)v[i] >> (8 * b));
}

/* Parses h as the header of a file_bytes-long shard and asserts a refusal
 * with rc and a message containing want. */
static void assert_refused(const uint8_t *h, size_t len, uint64_t file_bytes, int rc,
			   const char *want)
{
	struct tokens_header th = {.tokens = 99, .data_offset = 99};
	char err[256] = "";

	assert_int_equal(tokens_parse_header(h, len, file_bytes, &th, err, sizeof(err)), rc);
	if (!strstr(err, want))
		fail_msg("message \"%s\" lacks \"%s\"", err, want);
	/* Nothing half-filled survives a refusal. */
	assert_int_equal(th.tokens, 0);
	assert_int_equal(th.data_offset, 0);
}

static void good_header_gives_count_and_data_offset(void **state)
{
	uint8_t h[TOKENS_HEADER_BYTES];
	struct tokens_header th;
	char err[256] = "";

	make_header(h, TOKENS_MAGIC, 1, 100000000);
	assert_int_equal(
		tokens_parse_header(h, sizeof(h), 1024 + 2 * 100000000ull, &th, err, sizeof(err)),
		0);
	assert_int_equal(th.tokens, 100000000);
	assert_int_equal(th.data_offset, 1024);
	assert_string_equal(err, "");
}

static void short_final_shard_is_accepted(void **state)
{
	uint8_t h[TOKENS_HEADER_BYTES];
	struct tokens_header th;

	make_header(h, TOKENS_MAGIC, 1, 1);
	assert_int_equal(tokens_parse_header(h, sizeof(h), 1026, &th, NULL, 0), 0);
	assert_int_equal(th.tokens, 1);
}

static void largest_count_does_not_overflow(void **state)
{
	uint8_t h[TOKENS_HEADER_BYTES];
	struct tokens_header th;

	make_header(h, TOKENS_MAGIC, 1, INT32_MAX);
	assert_int_equal(
		tokens_parse_header(h, sizeof(h), 1024 + 2 * (uint64_t)INT32_MAX, &th, NULL, 0), 0);
	assert_int_equal(th.tokens, INT32_MAX);
	assert_refused(h, sizeof(h), 1024 + 2 * (uint64_t)INT32_MAX - 1, -EINVAL,
		       "header says 2147483647 tokens but the file holds 2147483646");
}

static void unused_header_words_are_ignored(void **state)
{
	uint8_t h[TOKENS_HEADER_BYTES];
	struct tokens_header th;

	make_header(h, TOKENS_MAGIC, 1, 5);
	memset(h + 12, 0xff, sizeof(h) - 12);
	assert_int_equal(tokens_parse_header(h, sizeof(h), 1034, &th, NULL, 0), 0);
	assert_int_equal(th.tokens, 5);
}

static void file_shorter_than_the_header_is_refused(void **state)
{
	uint8_t h[TOKENS_HEADER_BYTES];

	make_header(h, TOKENS_MAGIC, 1, 5);
	assert_refused(h, 500, 500, -EINVAL,
		       "truncated: the file is 500 bytes, shorter than the 1024-byte header");
	assert_refused(h, 0, 0, -EINVAL, "the file is 0 bytes");
}

static void short_buffer_of_a_long_file_asks_for_more(void **state)
{
	uint8_t h[TOKENS_HEADER_BYTES];

	make_header(h, TOKENS_MAGIC, 1, 5);
	assert_refused(h, 1023, 1034, -ENODATA, "only 1023 of the 1024 header bytes");
}

static void wrong_magic_is_refused_with_its_value(void **state)
{
	uint8_t h[TOKENS_HEADER_BYTES];

	make_header(h, 20240519, 1, 5);
	assert_refused(h, sizeof(h), 1034, -EINVAL,
		       "not a token shard: bad magic 20240519 (expected 20240520)");
	make_header(h, -1, 1, 5);
	assert_refused(h, sizeof(h), 1034, -EINVAL, "bad magic -1");
}

static void npy_file_is_named_as_such(void **state)
{
	uint8_t h[TOKENS_HEADER_BYTES] = {0};

	memcpy(h, "\x93NUMPY\x01\x00", 8);
	assert_refused(h, sizeof(h), 4096, -EINVAL, "this is a .npy file");
}

static void llama3_shard_is_named_as_such(void **state)
{
	uint8_t h[TOKENS_HEADER_BYTES];

	make_header(h, 20240801, 7, 5);
	assert_refused(h, sizeof(h), 1044, -EINVAL, "Llama 3 shard (uint32 tokens)");
}

static void wrong_version_is_refused_with_its_value(void **state)
{
	uint8_t h[TOKENS_HEADER_BYTES];

	make_header(h, TOKENS_MAGIC, 2, 5);
	assert_refused(h, sizeof(h), 1034, -EINVAL, "unsupported token shard version 2");
	make_header(h, TOKENS_MAGIC, 0, 5);
	assert_refused(h, sizeof(h), 1034, -EINVAL, "version 0");
}

static void zero_and_negative_counts_are_refused(void **state)
{
	uint8_t h[TOKENS_HEADER_BYTES];

	make_header(h, TOKENS_MAGIC, 1, 0);
	assert_refused(h, sizeof(h), 1024, -EINVAL, "bad token count 0");
	/* A count above INT32_MAX written as uint32 reads back negative. */
	make_header(h, TOKENS_MAGIC, 1, INT32_MIN);
	assert_refused(h, sizeof(h), 1024, -EINVAL, "bad token count -2147483648");
}

static void count_larger_than_the_file_is_refused_with_what_it_holds(void **state)
{
	uint8_t h[TOKENS_HEADER_BYTES];

	make_header(h, TOKENS_MAGIC, 1, 11);
	assert_refused(h, sizeof(h), 1044, -EINVAL,
		       "truncated: the header says 11 tokens but the file holds 10 (20 bytes "
		       "after the header)");
	/* Half a token is not a token. */
	assert_refused(h, sizeof(h), 1045, -EINVAL, "the file holds 10 (21 bytes");
	make_header(h, TOKENS_MAGIC, 1, 1);
	assert_refused(h, sizeof(h), 1024, -EINVAL, "the file holds 0 (0 bytes");
}

static void bytes_after_the_last_token_are_refused(void **state)
{
	uint8_t h[TOKENS_HEADER_BYTES];

	make_header(h, TOKENS_MAGIC, 1, 10);
	assert_refused(h, sizeof(h), 1044 + 4096, -EINVAL,
		       "the file has 4116 bytes after the header, 4096 more than its 10 tokens");
	assert_refused(h, sizeof(h), 1045, -EINVAL, "1 more than its 10 tokens");
}

/* A shard as llm.c writes one (header, then the tokens as little-endian
 * uint16), read back through a file the way the dataset loader does. */
static void shard_written_like_llm_c_is_accepted(void **state)
{
	char path[] = "/tmp/test_tokens.XXXXXX";
	uint8_t h[TOKENS_HEADER_BYTES], tok[2 * 7];
	struct tokens_header th;
	struct stat st;
	char err[256] = "";
	int fd = mkstemp(path);

	assert_true(fd >= 0);
	unlink(path);
	make_header(h, TOKENS_MAGIC, 1, 7);
	for (int i = 0; i < 7; i++) {
		tok[2 * i] = (uint8_t)(50256 - i);
		tok[2 * i + 1] = (uint8_t)((50256 - i) >> 8);
	}
	assert_int_equal(write(fd, h, sizeof(h)), sizeof(h));
	assert_int_equal(write(fd, tok, sizeof(tok)), sizeof(tok));
	assert_int_equal(fstat(fd, &st), 0);
	memset(h, 0, sizeof(h));
	assert_int_equal(pread(fd, h, sizeof(h), 0), sizeof(h));
	assert_int_equal(
		tokens_parse_header(h, sizeof(h), (uint64_t)st.st_size, &th, err, sizeof(err)), 0);
	assert_int_equal(th.tokens, 7);
	assert_int_equal(pread(fd, tok, 2, (off_t)th.data_offset), 2);
	assert_int_equal(tok[0] | tok[1] << 8, 50256);
	close(fd);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(good_header_gives_count_and_data_offset),
		cmocka_unit_test(short_final_shard_is_accepted),
		cmocka_unit_test(largest_count_does_not_overflow),
		cmocka_unit_test(unused_header_words_are_ignored),
		cmocka_unit_test(file_shorter_than_the_header_is_refused),
		cmocka_unit_test(short_buffer_of_a_long_file_asks_for_more),
		cmocka_unit_test(wrong_magic_is_refused_with_its_value),
		cmocka_unit_test(npy_file_is_named_as_such),
		cmocka_unit_test(llama3_shard_is_named_as_such),
		cmocka_unit_test(wrong_version_is_refused_with_its_value),
		cmocka_unit_test(zero_and_negative_counts_are_refused),
		cmocka_unit_test(count_larger_than_the_file_is_refused_with_what_it_holds),
		cmocka_unit_test(bytes_after_the_last_token_are_refused),
		cmocka_unit_test(shard_written_like_llm_c_is_accepted),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
