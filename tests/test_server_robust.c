/* quill serve against slow and greedy clients: a header or body that trickles in is cut off after
 * --read-timeout (not the long idle timeout of replies), and one address cannot hold more than
 * --max-connections-per-client connections, so others still get served. */
#include "server_util.h"
#include "test.h"

#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* Waits up to `ms` for the server to close the socket (or reset it); true when it did. `reply`
 * receives what came before (NUL-terminated). */
static bool closed_within(int fd, int ms, char *reply, size_t cap) {
    size_t got = 0;
    double waited = 0;
    while (waited < ms) {
        struct pollfd p = {fd, POLLIN, 0};
        int r = poll(&p, 1, 100);
        waited += 100;
        if (r <= 0) continue;
        ssize_t n = recv(fd, reply + got, cap - 1 - got, 0);
        if (n <= 0) {
            reply[got] = 0;
            return true;
        }
        got += (size_t)n;
        if (got >= cap - 1) break;
    }
    reply[got] = 0;
    return false;
}

TEST(server_read_timeout_and_per_client_cap) {
    REQUIRE_SHARED(shared);
    char *model = path_join(shared, "models/stories260K.gguf");
    test_server s;
    bool started = server_start(&s, model, "-np 1 -c 256 -t 1 --read-timeout 1");
    free(model);
    CHECK(started);
    char reply[4096];
    /* a header that never ends */
    int fd = http_connect(s.port);
    CHECK(fd >= 0, "cannot connect");
    const char partial[] = "POST /v1/completions HTTP/1.1\r\nHost: x\r\n";
    CHECK(send(fd, partial, sizeof partial - 1, MSG_NOSIGNAL) > 0, "send");
    bool closed = closed_within(fd, 4000, reply, sizeof reply);
    close(fd);
    CHECK(closed, "a half-sent header kept its connection past the read timeout");
    /* a body that trickles: 408 */
    fd = http_connect(s.port);
    CHECK(fd >= 0, "cannot connect");
    const char head[] = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 40\r\n\r\n{\"prompt\"";
    CHECK(send(fd, head, sizeof head - 1, MSG_NOSIGNAL) > 0, "send");
    usleep(600 * 1000);
    CHECK(send(fd, ": \"On", 5, MSG_NOSIGNAL) > 0, "send");
    usleep(700 * 1000);
    send(fd, "ce upon", 7, MSG_NOSIGNAL);
    closed = closed_within(fd, 4000, reply, sizeof reply);
    close(fd);
    CHECK(closed, "a trickled body kept its connection");
    CHECK(strstr(reply, " 408 ") || reply[0] == 0, "a trickled body: %s", reply);
    http_resp r;
    CHECK(http_do(s.port, "GET", "/health", NULL, NULL, 0, 10, &r) && r.status == 200, "health after the timeouts");
    http_resp_free(&r);
    CHECK_EQ_INT(server_stop(&s), 0);

    /* four idle connections from this address fill its share; a fifth is refused until one goes
     * (a long read timeout here, so that a loaded machine cannot free a place meanwhile) */
    model = path_join(shared, "models/stories260K.gguf");
    started = server_start(&s, model, "-np 1 -c 256 -t 1 --read-timeout 60 --max-connections-per-client 4");
    free(model);
    CHECK(started);
    int held[4];
    for (int i = 0; i < 4; i++) {
        held[i] = http_connect(s.port);
        CHECK(held[i] >= 0, "connection %d", i);
        send(held[i], "G", 1, MSG_NOSIGNAL);
    }
    const char get[] = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
    int extra = http_connect(s.port);
    bool refused = extra < 0;
    if (extra >= 0) {
        send(extra, get, sizeof get - 1, MSG_NOSIGNAL);
        refused = closed_within(extra, 5000, reply, sizeof reply) && !strstr(reply, "200 OK");
        close(extra);
    }
    CHECK(refused, "a fifth connection from one address was served: %s", reply);
    close(held[0]);
    usleep(300 * 1000);
    /* with one place free, a request goes through */
    bool served = false;
    for (int attempt = 0; attempt < 20 && !served; attempt++) {
        memset(&r, 0, sizeof r);
        served = http_do(s.port, "GET", "/health", NULL, NULL, 0, 10, &r) && r.status == 200;
        http_resp_free(&r);
        if (!served) usleep(200 * 1000);
    }
    CHECK(served, "no place freed after a held connection closed");
    for (int i = 1; i < 4; i++) close(held[i]);
    CHECK_EQ_INT(server_stop(&s), 0);
}
