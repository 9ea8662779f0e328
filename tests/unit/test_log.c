/*
 * test_log.c — the daemon's log (finding 7 of issue 15; issue 18): every
 * line is one printable line whatever it quotes, in the form its reader
 * wants (priority prefixes for journald, the time and a level word
 * anywhere else), and no caller can flood it.  The lines go to stderr,
 * which each case points at a file it then reads; a case makes that file
 * "the journal" by naming it in $JOURNAL_STREAM, as systemd does.
 */
#include <errno.h>
#include <regex.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "base/log.h"

/* stderr into a fresh temporary file, until captured_end. */
static FILE *cap;
static int saved_stderr = -1;
/* Lines below error level the cases wrote, which the daemon-wide limit
 * counted against its burst before the flood case. */
static unsigned limited_so_far;

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

/* $JOURNAL_STREAM names fd's file, as systemd names the stream it gives a
 * unit's stderr. */
static void journal_is(int fd)
{
	struct stat st;
	char v[64];

	assert_int_equal(fstat(fd, &st), 0);
	snprintf(v, sizeof(v), "%ju:%ju", (uintmax_t)st.st_dev, (uintmax_t)st.st_ino);
	assert_int_equal(setenv("JOURNAL_STREAM", v, 1), 0);
}

/* The line's form is chosen at log_init, from stderr as it is then. */
static void log_to_journal(int verbose)
{
	journal_is(STDERR_FILENO);
	log_init("prefetchd", verbose);
	assert_true(log_stderr_is_journal());
}

static void log_to_file(int verbose)
{
	unsetenv("JOURNAL_STREAM");
	log_init("prefetchd", verbose);
}

/* line is "YYYY-MM-DD HH:MM:SS.mmm LEVEL prefetchd: rest" (rest with its
 * newline), stamped between t0 and t1, local time. */
static void assert_stamped(const char *line, time_t t0, time_t t1, const char *level,
			   const char *rest)
{
	char want[256];
	struct tm tm = {0};
	const char *after;
	regex_t re;
	time_t t;
	int rc;

	assert_int_equal(
		regcomp(&re, "^[0-9]{4}-[0-9]{2}-[0-9]{2} [0-9]{2}:[0-9]{2}:[0-9]{2}\\.[0-9]{3} ",
			REG_EXTENDED | REG_NOSUB),
		0);
	rc = regexec(&re, line, 0, NULL, 0);
	regfree(&re);
	if (rc != 0)
		fail_msg("not stamped with the time to the millisecond: '%s'", line);
	after = strptime(line, "%Y-%m-%d %H:%M:%S", &tm);
	assert_non_null(after);
	tm.tm_isdst = -1;
	t = mktime(&tm);
	if (t < t0 || t > t1)
		fail_msg("stamped %lld, not between %lld and %lld (local time): '%s'", (long long)t,
			 (long long)t0, (long long)t1, line);
	snprintf(want, sizeof(want), " %s prefetchd: %s", level, rest);
	assert_string_equal(after + 4, want); /* past ".mmm" */
}

static void a_line_quoting_control_characters_stays_one_printable_line(void **unused)
{
	const char *forgery = "x\n<3>prefetchd: forged\x1b[2J\r\x7f";
	char found[2048];
	time_t t0;

	capture();
	log_to_journal(0);
	log_warn("client said %s", forgery);
	assert_int_equal(captured_end("client said", found, sizeof(found)), 1);
	assert_string_equal(found, "<4>prefetchd: client said x?<3>prefetchd: forged?[2J??\n");

	capture();
	log_to_file(0);
	t0 = time(NULL);
	log_warn("client said %s", forgery);
	assert_int_equal(captured_end("client said", found, sizeof(found)), 1);
	assert_stamped(found, t0, time(NULL), "warn", "client said x?<3>prefetchd: forged?[2J??\n");
	limited_so_far += 2;
}

