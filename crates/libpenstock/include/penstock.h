/*
 * penstock.h: libpenstock, penstock's engine for any program with a C FFI.
 *
 * Generated from crates/libpenstock by cbindgen (tests/header.rs); do not edit.
 * Build against the installed library: cc prog.c $(pkg-config --cflags --libs penstock)
 * Guide: docs/c-api.md. Every call is thread-safe; every failing call leaves a message for
 * penstock_last_error() on the calling thread.
 */

#ifndef PENSTOCK_H
#define PENSTOCK_H

#include <stddef.h>
#include <stdint.h>

// The default of `penstock_conn_set_timeout`, in ms.
#define PENSTOCK_CONN_TIMEOUT_MS 10000

// `penstock_stream` flag: move the bytes with read(2)/write(2) through a buffer (the
// baseline data path) instead of the one the planner picks (sendfile, splice, io_uring).
#define PENSTOCK_STREAM_COPY 1

// `penstock_stream` flag: the `rt` class — the stream is admitted against the engine's disk
// and network capacity first (`PENSTOCK_EREFUSED` when it does not fit) and its reads go
// first. Needs a `period_ns`.
#define PENSTOCK_STREAM_RT 2

// Where a stream is in its life (`penstock_stream_state_t.state`; `STATE`'s second word).
typedef enum penstock_state {
  // Opened, not started.
  PENSTOCK_STATE_PENDING = 0,
  // START is opening its endpoints.
  PENSTOCK_STATE_STARTING = 1,
  // A listening endpoint waits for its peer.
  PENSTOCK_STATE_WAITING = 2,
  // Moving bytes.
  PENSTOCK_STATE_RUNNING = 3,
  // Paused: no new I/O until RESUME.
  PENSTOCK_STATE_PAUSED = 4,
  // Every byte asked for was sent.
  PENSTOCK_STATE_DONE = 5,
  // It failed, or was cancelled: `penstock_stream_wait` says why.
  PENSTOCK_STATE_FAILED = 6,
} penstock_state;

// What a call returns when it fails (negative), or `PENSTOCK_OK`. Calls return these as an
// `int` (a descriptor or a byte count when positive); compare with the names.
typedef enum penstock_error {
  // Success.
  PENSTOCK_OK = 0,
  // A NULL pointer where the call needs one.
  PENSTOCK_ENULL = -1,
  // An invalid argument: an endpoint name, an options string, a configuration value, flags,
  // a string that is not UTF-8; or a stream the engine's planner refuses.
  PENSTOCK_EINVAL = -2,
  // Not a live handle: closed or freed already, or never returned by the library.
  PENSTOCK_EHANDLE = -3,
  // An `fd:N` (or a `penstock_stream` descriptor) that is not open.
  PENSTOCK_EBADF = -4,
  // An `fd:N` descriptor of the wrong kind or mode for its part: a directory, a listening
  // socket, a read-only target, a UDP target that is not connected.
  PENSTOCK_EFD = -5,
  // Not permitted: a control descriptor asked about another stream.
  PENSTOCK_EPERM = -6,
  // No such stream: it was closed (or expired).
  PENSTOCK_ENOSTREAM = -7,
  // The stream is not in a state that allows this (starting a started stream, pausing a
  // pending one, anything but close on a finished one).
  PENSTOCK_ESTATE = -8,
  // Refused by admission control or a limit (streams, buffers): try later or ask for less.
  PENSTOCK_EREFUSED = -9,
  // An endpoint could not be opened, or the stream failed while running.
  PENSTOCK_EIO = -10,
  // Not supported here (`path=uring` without io_uring).
  PENSTOCK_ENOTSUP = -11,
  // The wait ended before the stream did; or the stream moved nothing for its send timeout.
  PENSTOCK_ETIMEDOUT = -12,
  // The stream was cancelled.
  PENSTOCK_ECANCELED = -13,
  // A system resource ran out (a socketpair, a thread).
  PENSTOCK_ESYS = -14,
  // A bug in the library: a panic was caught at the boundary (the message says where).
  PENSTOCK_EPANIC = -15,
} penstock_error;

