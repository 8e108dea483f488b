/* Helpers for the server tests: see server_util.h. */
#include "server_util.h"
#include "test.h"

#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double mono_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

bool server_start(test_server *s, const char *model, const char *args) {
    static int counter;
    memset(s, 0, sizeof *s);
    snprintf(s->log, sizeof s->log, "%s/serve-%d-%d.log", tmp_dir(), (int)getpid(), counter++);
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "exec %s serve -m %s --port 0 %s 2>%s", quill_bin(), model, args ? args : "", s->log);
    pid_t pid = fork();
    if (pid < 0) {
        test_fail(__FILE__, __LINE__, "fork: %s", strerror(errno));
        return false;
    }
    if (pid == 0) {
        int devnull = open("/dev/null", O_RDWR);
        if (devnull >= 0) {
            dup2(devnull, 0);
            dup2(devnull, 1);
        }
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    s->pid = pid;
    double t0 = mono_s();
    while (mono_s() - t0 < 10) {
        char *log = read_file(s->log, NULL);
        const char *at = log ? strstr(log, "listening on http://127.0.0.1:") : NULL;
        if (at) s->port = atoi(at + strlen("listening on http://127.0.0.1:"));
        bool ready = log && strstr(log, "ready in");
        free(log);
        if (ready && s->port > 0) return true;
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid) {
            s->pid = 0;
            break;
        }
        usleep(20000);
    }
    char *log = read_file(s->log, NULL);
    test_fail(__FILE__, __LINE__, "quill serve did not become ready: %s", log ? log : "(no log)");
    free(log);
    server_stop(s);
    return false;
}

int server_stop(test_server *s) {
    if (s->pid <= 0) return -1;
    kill(s->pid, SIGTERM);
    double t0 = mono_s();
    int st = 0;
    for (;;) {
        pid_t w = waitpid(s->pid, &st, WNOHANG);
        if (w == s->pid) break;
        if (mono_s() - t0 > 20) {
            kill(s->pid, SIGKILL);
            waitpid(s->pid, &st, 0);
            s->pid = 0;
            return -1;
        }
        usleep(10000);
    }
    s->pid = 0;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

int http_connect(int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof a)) {
        close(fd);
        return -1;
    }
    return fd;
}

static bool send_all(int fd, const char *p, size_t n) {
    while (n) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return false;
        p += w;
        n -= (size_t)w;
    }
    return true;
}

/* Undoes chunked transfer encoding in place; false when malformed. */
static bool dechunk(char *body, size_t len, size_t *out_len) {
    size_t in = 0, out = 0;
    for (;;) {
        char *end;
        if (in >= len) return false;
        unsigned long n = strtoul(body + in, &end, 16);
        char *crlf = strstr(body + in, "\r\n");
        if (!crlf || end > crlf) return false;
        in = (size_t)(crlf - body) + 2;
        if (n == 0) break;
        if (in + n + 2 > len) return false;
        memmove(body + out, body + in, n);
        out += n;
        in += n + 2;
    }
    body[out] = 0;
    *out_len = out;
    return true;
}

bool http_do(int port, const char *method, const char *path, const char *headers, const char *body, size_t body_len,
             int timeout_s, http_resp *out) {
    memset(out, 0, sizeof *out);
    int fd = http_connect(port);
    if (fd < 0) return false;
    char head[4096], length[96] = "";
    if (body) snprintf(length, sizeof length, "Content-Type: application/json\r\nContent-Length: %zu\r\n", body_len);
    int hn = snprintf(head, sizeof head, "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n%s%s\r\n", method,
                      path, length, headers ? headers : "");
    bool ok = send_all(fd, head, (size_t)hn) && (!body || send_all(fd, body, body_len));
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap + 1);
    double t0 = mono_s();
    while (ok && buf) {
        struct pollfd p = {fd, POLLIN, 0};
        int left = (int)((timeout_s - (mono_s() - t0)) * 1000);
        const int ready = left > 0 ? poll(&p, 1, left) : 0;
        if (ready < 0 && errno == EINTR) continue; /* a signal (a child server's exit) is no failure */
        if (ready <= 0) {
            ok = false;
            break;
        }
        if (len == cap) {
            char *g = realloc(buf, (cap *= 2) + 1);
            if (!g) {
                ok = false;
                break;
            }
            buf = g;
        }
        ssize_t r = recv(fd, buf + len, cap - len, 0);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) ok = false;
        if (r <= 0) break;
        len += (size_t)r;
    }
    close(fd);
    if (!buf) return false;
    buf[len] = 0;
    char *sep = strstr(buf, "\r\n\r\n");
    if (!ok || !sep || strncmp(buf, "HTTP/1.", 7)) {
        free(buf);
        return false;
    }
    out->status = atoi(buf + 9);
    *sep = 0;
    out->headers = strdup(buf);
    size_t blen = len - (size_t)(sep + 4 - buf);
    out->body = malloc(blen + 1);
    memcpy(out->body, sep + 4, blen);
    out->body[blen] = 0;
    out->body_len = blen;
    free(buf);
    char *te = http_header(out, "Transfer-Encoding");
    bool chunked = te && strstr(te, "chunked");
    free(te);
    if (chunked && !dechunk(out->body, out->body_len, &out->body_len)) {
        http_resp_free(out);
        return false;
    }
    return true;
}

