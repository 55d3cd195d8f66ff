/* Value parsers shared by every place settings come from. */
#include "config.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

int config_parse_int(const char *name, const char *text, int64_t lo, int64_t hi, int64_t *out,
                     char *err, size_t errlen) {
    char *end;
    errno = 0;
    long long v = text ? strtoll(text, &end, 10) : 0;
    if (!text || !*text || *end || errno) {
        snprintf(err, errlen, "%s: '%s' is not an integer", name, text ? text : "");
        return -1;
    }
    if (v < lo || v > hi) {
        snprintf(err, errlen, "%s: %lld is out of range [%lld, %lld]", name, v, (long long)lo,
                 (long long)hi);
        return -1;
    }
    *out = v;
    return 0;
}

int config_parse_float(const char *name, const char *text, double lo, double hi, double *out,
                       char *err, size_t errlen) {
    char *end;
    errno = 0;
    double v = text ? strtod(text, &end) : 0;
    if (!text || !*text || *end || errno || !isfinite(v)) {
        snprintf(err, errlen, "%s: '%s' is not a number", name, text ? text : "");
        return -1;
    }
    if (v < lo || v > hi) {
        snprintf(err, errlen, "%s: %g is out of range [%g, %g]", name, v, lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}
