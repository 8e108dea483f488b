/* The byte side of every streamed reply (OpenAI's chunks, Anthropic's and the Responses API's
 * events): libmicrohttpd pulls bytes from a buffer; when the buffer is empty the route's
 * `produce` turns the jobs' progress into events under the scheduler's lock, and when there is no
 * progress the reader sleeps on the scheduler's signal for the job the route names. A client that
 * leaves is noticed while waiting (its jobs are cancelled at once, not when they would finish), and
 * an event that cannot be buffered ends the stream with an error instead of a hole in it. */
#include "server.h"

#include <microhttpd.h>
#include <stdlib.h>
#include <string.h>

static bool reserve(sse_stream *s, size_t more) {
    if (s->out_len + more <= s->out_cap) return true;
    size_t cap = (s->out_len + more) * 2;
    char *grown = realloc(s->out, cap);
    if (!grown) {
        s->broken = true;
        return false;
    }
    s->out = grown;
    s->out_cap = cap;
    return true;
}

static void append(sse_stream *s, const char *bytes, size_t n) {
    memcpy(s->out + s->out_len, bytes, n);
    s->out_len += n;
}

void sse_write(sse_stream *s, const char *name, const char *data) {
    static const char event[] = "event: ", field[] = "data: ";
    size_t nl = name ? strlen(name) : 0, dl = strlen(data);
    if (!reserve(s, (name ? sizeof event + nl : 0) + sizeof field + dl + 2)) return;
    if (name) {
        append(s, event, sizeof event - 1);
        append(s, name, nl);
        append(s, "\n", 1);
    }
    append(s, field, sizeof field - 1);
    append(s, data, dl);
    append(s, "\n\n", 2);
}

void sse_json(sse_stream *s, const char *name, cJSON *data) {
    char *text = data ? cJSON_PrintUnformatted(data) : NULL;
    cJSON_Delete(data);
    if (!text) {
        s->broken = true;
        return;
    }
    sse_write(s, name, text);
    free(text);
}

static void cancel(sse_stream *s) {
    if (s->cancel) s->cancel(s);
    else scheduler_cancel(s->srv->sched, gen_job(s->g));
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    sse_stream *s = cls;
    scheduler *sched = s->srv->sched;
    for (;;) {
        if (s->out_pos < s->out_len) {
            size_t n = s->out_len - s->out_pos < max ? s->out_len - s->out_pos : max;
            memcpy(buf, s->out + s->out_pos, n);
            s->out_pos += n;
            return (ssize_t)n;
        }
        s->out_len = s->out_pos = 0;
        if (s->broken) {
            cancel(s);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
        if (s->finished) return MHD_CONTENT_READER_END_OF_STREAM;
        scheduler_lock(sched);
        bool produced = s->produce(s);
        if (!produced) {
            int ms = 200;
            job *j = s->waiting ? s->waiting(s, &ms) : gen_job(s->g);
            scheduler_wait(sched, j, ms);
            produced = s->produce(s);
        }
        scheduler_unlock(sched);
        if (!produced && http_client_gone(s->conn)) {
            cancel(s);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
    }
}

/* Called by libmicrohttpd when the stream ends, finished or cut (the client went away). */
static void stream_free(void *cls) {
    sse_stream *s = cls;
    cancel(s);
    free(s->out);
    s->destroy(s);
}

int sse_reply(http_request *r, sse_stream *s) {
    s->srv = r->srv;
    s->conn = r->conn;
    struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_read, s, stream_free);
    if (!resp) {
        stream_free(s);
        return MHD_NO;
    }
    return reply_stream(r, resp);
}