void http_resp_free(http_resp *r) {
    free(r->headers);
    free(r->body);
    memset(r, 0, sizeof *r);
}

bool http_post(int port, const char *path, const char *json, http_resp *out) {
    return http_do(port, "POST", path, NULL, json, strlen(json), 60, out);
}

char *http_header(const http_resp *r, const char *name) {
    size_t n = strlen(name);
    for (const char *line = r->headers; line && *line;) {
        const char *eol = strstr(line, "\r\n");
        if (!strncasecmp(line, name, n) && line[n] == ':') {
            const char *v = line + n + 1;
            while (*v == ' ') v++;
            size_t vl = eol ? (size_t)(eol - v) : strlen(v);
            char *out = malloc(vl + 1);
            memcpy(out, v, vl);
            out[vl] = 0;
            return out;
        }
        line = eol ? eol + 2 : NULL;
    }
    return NULL;
}

char *sse_text(const char *body, char **finish, bool *done) {
    size_t cap = 256, len = 0;
    char *text = calloc(1, cap);
    *finish = NULL;
    *done = false;
    for (const char *p = body; p && *p;) {
        const char *eol = strstr(p, "\n\n");
        if (!strncmp(p, "data: ", 6)) {
            size_t n = eol ? (size_t)(eol - p - 6) : strlen(p + 6);
            if (n == 6 && !strncmp(p + 6, "[DONE]", 6)) *done = true;
            cJSON *o = cJSON_ParseWithLength(p + 6, n);
            const cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0);
            const cJSON *delta = cJSON_GetObjectItem(ch, "delta");
            const cJSON *piece = delta ? cJSON_GetObjectItem(delta, "content") : cJSON_GetObjectItem(ch, "text");
            if (cJSON_IsString(piece)) {
                size_t k = strlen(piece->valuestring);
                if (len + k + 1 > cap) text = realloc(text, cap = (len + k + 1) * 2);
                memcpy(text + len, piece->valuestring, k + 1);
                len += k;
            }
            const cJSON *fr = cJSON_GetObjectItem(ch, "finish_reason");
            if (cJSON_IsString(fr)) {
                free(*finish);
                *finish = strdup(fr->valuestring);
            }
            cJSON_Delete(o);
        }
        p = eol ? eol + 2 : NULL;
    }
    return text;
}

/* One greedy completion of `n` prompt tokens: its text (malloc'd) and the tokens the server reused.
 * NULL after recording a failure. */
static char *complete_tokens(int port, const int32_t *prompt, int n, int *cached) {
    char body[8192];
    int at = snprintf(body, sizeof body, "{\"prompt\": [");
    for (int i = 0; i < n && at < (int)sizeof body - 64; i++)
        at += snprintf(body + at, sizeof body - (size_t)at, "%s%d", i ? "," : "", prompt[i]);
    snprintf(body + at, sizeof body - (size_t)at, "], \"max_tokens\": 8, \"temperature\": 0, \"ignore_eos\": true}");
    http_resp r;
    char *text = NULL;
    if (!http_post(port, "/v1/completions", body, &r) || r.status != 200) {
        test_fail(__FILE__, __LINE__, "completion of %d tokens: status %d: %s", n, r.status, r.body ? r.body : "");
    } else {
        cJSON *j = cJSON_Parse(r.body);
        const cJSON *choice = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0);
        const cJSON *t = cJSON_GetObjectItem(choice, "text");
        const cJSON *c = cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "usage"),
                                                                 "prompt_tokens_details"), "cached_tokens");
        if (cJSON_IsString(t)) text = strdup(t->valuestring);
        else test_fail(__FILE__, __LINE__, "no text in %s", r.body);
        *cached = cJSON_IsNumber(c) ? (int)c->valuedouble : -1;
        cJSON_Delete(j);
    }
    http_resp_free(&r);
    return text;
}

void server_check_prefix_reuse(const char *label, const char *model, const char *args, const int32_t *prompt,
                               int n_first, int n) {
    test_server s;
    int cached_long = -1, cached_again = -1, unused;
    char *first = NULL, *longer = NULL, *again = NULL, *fresh = NULL;
    if (server_start(&s, model, args)) {
        first = complete_tokens(s.port, prompt, n_first, &unused);
        longer = complete_tokens(s.port, prompt, n, &cached_long);
        again = complete_tokens(s.port, prompt, n_first, &cached_again);
        if (server_stop(&s) != 0) test_fail(__FILE__, __LINE__, "%s: the server's exit was not clean", label);
    }
    if (server_start(&s, model, args)) {
        fresh = complete_tokens(s.port, prompt, n, &unused);
        if (server_stop(&s) != 0) test_fail(__FILE__, __LINE__, "%s: the server's exit was not clean", label);
    }
    const bool ok = first && longer && again && fresh;
    printf("    %s served: %d and %d prompt tokens reused\n", label, cached_long, cached_again);
    if (!ok) test_fail(__FILE__, __LINE__, "%s: a completion failed", label);
    else if (cached_long < n_first) test_fail(__FILE__, __LINE__, "%s: the longer prompt reused %d tokens", label, cached_long);
    else if (strcmp(first, again)) test_fail(__FILE__, __LINE__, "%s: the same prompt again answers differently", label);
    else if (strcmp(longer, fresh))
        test_fail(__FILE__, __LINE__, "%s: the longer prompt answers differently from a fresh server", label);
    free(first);
    free(longer);
    free(again);
    free(fresh);
}
