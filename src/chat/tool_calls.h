/* Tool calls and reasoning in generated text: which syntax a model writes them in (read from its
 * chat template, as the reference's chat-format detection does), the parse of generated text into
 * content, reasoning and calls (also of text still being generated, for streams), and the grammar
 * that makes a model's next reply a call in its own syntax.
 *
 * Syntaxes:
 *   hermes       Hermes 2 Pro, Qwen 2.5, Qwen 3: <tool_call>\n{"name": N, "arguments": {...}}\n</tool_call>
 *   llama3       Llama 3.1 / 3.2: a reply that is {"name": N, "parameters": {...}}, or
 *                <|python_tag|> followed by such an object or by code (the call "python", {"code"})
 *   mistral      Mistral Nemo / Small: [TOOL_CALLS][{"name": N, "arguments": {...}, "id": I}, ...]
 *   gpt-oss      harmony channels: analysis is reasoning, final the answer, and
 *                commentary to=functions.N ...<|message|>{args}<|call|> a call
 *   deepseek-v3  DeepSeek V3 / R1: <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>N\n```json\n{args}\n```<｜tool▁call▁end｜>...
 *   qwen3-coder  <tool_call>\n<function=N>\n<parameter=P>\nvalue\n</parameter>\n</function>\n</tool_call>
 *   generic      templates without tool syntax: the reply is JSON, {"tool_calls": [{"name", "arguments"}]}
 *                or {"response": text}, as the reference's generic format asks in a system message
 * Reasoning: <think>...</think> at the start of the reply when the template knows <think> (also when
 * the prompt itself opened it), and gpt-oss's analysis channel.
 *
 * Library code: never prints, no JSON library (arguments stay JSON text, checked here). */
#ifndef QUILL_TOOL_CALLS_H
#define QUILL_TOOL_CALLS_H

#include "quill.h"
#include "quill_model.h"

#include <stdbool.h>
#include <stddef.h>

typedef enum tool_syntax {
    TOOL_SYNTAX_GENERIC,
    TOOL_SYNTAX_HERMES,
    TOOL_SYNTAX_LLAMA3,
    TOOL_SYNTAX_MISTRAL,
    TOOL_SYNTAX_GPT_OSS,
    TOOL_SYNTAX_DEEPSEEK_V3,
    TOOL_SYNTAX_QWEN3_CODER,
} tool_syntax;

typedef struct chat_syntax {
    tool_syntax tools;
    bool think_tags;        /* the template writes <think>...</think> */
} chat_syntax;

/* The syntax of a template's family, from marks in its source. */
chat_syntax chat_syntax_detect(const char *template_src);
const char *tool_syntax_name(tool_syntax s);

typedef struct parsed_call {
    char *name;             /* NUL-terminated */
    char *arguments;        /* JSON text of the arguments object; of a call still being written, the
                             * part written so far (only ever grows while generation goes on) */
    char *id;               /* the id the model wrote (Mistral), else NULL */
    bool complete;
} parsed_call;

typedef struct chat_parse {
    char *content;          /* the answer (never NULL) */
    char *reasoning;        /* never NULL; "" without reasoning */
    parsed_call *calls;
    size_t n_calls;
    bool dropped;           /* call syntax that made no whole call (cut off, or malformed) was left out */
} chat_parse;

typedef struct chat_parse_options {
    bool partial;           /* generation still goes on: text that could begin a mark is held back */
    bool extract_reasoning; /* false: reasoning stays in the content, as written */
    bool thinking_open;     /* the prompt ended inside <think>: the reply begins with reasoning */
    bool tools;             /* the request offered tools: calls are looked for */
    bool cut;               /* the text was cut off (max_tokens): an end that could begin a mark is
                             * dropped, as while `partial` */
} chat_parse_options;

/* Parses generated text (need not be NUL-terminated). The syntax of calls and reasoning never
 * reaches the content or the reasoning as text: the text before a call's first mark is content, and
 * from that mark on the reply is calls, or is left out (`dropped`) when it makes none; stray marks
 * (a lone </tool_call>, a special token of the syntax written into prose) are removed. With
 * `partial` or `cut`, an end that could begin a mark is held back. QUILL_E_NOMEM is the only
 * failure. */
quill_status chat_parse_output(const chat_syntax *syn, const chat_parse_options *opt, const char *text, size_t n,
                               chat_parse *out, quill_error *err);
void chat_parse_free(chat_parse *p);

/* A GBNF grammar (the reference's format) whose sentences are replies made of tool calls in the
 * syntax: one call, or with `parallel` one or more, to one of `names` (n_names >= 1); a call's
 * arguments follow args_gbnf[i] (a GBNF grammar with a `root` rule, e.g. the tool's JSON Schema
 * converted; its rules are renamed apart) or, where that is NULL (or args_gbnf is), any JSON object. With `think_tags` and `thinking_open`, the reply first closes its reasoning.
 * Marks that are special tokens of `tok` (harmony's <|channel|>, DeepSeek's, Mistral's
 * [TOOL_CALLS]) are written as those tokens (`<[id]>`); `tok` may be NULL (every mark a literal).
 * malloc'd. */
quill_status tool_call_grammar(const chat_syntax *syn, const quill_tokenizer *tok, const char *const *names,
                               const char *const *args_gbnf, size_t n_names, bool parallel, bool thinking_open,
                               char **out, quill_error *err);

/* The text every call (or list of calls) of a syntax begins with, as tool_call_grammar's root does
 * without `thinking_open`: the trigger of a grammar that applies only once the model starts a call
 * (tool_choice "auto"; quill_sampler_add_grammar_lazy). Special-token marks are their text. */
const char *tool_call_trigger(const chat_syntax *syn);

/* JSON helpers for the pieces of a reply (strict RFC 8259). The length of the JSON value at
 * s[0..n) after leading whitespace, counting the whitespace, or 0 when it is not a whole value;
 * *incomplete says whether it could still become one as text is added. */
size_t json_value_span(const char *s, size_t n, bool *incomplete);

#endif
