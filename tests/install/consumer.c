/*
 * consumer.c — a program from outside the tree, as a user of the installed
 * libprefetch writes one: test_install.sh builds it with nothing but what
 * `pkg-config libprefetch` says about a DESTDIR install, and runs it
 * against that install's libprefetch.so.0.
 *
 * It calls the library for real: pf_connect to a socket path that does not
 * exist must fail with -ENOENT and a message naming the path and the
 * cause.  It prints the file the library was loaded from (dladdr), so the
 * test can tell the installed library from build/'s.
 *
 *   consumer SOCKET_PATH   exit 0: as expected, 1: not (says why)
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include <prefetch.h>

int main(int argc, char **argv)
{
	struct pf_client *c = NULL;
	const char *msg;
	Dl_info info;
	int rc;

	if (argc != 2) {
		fprintf(stderr, "usage: consumer SOCKET_PATH\n");
		return 2;
	}
	if (!dladdr((void *)pf_connect, &info) || !info.dli_fname) {
		fprintf(stderr, "consumer: dladdr cannot say where pf_connect is\n");
		return 1;
	}
	printf("libprefetch: %s\n", info.dli_fname);
	rc = pf_connect(argv[1], &c);
	msg = pf_errmsg(c);
	printf("pf_connect: %d, %s\n", rc, msg ? msg : "(no message)");
	if (rc != -ENOENT || !msg || !strstr(msg, argv[1]) || !strstr(msg, strerror(ENOENT))) {
		fprintf(stderr,
			"consumer: expected -ENOENT (%d) and a message naming %s and '%s'\n",
			-ENOENT, argv[1], strerror(ENOENT));
		pf_close(c);
		return 1;
	}
	pf_close(c);
	return 0;
}
