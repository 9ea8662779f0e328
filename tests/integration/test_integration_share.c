/*
 * test_integration_share.c — shares (pf_open_opts.share) against a real
 * prefetchd: trainers of one share get the same batches from one read.
 *
 * Every case checks every member's epoch byte by byte: each sample of the
 * epoch exactly once, each row holding its sample's bytes.  Members that
 * take their batches in step get the same batches in the same order, and
 * the daemon reads each batch once (the producing session's bytes_sent is
 * one epoch's, whatever the member count).  A member that stops taking
 * batches is dropped from the share once it trails by more than share_lag
 * and gets the rest of its epoch alone; one that starts the epoch late gets
 * the share's next batch first and what it missed at the end; one that dies
 * gives back its holds.  Mismatched sessions are refused with the
 * difference named, and another user's share of the same name is not
 * joined.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "prefetch.h"
#include "testutil.h"

#define N     1000
#define SEED  41
#define BATCH 16
#define ROW   24 /* bytes: 6 x f4 */
#define NB    ((N + BATCH - 1) / BATCH)
#define LAG   3 /* share_lag of the daemon these cases run */

static struct tdaemon td;

static int setup(void **state)
{
	char p[400];
	uint64_t shape[1] = {6};

	if (td_init(&td, "share"))
		return -1;
	if (chmod(td.dir, 0755)) /* another user's trainer passes */
		return -1;
	td_path(&td, "x.npy", p, sizeof(p));
	if (td_write_npy(p, 1, "<f4", 4, N, shape, 1, SEED, 0))
		return -1;
	(void)state;
	return td_start(&td, "socket_mode = 0666\nallow_users = *\nshare_lag = 3\n",
			"[dataset.x]\nfield.x = x.npy\n");
}

static int teardown(void **state)
{
	int rc = td_stop(&td, 5000);

	td_cleanup(&td);
	(void)state;
	return rc;
}

static struct pf_client *join(const char *share, uint32_t batch, int *rc)
{
	struct pf_client *c = NULL;

	*rc = pf_connect(td.sock, &c);
	if (!*rc)
		*rc = pf_open(c, &(struct pf_open_opts){
					 .dataset = "x", .batch_size = batch, .share = share});
	return c;
}

static struct pf_client *join_ok(const char *share)
{
	int rc;
	struct pf_client *c = join(share, BATCH, &rc);

	if (rc)
		fail_msg("join %s: %d %s", share, rc, pf_errmsg(c));
	return c;
}

static void start(struct pf_client *c, uint64_t epoch, uint64_t seed)
{
	uint64_t batches = 0;

	assert_int_equal(pf_set_epoch(c, epoch), 0);
	assert_int_equal(
		pf_start_epoch(c, &(struct pf_epoch_opts){.order = PF_ORDER_SHUFFLE, .seed = seed},
			       &batches),
		0);
	assert_int_equal(batches, NB);
}

/* One member's epoch so far: how often each sample came, and the picks in
 * the order they came. */
struct seen {
	uint8_t count[N];
	uint64_t picks[N];
	uint32_t npicks;
	uint32_t batches;
};

/* Takes one batch into s, checking its rows and its seq (the member's
 * batches are numbered in the order they come); false at the epoch's end. */
static bool take(struct pf_client *c, struct seen *s)
{
	struct pf_batch *b = NULL;
	int rc = pf_next(c, (int)(10000 * td_patience()), &b);

	if (rc)
		fail_msg("pf_next: %d %s", rc, pf_errmsg(c));
	if (!b)
		return false;
	assert_int_equal(b->seq, s->batches);
	for (uint32_t i = 0; i < b->count; i++) {
		uint64_t p = b->picks[i];

		assert_true(p < N);
		if (!td_row_ok((const uint8_t *)b->data[0] + i * ROW, ROW, SEED, p))
			fail_msg("batch %llu row %u: not sample %llu's bytes",
				 (unsigned long long)b->seq, i, (unsigned long long)p);
		s->count[p]++;
		s->picks[s->npicks++] = p;
	}
	s->batches++;
	assert_int_equal(pf_release(c, b, NULL), 0);
	return true;
}

static void all_once(const struct seen *s)
{
	assert_int_equal(s->npicks, N);
	assert_int_equal(s->batches, NB);
	for (uint32_t i = 0; i < N; i++)
		if (s->count[i] != 1)
			fail_msg("sample %u came %u times", i, s->count[i]);
}

