/*
 * sess_ops.h — the input language of the session harness (fuzz_sess.c),
 * shared with mkcorpus.c, which writes seed scripts in it.
 *
 * An input is a script of actions.  Each action is one header byte, then
 * its argument bytes; a script that ends early reads zeros, so every byte
 * string is a valid script.  The header byte:
 *
 *   bits 0-3  the op (enum fz_op), plus 16 when bit 7 is set (taken
 *             modulo FZ_NOPS)
 *   bits 4-5  the client it acts on (0..2; 3 is taken as 0)
 *   bit 6     connect without the automatic Hello (a client that is not
 *             connected yet connects first, and normally says Hello at once)
 *
 * Arguments, one byte each unless said otherwise ("u64" is 8 bytes
 * little-endian; a byte at or above the "raw" threshold switches a small
 * choice to a raw value read from the bytes that follow):
 *
 *   HELLO       version (< 240: WIRE_VERSION, else version - 240);
 *               name length (% 48), name bytes
 *   OPEN        dataset (% FZ_NDATASETS: the harness's table plus unknown
 *               names); device (% FZ_NDEVICES); batch (< 200: % 17, < 240:
 *               17 + 4 * (b - 200), else u32); flags (bit 0 drop_last,
 *               bits 1-2 ipc, bit 3 a PCI bus id); augment (< 240: % 9,
 *               else u16 % 1025); min_depth, max_depth (< 240: % 20, else
 *               one of FZ_BIG_DEPTHS by b - 240); name length (% 80), bytes
 *   START       epoch (< 200: the client's epoch + 1, < 220: its epoch,
 *               < 240: 0, else u64); order (< 240: % 4, paced included,
 *               else b as an invalid enum); seed (< 255: b, else u64); world (% 5);
 *               rank (% 6); start_batch (< 240: % 6, else u64); count of
 *               indices (% 33), then each index (< 250: b, else u64)
 *   ACK         epoch (< 200: the client's, < 230: its epoch - 1, else u64);
 *               seq (< 250: the next one to ack, else u64); wait (< 250:
 *               b / 10 s, else a raw double from u64)
 *   RELEASE     which held batch (% the held count; none held: nothing)
 *   RELEASE_ANY slot (int8); epoch (< 250: the client's, else u64); seq
 *               (< 250: b, else u64)
 *   ABANDON     epoch (as ACK)
 *   PROBE       free, total (< 255: b * 256 MiB, else u64)
 *   DEPTH       session (% 4: 0, its own id, another client's id, u64);
 *               target (< 240: % 20, else u32); automatic (bit 0)
 *   STATUS      -
 *   POOL        dataset (as OPEN); action (< 240: % 3, else b)
 *   UNEXPECTED  which daemon-to-client message to send (% 10)
 *   RAW         length, then that many bytes written as they are
 *   COMPLETE    count (255: every pending reader job, else 1 + b % 4),
 *               then for each job which pending one (% pending)
 *   AHEAD       which pending order build to run (% pending)
 *   CLOSE       mode (% 4: close; close after half a frame; shut down the
 *               writing side and let the daemon close; send a request
 *               with a descriptor attached, which the daemon ends the
 *               connection for)
 *   LOAD        epoch (as ACK); end (b % 8 == 7); count of picks (% 24),
 *               then each pick (< 250: b, else u64)
 */
#ifndef PF_FUZZ_SESS_OPS_H
#define PF_FUZZ_SESS_OPS_H

/* Zero bytes, the commonest in mutated inputs, are cheap actions that do
 * nothing when there is nothing to do. */
enum fz_op {
	FZ_COMPLETE,
	FZ_AHEAD,
	FZ_HELLO,
	FZ_OPEN,
	FZ_START,
	FZ_ACK,
	FZ_RELEASE,
	FZ_RELEASE_ANY,
	FZ_ABANDON,
	FZ_PROBE,
	FZ_DEPTH,
	FZ_STATUS,
	FZ_POOL,
	FZ_UNEXPECTED,
	FZ_RAW,
	FZ_CLOSE,
	FZ_LOAD,
	FZ_NOPS
};

#define FZ_CLIENTS	   3
#define FZ_NO_HELLO	   0x40
#define FZ_HDR(op, client) ((unsigned char)(((op)&15) | ((op)&16) << 3 | (client) << 4))

/* OPEN's dataset choices: "xy" (two fields, mmap), "wide" (a 24 KiB row:
 * batches split into parts), "pq" (pread, a field in two shards), "broken"
 * (failed to load), "cut" and "cutmap" (truncated after load: pread and
 * mmap), then names the daemon does not serve. */
enum fz_set_index { FZ_XY, FZ_WIDE, FZ_PQ, FZ_BROKEN, FZ_CUT, FZ_CUTMAP, FZ_UNKNOWN };
#define FZ_NDATASETS 8
/* OPEN's device choices: "", "host", then CUDA and malformed devices. */
#define FZ_NDEVICES 8
/* Depth bounds past 239: overflow and extreme cases. */
#define FZ_BIG_DEPTHS                                                                              \
	{                                                                                          \
		0xffffffffu, 0xfffffffeu, 0xfffffffdu, 0x80000000u, 0x7fffffffu, 65536u, 1000u     \
	}

#endif
