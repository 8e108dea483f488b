/* quill serve: an OpenAI-compatible HTTP server on the batched multi-sequence engine.
 *
 *   serve.c          options, startup (the HTTP side answers "loading" while the model loads),
 *                    signals, shutdown
 *   http.c           libmicrohttpd daemon: bodies and their limits, auth, the route table (the top
 *                    of the server: it calls the routes, and nothing calls back into it)
 *   reply.c          replies, error objects, CORS headers, streams, metrics by status, a client
 *                    gone: what the routes, sse.c and generation.c answer through
 *   generation.c     a generation request every API route shares: parsed, prompt rendered, a job per
 *                    choice queued; waiting for it, reading a chat reply as it grows
 *   routes_openai.c  /v1/chat/completions, /v1/completions, /v1/models (replies and SSE streams)
 *   routes_misc.c    /health, /metrics, /tokenize, /detokenize
 *   routes_anthropic.c  /v1/messages (Anthropic's Messages API, translated to a chat request)
 *   routes_responses.c  /v1/responses (OpenAI's Responses API, likewise)
 *   routes_embeddings.c /v1/embeddings (pooled final hidden states, quill_embed)
 *   sse.c            the byte side of every streamed reply: buffering, waiting, clients that leave
 *   translate.c      Anthropic and Responses bodies to chat bodies (fuzzed)
 *   chat_tools.c     tools, tool_choice and reasoning: the conversation as the template wants it,
 *                    the reply read back into content, reasoning_content and tool_calls
 *   request.c        a request's JSON to generation parameters, every field checked (fuzzed by
 *                    fuzz/fuzz_request.c)
 *   scheduler.c      the slots and the engine thread: continuous batching, queue, prefix reuse
 *
 * A new route: a handler in routes_*.c and a line in http.c's route table. */
#ifndef QUILL_SERVER_H
#define QUILL_SERVER_H

#include "quill.h"
#include "quill_chat.h"
#include "chat/tool_calls.h"

#include <cjson/cJSON.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>

/* ---------------------------------------------------------------- errors (OpenAI's error object) */

typedef struct api_error {
    int status;             /* HTTP status: 400, 401, 404, 405, 413, 500, 503 */
    const char *type;       /* "invalid_request_error", "authentication_error", ... */
    const char *param;      /* the request field at fault, or NULL */
    char message[512];
} api_error;

