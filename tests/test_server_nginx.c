/* The nginx deployment (deploy/nginx/quill.conf): Debian's nginx started by the test with the
 * shipped configuration, its ports rewritten to ephemeral ones and its pid, log and temp paths in
 * a temporary directory, in front of two quill serve replicas. */
#include "server_util.h"
#include "test.h"

#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    int port = -1;
    if (fd >= 0 && !bind(fd, (struct sockaddr *)&a, sizeof a) && !getsockname(fd, (struct sockaddr *)&a, &len))
        port = ntohs(a.sin_port);
    if (fd >= 0) close(fd);
    return port;
}

/* s with every `from` replaced by `to`; malloc'd. */
static char *replace(const char *s, const char *from, const char *to) {
    size_t n = 0, fl = strlen(from), tl = strlen(to);
    for (const char *p = s; (p = strstr(p, from)); p += fl) n++;
    char *out = malloc(strlen(s) + n * (tl + 1) + 1), *o = out;
    for (const char *p = s, *q; ; p = q + fl) {
        q = strstr(p, from);
        size_t k = q ? (size_t)(q - p) : strlen(p);
        memcpy(o, p, k);
        o += k;
        if (!q) break;
        memcpy(o, to, tl);
        o += tl;
    }
    *o = 0;
    return out;
}

typedef struct {
    pid_t pid;
    int port;
    char dir[300];
} test_nginx;

/* nginx with deploy/nginx/quill.conf, its replicas at ports a and b. */
static bool nginx_start(test_nginx *n, int a, int b) {
    memset(n, 0, sizeof n[0]);
    if (access("/usr/sbin/nginx", X_OK)) {
        test_fail(__FILE__, __LINE__, "/usr/sbin/nginx is missing (Debian package nginx)");
        return false;
    }
    static int count;
    snprintf(n->dir, sizeof n->dir, "%s/nginx-%d", tmp_dir(), count++);
    mkdir(n->dir, 0700);
    char *conf = read_file("deploy/nginx/quill.conf", NULL);
    if (!conf) {
        test_fail(__FILE__, __LINE__, "cannot read deploy/nginx/quill.conf");
        return false;
    }
    n->port = free_port();
    char pa[32], pb[32], pn[48];
    snprintf(pa, sizeof pa, "127.0.0.1:%d", a);
    snprintf(pb, sizeof pb, "127.0.0.1:%d", b);
    snprintf(pn, sizeof pn, "listen 127.0.0.1:%d", n->port);
    char *c1 = replace(conf, "127.0.0.1:8081", pa), *c2 = replace(c1, "127.0.0.1:8082", pb);
    char *c3 = replace(c2, "listen 127.0.0.1:8080", pn);
    free(conf);
    free(c1);
    free(c2);
    char path[400], main_conf[4096];
    snprintf(path, sizeof path, "%s/quill.conf", n->dir);
    FILE *f = fopen(path, "w");
    bool ok = f && fputs(c3, f) >= 0;
    if (f) fclose(f);
    free(c3);
    /* as root the workers would switch to nobody, who cannot enter the test's private directory */
    snprintf(main_conf, sizeof main_conf,
             "%s" "pid %s/nginx.pid;\nerror_log %s/error.log;\nworker_processes 1;\nevents { worker_connections 256; }\n"
             "http {\n  access_log %s/access.log;\n  client_body_temp_path %s/body;\n  proxy_temp_path %s/proxy;\n"
             "  fastcgi_temp_path %s/fastcgi;\n  uwsgi_temp_path %s/uwsgi;\n  scgi_temp_path %s/scgi;\n"
             "  include %s/quill.conf;\n}\n",
             geteuid() == 0 ? "user root;\n" : "", n->dir, n->dir, n->dir, n->dir, n->dir, n->dir, n->dir, n->dir, n->dir);
    snprintf(path, sizeof path, "%s/nginx.conf", n->dir);
    f = fopen(path, "w");
    ok = ok && f && fputs(main_conf, f) >= 0;
    if (f) fclose(f);
    if (!ok) {
        test_fail(__FILE__, __LINE__, "cannot write the nginx configuration in %s", n->dir);
        return false;
    }
    char elog[400];
    snprintf(elog, sizeof elog, "%s/error.log", n->dir);
    pid_t pid = fork();
    if (pid == 0) {
        int devnull = open("/dev/null", O_RDWR);
        dup2(devnull, 0), dup2(devnull, 1), dup2(devnull, 2);
        execl("/usr/sbin/nginx", "nginx", "-e", elog, "-p", n->dir, "-c", path, "-g", "daemon off;", (char *)NULL);
        _exit(127);
    }
    n->pid = pid;
    for (int i = 0; i < 200; i++) {
        int fd = http_connect(n->port);
        if (fd >= 0) {
            close(fd);
            return true;
        }
        usleep(25000);
    }
    char *log = read_file(elog, NULL);
    test_fail(__FILE__, __LINE__, "nginx did not start: %s", log ? log : "(no log)");
    free(log);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    n->pid = 0;
    return false;
}

