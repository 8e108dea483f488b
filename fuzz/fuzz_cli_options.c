/* libFuzzer target for the CLI's option parser (cli/options.c): the input, split at NUL bytes, is
 * an argument vector for run, chat and tokenize, and as a whole a --tokens list. Every outcome is
 * a parse or an error message; a crash, leak or undefined behaviour is a bug. Arguments that
 * would make the parser read a device or a pseudo-file (-f /dev/zero, -p - on stdin) are left
 * out: reading them is not parsing. */
#include "cli.h"
#include "options.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    if (!freopen("/dev/null", "r", stdin)) abort();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *buf = malloc(size + 1);
    if (!buf) return 0;
    memcpy(buf, data, size);
    buf[size] = 0;
    char *argv[64];
    int argc = 0;
    argv[argc++] = "cmd";
    for (size_t i = 0; i < size && argc < 63;) {
        char *arg = buf + i;
        size_t len = strlen(arg);
        bool file_like = strstr(arg, "/dev") || strstr(arg, "/proc") || strstr(arg, "/sys") || !strcmp(arg, "-");
        if (!file_like) argv[argc++] = arg;
        i += len + 1;
    }
    argv[argc] = NULL;
    static const unsigned commands[] = {CLI_RUN, CLI_CHAT, CLI_TOKENIZE};
    for (size_t c = 0; c < 3; c++) {
        cli_opts o;
        if (cli_opts_parse(argc, argv, commands[c], &o, NULL) == 0) {
            if (!o.model) abort();
            if (o.n_stop > CLI_MAX_STOP) abort();
            cli_opts_free(&o);
        }
    }
    int32_t *ids = NULL;
    size_t n = 0;
    if (cli_parse_token_list(buf, &ids, &n) == 0) {
        if (!ids || n == 0) abort();
        for (size_t i = 0; i < n; i++)
            if (ids[i] < 0) abort();
        free(ids);
    } else if (ids) {
        abort();
    }
    FILE *sink = fopen("/dev/null", "w");
    if (sink) {
        cli_json_string(sink, (const char *)data, size);
        fclose(sink);
    }
    free(buf);
    return 0;
}
