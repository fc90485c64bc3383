/*
** profile.h -- the profiler's recording side, as core/ sees it (the public half
** is em_profile_* in ember.h).
**
** Who records. Whatever thread does the work: the step thread (ops at the
** dispatch point, backward nodes, data waits, waits on collectives, user
** ranges, step marks), loader workers (their batches), and each
** communicator's thread (the collectives themselves). Each thread appends to
** its own buffer, so recording takes no lock; a thread finds its buffer
** through a one-entry thread-local cache and registers a new one under the
** profiler's mutex the first time it records into a profiler.
**
** Cost when off: the recording points test S->profiler (one branch). Threads
** other than the step thread read it with an atomic load, because start and
** stop write it from the step thread while they run.
**
** Buffers are chunked and chunks never move, so stop() can merge what every
** thread published (an atomic count) while a straggler is still appending;
** such late events are simply not part of the profile.
*/
#ifndef EMBER_PROFILE_H
#define EMBER_PROFILE_H
#include "../internal.h"

/* The profiler of S when recording, else NULL (any thread). */
static inline struct emi_profiler *emi_profiler_of(em_state *S) {
  return __atomic_load_n(&S->profiler, __ATOMIC_ACQUIRE);
}

/* Names this thread's track in every profile it records into from now on:
** "comm", "loader worker" (index 1, 2, ...). The step thread is "main". */
void emi_profile_thread_label(const char *label, int index);

/* Appends ev to the calling thread's buffer (times are absolute emi_now
** seconds; name must outlive the profile: a literal or emi_profile_intern). */
void emi_profile_record(struct emi_profiler *p, const em_profile_event *ev);
const char *emi_profile_intern(struct emi_profiler *p, const char *name);

/* Convenience for the common spans. */
void emi_profile_span(em_state *S, int kind, const char *name, double t0, double t1,
                      int64_t bytes);

#endif
