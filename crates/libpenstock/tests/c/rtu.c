/* Real-Time Upcalls from C: three upcalls at 60, 75 and 120 ms for about 2 s on one worker,
 * one of them suspended and run again (MARS's rtu_suspend / rtu_run) first,
 * each called (the callback's own count matches the library's), none overrunning its
 * (generous) budget; an upcall that would over-commit the worker is refused with a code and a
 * message, and nothing of it runs; bad arguments give codes, never an abort. */
#include <stdatomic.h>

#include "common.h"

static atomic_ulong calls[3];

static void tick(void *arg) { atomic_fetch_add((atomic_ulong *)arg, 1); }

static void never(void *arg) {
    (void)arg;
    fprintf(stderr, "a refused upcall was called\n");
    abort();
}

int main(void) {
    /* Under memcheck CPU time includes valgrind's own translation of the code an upcall runs
     * first: the budget is checked in the plain run (c.rs runs both). */
    const int memcheck = getenv("PENSTOCK_TEST_MEMCHECK") != NULL;
    penstock_config cfg;
    CHECK(penstock_config_default(&cfg) == PENSTOCK_OK);
    cfg.workers = 1; /* every upcall on one worker: admission sees them together */
    penstock_engine *e = penstock_engine_new(&cfg);
    DIE_UNLESS(e != NULL);

    const uint64_t ms = 1000000;
    const uint64_t period[3] = {60 * ms, 75 * ms, 120 * ms};
    penstock_rtu *rtu[3] = {NULL, NULL, NULL};
    for (int i = 0; i < 3; i++)
        CHECK(penstock_rtu_create(e, period[i], 5 * ms, tick, &calls[i], &rtu[i]) ==
              PENSTOCK_OK);

    /* 5/60 + 5/75 + 5/120 = 0.19 of the worker; 50/60 more would pass 1. */
    penstock_rtu *too_much = NULL;
    CHECK_ERR(penstock_rtu_create(e, 60 * ms, 50 * ms, never, NULL, &too_much),
              PENSTOCK_EREFUSED, "upcall admission");
    CHECK(too_much == NULL);
    CHECK_ERR(penstock_rtu_create(e, 10 * ms, 20 * ms, never, NULL, &too_much),
              PENSTOCK_EREFUSED, "upcall admission");
    CHECK_ERR(penstock_rtu_create(e, 60 * ms, 1 * ms, NULL, NULL, &too_much), PENSTOCK_ENULL,
              "callback is NULL");
    CHECK_ERR(penstock_rtu_create(e, 60 * ms, 1 * ms, tick, NULL, NULL), PENSTOCK_ENULL,
              "out is NULL");
    CHECK_ERR(penstock_rtu_create(NULL, 60 * ms, 1 * ms, tick, NULL, &too_much),
              PENSTOCK_ENULL, "NULL");

    /* MARS's rtu_suspend / rtu_run (the Rust test rtu.rs checks what a suspension holds
     * back): keeping the reservation or giving it back, each run puts the upcall back, and
     * its calls go on (a bounded poll). */
    for (int keep = 1; keep >= 0; keep--) {
        CHECK(penstock_rtu_suspend(rtu[2], keep) == PENSTOCK_OK);
        CHECK(penstock_rtu_suspend(rtu[2], keep) == PENSTOCK_OK); /* again: no change */
        CHECK(penstock_rtu_run(rtu[2]) == PENSTOCK_OK);
        CHECK(penstock_rtu_run(rtu[2]) == PENSTOCK_OK); /* running: no change */
        unsigned long before = atomic_load(&calls[2]);
        int polls = 0;
        while (atomic_load(&calls[2]) <= before && polls++ < 400)
            sleep_ms(5);
        CHECK(atomic_load(&calls[2]) > before);
    }
    CHECK_ERR(penstock_rtu_suspend(NULL, 1), PENSTOCK_ENULL, "NULL");
    CHECK_ERR(penstock_rtu_run(NULL), PENSTOCK_ENULL, "NULL");

    sleep_ms(2000);

    penstock_rtu_stats_t live;
    CHECK(penstock_rtu_stats(rtu[0], &live) == PENSTOCK_OK);
    CHECK(live.running == 1 && live.activations > 0);
    CHECK_ERR(penstock_rtu_stats(rtu[0], NULL), PENSTOCK_ENULL, "stats is NULL");

    for (int i = 0; i < 3; i++) {
        penstock_rtu_stats_t r;
        memset(&r, 0xff, sizeof r);
        CHECK(penstock_rtu_free(rtu[i], &r) == PENSTOCK_OK);
        unsigned long n = atomic_load(&calls[i]);
        printf("upcall %d: period %llu ms, %llu activations (%lu calls), %llu overruns, "
               "%llu misses, %llu skipped, lateness p50 %llu ns p99 %llu ns max %llu ns\n",
               i, (unsigned long long)(period[i] / ms), (unsigned long long)r.activations, n,
               (unsigned long long)r.overruns, (unsigned long long)r.misses,
               (unsigned long long)r.skipped, (unsigned long long)r.lateness_p50_ns,
               (unsigned long long)r.lateness_p99_ns, (unsigned long long)r.lateness_max_ns);
        CHECK(r.activations > 0 && r.activations == n);
        /* About 2 s / period; no more than the periods that fit, with one of slack. */
        CHECK(r.activations <= 2600 * ms / period[i] + 1);
        CHECK(memcheck || r.overruns == 0);
        CHECK(r.running == 0);
        CHECK(r.lateness_max_ns >= r.lateness_p99_ns && r.lateness_p99_ns >= r.lateness_p50_ns);
    }
    /* Freed: the handle is dead, the callback no longer called. */
    unsigned long after = atomic_load(&calls[0]);
    CHECK_ERR(penstock_rtu_stats(rtu[0], &live), PENSTOCK_EHANDLE, "not a live penstock_rtu");
    CHECK_ERR(penstock_rtu_free(rtu[0], NULL), PENSTOCK_EHANDLE, "not a live penstock_rtu");
    CHECK_ERR(penstock_rtu_suspend(rtu[0], 1), PENSTOCK_EHANDLE, "not a live penstock_rtu");
    CHECK_ERR(penstock_rtu_run(rtu[0]), PENSTOCK_EHANDLE, "not a live penstock_rtu");
    sleep_ms(150);
    CHECK(atomic_load(&calls[0]) == after);

    /* Freeing the engine first stops its upcalls; the handle's free then says so. */
    penstock_rtu *orphan = NULL;
    CHECK(penstock_rtu_create(e, 60 * ms, 1 * ms, tick, &calls[0], &orphan) == PENSTOCK_OK);
    penstock_engine_free(e);
    CHECK(penstock_rtu_free(orphan, NULL) == PENSTOCK_EHANDLE);
    return finish("rtu");
}