// A connection to a running server's Unix control socket (opaque). Made by
// `penstock_connect`, ended by `penstock_conn_free`.
typedef struct penstock_conn penstock_conn;

// An engine (opaque). Made by `penstock_engine_new`, ended by `penstock_engine_free`.
typedef struct penstock_engine penstock_engine;

// An upcall (opaque). Made by `penstock_rtu_create`, ended by `penstock_rtu_free`.
typedef struct penstock_rtu penstock_rtu;

// A stream held by a handle (opaque). Made by `penstock_stream_open`, ended by
// `penstock_stream_close`. (Not `penstock_stream`: that name is the one-shot call's.)
typedef struct penstock_stream_t penstock_stream_t;

// An engine's limits. Fill it with `penstock_config_default`, change what you need, pass it
// to `penstock_engine_new` (which checks every field and says which one it refuses).
typedef struct penstock_config {
  // Worker threads (event loops), 1 to 1024. Default: the CPUs available.
  uint32_t workers;
  // Streams open at once (cues and typed streams together, running or not), 1 to 1048576.
  // Default 4096.
  uint32_t streams_max;
  // Buffers in each worker's io_uring pool (the uring path's read-ahead and in-flight
  // sends), 1 to 65535. Default 32.
  uint32_t pool_buffers;
  // Bytes per pool buffer: the largest unit of a paced or uring-path stream; a multiple of
  // 4096. Default 1048576.
  uint32_t buffer_bytes;
  // A stream that moves no byte for this long fails (`PENSTOCK_ETIMEDOUT`); 0: never.
  // Default 60000.
  uint64_t send_timeout_ms;
  // A control descriptor's stream not started within this long is closed, and a finished
  // one whose descriptor is still open is forgotten this long after it ended (typed
  // streams never expire: their handle closes them). Default 60000; at least 1.
  uint64_t pending_timeout_ms;
  // A `tcp://` endpoint's connect gives up after this long. Default 10000; at least 1.
  uint64_t connect_timeout_ms;
  // A `tcp-listen://` or `unix-listen:` endpoint waits this long for its peer after START.
  // Default 60000; at least 1.
  uint64_t accept_timeout_ms;
  // A control descriptor whose stream is closed is closed by the library after this long
  // without a command. Default 300000; at least 1.
  uint64_t idle_timeout_ms;
} penstock_config;

// An upcall's function: called with the `arg` given to `penstock_rtu_create`, on one of the
// engine's worker threads. It must not block (no sleep, no lock another thread holds, no
// wait on a stream or an upcall): while it runs, that worker sends nothing.
typedef void (*penstock_rtu_fn)(void *arg);

// What `penstock_rtu_stats` and `penstock_rtu_free` report.
typedef struct penstock_rtu_stats_t {
  // Activations run (the callback called).
  uint64_t activations;
  // Activations whose callback used more CPU time than `budget_ns`.
  uint64_t overruns;
  // Activations that started later than `period_ns - budget_ns` after their release.
  uint64_t misses;
  // Activations never run: their period had passed when the previous one ended.
  uint64_t skipped;
  // Lateness (release to start of the callback), in ns: median, 99th percentile, most.
  // From `penstock_rtu_stats`: the upper ends of power-of-two buckets (never below the
  // true figure, less than twice it; the maximum is exact); from `penstock_rtu_free`:
  // within 1/2048 of the truth.
  uint64_t lateness_p50_ns;
  uint64_t lateness_p99_ns;
  uint64_t lateness_max_ns;
  // The most CPU time and wall time one activation took, and the CPU time of all, in ns.
  uint64_t cpu_max_ns;
  uint64_t wall_max_ns;
  uint64_t cpu_total_ns;
  // 1 while the upcall is on its worker; 0 once it was stopped (or its engine freed).
  int running;
} penstock_rtu_stats_t;

