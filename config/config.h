/* Settings: parsing and validating values given on the command line (and,
 * with the server, in the config file and environment). Every invalid value
 * is reported with the setting's name. */
#ifndef POTSERVE_CONFIG_H
#define POTSERVE_CONFIG_H

#include <stddef.h>
#include <stdint.h>

/* Parses a whole decimal integer in [lo, hi]. 0, or -1 with
 * "NAME: ..." in err. */
int config_parse_int(const char *name, const char *text, int64_t lo, int64_t hi, int64_t *out,
                     char *err, size_t errlen);
/* Parses a finite number in [lo, hi]. */
int config_parse_float(const char *name, const char *text, double lo, double hi, double *out,
                       char *err, size_t errlen);

#endif
