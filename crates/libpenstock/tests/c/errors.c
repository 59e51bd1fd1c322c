/* Bad input never aborts the caller: NULL pointers, closed and wrong-kind descriptors, garbage
 * names and options, invalid configurations, made-up and dead handles, calls on closed or
 * finished streams: each gives its error code and a message that says what was wrong. */
#include "common.h"

static void null_pointers(penstock_engine *e) {
    penstock_stream_t *st = NULL;
    CHECK_ERR(penstock_config_default(NULL), PENSTOCK_ENULL, "cfg is NULL");
    CHECK_ERR(penstock_cue(NULL, "a", "b", NULL), PENSTOCK_ENULL, "penstock_engine is NULL");
    CHECK_ERR(penstock_cue(e, NULL, "b", NULL), PENSTOCK_ENULL, "src is NULL");
    CHECK_ERR(penstock_cue(e, "a", NULL, NULL), PENSTOCK_ENULL, "dst is NULL");
    CHECK_ERR(penstock_stream_open(e, "a", "b", NULL, NULL), PENSTOCK_ENULL, "out is NULL");
    CHECK_ERR(penstock_stream_open(NULL, "a", "b", NULL, &st), PENSTOCK_ENULL, "NULL");
    CHECK(st == NULL);
    CHECK_ERR(penstock_stream_start(NULL), PENSTOCK_ENULL, "is NULL");
    CHECK_ERR(penstock_stream_pause(NULL), PENSTOCK_ENULL, "is NULL");
    CHECK_ERR(penstock_stream_class(NULL, "rt"), PENSTOCK_ENULL, "is NULL");
    CHECK_ERR(penstock_stream_resume(NULL), PENSTOCK_ENULL, "is NULL");
    CHECK_ERR(penstock_stream_wait(NULL, 0), PENSTOCK_ENULL, "is NULL");
    CHECK_ERR(penstock_stream_cancel(NULL), PENSTOCK_ENULL, "is NULL");
    CHECK_ERR(penstock_stream_close(NULL), PENSTOCK_ENULL, "is NULL");
    penstock_stream_state_t s;
    CHECK_ERR(penstock_stream_state(NULL, &s), PENSTOCK_ENULL, "is NULL");
    penstock_engine_free(NULL); /* ignored, as free(NULL) */
}

static void made_up_and_dead_handles(penstock_engine *e) {
    penstock_stream_t *fake = (penstock_stream_t *)(uintptr_t)0xdead0;
    CHECK_ERR(penstock_stream_start(fake), PENSTOCK_EHANDLE, "not a live penstock_stream_t");
    /* An engine handle is not a stream handle, nor the other way round. */
    CHECK_ERR(penstock_stream_start((penstock_stream_t *)e), PENSTOCK_EHANDLE, "not a live");
    char path[64];
    make_file(path, 10);
    penstock_stream_t *st = NULL;
    CHECK(penstock_stream_open(e, path, "/dev/null", "TRUNCATE", &st) == PENSTOCK_OK);
    CHECK_ERR(penstock_cue((penstock_engine *)st, path, "/dev/null", NULL), PENSTOCK_EHANDLE,
              "not a live penstock_engine");
    CHECK(penstock_stream_close(st) == PENSTOCK_OK);
    /* Closed: dead from now on. */
    CHECK_ERR(penstock_stream_start(st), PENSTOCK_EHANDLE, "closed or freed already");
    CHECK_ERR(penstock_stream_close(st), PENSTOCK_EHANDLE, "closed or freed already");
    penstock_stream_state_t s;
    CHECK_ERR(penstock_stream_state(st, &s), PENSTOCK_EHANDLE, "not a live");
    unlink(path);
}

