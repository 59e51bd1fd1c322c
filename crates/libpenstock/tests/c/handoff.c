/* Descriptor hand-off to a running server (started by tests/c.rs, a separate process):
 *   handoff SOCKET allowed         a file and a TCP socket handed over by OPEN fd fd arrive
 *                                  byte-exact at a receiver; bad descriptors and options give
 *                                  codes and messages
 *   handoff SOCKET stranger        (run as a uid the socket does not allow) refused, 403
 *   handoff SOCKET token TOKEN     authenticated by the token only: refused all the same */
#include "common.h"

static void allowed(penstock_conn *c) {
    char path[64], reply[512];
    const size_t n = 3u << 20;
    make_file(path, n);
    int file = open(path, O_RDONLY | O_CLOEXEC);
    DIE_UNLESS(file >= 0);
    struct receiver r;
    int send_end = tcp_to_receiver(&r);
    int id = penstock_conn_cue(c, file, send_end, "class=bulk");
    CHECK(id >= 0);
    /* The server holds its own duplicates. */
    close(file);
    close(send_end);
    char line[64];
    snprintf(line, sizeof line, "START %d", id);
    CHECK(penstock_conn_command(c, line, reply, sizeof reply) == 200);
    receiver_join(&r);
    CHECK(r.len == n && is_pattern(r.buf, r.len, 0));
    free(r.buf);
    snprintf(line, sizeof line, "STATE %d", id);
    CHECK(penstock_conn_command(c, line, reply, sizeof reply) == 211);
    CHECK(strstr(reply, " done ") != NULL && state_field(reply, "sent") == (long long)n);

    /* A paced window of the same file, the receiver checks the bytes. */
    file = open(path, O_RDONLY | O_CLOEXEC);
    DIE_UNLESS(file >= 0);
    send_end = tcp_to_receiver(&r);
    id = penstock_conn_cue(c, file, send_end, "offset=4096 length=131600 rate=100/s unit=13160");
    CHECK(id >= 0);
    close(file);
    close(send_end);
    snprintf(line, sizeof line, "START %d", id);
    CHECK(penstock_conn_command(c, line, reply, sizeof reply) == 200);
    receiver_join(&r);
    CHECK(r.len == 131600 && is_pattern(r.buf, r.len, 4096));
    free(r.buf);

    /* Bad input: codes and messages, the connection still usable. */
    CHECK_ERR(penstock_conn_cue(c, 999, 1, NULL), PENSTOCK_EBADF, "not an open descriptor");
    const char *tmp = getenv("TMPDIR");
    int dir = open(tmp ? tmp : "/tmp", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    int sv[2];
    DIE_UNLESS(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
    CHECK_ERR(penstock_conn_cue(c, dir, sv[0], NULL), PENSTOCK_EINVAL, "directory");
    file = open(path, O_RDONLY | O_CLOEXEC);
    CHECK_ERR(penstock_conn_cue(c, file, sv[0], "rate=fast"), PENSTOCK_EINVAL, "400");
    CHECK_ERR(penstock_conn_cue(NULL, file, sv[0], NULL), PENSTOCK_ENULL, "NULL");
    CHECK(penstock_conn_command(c, "START 99999", reply, sizeof reply) == 404);
    CHECK(penstock_conn_command(c, "HELP", reply, sizeof reply) == 214);
    CHECK(strstr(reply, "OPEN fd fd") != NULL);
    close(dir);
    close(file);
    close(sv[0]);
    close(sv[1]);
    unlink(path);
}

/* Whoever is not allowed by SO_PEERCRED gets 403 naming why. */
static void refused(penstock_conn *c) {
    int src = open("/dev/null", O_RDONLY | O_CLOEXEC);
    int sv[2];
    DIE_UNLESS(src >= 0 && socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
    CHECK_ERR(penstock_conn_cue(c, src, sv[0], NULL), PENSTOCK_EPERM, "SO_PEERCRED");
    CHECK(strstr(penstock_last_error(), "403") != NULL);
    /* The connection goes on answering. */
    char reply[256];
    CHECK(penstock_conn_command(c, "HELP", reply, sizeof reply) == 214);
    close(src);
    close(sv[0]);
    close(sv[1]);
}

int main(int argc, char **argv) {
    DIE_UNLESS(argc >= 3);
    penstock_conn *c = NULL;
    CHECK_ERR(penstock_connect(NULL, &c), PENSTOCK_ENULL, "socket_path is NULL");
    CHECK_ERR(penstock_connect("/nonexistent/ctl.sock", &c), PENSTOCK_EIO, "/nonexistent");
    DIE_UNLESS(penstock_connect(argv[1], &c) == PENSTOCK_OK);
    CHECK(penstock_conn_set_timeout(c, 20000) == PENSTOCK_OK);
    CHECK_ERR(penstock_conn_set_timeout(c, 0), PENSTOCK_EINVAL, "timeout_ms");
    const char *mode = argv[2];
    if (strcmp(mode, "allowed") == 0) {
        allowed(c);
    } else if (strcmp(mode, "stranger") == 0) {
        refused(c);
    } else if (strcmp(mode, "token") == 0 && argc == 4) {
        char line[256], reply[256];
        snprintf(line, sizeof line, "AUTH %s", argv[3]);
        CHECK(penstock_conn_command(c, line, reply, sizeof reply) == 200);
        refused(c);
    } else {
        DIE_UNLESS(!"a known mode");
    }
    penstock_conn_free(c);
    CHECK_ERR(penstock_conn_command(c, "HELP", NULL, 0), PENSTOCK_EHANDLE, "not a live");
    return finish("handoff");
}
