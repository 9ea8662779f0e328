/*
 * tokens.h — the header of an llm.c / modded-nanogpt token shard.
 *
 * A shard is 256 little-endian int32s, then header[2] uint16 tokens:
 *
 *   header[0] = 20240520   magic
 *   header[1] = 1          version (uint16 GPT-2 tokens)
 *   header[2] = T          token count, 1 .. INT32_MAX
 *   header[3..255]         unused (llm.c writes zeros; not checked)
 *   then 2 * T bytes       the tokens, little-endian uint16
 *
 * The file must be exactly 1024 + 2 * T bytes long, as llm.c's own loader
 * (dataloader.h) requires: a writer that wrote the tokens but not the right
 * count, or appended to a shard, is caught here and not by a trainer that
 * reads a window of garbage.  A short final shard is an ordinary shard with
 * a smaller T.
 *
 * DESIGN: a pure function, no state; called by the loop thread at dataset
 * load.  It never reads past `len`.
 */
#ifndef PF_TOKENS_H
#define PF_TOKENS_H

#include <stddef.h>
#include <stdint.h>

#define TOKENS_MAGIC	    20240520
#define TOKENS_VERSION	    1
#define TOKENS_HEADER_INTS  256
#define TOKENS_HEADER_BYTES (TOKENS_HEADER_INTS * 4)
#define TOKENS_TOKEN_BYTES  2 /* uint16 */

struct tokens_header {
	uint64_t tokens;      /* uint16 tokens in the shard, >= 1 */
	uint64_t data_offset; /* where token 0 starts: TOKENS_HEADER_BYTES */
};

/* Checks the header in buf[0..len) of a shard whose file is file_bytes long
 * and fills *out.  Returns 0; -ENODATA when len < TOKENS_HEADER_BYTES but the
 * file is long enough (the caller read too little); -EINVAL for a file that
 * is not a valid shard: shorter than the header, wrong magic, wrong version,
 * a count below 1, a count the file does not hold, or bytes after the last
 * token.  On error err receives a message without the file's name, saying
 * what is wrong with the figures that show it. */
int tokens_parse_header(const void *buf, size_t len, uint64_t file_bytes, struct tokens_header *out,
			char *err, size_t errlen);

#endif
