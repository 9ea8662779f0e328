/*
 * test_streamcopy.c — the streaming-store copy of slots a copy engine reads
 * next: the same bytes as memcpy at every alignment of source and
 * destination and at every length around its line and threshold edges,
 * nothing written outside [dst, dst + n); and PREFETCHD_CACHED_FILLS=1
 * telling the session layer not to ask for it (copy_streaming false).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "base/streamcopy.h"

#define GUARD  64
#define POISON 0x5a

static uint8_t byte_at(uint64_t seed, size_t i)
{
	uint64_t z = seed + 0x9e3779b97f4a7c15ull * (i + 1);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return (uint8_t)(z ^ (z >> 31));
}

/* Copies n bytes from src + soff to dst + doff and checks every byte of the
 * destination buffer: the copy's, and the poison on either side. */
static void check_copy(size_t soff, size_t doff, size_t n, uint64_t seed)
{
	uint8_t *src = malloc(n + 2 * GUARD), *buf = malloc(n + 3 * GUARD);
	uint8_t *dst;

	assert_non_null(src);
	assert_non_null(buf);
	for (size_t i = 0; i < n + 2 * GUARD; i++)
		src[i] = byte_at(seed, i);
	memset(buf, POISON, n + 3 * GUARD);
	dst = buf + GUARD + doff;
	copy_streamed(dst, src + soff, n);
	copy_streamed_fence();
	for (size_t i = 0; i < n; i++) {
		if (dst[i] != src[soff + i])
			fail_msg("src+%zu -> dst+%zu, %zu bytes: byte %zu is %#x, not %#x", soff,
				 doff, n, i, dst[i], src[soff + i]);
	}
	for (uint8_t *p = buf; p < dst; p++)
		if (*p != POISON)
			fail_msg("src+%zu -> dst+%zu, %zu bytes: wrote %td bytes before dst", soff,
				 doff, n, dst - p);
	for (uint8_t *p = dst + n; p < buf + n + 3 * GUARD; p++)
		if (*p != POISON)
			fail_msg("src+%zu -> dst+%zu, %zu bytes: wrote byte %td past the end", soff,
				 doff, n, p - (dst + n));
	free(src);
	free(buf);
}

static const size_t lengths[] = {0,   1,   15,	16,  63,   64,	 65,   127,  128,   255,
				 256, 257, 319, 320, 1000, 4095, 4096, 4097, 65549, 1 << 20};

static void every_alignment_and_edge_length_copies_exactly(void **state)
{
	(void)state;
#if defined(__x86_64__)
	assert_true(copy_streaming()); /* on by default where it exists */
#endif
	for (size_t l = 0; l < sizeof(lengths) / sizeof(lengths[0]); l++)
		for (size_t soff = 0; soff < 64; soff += 7)
			for (size_t doff = 0; doff < 64; doff++)
				check_copy(soff, doff, lengths[l], l * 4096 + soff * 64 + doff);
}

static void with_streaming_off_it_copies_the_same(void **state)
{
	(void)state;
	/* The flag is read once per process: this test runs in its own
	 * process (main re-executes itself with the variable set). */
	assert_false(copy_streaming());
	for (size_t l = 0; l < sizeof(lengths) / sizeof(lengths[0]); l++)
		check_copy(3, 17, lengths[l], l);
}

int main(int argc, char **argv)
{
	const struct CMUnitTest streaming[] = {
		cmocka_unit_test(every_alignment_and_edge_length_copies_exactly),
	};
	const struct CMUnitTest cached[] = {
		cmocka_unit_test(with_streaming_off_it_copies_the_same),
	};
	const char *off = getenv("PREFETCHD_CACHED_FILLS");
	int rc;

	if (off && strcmp(off, "1") == 0)
		return cmocka_run_group_tests_name("streaming off", cached, NULL, NULL);
	fflush(stdout);
	rc = cmocka_run_group_tests_name("streaming", streaming, NULL, NULL);
	fflush(stdout);
	if (rc == 0 && argc > 0) {
		char cmd[4096];

		/* The second group, in a child with streaming turned off. */
		snprintf(cmd, sizeof(cmd), "PREFETCHD_CACHED_FILLS=1 '%s'", argv[0]);
		rc = system(cmd) == 0 ? 0 : 1;
	}
	return rc;
}
