/* api/openapi.json, embedded into the binary at build time (the assembler's
 * .incbin, so the build needs no generator tool): GET /openapi.json serves it.
 * The Makefile names the JSON file as this object's prerequisite. */
#include <stddef.h>

#include "api/api.h"

__asm__(".pushsection .rodata\n"
        ".global potserve_openapi_start\n"
        ".global potserve_openapi_end\n"
        "potserve_openapi_start:\n"
        ".incbin \"api/openapi.json\"\n"
        "potserve_openapi_end:\n"
        ".byte 0\n"
        ".popsection\n");

extern const char potserve_openapi_start[], potserve_openapi_end[];

const char *api_openapi_json(size_t *len) {
    *len = (size_t)(potserve_openapi_end - potserve_openapi_start);
    return potserve_openapi_start;
}