static void nginx_stop(test_nginx *n) {
    if (n->pid <= 0) return;
    kill(n->pid, SIGTERM);
    for (int i = 0; i < 400; i++) {
        if (waitpid(n->pid, NULL, WNOHANG) == n->pid) {
            n->pid = 0;
            return;
        }
        usleep(10000);
    }
    kill(n->pid, SIGKILL);
    waitpid(n->pid, NULL, 0);
    n->pid = 0;
}

/* A counter of a replica's /metrics, or -1. */
static double metric(int port, const char *name) {
    http_resp r;
    double v = -1;
    char key[128];
    snprintf(key, sizeof key, "\n%s ", name);
    if (http_do(port, "GET", "/metrics", NULL, NULL, 0, 10, &r) && r.status == 200) {
        const char *at = strstr(r.body, key);
        if (at) v = atof(at + strlen(key));
    }
    http_resp_free(&r);
    return v;
}

static const char *const topics[] = {"a dragon", "the sea", "a red ball", "Lily's cat"};

static void chat_body(char *buf, size_t cap, int i, bool stream) {
    snprintf(buf, cap,
             "{\"messages\": [{\"role\": \"user\", \"content\": \"Tell me about %s\"}], \"max_tokens\": 16, "
             "\"temperature\": 0%s}",
             topics[i % 4], stream ? ", \"stream\": true" : "");
}

/* The reply text of a whole or streamed chat reply; malloc'd or NULL. */
static char *reply_text(const http_resp *r, bool stream) {
    if (r->status != 200) return NULL;
    if (stream) {
        char *finish;
        bool done;
        char *t = sse_text(r->body, &finish, &done);
        bool ok = finish && done;
        free(finish);
        if (!ok) {
            free(t);
            return NULL;
        }
        return t;
    }
    cJSON *o = cJSON_Parse(r->body);
    const cJSON *c = cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0), "message"), "content");
    char *t = cJSON_IsString(c) ? strdup(c->valuestring) : NULL;
    cJSON_Delete(o);
    return t;
}

typedef struct {
    int port, first, count;
    char *const *expected;
    int failures;
    char detail[512];
} nginx_client;

static void *nginx_client_run(void *arg) {
    nginx_client *c = arg;
    for (int i = c->first; i < c->first + c->count; i++) {
        char body[512];
        bool stream = i % 3 == 0;
        chat_body(body, sizeof body, i, stream);
        http_resp r;
        char *t = http_post(c->port, "/v1/chat/completions", body, &r) ? reply_text(&r, stream) : NULL;
        if (!t || strcmp(t, c->expected[i % 4])) {
            if (!c->failures++)
                snprintf(c->detail, sizeof c->detail, "request %d: %d %.300s", i, r.status, r.body ? r.body : "");
        }
        free(t);
        http_resp_free(&r);
    }
    return NULL;
}

/* 40 chat requests (every third streamed) through nginx spread over both replicas, each reply
 * equal to a single server's; a conversation's second turn reaches the replica that holds it. */
