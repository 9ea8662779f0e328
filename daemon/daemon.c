/*
 * daemon.c — small lookups on the daemon's process-wide state (daemon.h),
 * kept out of main.c so unit tests link them with the daemon core.
 *
 * DESIGN: loop thread only.
 */
#include "daemon.h"

#include <string.h>
#include <time.h>

uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

const struct dataset *daemon_dataset(const struct daemon *d, const char *name)
{
	for (size_t i = 0; i < d->ndatasets; i++)
		if (strcmp(d->datasets[i].name, name) == 0)
			return &d->datasets[i];
	return NULL;
}
