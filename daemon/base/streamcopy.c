/*
 * streamcopy.c — memcpy with streaming stores, for slots a DMA engine reads
 * next (see streamcopy.h).
 */
#include "base/streamcopy.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__)
#include <emmintrin.h>
#define HAVE_STREAMING 1
#else
#define HAVE_STREAMING 0
#endif

/* Below this a copy is a few lines, which streaming gains nothing on: a
 * partial line written by streaming stores costs a partial write to memory. */
#define STREAM_MIN 256

static pthread_once_t streaming_once = PTHREAD_ONCE_INIT;
static bool streaming;

static void streaming_read(void)
{
	const char *v = getenv("PREFETCHD_CACHED_FILLS");

	streaming = HAVE_STREAMING && !(v && *v && strcmp(v, "0") != 0);
}

bool copy_streaming(void)
{
	pthread_once(&streaming_once, streaming_read);
	return streaming;
}

#if HAVE_STREAMING
/* The bulk in whole 64-byte lines of dst: four unaligned loads, four
 * streaming stores.  dst is 64-byte aligned here, so no line is written
 * by both kinds of store. */
static void stream_lines(uint8_t *dst, const uint8_t *src, size_t lines)
{
	for (size_t i = 0; i < lines; i++, dst += 64, src += 64) {
		__m128i a = _mm_loadu_si128((const __m128i *)src);
		__m128i b = _mm_loadu_si128((const __m128i *)(src + 16));
		__m128i c = _mm_loadu_si128((const __m128i *)(src + 32));
		__m128i d = _mm_loadu_si128((const __m128i *)(src + 48));

		_mm_stream_si128((__m128i *)dst, a);
		_mm_stream_si128((__m128i *)(dst + 16), b);
		_mm_stream_si128((__m128i *)(dst + 32), c);
		_mm_stream_si128((__m128i *)(dst + 48), d);
	}
}
#endif

void copy_streamed(void *dst, const void *src, size_t n)
{
#if HAVE_STREAMING
	uint8_t *d = dst;
	const uint8_t *s = src;
	size_t head, lines;

	if (n < STREAM_MIN) {
		memcpy(dst, src, n);
		return;
	}
	/* Up to dst's next line with ordinary stores, then whole lines
	 * streamed, then the tail. */
	head = (64 - ((uintptr_t)d & 63)) & 63;
	memcpy(d, s, head);
	d += head;
	s += head;
	n -= head;
	lines = n / 64;
	stream_lines(d, s, lines);
	memcpy(d + lines * 64, s + lines * 64, n - lines * 64);
#else
	memcpy(dst, src, n);
#endif
}

void copy_streamed_fence(void)
{
#if HAVE_STREAMING
	_mm_sfence();
#endif
}