TEST(nginx_balances_replicas_with_affinity) {
    REQUIRE_SHARED(shared);
    char *model = path_join(shared, "models/stories260K.gguf");
    test_server a, b;
    bool ok = server_start(&a, model, "-np 2 -c 1024 -t 1");
    ok = ok && server_start(&b, model, "-np 2 -c 1024 -t 1");
    free(model);
    char *expected[4] = {NULL, NULL, NULL, NULL};
    for (int i = 0; ok && i < 4; i++) {
        char body[512];
        chat_body(body, sizeof body, i, false);
        http_resp r;
        ok = http_post(a.port, "/v1/chat/completions", body, &r) && (expected[i] = reply_text(&r, false));
        http_resp_free(&r);
    }
    double a0 = metric(a.port, "quill_generated_tokens_total"), b0 = metric(b.port, "quill_generated_tokens_total");
    test_nginx n = {0};
    ok = ok && nginx_start(&n, a.port, b.port);
    nginx_client clients[4];
    pthread_t th[4];
    for (int k = 0; ok && k < 4; k++) {
        clients[k] = (nginx_client){n.port, k * 10, 10, expected, 0, ""};
        pthread_create(&th[k], NULL, nginx_client_run, &clients[k]);
    }
    for (int k = 0; ok && k < 4; k++) pthread_join(th[k], NULL);
    for (int k = 0; ok && k < 4; k++)
        if (clients[k].failures) {
            test_fail(__FILE__, __LINE__, "%d replies through nginx differ from a single server's; first: %s",
                      clients[k].failures, clients[k].detail);
            ok = false;
        }
    double a1 = metric(a.port, "quill_generated_tokens_total"), b1 = metric(b.port, "quill_generated_tokens_total");
    if (ok && !(a1 > a0 && b1 > b0)) {
        test_fail(__FILE__, __LINE__, "both replicas should take a share: generated tokens %g -> %g and %g -> %g", a0,
                  a1, b0, b1);
        ok = false;
    }
    /* affinity: turn 2 of a conversation (header X-Session-Id) finds turn 1 in its replica's cache */
    for (int conv = 0; ok && conv < 3; conv++) {
        char hdr[64], t1[512], t2[1024];
        snprintf(hdr, sizeof hdr, "X-Session-Id: conversation-%d\r\n", conv);
        snprintf(t1, sizeof t1, "{\"messages\": [{\"role\": \"user\", \"content\": \"Once upon a time %d\"}], \"max_tokens\": 12, \"temperature\": 0}", conv);
        http_resp r;
        ok = http_do(n.port, "POST", "/v1/chat/completions", hdr, t1, strlen(t1), 30, &r) && r.status == 200;
        char *reply = ok ? reply_text(&r, false) : NULL;
        cJSON *o = ok ? cJSON_Parse(r.body) : NULL;
        double p1 = cJSON_GetObjectItem(cJSON_GetObjectItem(o, "usage"), "prompt_tokens")->valuedouble;
        cJSON_Delete(o);
        http_resp_free(&r);
        cJSON *msgs = cJSON_CreateArray(), *m;
        char first[64];
        snprintf(first, sizeof first, "Once upon a time %d", conv);
        m = cJSON_CreateObject(), cJSON_AddStringToObject(m, "role", "user"), cJSON_AddStringToObject(m, "content", first), cJSON_AddItemToArray(msgs, m);
        m = cJSON_CreateObject(), cJSON_AddStringToObject(m, "role", "assistant"), cJSON_AddStringToObject(m, "content", reply ? reply : ""), cJSON_AddItemToArray(msgs, m);
        m = cJSON_CreateObject(), cJSON_AddStringToObject(m, "role", "user"), cJSON_AddStringToObject(m, "content", "What next?"), cJSON_AddItemToArray(msgs, m);
        char *ms = cJSON_PrintUnformatted(msgs);
        snprintf(t2, sizeof t2, "{\"messages\": %s, \"max_tokens\": 8, \"temperature\": 0}", ms);
        free(ms);
        cJSON_Delete(msgs);
        free(reply);
        ok = ok && http_do(n.port, "POST", "/v1/chat/completions", hdr, t2, strlen(t2), 30, &r) && r.status == 200;
        o = ok ? cJSON_Parse(r.body) : NULL;
        const cJSON *cached = cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetObjectItem(o, "usage"), "prompt_tokens_details"), "cached_tokens");
        if (ok && !(cJSON_IsNumber(cached) && cached->valuedouble > p1)) {
            test_fail(__FILE__, __LINE__, "conversation %d: turn 2 should reuse turn 1's %g prompt tokens and more: %s", conv,
                      p1, r.body);
            ok = false;
        }
        cJSON_Delete(o);
        http_resp_free(&r);
    }
    nginx_stop(&n);
    for (int i = 0; i < 4; i++) free(expected[i]);
    int sa = server_stop(&a), sb = server_stop(&b);
    CHECK(ok);
    CHECK_EQ_INT(sa, 0);
    CHECK_EQ_INT(sb, 0);
}

/* Reads until the peer closes; false when nothing ends it within `seconds`. */
static bool drains(int fd, int seconds) {
    char buf[4096];
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        struct pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, 200) > 0) {
            ssize_t r = recv(fd, buf, sizeof buf, 0);
            if (r <= 0) return true;
        }
        clock_gettime(CLOCK_MONOTONIC, &t);
        if (t.tv_sec - t0.tv_sec > seconds) return false;
    }
}