static Pf__ShareStatus *share_of(Pf__Envelope *st, const char *name, uint32_t uid)
{
	for (size_t i = 0; i < st->status_reply->n_shares; i++) {
		Pf__ShareStatus *sh = st->status_reply->shares[i];

		if (strcmp(sh->name, name) == 0 && sh->uid == uid)
			return sh;
	}
	return NULL;
}

/* What members_of_a_share_... asked of status, through prefetchctl's
 * --json: the share, its producer, and its three members alike. */
static void json_shows_the_share(uint64_t producer)
{
	char cmd[512], json[65536], want[64];
	const char *sh, *p;
	int members = 0;

	snprintf(cmd, sizeof(cmd), "%s -s %s status --json", td_prefetchctl(), td.sock);
	assert_int_equal(td_capture(cmd, json, sizeof(json)), 0);
	sh = strstr(json, "\"shares\":[{\"name\":\"sweep\"");
	assert_non_null(sh);
	snprintf(want, sizeof(want), "\"session\":%llu,", (unsigned long long)producer);
	assert_non_null(strstr(sh, want));
	snprintf(want, sizeof(want), "\"lag\":%d,", LAG);
	assert_non_null(strstr(sh, want));
	snprintf(want, sizeof(want), "\"state\":\"idle\",\"delivered\":%d,", NB);
	for (p = strstr(sh, want); p; p = strstr(p + 1, want))
		members++;
	assert_int_equal(members, 3);
	/* Host sessions (the producer, at least) hold no device memory. */
	members = 0;
	for (p = strstr(json, "\"device_bytes\":"); p; p = strstr(p + 1, "\"device_bytes\":")) {
		assert_memory_equal(p + strlen("\"device_bytes\":"), "0,", 2);
		members++;
	}
	assert_true(members >= 1);
}

static void members_of_a_share_get_the_same_batches_from_one_read(void **state)
{
	struct pf_client *c[3];
	static struct seen s[3];
	Pf__Envelope *st;
	Pf__ShareStatus *sh;
	Pf__SessionStatus *src;
	uint64_t producer;

	for (int k = 0; k < 3; k++)
		c[k] = join_ok("sweep");
	for (uint64_t epoch = 0; epoch < 2; epoch++) {
		memset(s, 0, sizeof(s));
		for (int k = 0; k < 3; k++)
			start(c[k], epoch, 5);
		/* In step, one batch each in turn. */
		for (bool done[3] = {false}; !done[0] || !done[1] || !done[2];)
			for (int k = 0; k < 3; k++)
				if (!done[k])
					done[k] = !take(c[k], &s[k]);
		for (int k = 0; k < 3; k++) {
			all_once(&s[k]);
			assert_memory_equal(s[k].picks, s[0].picks, sizeof(s[0].picks));
		}
	}
	st = td_status(td.sock);
	assert_non_null(st);
	sh = share_of(st, "sweep", getuid());
	assert_non_null(sh);
	assert_int_equal(sh->n_members, 3);
	for (size_t k = 0; k < 3; k++) {
		print_message("  member %llu: %s, delivered %llu, dropped %llu, alone %llu\n",
			      (unsigned long long)sh->members[k]->session, sh->members[k]->state,
			      (unsigned long long)sh->members[k]->delivered,
			      (unsigned long long)sh->members[k]->dropped,
			      (unsigned long long)sh->members[k]->own_batches);
		assert_string_equal(sh->members[k]->state, "idle");
		assert_int_equal(sh->members[k]->delivered, NB);
		assert_int_equal(sh->members[k]->dropped, 0);
		assert_int_equal(sh->members[k]->own_batches, 0);
	}
	producer = sh->session;
	src = td_session(st, producer);
	assert_non_null(src);
	/* One read of each epoch for the three: two epochs' bytes. */
	assert_int_equal(src->bytes_sent, 2ull * N * ROW);
	pf__envelope__free_unpacked(st, NULL);
	json_shows_the_share(producer);
	for (int k = 0; k < 3; k++)
		pf_close(c[k]);
	(void)state;
}