static void bad_names_and_options(penstock_engine *e) {
    char path[64];
    make_file(path, 10);
    CHECK_ERR(penstock_cue(e, path, "tcp:127.0.0.1:80", NULL), PENSTOCK_EINVAL,
              "write tcp://HOST:PORT");
    CHECK_ERR(penstock_cue(e, "", "/dev/null", NULL), PENSTOCK_EINVAL, "empty endpoint name");
    CHECK_ERR(penstock_cue(e, "fd:-3", "/dev/null", NULL), PENSTOCK_EINVAL, "fd:N takes");
    CHECK_ERR(penstock_cue(e, "udp://127.0.0.1:9", "/dev/null", NULL), PENSTOCK_EINVAL,
              "cannot be a source");
    CHECK_ERR(penstock_cue(e, path, "/dev/null", "colour=red"), PENSTOCK_EINVAL,
              "unknown option");
    CHECK_ERR(penstock_cue(e, path, "/dev/null", "rate=fast"), PENSTOCK_EINVAL, "rate");
    CHECK_ERR(penstock_cue(e, path, "/dev/null", "unit=0"), PENSTOCK_EINVAL, "non-zero");
    CHECK_ERR(penstock_cue(e, path, "/dev/null", "unit=1 unit=2"), PENSTOCK_EINVAL, "twice");
    CHECK_ERR(penstock_cue(e, path, "/dev/null", "\x01\x02garbage\n"), PENSTOCK_EINVAL,
              "control character");
    CHECK_ERR(penstock_cue(e, path, "/dev/null", "class=rt"), PENSTOCK_EINVAL,
              "class=rt needs rate=");
    CHECK_ERR(penstock_cue(e, "\xff\xfe", "/dev/null", NULL), PENSTOCK_EINVAL, "not UTF-8");
    char big[8192];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = 0;
    CHECK_ERR(penstock_cue(e, path, "/dev/null", big), PENSTOCK_EINVAL, "longer than");
    /* A name that parses but cannot be opened fails at START, saying why. */
    penstock_stream_t *st = NULL;
    CHECK(penstock_stream_open(e, "/nonexistent/file", "/dev/null", NULL, &st) == PENSTOCK_OK);
    CHECK_ERR(penstock_stream_start(st), PENSTOCK_EIO, "/nonexistent/file");
    penstock_stream_state_t s;
    CHECK(penstock_stream_state(st, &s) == PENSTOCK_OK && s.state == PENSTOCK_STATE_FAILED);
    CHECK_ERR(penstock_stream_wait(st, -1), PENSTOCK_EIO, "No such file");
    CHECK(penstock_stream_close(st) == PENSTOCK_OK);
    /* A file target that exists is refused without TRUNCATE. */
    char out[64];
    make_file(out, 1);
    CHECK(penstock_stream_open(e, path, out, NULL, &st) == PENSTOCK_OK);
    CHECK_ERR(penstock_stream_start(st), PENSTOCK_EIO, "TRUNCATE");
    CHECK(penstock_stream_close(st) == PENSTOCK_OK);
    unlink(out);
    unlink(path);
}

static void closed_and_wrong_kind_descriptors(penstock_engine *e) {
    char path[64], d[32], s[32];
    make_file(path, 100);
    /* Closed: a number no descriptor has. */
    int gone = open(path, O_RDONLY | O_CLOEXEC);
    close(gone);
    snprintf(s, sizeof s, "fd:%d", gone);
    CHECK_ERR(penstock_cue(e, s, "/dev/null", NULL), PENSTOCK_EBADF, "Bad file descriptor");
    CHECK_ERR(penstock_stream(gone, 1, 0, 0, 0), PENSTOCK_EBADF, "Bad file descriptor");
    /* A read-only file as a target, a directory, a listening socket, an unconnected UDP
     * target. */
    int ro = open(path, O_RDONLY | O_CLOEXEC);
    snprintf(d, sizeof d, "fd:%d", ro);
    CHECK_ERR(penstock_cue(e, path, d, NULL), PENSTOCK_EFD, "open for reading only");
    int dir = open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    snprintf(s, sizeof s, "fd:%d", dir);
    CHECK_ERR(penstock_cue(e, s, "/dev/null", NULL), PENSTOCK_EFD, "is a directory");
    int port;
    int l = tcp_listener(&port);
    snprintf(d, sizeof d, "fd:%d", l);
    CHECK_ERR(penstock_cue(e, path, d, NULL), PENSTOCK_EFD, "listening socket");
    int u = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    snprintf(d, sizeof d, "fd:%d", u);
    CHECK_ERR(penstock_cue(e, path, d, NULL), PENSTOCK_EFD, "connect(2) it");
    CHECK_ERR(penstock_stream(ro, u, 0, 0, 0), PENSTOCK_EFD, "connect(2) it");
    /* The one-shot call's own checks. */
    CHECK_ERR(penstock_stream(ro, 1, 0x80, 0, 0), PENSTOCK_EINVAL, "flags");
    CHECK_ERR(penstock_stream(ro, 1, PENSTOCK_STREAM_RT, 0, 0), PENSTOCK_EINVAL, "period_ns");
    /* Refusals leave the caller's descriptors as they were: still open, still usable. */
    char b[4];
    CHECK(pread(ro, b, 4, 0) == 4);
    CHECK(fcntl(l, F_GETFD) >= 0 && fcntl(u, F_GETFD) >= 0);
    close(ro);
    close(dir);
    close(l);
    close(u);
    unlink(path);
}

