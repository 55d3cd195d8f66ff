/* What server/background.c (the runs: start, answer, poll, cancel, run marks)
 * and server/background_events.c (a streamed one's events, here and in a
 * shared store) share. Nothing else includes it. */
#ifndef POTSERVE_BACKGROUND_INTERNAL_H
#define POTSERVE_BACKGROUND_INTERNAL_H

#include "server/server_internal.h"

struct background {
    event_log *log;   /* "stream": true: its events (else NULL) */
    char id[48];
    json_t *in;       /* the Responses body, echoed by the objects */
    json_t *history;  /* what it is stored with: {messages, items, own_from} */
    char *queued;     /* the entry as written while queued (its text): the answer replaces only that */
    int64_t created;
    int cancelled;    /* a cancel reached it here */
    int stopped;      /* the server stopped it at the end of a drain: it ends "failed" */
    int lost;         /* its run mark was gone at a renewal: stopped, it ends "failed" (stored only where
                         its entry is still the queued one) */
};

/* Why a response no replica runs (its run mark gone) ended "failed". */
extern const char BACKGROUND_RUNNER_GONE[];

/* Whether a response object's status says it has not ended (queued, in_progress). */
int background_unfinished(json_t *object);
/* A response object as a poll finds it when its runner is gone: failed, with
 * BACKGROUND_RUNNER_GONE (a copy). */
json_t *background_runner_gone(json_t *object);

/* Response id's event log, one reference (shipped to the store as it grows
 * when the store is shared); NULL when out of memory. */
event_log *event_log_new(server *s, const char *id);
void event_log_unref(event_log *l);
/* Its last event is written: its followers end with it, and it is kept a
 * while for those that come later. */
void event_log_close(request *d);
/* r streams l's events from the start on, as they come. */
void event_log_follow(request *r, event_log *l);
/* At the end of a drain: the streams of events not kept here end (their
 * clients may stream again through another replica). */
void background_streams_stop(server *s);
/* Streams here of events not kept here (the store's copy, or waiting for the answer). */
int background_streams_waiting(const server *s);

#endif