static void a_member_that_stops_taking_goes_on_alone_and_loses_nothing(void **state)
{
	struct pf_client *fast = join_ok("lag"), *slow = join_ok("lag");
	static struct seen f, s;
	Pf__Envelope *st;
	Pf__ShareStatus *sh;

	memset(&f, 0, sizeof(f));
	memset(&s, 0, sizeof(s));
	start(fast, 0, 9);
	start(slow, 0, 9);
	/* The fast one runs its whole epoch while the slow one takes
	 * nothing: it is not held back past the lag. */
	while (take(fast, &f))
		;
	all_once(&f);
	while (take(slow, &s))
		;
	all_once(&s);
	st = td_status(td.sock);
	assert_non_null(st);
	sh = share_of(st, "lag", getuid());
	assert_non_null(sh);
	for (size_t k = 0; k < sh->n_members; k++) {
		Pf__ShareMember *m = sh->members[k];

		if (m->dropped) {
			assert_true(m->own_batches > 0);
			assert_true(m->own_batches < NB); /* it had some from the share */
		}
	}
	pf__envelope__free_unpacked(st, NULL);
	assert_true(td_log_has(&td, "batches behind the fastest", "share_lag = 3"));
	pf_close(fast);
	pf_close(slow);
	(void)state;
}

static void a_member_that_starts_late_gets_what_it_missed_at_the_end(void **state)
{
	struct pf_client *early = join_ok("late"), *late;
	static struct seen e, l;
	uint32_t first_late;

	memset(&e, 0, sizeof(e));
	memset(&l, 0, sizeof(l));
	start(early, 0, 3);
	for (int i = 0; i < 20; i++)
		assert_true(take(early, &e));
	late = join_ok("late");
	start(late, 0, 3);
	/* From here in step; the late one's first batch is the share's next
	 * one, not the epoch's first. */
	assert_true(take(late, &l));
	first_late = 0;
	while (first_late < e.npicks && e.picks[first_late] != l.picks[0])
		first_late++;
	assert_true(first_late == e.npicks || first_late >= 20 * BATCH);
	for (bool ed = false, ld = false; !ed || !ld;) {
		if (!ed)
			ed = !take(early, &e);
		if (!ld)
			ld = !take(late, &l);
	}
	all_once(&e);
	all_once(&l);
	assert_true(td_log_has(&td, "joins epoch 0 at batch", "from a session of its own"));
	pf_close(early);
	pf_close(late);
	(void)state;
}

