/*
 * share_key.c — what every session of a share must ask for alike, and
 * the first difference a request has (share.h: its refusals name it).
 *
 * DESIGN: loop thread only; reads a share, changes nothing.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "sess/share_int.h"

/* The first difference between what req asks and what share sh is, or
 * NULL. */
const char *share_open_differs(const struct share *sh, const Pf__OpenSession *req, char *why,
			       size_t len)
{
	const char *dev = req->device[0] ? req->device : "host";

	if (strcmp(sh->dataset, req->dataset) != 0)
		snprintf(why, len, "dataset '%s', not '%s'", sh->dataset, req->dataset);
	else if (strcmp(sh->device, dev) != 0)
		snprintf(why, len, "device %s, not %s", sh->device, dev);
	else if (sh->batch_size != req->batch_size)
		snprintf(why, len, "batch_size %u, not %u", sh->batch_size, req->batch_size);
	else if (sh->drop_last != req->drop_last)
		snprintf(why, len, "drop_last %s, not %s", sh->drop_last ? "on" : "off",
			 req->drop_last ? "on" : "off");
	else if (sh->augment != (req->augment ? req->augment : 1))
		snprintf(why, len, "augment %u, not %u", sh->augment,
			 req->augment ? req->augment : 1);
	else if (sh->picks_le != req->picks_le || sh->narrow != req->narrow)
		snprintf(why, len, "opened by another version of libprefetch");
	else
		return NULL;
	return why;
}

/* The first difference between two starts of the same epoch, or NULL. */
const char *share_start_differs(const Pf__StartEpoch *a, const Pf__StartEpoch *b, char *why,
				size_t len)
{
	if (a->order != b->order)
		snprintf(why, len, "order %d, not %d", a->order, b->order);
	else if (a->seed != b->seed)
		snprintf(why, len, "seed %" PRIu64 ", not %" PRIu64, a->seed, b->seed);
	else if (a->rank != b->rank ||
		 (a->world > 1 ? a->world : 1) != (b->world > 1 ? b->world : 1))
		snprintf(why, len, "rank %u of %u, not %u of %u", a->rank, a->world, b->rank,
			 b->world);
	else if (a->block_rows != b->block_rows || a->block_bytes != b->block_bytes ||
		 a->window_blocks != b->window_blocks)
		snprintf(why, len, "other block_shuffle blocks");
	else if (a->n_indices != b->n_indices ||
		 (a->n_indices && memcmp(a->indices, b->indices, a->n_indices * 8) != 0))
		snprintf(why, len, "another explicit order");
	else
		return NULL;
	return why;
}