/* Fills *e (type from the status) and returns false, so that parsers can `return api_fail(...)`. */
bool api_fail(api_error *e, int status, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* ---------------------------------------------------------------- JSON and text helpers */

/* Length of the valid UTF-8 prefix of s[0..n) (n when all of it is valid). */
size_t utf8_valid_prefix(const char *s, size_t n);
/* s[0..n) with every invalid byte replaced by U+FFFD; malloc'd, NUL-terminated. */
char *utf8_sanitize(const char *s, size_t n);
/* Checks a request body before parsing it: valid UTF-8, JSON nesting at most max_depth. */
bool json_body_check(const char *body, size_t len, int max_depth, api_error *e);

/* ---------------------------------------------------------------- requests (request.c) */

typedef enum { REQ_CHAT, REQ_COMPLETION } request_kind;

typedef struct request_limits {
    int max_depth;
    long max_tokens;        /* largest max_tokens a request may ask for; 0 = no limit */
} request_limits;

enum { MAX_STOP = 16, MAX_TOP_LOGPROBS = 20 };

typedef struct gen_request {
    request_kind kind;
    char *model;                    /* as the client named it (echoed back); NULL when absent */
    quill_chat_message *msgs;       /* chat: role and content malloc'd per message */
    size_t n_msgs;
    char *prompt;                   /* completion with a text prompt */
    int32_t *prompt_ids;            /* completion with token ids */
    size_t n_prompt_ids;
    long max_tokens;                /* -1: until the end of generation or of the context */
    quill_sampler_params sp;
    bool seed_given, ignore_eos;
    char *stop[MAX_STOP];
    int n_stop;
    bool stream, include_usage;
    int n;                          /* choices (0 or 1: one) */
    bool logprobs;
    int top_logprobs;
    bool echo;                      /* completions: the reply's text starts with the prompt (with
                                     * logprobs, the prompt tokens' log-probabilities too) */
    /* Constrained decoding: GBNF text from 'grammar', or converted from 'response_format' (a
     * json_schema or json_object) or llama-server's 'json_schema'; grammar_param names the field. */
    char *grammar;
    const char *grammar_param;
} gen_request;

/* Parses and checks a /v1/chat/completions or /v1/completions body. Unknown fields are ignored;
 * a known field of the wrong type or range is a 400 naming it. On failure *out holds nothing. */
bool request_parse(const char *body, size_t len, request_kind kind, const request_limits *lim, gen_request *out,
                   api_error *e);
void request_free(gen_request *r);

/* ---------------------------------------------------------------- scheduler (scheduler.c) */

/* One generated token, for logprobs. */
typedef struct token_info {
    int32_t id;
    float logprob;
    int n_top;
    int32_t top_id[MAX_TOP_LOGPROBS];
    float top_logprob[MAX_TOP_LOGPROBS];
} token_info;

/* A request in flight, shared by its connection thread and the engine thread (both hold a
 * reference; the last to let go frees it). Fields below `sched` are guarded by the scheduler's
 * mutex. */
typedef struct job {
    /* set before submission, read-only afterwards */
    int32_t *prompt;
    int n_prompt;
    quill_sampler_params sp;
    long max_tokens;
    char **stop;                /* borrowed from the request, which outlives the job's use of it */
    int n_stop;
    bool want_logprobs, ignore_eos;
    bool prompt_logprobs;       /* also of the prompt's tokens (echo): its whole prompt is evaluated,
                                 * no cached prefix reused */
    bool render_special;        /* special tokens go into the text (the reply's parse needs them) */
    int top_logprobs;
    quill_grammar *grammar;     /* owned; NULL: unconstrained */
    const char *grammar_trigger;/* the grammar applies from this text on (static), or NULL: from the start */
    /* A job with the same prompt submitted just before (the first of n choices): this one waits
     * in the queue until that prompt is evaluated and then copies it (scheduler_submit takes a
     * reference). NULL: none. */
    struct job *prompt_source;
    double t_submit;

    /* guarded by the scheduler's mutex */
    pthread_cond_t changed;     /* text, tokens or done changed */
    int refs;
    char *text;                 /* generated text; text[0..ready) is final (no stop string can
                                 * still begin in it) */
    size_t text_len, text_cap, ready;
    token_info *tokens;         /* when want_logprobs */
    token_info *prompt_info;    /* [n_prompt] when prompt_logprobs: token i's from position i - 1
                                 * (the first has none: n_top -1); allocated before submission */
    size_t n_tokens, tokens_cap;
    int n_generated, n_cached, slot;
    int n_drafted, n_accepted;  /* speculative decoding: tokens drafted and drawn as drafted */
    double t_start, t_first, t_end;   /* started in a slot, first token, finished (ms) */
    const char *finish_reason;  /* "stop" or "length" once done */
    bool done, cancelled;
    bool holds_source;          /* the reference on prompt_source was taken */
    int error_status;           /* nonzero: ended by an error (message in error) */
    char error[256];
} job;

typedef struct scheduler scheduler;

typedef struct scheduler_params {
    int n_slots;
    int n_ctx;                  /* per slot */
    int n_threads;
    int n_batch;                /* tokens per step: generating slots first, then prompt chunks */
    int max_queue;
    quill_type type_k, type_v;  /* the KV cache's types (-ctk, -ctv) */
    /* Speculative decoding, per request while the step's batch has room: n-gram lookup, or a draft
     * model (borrowed: it outlives the scheduler); off when neither is set. */
    bool lookup;
    quill_model *draft_model;
    int draft_max, draft_min;
    /* --backend, -ngl, --device: where the slots' context runs its weight products */
    quill_backend backend;
    int n_gpu_layers, device;
} scheduler_params;

typedef struct scheduler_stats {
    int n_slots, busy, queued;
    unsigned long long prompt_tokens, cached_tokens, generated_tokens, steps;
    unsigned long long drafted_tokens, accepted_tokens;
    double decode_seconds, generation_seconds;
} scheduler_stats;

quill_status scheduler_new(quill_model *m, const scheduler_params *p, scheduler **out, quill_error *err);
/* Ends every job (queued and running: an error "the server is shutting down") and stops the
 * engine thread; the scheduler stays usable for releasing jobs and reading stats. */
void scheduler_stop(scheduler *s);
/* Stops it if needed and frees everything: after every connection has let go of its jobs. */
void scheduler_free(scheduler *s);
/* Queues a job (the scheduler takes a reference). False with a 503 when the queue is full or the
 * server is stopping, a 400 when the prompt does not fit a slot. */
bool scheduler_submit(scheduler *s, job *j, api_error *e);
/* The client went away or gave up: the engine frees its slot at its next step. */
void scheduler_cancel(scheduler *s, job *j);
/* Waits until the job changed or `ms` passed; returns with the scheduler's mutex held. */
void scheduler_lock(scheduler *s);
void scheduler_unlock(scheduler *s);
void scheduler_wait(scheduler *s, job *j, int ms);
void scheduler_stats_get(scheduler *s, scheduler_stats *out);
int scheduler_n_ctx(const scheduler *s);
const char *scheduler_kernels(const scheduler *s);
/* ", vulkan backend on DEVICE (N layers)" for the startup line, or "" on the CPU. */
const char *scheduler_backend(const scheduler *s);

job *job_new(void);
void job_release(scheduler *s, job *j);   /* drops a reference (under no lock) */

/* ---------------------------------------------------------------- the server */

typedef struct server_config {
    const char *model_path, *host, *alias, *api_key, *chat_template_path, *chat_format, *cors_origin;
    int port, n_ctx, n_slots, n_threads, n_batch, timeout_s, max_queue, max_connections, max_depth;
    int read_timeout_s;             /* a request's header and body must arrive within it */
    const char *model_draft;        /* speculative decoding: a draft model, or n-gram lookup */
    bool lookup;
    int draft_max, draft_min;
    int max_per_client;             /* connections from one address */
    long max_tokens;
    size_t max_body;
    quill_type type_k, type_v;      /* the KV cache's types (-ctk, -ctv; default f32) */
    quill_backend backend;          /* --backend, -ngl (-1: all and the output layer), --device */
    int n_gpu_layers, device;
} server_config;

/* What the chat template can do with tools, probed once at start (chat_tools.c). */
typedef struct chat_caps {
    chat_syntax syntax;         /* the syntax replies use (generic when the template shows no tools) */
    bool template_has_tools;    /* the template reads `tools` */
    bool writes_calls;          /* it writes an assistant turn's tool_calls */
    bool null_content;          /* ... only beside content null (else content "") */
    bool object_arguments;      /* it takes arguments as an object (else as JSON text) */
} chat_caps;

typedef struct response_store response_store;
response_store *response_store_new(void);
void response_store_free(response_store *st);

typedef struct server {
    server_config cfg;
    char *api_key;                  /* owned copy (from --api-key or --api-key-file) */
    char *model_id;                 /* what /v1/models lists */
    atomic_bool ready;              /* the model is loaded: /health says "ok" */
    atomic_bool stopping;
    quill_model *model;
    quill_model *draft_model;       /* -md: speculative decoding's draft model, or NULL */
    const quill_tokenizer *tok;
    char *chat_template;
    chat_caps caps;
    response_store *responses;      /* /v1/responses kept for previous_response_id */
    pthread_mutex_t embed_mu;       /* /v1/embeddings: one at a time, on a context of their own */
    quill_context *embed_ctx;
    scheduler *sched;
    long long created;              /* start time, for the "created" fields */
    atomic_ullong next_id;
    /* requests by status, for /metrics */
    pthread_mutex_t stats_mu;
    unsigned long long by_status[6][100];   /* [status / 100][status % 100] */
} server;

/* ---------------------------------------------------------------- other APIs as chat requests (translate.c) */

/* An Anthropic Messages body as an OpenAI chat body (malloc'd JSON text); *stream: it asked for
 * events. NULL with *e (a 400 naming the field) when it is malformed or asks for what is not
 * supported. */
char *anthropic_to_chat(const char *body, size_t len, bool *stream, api_error *e);

/* A stored conversation (chat messages) by response id, parsed; NULL when unknown. */
typedef cJSON *(*stored_conversation_fn)(void *ctx, const char *id);

/* A Responses body as a chat request, with what its reply repeats. */
typedef struct responses_req {
    char *chat_body;            /* the chat request to generate */
    cJSON *history;             /* the conversation without instructions, to store */
    cJSON *echo;                /* request fields the response repeats */
    bool stream, store;
    char *previous;
} responses_req;
bool responses_to_chat(const char *body, size_t len, stored_conversation_fn stored, void *stored_ctx, responses_req *q,
                       api_error *e);
void responses_req_free(responses_req *q);

/* ---------------------------------------------------------------- tools and reasoning (chat_tools.c) */

typedef enum { TOOL_CHOICE_NONE, TOOL_CHOICE_AUTO, TOOL_CHOICE_REQUIRED, TOOL_CHOICE_NAMED } tool_choice;
typedef struct chat_tools chat_tools;

void chat_caps_probe(server *s);
/* Reads a chat body's tools, tool_choice, parallel_tool_calls, reasoning_format,
 * chat_template_kwargs and reasoning_effort, and renders its messages through the template:
 * *prompt is the text to tokenize (malloc'd). `id` seeds the reply's call ids. */
bool chat_tools_prepare(server *s, const char *body, size_t len, const char *id, chat_tools **out, char **prompt,
                        api_error *e);
void chat_tools_free(chat_tools *t);
/* A copy for another choice of the same request (its calls get ids of their own). */
chat_tools *chat_tools_clone(const chat_tools *t, int choice);
tool_choice chat_tools_choice(const chat_tools *t);
/* The GBNF the calls must follow (*grammar NULL for none): the whole reply for a required or named
 * call; for auto, the reply from *trigger on (a lazy grammar), once the model begins a call. */
bool chat_tools_grammar(const chat_tools *t, const quill_tokenizer *tok, char **grammar, const char **trigger,
                        api_error *e);
/* Whether the reply's special tokens must be kept in its text for the parse. */
bool chat_tools_render_special(const chat_tools *t);
/* Fills a reply's message: content (null beside calls), reasoning_content, tool_calls; a
 * finish_reason "stop" becomes "tool_calls" when there are calls; a reply cut off ("length") has
 * none. Call syntax never reaches the content (chat_parse_output). */
void chat_tools_message(chat_tools *t, const char *text, size_t n, cJSON *msg, const char **finish_reason);
/* Adds to `delta` what the text adds to the stream so far (content, reasoning_content, tool_calls
 * in OpenAI's chunk shape); `final`: the text is whole, ended by `finish_reason`. Calls come with
 * the final text (none when it was cut off), content and reasoning as they grow. False when there
 * is nothing new. */
bool chat_tools_delta(chat_tools *t, const char *text, size_t n, bool final, const char *finish_reason, cJSON *delta,
                      bool *had_calls);

/* ---------------------------------------------------------------- HTTP (http.c, reply.c) */

struct MHD_Connection;
struct MHD_Response;

typedef struct http_request {
    server *srv;
    struct MHD_Connection *conn;
    const char *method, *url;
    const char *body;
    size_t body_len;
} http_request;

/* Replies (reply.c), each counted by status in /metrics. `json` is consumed. */
int reply_json(http_request *r, int status, cJSON *json);
int reply_text(http_request *r, int status, const char *content_type, const char *text);
int reply_error(http_request *r, const api_error *e);
/* Queues any response with the common headers (consumed; MHD_NO when NULL). */
int reply_queue(http_request *r, int status, struct MHD_Response *resp);
/* Queues a streamed reply (the response is consumed). */
int reply_stream(http_request *r, struct MHD_Response *resp);
/* True when the client closed its end of the connection. */
bool http_client_gone(struct MHD_Connection *conn);
void server_count_status(server *s, int status);

typedef int (*route_fn)(http_request *r);
int route_chat_completions(http_request *r);
int route_completions(http_request *r);
int route_models(http_request *r);
int route_messages(http_request *r);
int route_responses(http_request *r);
int route_embeddings(http_request *r);
int route_health(http_request *r);
int route_metrics(http_request *r);
int route_tokenize(http_request *r);
int route_detokenize(http_request *r);

/* ---------------------------------------------------------------- a generation (generation.c) */

/* A request's generation, shared by the API routes: its body parsed as an OpenAI chat or
 * completions request (other APIs translate theirs to that), its prompt rendered and queued. */
typedef struct gen gen;
/* NULL with *e filled when the request is refused; `id_prefix` names the reply ("chatcmpl", "msg"). */
gen *gen_begin(http_request *r, request_kind kind, const char *body, size_t len, const char *id_prefix, api_error *e);
void gen_free(gen *g);
/* Waits for the whole reply: true with the scheduler's mutex held (scheduler_unlock after
 * reading the job); false when the client went away or the server stops (the job is cancelled). */
bool gen_wait(gen *g);
/* gen_wait for a reply that is not streamed, with the failures every API answers alike: true when
 * every choice finished without error, with the mutex held; otherwise false with g freed, the
 * mutex released and *reply what the handler returns (MHD_NO when the client went away, else the
 * first failed choice's error). */
bool gen_wait_whole(http_request *r, gen *g, int *reply);
job *gen_job(gen *g);
/* Tokens' log-probabilities as chat and the Responses API give them: [{"token", "logprob", "bytes",
 * "top_logprobs": [...]}, ...]. */
cJSON *logprobs_array(const quill_tokenizer *tok, const token_info *t, size_t n);
chat_tools *gen_tools(gen *g);
const char *gen_id(const gen *g);
const gen_request *gen_req(const gen *g);
server *gen_server(const gen *g);

/* ---------------------------------------------------------------- streamed replies (sse.c) */

/* A Server-Sent Events reply fed by generation jobs. A route embeds it as the first member of its
 * own stream state, sets the four functions and calls sse_reply(); sse.c owns the bytes and the
 * waiting, the route only decides which events the jobs' progress allows. */
typedef struct sse_stream sse_stream;
struct sse_stream {
    /* Under the scheduler's lock: writes the events the jobs' progress allows (sse_json), sets
     * `finished` after the last one; true when it wrote anything. */
    bool (*produce)(sse_stream *s);
    /* The job to wait for when produce wrote nothing, and how long at most (*ms, 200 preset);
     * NULL: the job of `g`. */
    job *(*waiting)(sse_stream *s, int *ms);
    void (*cancel)(sse_stream *s);      /* stops the jobs (the client left, or the stream ended);
                                         * NULL: cancels the job of `g` */
    void (*destroy)(sse_stream *s);     /* frees the route's state, after cancel */
    gen *g;                 /* a stream of one generation: the job the defaults use */
    server *srv;
    struct MHD_Connection *conn;
    bool finished;          /* the last event is written */
    bool broken;            /* an event could not be buffered: the stream ends with an error */
    char *out;
    size_t out_len, out_pos, out_cap;
};
/* One event: "event: NAME" (when name is not NULL) and "data: DATA". */
void sse_write(sse_stream *s, const char *name, const char *data);
/* The same with a JSON value as the data (consumed). */
void sse_json(sse_stream *s, const char *name, cJSON *data);
/* Queues the stream as the reply; on failure it is cancelled and destroyed. */
int sse_reply(http_request *r, sse_stream *s);

/* Reads a chat job's reply as it grows, as OpenAI deltas (content, reasoning_content, tool_calls),
 * for the routes that translate those into their own events (generation.c). */
typedef struct reply_reader {
    size_t text_seen;
    bool parsed_final;      /* the whole reply has been read (the job is done) */
    bool had_calls;         /* it held tool calls */
} reply_reader;
/* Hands the delta the reply's new text makes to `translate`; false when it adds nothing. */
bool reply_reader_feed(reply_reader *rr, gen *g, void (*translate)(void *self, const cJSON *delta), void *self);

struct MHD_Daemon *http_start(server *s, quill_error *err);
int http_port(struct MHD_Daemon *d);

double now_ms(void);

int cmd_serve(int argc, char **argv);

#endif
