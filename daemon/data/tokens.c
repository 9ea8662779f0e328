/*
 * tokens.c — the llm.c / modded-nanogpt token-shard header (see tokens.h).
 *
 * The checks run in the order a reader of the message needs them: a file
 * too short to hold a header says so before anything is read from it, a
 * wrong magic before a version (a file that is not a shard at all has no
 * meaningful version), and the size checks last, with both figures.
 *
 * DESIGN: a pure function with no state, so any thread may call it; in
 * practice the loop thread at dataset load.  Every figure from the header is
 * widened to 64 bits before arithmetic: a hostile count cannot wrap.
 */
#include "data/tokens.h"
#include "util.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* llm.c's Llama 3 shards: uint32 tokens under another magic.  Named in the
 * refusal because it is the likeliest wrong file to be handed. */
#define LLAMA3_MAGIC 20240801

/* header[i], little-endian, whatever the host's byte order. */
static int32_t header_int(const uint8_t *p, unsigned i)
{
	p += 4 * i;
	return (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
			 (uint32_t)p[3] << 24);
}

int tokens_parse_header(const void *buf, size_t len, uint64_t file_bytes, struct tokens_header *out,
			char *err, size_t errlen)
{
	const uint8_t *p = buf;
	uint64_t data_bytes, holds;
	int32_t magic, version, count;

	memset(out, 0, sizeof(*out));
	if (file_bytes < TOKENS_HEADER_BYTES) {
		set_err(err, errlen,
			"truncated: the file is %llu bytes, shorter than the %u-byte header",
			(unsigned long long)file_bytes, TOKENS_HEADER_BYTES);
		return -EINVAL;
	}
	if (len < TOKENS_HEADER_BYTES) {
		set_err(err, errlen, "only %zu of the %u header bytes were read", len,
			TOKENS_HEADER_BYTES);
		return -ENODATA;
	}
	magic = header_int(p, 0);
	if (magic != TOKENS_MAGIC) {
		const char *hint = "";

		if (memcmp(p, "\x93NUMPY", 6) == 0)
			hint = "; this is a .npy file (format = npy)";
		else if (magic == LLAMA3_MAGIC)
			hint = "; this is an llm.c Llama 3 shard (uint32 tokens), which is not "
			       "supported";
		set_err(err, errlen, "not a token shard: bad magic %d (expected %d)%s", magic,
			TOKENS_MAGIC, hint);
		return -EINVAL;
	}
	version = header_int(p, 1);
	if (version != TOKENS_VERSION) {
		set_err(err, errlen,
			"unsupported token shard version %d (only version %d, uint16 tokens, is "
			"read)",
			version, TOKENS_VERSION);
		return -EINVAL;
	}
	count = header_int(p, 2);
	if (count < 1) {
		set_err(err, errlen,
			"bad token count %d in the header (a shard holds at least one)", count);
		return -EINVAL;
	}
	data_bytes = file_bytes - TOKENS_HEADER_BYTES;
	holds = data_bytes / TOKENS_TOKEN_BYTES;
	if ((uint64_t)count > holds) {
		set_err(err, errlen,
			"truncated: the header says %d tokens but the file holds %llu (%llu bytes "
			"after the header)",
			count, (unsigned long long)holds, (unsigned long long)data_bytes);
		return -EINVAL;
	}
	if (data_bytes != (uint64_t)count * TOKENS_TOKEN_BYTES) {
		set_err(err, errlen,
			"the file has %llu bytes after the header, %llu more than its %d tokens "
			"take (appended to, or a wrong count?)",
			(unsigned long long)data_bytes,
			(unsigned long long)(data_bytes - (uint64_t)count * TOKENS_TOKEN_BYTES),
			count);
		return -EINVAL;
	}
	out->tokens = (uint64_t)count;
	out->data_offset = TOKENS_HEADER_BYTES;
	return 0;
}