// What `penstock_stream_state` reports.
typedef struct penstock_stream_state_t {
  enum penstock_state state;
  // Where the stream is in its source: the next byte it sends.
  uint64_t offset;
  // Bytes that reached the target.
  uint64_t sent;
  // Bytes still to send; -1: to the end of the source.
  int64_t remaining;
  // The pace a RATE or SCHEDULE sets, in bytes per second; 0: as fast as possible.
  uint64_t rate_bytes_per_s;
  // Paced units sent (those the lateness figures count).
  uint64_t units_paced;
  // Lateness of the paced units, in ns: the median, the 99th percentile and the most, each
  // as the upper end of a power-of-two bucket (never below the true figure, less than
  // twice it); 0 for a burst stream.
  uint64_t lateness_p50_ns;
  uint64_t lateness_p99_ns;
  uint64_t lateness_max_ns;
  // Paced units later than their deadline by more than a period.
  uint64_t misses;
} penstock_stream_state_t;

#ifdef __cplusplus
extern "C" {
#endif // __cplusplus

// The library's version, `MAJOR.MINOR.PATCH` (a static string; never free it).
const char *penstock_version(void);

// Connects to a running `penstock serve`'s Unix control socket (`--control-unix PATH`,
// `control.unix`) and writes the connection to `*out`. Waits on the server (each reply, each
// send) are bounded by a timeout, 10 s unless `penstock_conn_set_timeout` says otherwise.
// What the connection may do is the server's decision (`docs/security.md`): a peer whose
// uid or gid the socket allows may open streams and pass descriptors.
//
// # Safety
// `socket_path` is NULL or a NUL-terminated string; `out` is NULL or writable.
int penstock_connect(const char *socket_path, struct penstock_conn **out);

// Sets how long the connection's calls wait for the server (each send, each reply), in ms,
// at least 1. `PENSTOCK_OK`, or `PENSTOCK_EINVAL` for 0.
int penstock_conn_set_timeout(struct penstock_conn *conn, uint64_t timeout_ms);

// Closes the connection. Streams it opened are closed by the server (cancelled if running)
// unless they were opened `DETACHED`. NULL is ignored.
void penstock_conn_free(struct penstock_conn *conn);

// `penstock_cue()`'s shape over a connection to a running server: opens a stream from
// `src` to `dst` *in the server* and returns its **control descriptor** (≥ 0), or a
// negative `PENSTOCK_E…` code with the server's reply in `penstock_last_error()`.
//
// `src` and `dst` are `fd:N` — a descriptor of this process (a file, an accepted socket, a
// pipe…), handed to the server by SCM_RIGHTS with the line (the server holds its own
// duplicate: the caller may close N at once) — or an endpoint name the server opens under
// its own access policy. `options` as `penstock_cue`'s (NULL: none). The line sent is
// `CUE src dst options` (docs/control-protocol.md); the server answers with the stream's
// own descriptor attached, which this call returns: write the control protocol's lines to
// it (`START`, `STATE`, `SEEK n`, `CLOSE`…, the id left out) and read one reply per line,
// exactly as on `penstock_cue()`'s. The stream runs like any of the server's (admission,
// QoS class, pacing, metrics) and belongs to that descriptor, not to `conn`: closing it
// closes the stream unless the options said `DETACHED` (then it runs to its end), and
// `penstock_conn_free` leaves it alone. Refused (`PENSTOCK_EPERM`) unless the server allows
// this process's uid or gid by SO_PEERCRED.
//
// # Safety
// `src`, `dst` and `options` are each NULL or a NUL-terminated string.
int penstock_conn_cue(struct penstock_conn *conn, const char *src, const char *dst, const char *options);

// Sends one control-protocol line (`START 7`, `STATE 7`, `CLOSE 7`, ...; no line break) and
// reads its reply: returns the reply code (200 to 599) and copies the reply's text — for a
// multi-line reply its first line (the STATE line) — NUL-terminated, cut to fit, into
// `reply` (`reply_len` bytes; NULL or 0: not copied). A negative `PENSTOCK_E…` code when the
// line could not be sent or no reply came in time.
//
// # Safety
// `line` is NULL or a NUL-terminated string; `reply` is NULL or `reply_len` writable bytes.
int penstock_conn_command(struct penstock_conn *conn, const char *line, char *reply, size_t reply_len);

// Cues' `cue(src, dst)`: opens a stream from `src` to `dst` and returns its **control
// descriptor** (≥ 0), or a negative `PENSTOCK_E…` code.
//
// `src` and `dst` are endpoint names (a path, `tcp://HOST:PORT`, `udp://HOST:PORT`,
// `unix:PATH`, `tcp-listen://…`, …) or `fd:N`, a descriptor of the caller — a regular file,
// a block device, a pipe, a TCP, UDP or Unix socket — which is duplicated now: the caller
// may close its own at once. A socket passed so is made non-blocking (the flag is shared
// with the caller's descriptor). `options` (NULL or "": none) are `OPEN`'s, space-separated:
// `class=rt|bulk rate=R period=D unit=SIZE schedule=K,T buffers=N offset=SIZE length=SIZE
// path=auto|copy|sendfile|splice|uring DETACHED TRUNCATE` (`docs/control-protocol.md`).
// Admission control decides now (`PENSTOCK_EREFUSED`).
//
// The descriptor is one end of a socketpair (close-on-exec) served by a thread of the
// library: write the control protocol's lines to it and read one reply per line — `START`,
// `PAUSE`, `RESUME`, `SEEK n`, `LENGTH n`, `UNIT n`, `RATE r`, `SCHEDULE k,t`, `STATE`,
// `CLOSE [NOW]`, `HELP`, `QUIT`; the stream's id may be left out, and no other stream can
// be reached through it. It can be polled, and passed to another process. Closing it closes
// the stream (cancelling it if still running) unless the options said `DETACHED`: a
// detached stream runs to its end and is then forgotten (one never started, or paused, is
// closed with its descriptor: nobody could start or resume it any more).
//
// # Safety
// `src`, `dst` and `options` are each NULL or a NUL-terminated string.
int penstock_cue(struct penstock_engine *engine, const char *src, const char *dst, const char *options);

// Fills `*cfg` with the defaults. `PENSTOCK_ENULL` when `cfg` is NULL.
//
// # Safety
// `cfg` is NULL or points to a writable `penstock_config`.
int penstock_config_default(struct penstock_config *cfg);

// Starts an engine with `cfg` (NULL: the defaults). NULL on failure, with
// `penstock_last_error()` saying why (an invalid field names itself). Without io_uring (a
// sysctl, seccomp) the engine still runs, on the copy, sendfile and splice paths.
//
// # Safety
// `cfg` is NULL or points to a readable `penstock_config`.
struct penstock_engine *penstock_engine_new(const struct penstock_config *cfg);

// Stops and frees an engine: its control descriptors are answered `421` and closed, its
// streams cancelled. Streams still open by handle stay valid handles whose calls fail
// (`PENSTOCK_ENOSTREAM`) until `penstock_stream_close`. NULL is ignored; an unknown handle
// sets the last error (`PENSTOCK_EHANDLE`) and is otherwise ignored.
void penstock_engine_free(struct penstock_engine *engine);

// Waits until none of the engine's streams is starting, waiting for its peer or running —
// a graceful stop before `penstock_engine_free` (which cancels what still runs) — at most
// `timeout_ms` (negative: as long as it takes). Pending and paused streams do not count.
// `PENSTOCK_OK`, or `PENSTOCK_ETIMEDOUT` when streams still ran at the timeout.
int penstock_engine_drain(struct penstock_engine *engine, int64_t timeout_ms);

// The message of the last call on this thread that failed: what went wrong and, where it
// helps, what would be accepted. An empty string when no call has failed yet. The pointer
// stays valid until the next failing call on this thread; copy the text to keep it.
const char *penstock_last_error(void);

// The code (`PENSTOCK_E…`) of the last call on this thread that failed; `PENSTOCK_OK` when
// none has. For calls that return a pointer (`penstock_engine_new`), this is how the code
// of a NULL return is found.
int penstock_last_error_code(void);

// A short fixed description of an error code (a static string; never free it).
const char *penstock_strerror(int code);

// Streams `src_fd` to `dst_fd` and returns when done: the bytes sent (≥ 0), or a negative
// `PENSTOCK_E…` code with `penstock_last_error()` saying why (how many bytes had gone is in
// the message).
//
// Both are descriptors of the caller, as with `fd:N` (duplicated; the caller's stay open and
// are the caller's to close): a regular file or block device is read from its start to its
// end; a pipe or socket until end of file. `period_ns` 0 sends as fast as possible (a burst);
// otherwise one `unit` every `period_ns` (a periodic stream, paced by the engine's EDF
// dispatcher). `unit` is the bytes per read and send, one datagram on UDP (0: the planner's
// default; 1316 for a periodic stream). `flags`: 0, or `PENSTOCK_STREAM_COPY`,
// `PENSTOCK_STREAM_RT`.
//
// Each call runs a private engine of one worker (set up and torn down by the call: a ring
// and a pool of at least 8 MiB), so a program that streams often is better served by
// `penstock_engine_new` and `penstock_cue` or `penstock_stream_open`.
int64_t penstock_stream(int src_fd, int dst_fd, uint32_t flags, uint64_t period_ns, uint64_t unit);

// Creates a Real-Time Upcall on `engine`: `callback(arg)` every `period_ns`, each call
// declared to need at most `budget_ns` of CPU time. Admission decides now: a budget of 0 or
// above the period, a period out of range, or a set of upcalls on the chosen worker that
// would no longer be schedulable gives `PENSTOCK_EREFUSED` (the message names the
// utilization and the bound); nothing runs then. On success `*out` holds the upcall and
// `PENSTOCK_OK` is returned. The callback runs on a worker of the engine, in the same
// EDF/RM order as the streams' paced units, never preempted: it must not block
// (`docs/rtu.md`). An overrun (more CPU than `budget_ns`) is counted, never cut short.
//
// # Safety
// `out` is NULL or points to a writable `penstock_rtu *`. `callback` may be called with
// `arg` from another thread until `penstock_rtu_free(rtu)` (or `penstock_engine_free`)
// returns; it must not unwind.
int penstock_rtu_create(struct penstock_engine *engine, uint64_t period_ns, uint64_t budget_ns, penstock_rtu_fn callback, void *arg, struct penstock_rtu **out);

// Fills `*stats` with the upcall's live counts. `PENSTOCK_OK`, `PENSTOCK_ENULL`, or
// `PENSTOCK_EHANDLE` for a freed upcall.
//
// # Safety
// `stats` is NULL or points to a writable `penstock_rtu_stats_t`.
int penstock_rtu_stats(struct penstock_rtu *rtu, struct penstock_rtu_stats_t *stats);

// MARS's `rtu_suspend`: asks the upcall's worker to take it off its queue, which it does at
// its next turn (an activation in progress ends first; `penstock_rtu_stats`' `activations`
// then stop). With `keep` not 0 it keeps its
// CPU reservation (`penstock_rtu_run` cannot be refused); with 0 the CPU goes back to
// admission now. Suspending a suspended upcall changes nothing. `PENSTOCK_OK`;
// `PENSTOCK_ESTATE` once the upcall has ended; `PENSTOCK_EHANDLE` for a freed one.
int penstock_rtu_suspend(struct penstock_rtu *rtu, int keep);

// MARS's `rtu_run`: puts a suspended upcall back on its worker, its next activation
// released at once. One suspended without its reservation asks admission again (on the
// same worker): `PENSTOCK_EREFUSED` naming the utilization leaves it suspended. Running a
// running upcall changes nothing. `PENSTOCK_OK`; `PENSTOCK_ESTATE` once it has ended;
// `PENSTOCK_EHANDLE` for a freed one.
int penstock_rtu_run(struct penstock_rtu *rtu);

// Stops an upcall (waiting for an activation in progress to end: the callback is not
// called after this returns) and frees it; with `report` not NULL, fills it with the
// exact figures of its whole run. `PENSTOCK_OK`; `PENSTOCK_EHANDLE` if its engine was freed
// first (the upcall stopped then; `*report` is not written); `PENSTOCK_EHANDLE` or
// `PENSTOCK_ENULL` for a bad handle. The handle is dead afterwards in every case.
//
// # Safety
// `report` is NULL or points to a writable `penstock_rtu_stats_t`.
int penstock_rtu_free(struct penstock_rtu *rtu, struct penstock_rtu_stats_t *report);

// Opens a stream as `penstock_cue` does (same names, `fd:N`, options and admission), held by
// a handle instead of a control descriptor; `*out` receives it. It does not expire: it is
// there until `penstock_stream_close`, whatever its state.
//
// # Safety
// `src`, `dst` and `options` are each NULL or a NUL-terminated string; `out` is NULL or
// points to a writable `penstock_stream_t *`.
int penstock_stream_open(struct penstock_engine *engine, const char *src, const char *dst, const char *options, struct penstock_stream_t **out);

// `START`: opens the endpoints not given as `fd:N` and starts the transfer. A listening
// endpoint is bound now and its peer awaited in the background (`PENSTOCK_STATE_WAITING`).
int penstock_stream_start(struct penstock_stream_t *stream);

// `PAUSE`: no new I/O from now on (what is in flight completes); a paced stream's later
// deadlines move by the length of the pause.
int penstock_stream_pause(struct penstock_stream_t *stream);

// `RESUME` a paused stream.
int penstock_stream_resume(struct penstock_stream_t *stream);

// `CLASS`: moves the stream to disk class `class` (`"rt"`, `"bulk"` or a class the engine
// was configured with) without stopping it: the engine re-admits it there (into `rt`, the
// rate it was opened with) and its next reads are queued in the new class.
// `PENSTOCK_EREFUSED` when admission refuses (`penstock_last_error` names the resource, e.g.
// disk), `PENSTOCK_EINVAL` for a class the engine does not have; nothing changes then.
//
// # Safety
// `class` is NULL or a NUL-terminated string.
int penstock_stream_class(struct penstock_stream_t *stream, const char *class_);

// `STATE`, as a struct: `*out` receives the stream's state and figures.
//
// # Safety
// `out` is NULL or points to a writable `penstock_stream_state_t`.
int penstock_stream_state(struct penstock_stream_t *stream, struct penstock_stream_state_t *out);

// Waits for the stream to end, at most `timeout_ms` (negative: as long as it takes).
// `PENSTOCK_OK` when it is done (every byte asked for sent); `PENSTOCK_ETIMEDOUT` when the
// wait ended first; `PENSTOCK_ECANCELED` after `penstock_stream_cancel`; when it failed,
// `PENSTOCK_EIO` (or `PENSTOCK_ETIMEDOUT` for a stream that stalled) with the engine's reason
// in `penstock_last_error()`. A stream that was never started waits until it is (from
// another thread) or the timeout.
int penstock_stream_wait(struct penstock_stream_t *stream, int64_t timeout_ms);

// Stops the stream (in-flight I/O completes first) and keeps the handle: its state becomes
// `PENSTOCK_STATE_FAILED`, `penstock_stream_wait` returns `PENSTOCK_ECANCELED`.
// `PENSTOCK_ESTATE` when it had ended already.
int penstock_stream_cancel(struct penstock_stream_t *stream);

// Closes the stream (cancelling it if it still runs; in-flight I/O completes first) and
// frees the handle, which is dead from then on (a later call with it gives
// `PENSTOCK_EHANDLE`). NULL gives `PENSTOCK_ENULL`.
int penstock_stream_close(struct penstock_stream_t *stream);

#ifdef __cplusplus
}  // extern "C"
#endif  // __cplusplus

#endif  /* PENSTOCK_H */