/* A member that takes two batches and dies holding them. */
static void die_holding(void)
{
	pid_t pid = fork();

	assert_true(pid >= 0);
	if (pid == 0) {
		int rc;
		struct pf_client *c = join("death", BATCH, &rc);
		struct pf_batch *b1 = NULL, *b2 = NULL;

		if (!rc)
			rc = pf_start_epoch(c, &(struct pf_epoch_opts){.order = PF_ORDER_SHUFFLE},
					    NULL);
		if (!rc)
			rc = pf_next(c, 10000, &b1);
		if (!rc)
			rc = pf_next(c, 10000, &b2);
		_exit(rc || !b1 || !b2 ? 1 : 0); /* no pf_close: the socket just closes */
	}
	int status;

	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

/* a and b take batches in turn to the end of their epochs. */
static void in_step(struct pf_client *a, struct pf_client *b, struct seen *sa, struct seen *sb)
{
	for (bool ad = false, bd = false; !ad || !bd;) {
		if (!ad)
			ad = !take(a, sa);
		if (!bd)
			bd = !take(b, sb);
	}
}

/* a and b through epoch 0 in step, then a takes `ahead` batches of
 * epoch 1; sa and sb are emptied for it. */
static void epoch0_then_ahead(struct pf_client *a, struct pf_client *b, struct seen *sa,
			      struct seen *sb, int ahead)
{
	memset(sa, 0, sizeof(*sa));
	memset(sb, 0, sizeof(*sb));
	start(a, 0, 9);
	start(b, 0, 9);
	in_step(a, b, sa, sb);
	all_once(sa);
	all_once(sb);
	memset(sa, 0, sizeof(*sa));
	memset(sb, 0, sizeof(*sb));
	start(a, 1, 9);
	for (int i = 0; i < ahead; i++)
		assert_true(take(a, sa));
}

/* Both members through epoch 0 in step, then `ahead` batches of epoch 1
 * taken by the first before the second starts it. */
static void one_epoch_then_ahead(struct pf_client *a, struct pf_client *b, struct seen *sa,
				 struct seen *sb, int ahead)
{
	epoch0_then_ahead(a, b, sa, sb, ahead);
	start(b, 1, 9);
	in_step(a, b, sa, sb);
	all_once(sa);
	all_once(sb);
}

/* The share kept epoch 1's batches for the member still in epoch 0: it
 * gets the whole epoch from the share, in the share's order. */
static void a_member_a_little_behind_at_an_epoch_gets_the_next_one_whole(void **state)
{
	struct pf_client *a = join_ok("next"), *b = join_ok("next");
	static struct seen sa, sb;
	Pf__Envelope *st;
	Pf__ShareStatus *sh;

	one_epoch_then_ahead(a, b, &sa, &sb, 8);
	assert_memory_equal(sa.picks, sb.picks, sizeof(sa.picks));
	st = td_status(td.sock);
	assert_non_null(st);
	sh = share_of(st, "next", getuid());
	assert_non_null(sh);
	assert_int_equal(sh->n_members, 2);
	for (size_t k = 0; k < 2; k++) {
		assert_int_equal(sh->members[k]->epoch, 1);
		assert_int_equal(sh->members[k]->delivered, NB);
		assert_int_equal(sh->members[k]->own_batches, 0);
	}
	pf__envelope__free_unpacked(st, NULL);
	assert_false(td_log_has(&td, "share 'next'", "joins epoch"));
	pf_close(a);
	pf_close(b);
	(void)state;
}

/* Kept only while the others have slots to go on with: the first member
 * is never held up, and the second gets what it missed on its own. */
static void what_is_kept_for_a_member_goes_back_when_the_others_need_it(void **state)
{
	struct pf_client *a = join_ok("far"), *b = join_ok("far");
	static struct seen sa, sb;

	one_epoch_then_ahead(a, b, &sa, &sb, NB / 2);
	assert_true(td_log_has(&td, "share 'far'", "has not started epoch 1 yet"));
	assert_true(td_log_has(&td, "share 'far': session", "joins epoch 1 at batch"));
	pf_close(a);
	pf_close(b);
	(void)state;
}

/* The first member leaves epoch 1 early: the producer stops filling, and
 * the member it was kept for gets what was kept, then the rest alone. */
static void the_kept_epoch_ends_whole_when_the_others_abandon_it(void **state)
{
	struct pf_client *a = join_ok("gone"), *b = join_ok("gone");
	static struct seen sa, sb;

	epoch0_then_ahead(a, b, &sa, &sb, 8);
	assert_int_equal(pf_abandon(a), 0);
	start(b, 1, 9);
	while (take(b, &sb))
		;
	all_once(&sb);
	/* The batches a took, b got from the share, in its order. */
	assert_memory_equal(sb.picks, sa.picks, (size_t)sa.npicks * sizeof(sa.picks[0]));
	pf_close(a);
	pf_close(b);
	(void)state;
}

/* A member that got the kept epoch and then stops taking: its slack does
 * not hold the first one up, and it loses nothing. */
static void a_member_that_rejoined_behind_and_stops_does_not_hold_up_the_others(void **state)
{
	struct pf_client *a = join_ok("pause"), *b = join_ok("pause");
	static struct seen sa, sb;

	epoch0_then_ahead(a, b, &sa, &sb, 8);
	start(b, 1, 9);
	for (int i = 0; i < 2; i++)
		assert_true(take(b, &sb));
	while (take(a, &sa)) /* b takes nothing meanwhile */
		;
	while (take(b, &sb))
		;
	all_once(&sa);
	all_once(&sb);
	assert_true(td_log_has(&td, "share 'pause': session", "batches behind the fastest"));
	pf_close(a);
	pf_close(b);
	(void)state;
}

static void a_member_that_dies_gives_back_what_it_held(void **state)
{
	struct pf_client *c = join_ok("death");
	static struct seen s;
	Pf__Envelope *st = NULL;
	Pf__ShareStatus *sh = NULL;
	double t0;

	memset(&s, 0, sizeof(s));
	die_holding();
	/* It left the share, its holds with it (a hang-only wait: how soon
	 * is the bench's to say). */
	t0 = td_now();
	for (;;) {
		st = td_status(td.sock);
		assert_non_null(st);
		sh = share_of(st, "death", getuid());
		assert_non_null(sh);
		if (sh->n_members == 1 || td_now() - t0 > 10 * td_patience())
			break;
		pf__envelope__free_unpacked(st, NULL);
		usleep(10000);
	}
	assert_int_equal(sh->n_members, 1);
	print_message("  the dead member was gone from status after %.1f ms\n",
		      (td_now() - t0) * 1e3);
	pf__envelope__free_unpacked(st, NULL);
	/* The survivor's epoch (the same epoch number, a new start: the
	 * dead one's epoch had no one left to receive it) runs whole. */
	start(c, 1, 0);
	while (take(c, &s))
		;
	all_once(&s);
	pf_close(c);
	(void)state;
}

static void mismatched_sessions_are_refused_naming_the_difference(void **state)
{
	struct pf_client *a = join_ok("strict"), *b, *d;
	uint64_t batches;
	int rc;

	b = join("strict", BATCH * 2, &rc);
	assert_int_equal(rc, -EINVAL);
	assert_non_null(strstr(pf_errmsg(b), "batch_size 16, not 32"));
	pf_close(b);
	d = join_ok("strict");
	start(a, 0, 5);
	assert_int_equal(pf_set_epoch(d, 0), 0);
	rc = pf_start_epoch(d, &(struct pf_epoch_opts){.order = PF_ORDER_SHUFFLE, .seed = 6},
			    &batches);
	assert_int_equal(rc, -EINVAL);
	assert_non_null(strstr(pf_errmsg(d), "seed 5, not 6"));
	/* The refusal disturbed no one: a's epoch runs whole. */
	{
		static struct seen s;

		memset(&s, 0, sizeof(s));
		while (take(a, &s))
			;
		all_once(&s);
	}
	pf_close(a);
	pf_close(d);
	(void)state;
}

static int other_user_joins(void *arg)
{
	int rc;
	struct pf_client *c = join("sweep2", BATCH, &rc);
	struct seen *s = calloc(1, sizeof(*s));
	struct pf_batch *b = NULL;

	(void)arg;
	if (rc || !s)
		return 1;
	if (pf_start_epoch(c, &(struct pf_epoch_opts){.order = PF_ORDER_SHUFFLE, .seed = 1}, NULL))
		return 2;
	/* A session of its own share: its first batch comes. */
	if (pf_next(c, 10000, &b) || !b)
		return 3;
	printf("other user's status sees %s\n", "its own share");
	pf_release(c, b, NULL);
	pf_close(c);
	free(s);
	return 0;
}

static void another_users_share_of_the_same_name_is_not_joined(void **state)
{
	struct pf_client *mine = join_ok("sweep2");
	struct passwd *pw = getpwnam("nobody");
	uid_t nobody = pw ? pw->pw_uid : 65534;
	pid_t pid;
	int status;

	if (geteuid() != 0) {
		pf_close(mine);
		print_message("skipped: needs root to act as another user (running as uid %u)\n",
			      (unsigned)geteuid());
		skip();
	}
	start(mine, 0, 1);
	/* The other user's session holds one batch, so its share lives while
	 * status is asked. */
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0)
		_exit(td_as_user(nobody, other_user_joins, NULL));
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_true(WIFEXITED(status));
	assert_int_equal(WEXITSTATUS(status), 0);
	/* Its share was another one: the log says two shares of that name
	 * were opened, one per uid, and ours kept one member. */
	assert_true(td_log_has(&td, "share 'sweep2' of uid 0 opened", NULL));
	{
		char want[64];

		snprintf(want, sizeof(want), "share 'sweep2' of uid %u opened", (unsigned)nobody);
		assert_true(td_log_has(&td, want, NULL));
	}
	{
		Pf__Envelope *st = td_status(td.sock);
		Pf__ShareStatus *sh;

		assert_non_null(st);
		sh = share_of(st, "sweep2", 0);
		assert_non_null(sh);
		assert_int_equal(sh->n_members, 1);
		pf__envelope__free_unpacked(st, NULL);
	}
	pf_close(mine);
	(void)state;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(members_of_a_share_get_the_same_batches_from_one_read),
		cmocka_unit_test(a_member_that_stops_taking_goes_on_alone_and_loses_nothing),
		cmocka_unit_test(a_member_that_starts_late_gets_what_it_missed_at_the_end),
		cmocka_unit_test(a_member_a_little_behind_at_an_epoch_gets_the_next_one_whole),
		cmocka_unit_test(what_is_kept_for_a_member_goes_back_when_the_others_need_it),
		cmocka_unit_test(the_kept_epoch_ends_whole_when_the_others_abandon_it),
		cmocka_unit_test(
			a_member_that_rejoined_behind_and_stops_does_not_hold_up_the_others),
		cmocka_unit_test(a_member_that_dies_gives_back_what_it_held),
		cmocka_unit_test(mismatched_sessions_are_refused_naming_the_difference),
		cmocka_unit_test(another_users_share_of_the_same_name_is_not_joined),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}