static void invalid_configurations(void) {
    penstock_config c;
    CHECK(penstock_config_default(&c) == PENSTOCK_OK);
    CHECK(c.workers >= 1 && c.streams_max == 4096 && c.buffer_bytes == 1048576);
    penstock_config bad = c;
    bad.workers = 0;
    CHECK(penstock_engine_new(&bad) == NULL);
    CHECK(penstock_last_error_code() == PENSTOCK_EINVAL);
    CHECK(strstr(penstock_last_error(), "penstock_config.workers is 0") != NULL);
    bad = c;
    bad.buffer_bytes = 1000;
    CHECK(penstock_engine_new(&bad) == NULL);
    CHECK(strstr(penstock_last_error(), "buffer_bytes") != NULL);
    bad = c;
    bad.pending_timeout_ms = 0;
    CHECK(penstock_engine_new(&bad) == NULL);
    CHECK(strstr(penstock_last_error(), "pending_timeout_ms") != NULL);
}

static void limits_are_refusals(void) {
    penstock_config c;
    penstock_config_default(&c);
    c.streams_max = 2;
    c.workers = 1;
    penstock_engine *e = penstock_engine_new(&c);
    DIE_UNLESS(e != NULL);
    penstock_stream_t *a = NULL, *b = NULL, *x = NULL;
    CHECK(penstock_stream_open(e, "/dev/zero", "/dev/null", NULL, &a) == PENSTOCK_OK);
    CHECK(penstock_stream_open(e, "/dev/zero", "/dev/null", NULL, &b) == PENSTOCK_OK);
    CHECK_ERR(penstock_stream_open(e, "/dev/zero", "/dev/null", NULL, &x), PENSTOCK_EREFUSED,
              "penstock_config.streams_max");
    CHECK(x == NULL);
    penstock_stream_close(a);
    CHECK(penstock_stream_open(e, "/dev/zero", "/dev/null", NULL, &x) == PENSTOCK_OK);
    /* Freeing the engine ends its streams; their handles fail until closed. */
    penstock_engine_free(e);
    CHECK_ERR(penstock_stream_start(b), PENSTOCK_ENOSTREAM, "no stream");
    CHECK_ERR(penstock_cue(e, "/dev/zero", "/dev/null", NULL), PENSTOCK_EHANDLE, "freed");
    CHECK(penstock_stream_close(b) == PENSTOCK_OK);
    CHECK(penstock_stream_close(x) == PENSTOCK_OK);
    penstock_engine_free(e); /* a second free: ignored, with the error recorded */
    CHECK(penstock_last_error_code() == PENSTOCK_EHANDLE);
}

static void strings_of_the_library(void) {
    CHECK(strcmp(penstock_strerror(PENSTOCK_EBADF), "descriptor not open") == 0);
    CHECK(strcmp(penstock_strerror(12345), "unknown error code") == 0);
    CHECK(penstock_version()[0] >= '0' && penstock_version()[0] <= '9');
}

int main(void) {
    /* Before any failure, no message. */
    CHECK(penstock_last_error_code() == PENSTOCK_OK && penstock_last_error()[0] == 0);
    penstock_engine *e = penstock_engine_new(NULL);
    DIE_UNLESS(e != NULL);
    null_pointers(e);
    made_up_and_dead_handles(e);
    bad_names_and_options(e);
    closed_and_wrong_kind_descriptors(e);
    penstock_engine_free(e);
    invalid_configurations();
    limits_are_refusals();
    strings_of_the_library();
    return finish("errors");
}
