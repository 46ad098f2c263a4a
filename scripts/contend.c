/* Threads calling skv_cache_stats on one handle back to back for a second: calls per second in
   all, and each thread's longest call (which includes its wait for the handle's lock). For
   comparing builds under contention (benches/MEASUREMENTS.md, ninth measurement):

     scripts/install.sh /tmp/skv
     gcc -O2 -I/tmp/skv/include scripts/contend.c -o /tmp/contend \
       -L/tmp/skv/lib -Wl,-rpath,/tmp/skv/lib -lskv -lpthread
     /tmp/contend 2      # the thread count, 1 to 8

   ctests/run.sh builds it (not run there: it only times). */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "skv.h"

static skv_cache *cache;
static volatile int stop;

typedef struct {
  long calls;
  double worst_ns;
} result;

static double now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e9 + t.tv_nsec;
}

static void *caller(void *arg) {
  result *r = arg;
  skv_stats s;
  while (!stop) {
    double t = now_ns();
    if (skv_cache_stats(cache, &s) != SKV_OK) {
      fprintf(stderr, "skv_cache_stats: %s\n", skv_last_error());
      exit(1);
    }
    double d = now_ns() - t;
    if (d > r->worst_ns) r->worst_ns = d;
    r->calls++;
  }
  return NULL;
}

int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 2;
  if (n < 1 || n > 8) {
    fprintf(stderr, "usage: %s [threads, 1 to 8]\n", argv[0]);
    return 2;
  }
  skv_cache_config cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.struct_size = sizeof cfg;
  cfg.page_size = 16;
  cfg.num_token_slots = 16 * 1024;
  cfg.num_rows = 64;
  cfg.max_context_len = 1024;
  if (skv_cache_new(&cfg, &cache) != SKV_OK) {
    fprintf(stderr, "skv_cache_new: %s\n", skv_last_error());
    return 1;
  }
  pthread_t threads[8];
  result results[8];
  memset(results, 0, sizeof results);
  for (int i = 0; i < n; i++) pthread_create(&threads[i], NULL, caller, &results[i]);
  struct timespec second = {1, 0};
  nanosleep(&second, NULL);
  stop = 1;
  long total = 0;
  double worst = 0;
  for (int i = 0; i < n; i++) {
    pthread_join(threads[i], NULL);
    total += results[i].calls;
    if (results[i].worst_ns > worst) worst = results[i].worst_ns;
    printf("  thread %d: %ld calls, longest %.1f us\n", i, results[i].calls, results[i].worst_ns / 1e3);
  }
  printf("%d threads: %.1f M calls/s in all, longest call %.1f us\n", n, total / 1e6, worst / 1e3);
  skv_cache_free(cache);
  return 0;
}
