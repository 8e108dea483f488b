/* The server under load, briefly: tests/node/load.mjs (node's own http module, no packages) for
 * 10 seconds with 32 clients against stories260K — streamed and whole requests, abandoned ones,
 * malformed ones, long and short prompts — every answer equal to the same request alone, no
 * error, resident memory flat after the warm-up, the slots idle afterwards, a clean exit.
 * bench/load.sh runs the same for two minutes. Without node the test fails under
 * QUILL_REQUIRE_SHARED=1 (CI) and is skipped elsewhere. */
#include "server_util.h"
#include "test.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


TEST(server_load_short) {
    REQUIRE_SHARED(shared);
    char *out = NULL;
    const int node = run_cmd("node --version", &out, true);
    free(out);
    out = NULL;
    if (node != 0) {
        const char *why = "node is missing (the load test's clients run on it)";
        const char *req = getenv("QUILL_REQUIRE_SHARED");
        if (req && !strcmp(req, "1")) test_fail(__FILE__, __LINE__, "%s", why);
        else test_skip(why);
        return;
    }
    char *model = path_join(shared, "models/stories260K.gguf");
    /* AddressSanitizer holds freed memory back (its quarantine): resident memory grows by design
     * there, and its own leak check at the server's exit takes the place of this one */
#if TEST_SANITIZED
    const int slack = 1024;
#else
    const int slack = 8;
#endif
    char cmd[1024];
    /* (under the sanitizers 5 s: the mix below is what must be served, whatever the time) */
    snprintf(cmd, sizeof cmd, "node tests/node/load.mjs --quill %s --model %s --seconds %d --clients 32 --rss-slack %d --json "
             "--min-completed 100 --min-abandoned 10 --min-streamed 30",
             quill_bin(), model, TEST_SANITIZED ? 5 : 10, slack);
    free(model);
    const int rc = run_cmd(cmd, &out, false);
    cJSON *o = out ? cJSON_Parse(out) : NULL;
    const cJSON *failures = cJSON_GetObjectItem(o, "failures");
    if (!o || !cJSON_IsArray(failures)) {
        test_fail(__FILE__, __LINE__, "load.mjs did not report (exit %d): %s", rc, out ? out : "");
    } else {
        const cJSON *f;
        cJSON_ArrayForEach(f, failures) test_fail(__FILE__, __LINE__, "%s", cJSON_IsString(f) ? f->valuestring : "?");
        const double completed = cJSON_GetNumberValue(cJSON_GetObjectItem(o, "completed"));
        const double abandoned = cJSON_GetNumberValue(cJSON_GetObjectItem(o, "abandoned"));
        const double streamed = cJSON_GetNumberValue(cJSON_GetObjectItem(o, "streamed"));
        /* the mix ran: enough of each kind to mean something (load.mjs goes on until it has, up to 60 s) */
        if (!(completed >= 100 && abandoned >= 10 && streamed >= 30))
            test_fail(__FILE__, __LINE__, "too little load: %s", out);
        CHECK_EQ_INT(rc, 0);
    }
    cJSON_Delete(o);
    free(out);
}
