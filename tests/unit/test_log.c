/*
 * test_log.c — the daemon's log (finding 7 of issue 15): every line is one
 * printable line whatever it quotes, and no caller can flood it.  The
 * lines go to stderr, which each case points at a file it then reads.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "log.h"

/* stderr into a fresh temporary file, until captured_end. */
static FILE *cap;
static int saved_stderr = -1;

static void capture(void)
{
	cap = tmpfile();
	assert_non_null(cap);
	fflush(stderr);
	saved_stderr = dup(STDERR_FILENO);
	assert_true(saved_stderr >= 0);
	assert_true(dup2(fileno(cap), STDERR_FILENO) >= 0);
}

/* Restores stderr; the captured lines, counted, and the last one holding
 * `find` (if any) in found. */
static unsigned captured_end(const char *find, char *found, size_t len)
{
	char line[2048];
	unsigned n = 0;

	fflush(stderr);
	assert_true(dup2(saved_stderr, STDERR_FILENO) >= 0);
	close(saved_stderr);
	rewind(cap);
	if (found)
		found[0] = '\0';
	while (fgets(line, sizeof(line), cap)) {
		n++;
		if (find && found && strstr(line, find))
			snprintf(found, len, "%s", line);
	}
	fclose(cap);
	return n;
}

static void a_line_quoting_control_characters_stays_one_printable_line(void **unused)
{
	char found[2048];

	capture();
	log_warn("client said %s", "x\n<3>prefetchd: forged\x1b[2J\r\x7f");
	assert_int_equal(captured_end("client said", found, sizeof(found)), 1);
	assert_string_equal(found, "<4>prefetchd: client said x?<3>prefetchd: forged?[2J??\n");
}

static void a_limit_passes_its_burst_then_counts_what_it_drops(void **unused)
{
	struct log_limit l = {0};
	uint64_t dropped = 99;

	/* No refill: the burst of 3, then nothing. */
	for (int i = 0; i < 3; i++) {
		assert_true(log_limit_pass(&l, 0, 3, &dropped));
		assert_int_equal(dropped, 0);
	}
	for (int i = 0; i < 5; i++)
		assert_false(log_limit_pass(&l, 0, 3, &dropped));
	/* A refill so fast that a token is back at once: the next line
	 * passes and says how many were dropped before it, once. */
	assert_true(log_limit_pass(&l, 1e12, 3, &dropped));
	assert_int_equal(dropped, 5);
	assert_true(log_limit_pass(&l, 1e12, 3, &dropped));
	assert_int_equal(dropped, 0);
}

static void a_flood_of_lines_is_cut_to_the_daemon_wide_limit_and_says_so(void **unused)
{
	char found[2048];
	unsigned n;

	capture();
	for (int i = 0; i < 10000; i++)
		log_info("line %d of a flood", i);
	usleep(50000); /* 200 a second: 10 lines' worth */
	log_info("after the flood");
	n = captured_end("dropped", found, sizeof(found));
	print_message("  10001 lines logged, %u written; %s", n, found);
	/* The burst of 2000 (less the earlier case's line), what trickled
	 * back while the loop ran, the note and the line after. */
	assert_true(n >= 2000 && n <= 2000 + 200 + 2);
	assert_non_null(strstr(found, "log line(s) dropped (more than 200 a second)"));
	/* Errors are never dropped. */
	capture();
	for (int i = 0; i < 3000; i++)
		log_err("error %d", i);
	assert_int_equal(captured_end(NULL, NULL, 0), 3000);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(a_line_quoting_control_characters_stays_one_printable_line),
		cmocka_unit_test(a_limit_passes_its_burst_then_counts_what_it_drops),
		cmocka_unit_test(a_flood_of_lines_is_cut_to_the_daemon_wide_limit_and_says_so),
	};

	log_init("prefetchd", 0);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