static int open_stream(int port) {
    static const char body[] = "{\"messages\": [{\"role\": \"user\", \"content\": \"Go on\"}], \"max_tokens\": 100000, "
                               "\"ignore_eos\": true, \"temperature\": 0, \"stream\": true}";
    int fd = http_connect(port);
    if (fd < 0) return -1;
    char req[512];
    int n = snprintf(req, sizeof req,
                     "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     "Content-Length: %zu\r\n\r\n%s", sizeof body - 1, body);
    char buf[64];
    if (send(fd, req, (size_t)n, MSG_NOSIGNAL) != n || recv(fd, buf, sizeof buf, 0) <= 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* A replica killed (SIGKILL) mid-run: its stream ends with an error the client sees, new requests
 * succeed on the other replica, and after a restart the replica takes traffic again. */
TEST(nginx_failover_when_a_replica_dies) {
    REQUIRE_SHARED(shared);
    char *model = path_join(shared, "models/stories260K.gguf");
    test_server a, b;
    bool ok = server_start(&a, model, "-np 2 -c 8192 -t 1") && server_start(&b, model, "-np 2 -c 8192 -t 1");
    test_nginx n = {0};
    ok = ok && nginx_start(&n, a.port, b.port);
    /* two long streams: least_conn puts one on each replica */
    int s1 = ok ? open_stream(n.port) : -1, s2 = ok ? open_stream(n.port) : -1;
    double busy_a = metric(a.port, "quill_slots_busy");
    for (int i = 0; i < 100 && busy_a != 1; i++) {   /* the first bytes come before a slot is taken */
        usleep(50000);
        busy_a = metric(a.port, "quill_slots_busy");
    }
    if (ok && (s1 < 0 || s2 < 0 || busy_a != 1)) {
        test_fail(__FILE__, __LINE__, "the two streams should run one per replica (replica a busy: %g)", busy_a);
        ok = false;
    }
    int port_a = a.port;
    kill(a.pid, SIGKILL);
    waitpid(a.pid, NULL, 0);
    a.pid = 0;
    /* the cut stream ends (nginx closes it unfinished); the other one goes on until closed */
    bool cut = false;
    if (ok) {
        struct pollfd p[2] = {{s1, POLLIN, 0}, {s2, POLLIN, 0}};
        cut = drains(s1, 0) || drains(s2, 0);
        for (int i = 0; !cut && i < 25; i++) {
            poll(p, 2, 200);
            char tmp[8192];
            for (int k = 0; k < 2 && !cut; k++) {
                ssize_t r = recv(k ? s2 : s1, tmp, sizeof tmp, MSG_DONTWAIT);
                if (r == 0) cut = true;
            }
        }
        if (!cut) test_fail(__FILE__, __LINE__, "the stream of the killed replica did not end");
        ok = cut;
    }
    if (s1 >= 0) close(s1);
    if (s2 >= 0) close(s2);
    /* requests not yet started succeed on the other replica */
    for (int i = 0; ok && i < 6; i++) {
        char body[512];
        chat_body(body, sizeof body, i, i % 2);
        http_resp r;
        ok = http_post(n.port, "/v1/chat/completions", body, &r) && r.status == 200;
        if (!ok) test_fail(__FILE__, __LINE__, "request %d after the kill: %d %s", i, r.status, r.body ? r.body : "");
        http_resp_free(&r);
    }
    /* restart on the same port; after fail_timeout (5 s) nginx sends it traffic again */
    char args[128];
    snprintf(args, sizeof args, "-np 2 -c 8192 -t 1 --port %d", port_a);
    test_server a2;
    ok = ok && server_start(&a2, model, args) && a2.port == port_a;
    free(model);
    if (ok) {
        sleep(6);
        double before = metric(port_a, "quill_generated_tokens_total"), after = before;
        for (int round = 0; round < 10 && after <= before; round++) {
            /* two at a time: least_conn then uses both */
            int f1 = open_stream(n.port), f2 = open_stream(n.port);
            usleep(100000);
            after = metric(port_a, "quill_generated_tokens_total");
            if (f1 >= 0) close(f1);
            if (f2 >= 0) close(f2);
        }
        if (!(after > before)) {
            test_fail(__FILE__, __LINE__, "the restarted replica takes no traffic (%g -> %g)", before, after);
            ok = false;
        }
        CHECK_EQ_INT(server_stop(&a2), 0);
    }
    nginx_stop(&n);
    int sb = server_stop(&b);
    CHECK(ok);
    CHECK_EQ_INT(sb, 0);
}
