/*
 * fuzz_tokens.c — libFuzzer harness: the token-shard header parser
 * (daemon/data/tokens.c).
 *
 * Input: byte 0 says how long the shard's file is (mode % 3: exactly what
 * the header's count needs plus a signed byte's worth of slack, the length
 * of the rest of the input, or the raw u64 in bytes 1-8); bytes 1-8 carry
 * the slack or the length; the rest is the buffer the header is parsed
 * from (any length, so short buffers are reached too).
 *
 * Checks, beyond ASan/UBSan's: an accepted header has magic 20240520,
 * version 1, a positive count, data at byte 1024, and a file exactly that
 * long; a refusal leaves *out zeroed and says why; -ENODATA only for a
 * short buffer of a long enough file; and the outcome is exactly what the
 * format in tokens.h prescribes, computed here from the bytes.
 *
 * DESIGN: one thread, no state.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/tokens.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void die(const char *what) __attribute__((noreturn));

static void die(const char *what)
{
	fprintf(stderr, "fuzz_tokens: %s\n", what);
	abort();
}

static int32_t word(const uint8_t *p, unsigned i)
{
	return (int32_t)((uint32_t)p[4 * i] | (uint32_t)p[4 * i + 1] << 8 |
			 (uint32_t)p[4 * i + 2] << 16 | (uint32_t)p[4 * i + 3] << 24);
}

/* The format's verdict, from tokens.h, without tokens.c. */
static int verdict(const uint8_t *h, size_t len, uint64_t file_bytes)
{
	if (file_bytes < TOKENS_HEADER_BYTES)
		return -EINVAL;
	if (len < TOKENS_HEADER_BYTES)
		return -ENODATA;
	if (word(h, 0) != TOKENS_MAGIC || word(h, 1) != TOKENS_VERSION || word(h, 2) < 1)
		return -EINVAL;
	if (file_bytes != TOKENS_HEADER_BYTES + 2 * (uint64_t)word(h, 2))
		return -EINVAL;
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct tokens_header th;
	uint64_t arg = 0, file_bytes;
	const uint8_t *h;
	size_t len;
	char err[256];
	int rc;

	if (size < 9)
		return 0;
	for (int i = 0; i < 8; i++)
		arg |= (uint64_t)data[1 + i] << (8 * i);
	h = data + 9;
	len = size - 9;
	switch (data[0] % 3) {
	case 0: {
		/* Near the exact length, where the off-by-ones live. */
		uint64_t count = len >= 12 ? (uint32_t)word(h, 2) : 0;

		file_bytes = TOKENS_HEADER_BYTES + 2 * count + (uint64_t)(int64_t)(int8_t)arg;
		break;
	}
	case 1: file_bytes = len; break;
	default: file_bytes = arg; break;
	}
	/* h ends where libFuzzer's allocation ends: a read past len is
	 * ASan's to catch. */
	err[0] = '\0';
	memset(&th, 0xa5, sizeof(th));
	rc = tokens_parse_header(h, len, file_bytes, &th, err, sizeof(err));
	if (rc != verdict(h, len, file_bytes))
		die("the parser's verdict differs from the format's");
	if (rc == 0) {
		if (th.tokens != (uint64_t)word(h, 2) || th.data_offset != TOKENS_HEADER_BYTES)
			die("an accepted header is described wrongly");
		if (err[0])
			die("an accepted header left a message");
	} else {
		if (th.tokens || th.data_offset)
			die("a refusal left *out filled");
		if (!err[0] || !memchr(err, '\0', sizeof(err)))
			die("a refusal without a message");
	}
	return 0;
}