static void lines_for_journald_carry_their_priority_and_no_time(void **unused)
{
	char out[4][256];
	unsigned n = 0;
	char line[256];

	capture();
	log_to_journal(1);
	log_err("e %d", 1);
	log_warn("w %d", 2);
	log_info("i %d", 3);
	log_debug("d %d", 4);
	fflush(stderr);
	rewind(cap);
	while (n < 4 && fgets(line, sizeof(line), cap))
		snprintf(out[n++], sizeof(out[0]), "%s", line);
	assert_int_equal(captured_end(NULL, NULL, 0), 4);
	assert_string_equal(out[0], "<3>prefetchd: e 1\n");
	assert_string_equal(out[1], "<4>prefetchd: w 2\n");
	assert_string_equal(out[2], "<6>prefetchd: i 3\n");
	assert_string_equal(out[3], "<7>prefetchd: d 4\n");
	limited_so_far += 3;
}

static void lines_elsewhere_carry_the_local_time_to_the_millisecond_and_a_level_word(void **unused)
{
	static const char *const want[][2] = {
		{"error", "e 1\n"}, {"warn", "w 2\n"}, {"info", "i 3\n"}, {"debug", "d 4\n"}};
	char line[256];
	unsigned n = 0;
	time_t t0, t1;

	capture();
	log_to_file(1);
	t0 = time(NULL);
	log_err("e %d", 1);
	log_warn("w %d", 2);
	log_info("i %d", 3);
	log_debug("d %d", 4);
	t1 = time(NULL);
	fflush(stderr);
	rewind(cap);
	while (fgets(line, sizeof(line), cap)) {
		assert_true(n < 4);
		assert_stamped(line, t0, t1, want[n][0], want[n][1]);
		n++;
	}
	assert_int_equal(captured_end(NULL, NULL, 0), 4);
	/* Without -v, no debug line in either form. */
	capture();
	log_to_file(0);
	log_debug("not shown");
	assert_int_equal(captured_end(NULL, NULL, 0), 0);
	limited_so_far += 3;
}

static void a_journal_stream_that_is_not_stderr_leaves_lines_stamped(void **unused)
{
	/* Inherited from a unit whose stderr was the journal, by a daemon
	 * whose stderr is a file: the variable names another file.  Or it is
	 * not systemd's at all. */
	static const char *const bogus[] = {
		"", "garbage", "1", "1:", ":2", "1:2:3", "1:2x", "-1:-2"};
	char found[256];
	FILE *other = tmpfile();
	time_t t0;

	assert_non_null(other);
	capture();
	journal_is(fileno(other));
	log_init("prefetchd", 0);
	assert_false(log_stderr_is_journal());
	for (size_t i = 0; i < sizeof(bogus) / sizeof(bogus[0]); i++) {
		assert_int_equal(setenv("JOURNAL_STREAM", bogus[i], 1), 0);
		if (log_stderr_is_journal())
			fail_msg("JOURNAL_STREAM='%s' taken for stderr's", bogus[i]);
	}
	journal_is(fileno(other));
	log_init("prefetchd", 0);
	t0 = time(NULL);
	log_info("started");
	assert_int_equal(captured_end("started", found, sizeof(found)), 1);
	assert_stamped(found, t0, time(NULL), "info", "started\n");
	fclose(other);
	unsetenv("JOURNAL_STREAM");
	limited_so_far += 1;
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
	log_to_file(0);
	for (int i = 0; i < 10000; i++)
		log_info("line %d of a flood", i);
	usleep(50000); /* 200 a second: 10 lines' worth */
	log_info("after the flood");
	n = captured_end("dropped", found, sizeof(found));
	print_message("  10001 lines logged, %u written; %s", n, found);
	/* The burst of 2000 (less the earlier cases' lines), what trickled
	 * back while the loop ran, the note and the line after. */
	assert_true(n >= 2000 - limited_so_far && n <= 2000 + 200 + 2);
	assert_non_null(strstr(found, " warn prefetchd: "));
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
		cmocka_unit_test(lines_for_journald_carry_their_priority_and_no_time),
		cmocka_unit_test(
			lines_elsewhere_carry_the_local_time_to_the_millisecond_and_a_level_word),
		cmocka_unit_test(a_journal_stream_that_is_not_stderr_leaves_lines_stamped),
		cmocka_unit_test(a_limit_passes_its_burst_then_counts_what_it_drops),
		cmocka_unit_test(a_flood_of_lines_is_cut_to_the_daemon_wide_limit_and_says_so),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
