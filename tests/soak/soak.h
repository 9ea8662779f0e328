/*
 * soak.h — what soak.c (the leak soak) and hostile.c (its hostile mix)
 * share: the bystander's dataset, written by soak.c, and the mix itself.
 */
#ifndef PF_SOAK_H
#define PF_SOAK_H

#include "testutil.h"

/* rows.npy: the bystander's '|u1' rows. */
#define SOAK_BY_ROWS	  4096
#define SOAK_BY_ROW_BYTES 512
#define SOAK_BY_SEED	  0x50a6

/* For `seconds`, attackers of every kind next to a bystander on dataset
 * "rows" of the daemon t; `what` names the round in its lines.  0 when the bystander saw every
 * epoch byte-exact and every status within 100 ms and every attacker ran to the end; -1 after
 * saying what went wrong. */
int soak_hostile(const struct tdaemon *t, unsigned seconds, const char *what);

#endif
