/* The host side of pots held by a device (cache/cache.h, "pots held by a
 * device"): the few calls cache/pot.c and cache/snapshot.c make so that a
 * pot whose K/V live in device memory behaves like any other pot. */
#include "cache.h"

int pot_host_sync(const pot *p) {
    if (!p->device) return 0;
    /* the host arrays are the device's cache: filling them changes no value the pot holds */
    return p->device->sync(p->device, (pot *)p);
}

int pot_host_take(pot *p) {
    if (!p->device) return 0;
    int rc = pot_host_sync(p);
    p->device->release(p->device, p);
    return rc;
}
