/* quill compare: where do two traces part ways? */
#include "cli.h"

#include <stdlib.h>
#include <string.h>

int cmd_compare(int argc, char **argv) {
    static const char usage[] =
        "usage: quill compare A.gguf B.gguf [--tol T]\n"
        "compares every tensor the two trace files share, in forward order (B is the reference).\n"
        "rel = max|A-B| / max|B|; the first tensor with rel > T (default 1e-3) is named and the exit\n"
        "status is 1.\n";
    const char *a = NULL, *b = NULL;
    double tol = 1e-3;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) { fputs(usage, stdout); return 0; }
        if (!strcmp(argv[i], "--tol")) {
            if (i + 1 >= argc || !cli_parse_double(argv[++i], 0, 1e30, &tol))
                return cli_fail("compare: --tol needs a non-negative number");
        } else if (argv[i][0] == '-' && argv[i][1]) return cli_fail("compare: unknown option '%s'", argv[i]);
        else if (!a) a = argv[i];
        else if (!b) b = argv[i];
        else return cli_fail("compare: too many files\n%s", usage);
    }
    if (!a || !b) return cli_fail("compare: need two trace files\n%s", usage);
    quill_trace_diff *d;
    size_t n;
    int64_t first_bad;
    quill_error err;
    if (quill_trace_compare(a, b, tol, &d, &n, &first_bad, &err)) return cli_fail("%s", err.message);
    if (n == 0) {
        free(d);
        return cli_fail("compare: %s and %s share no tensor names", a, b);
    }
    printf("%-24s %10s %12s %12s %12s %12s\n", "tensor", "elements", "max_abs", "max|ref|", "rel", "rms_rel");
    for (size_t i = 0; i < n; i++)
        printf("%-24s %10lld %12.4g %12.4g %12.4g %12.4g%s\n", d[i].name, (long long)d[i].n_elements,
               d[i].max_abs, d[i].max_ref, d[i].rel, d[i].rms_rel,
               (int64_t)i == first_bad ? "   <-- first beyond tolerance" : "");
    int rc = 0;
    if (first_bad >= 0) {
        printf("FIRST DIVERGENCE: %s (rel %.4g > tol %.4g)\n", d[first_bad].name, d[first_bad].rel, tol);
        rc = 1;
    } else {
        printf("all %zu tensors within tol %.4g\n", n, tol);
    }
    free(d);
    return rc;
}
