/*
 * test_integration_log.c — a real prefetchd's log takes the form its
 * reader wants (issue 18): with stderr going to journald, whose stream
 * systemd names in $JOURNAL_STREAM, every line keeps its sd-daemon
 * priority ("<6>prefetchd: ...") and no time, which the journal adds;
 * written anywhere else (here a file, as a terminal or a container's log
 * would be), every line starts with the local time to the millisecond and
 * a level word.  A $JOURNAL_STREAM that names another file (inherited from
 * a unit by a daemon started with its stderr elsewhere) changes nothing.
 * In both forms a client's string cannot start a line of its own.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "prefetch.h"
#include "testutil.h"

static struct tdaemon td;

static Pf__Release no_release = {.base = PROTOBUF_C_MESSAGE_INIT(&pf__release__descriptor),
				 .slot = 12345};
static const Pf__Envelope release = {.base = PROTOBUF_C_MESSAGE_INIT(&pf__envelope__descriptor),
				     .msg_case = PF__ENVELOPE__MSG_RELEASE,
				     .release = &no_release};

static int setup(void **state)
{
	unsetenv("JOURNAL_STREAM");
	return td_init(&td, "log") ? -1 : 0;
}

static int teardown(void **state)
{
	td_stop(&td, 5000);
	td_cleanup(&td);
	unsetenv("JOURNAL_STREAM");
	return 0;
}

/* $JOURNAL_STREAM names path's file (made if missing), as systemd names
 * the stream it connects to a unit's stderr. */
static void journal_is(const char *path)
{
	struct stat st;
	char v[64];
	int fd = open(path, O_WRONLY | O_CREAT | O_APPEND, 0644);

	assert_true(fd >= 0);
	assert_int_equal(fstat(fd, &st), 0);
	close(fd);
	snprintf(v, sizeof(v), "%ju:%ju", (uintmax_t)st.st_dev, (uintmax_t)st.st_ino);
	assert_int_equal(setenv("JOURNAL_STREAM", v, 1), 0);
}

/* A client whose name forges a line: hello, then a request the daemon
 * refuses and logs with the client's name. */
static void forge_a_line(void)
{
	int fd = td_raw_connect(td.sock);

	assert_true(fd >= 0);
	assert_int_equal(td_send_hello(fd, "x\n<3>prefetchd: forged line"), 0);
	assert_int_equal(td_send_env(fd, &release, -1), 0);
	usleep(200000);
	close(fd);
	assert_true(td_log_has(&td, "x?<3>prefetchd: forged line", NULL));
}

/* Every line of the daemon's log is in the one form; returns how many
 * there are.  The ready line and the refused forger's are among them. */
static unsigned check_log(bool journal)
{
	const char *form =
		journal ? "^<[3-7]>prefetchd: "
			: "^[0-9]{4}-[0-9]{2}-[0-9]{2} [0-9]{2}:[0-9]{2}:[0-9]{2}\\.[0-9]{3} "
			  "(error|warn|info|debug) prefetchd: ";
	const char *ready = journal ? "<6>prefetchd: prefetchd " PF_VERSION " ready"
				    : " info prefetchd: prefetchd " PF_VERSION " ready";
	FILE *f = fopen(td.log, "r");
	bool saw_ready = false;
	char line[2048];
	unsigned n = 0;
	regex_t re;

	assert_non_null(f);
	assert_int_equal(regcomp(&re, form, REG_EXTENDED | REG_NOSUB), 0);
	while (fgets(line, sizeof(line), f)) {
		n++;
		if (regexec(&re, line, 0, NULL, 0) != 0)
			fail_msg("line %u of the log is not in the %s form: %s", n,
				 journal ? "journal's" : "stamped", line);
		if (strncmp(line, "<3>prefetchd: forged", 20) == 0)
			fail_msg("a client's string starts line %u: %s", n, line);
		saw_ready |= strstr(line, ready) != NULL;
	}
	regfree(&re);
	fclose(f);
	if (!saw_ready)
		fail_msg("no line holds '%s'", ready);
	return n;
}

static void a_daemon_logging_to_a_file_stamps_every_line_with_the_time_and_a_level(void **state)
{
	assert_int_equal(td_start(&td, NULL, NULL), 0);
	forge_a_line();
	print_message("  %u lines, all stamped\n", check_log(false));
}

static void a_daemon_whose_stderr_is_the_journal_keeps_priority_prefixes(void **state)
{
	journal_is(td.log); /* td_start appends to this very file */
	assert_int_equal(td_start(&td, NULL, NULL), 0);
	unsetenv("JOURNAL_STREAM");
	forge_a_line();
	print_message("  %u lines, all with a priority prefix\n", check_log(true));
}

static void a_journal_stream_naming_another_file_is_not_taken_for_stderr(void **state)
{
	char other[400];

	td_path(&td, "journal", other, sizeof(other));
	journal_is(other);
	assert_int_equal(td_start(&td, NULL, NULL), 0);
	unsetenv("JOURNAL_STREAM");
	forge_a_line();
	print_message("  %u lines, all stamped\n", check_log(false));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(
			a_daemon_logging_to_a_file_stamps_every_line_with_the_time_and_a_level,
			setup, teardown),
		cmocka_unit_test_setup_teardown(
			a_daemon_whose_stderr_is_the_journal_keeps_priority_prefixes, setup,
			teardown),
		cmocka_unit_test_setup_teardown(
			a_journal_stream_naming_another_file_is_not_taken_for_stderr, setup,
			teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
