/* docs/events.md, "The drain path": an owned-mode engine with KV events on, draining the
 * batches after each step into a buffer that grows on SKV_ERR_BUFFER, as a publisher of its
 * own would. Built with the `events` feature (make test-c-events) it checks the batches' sequence
 * numbers, their msgpack shape and what they carry; against a library built without it, that
 * every events call is SKV_ERR_UNSUPPORTED with its message. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "skv.h"

static int failures;
#define EXPECT(cond)                                                        \
  do {                                                                      \
    if (!(cond)) {                                                          \
      fprintf(stderr, "%s:%d: expected %s\n", __FILE__, __LINE__, #cond);   \
      failures++;                                                           \
    }                                                                       \
  } while (0)
#define TRY(call)                                                            \
  do {                                                                       \
    skv_status s_ = (call);                                                  \
    if (s_ != SKV_OK) {                                                      \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, skv_status_str(s_), \
              skv_last_error());                                             \
      exit(1);                                                               \
    }                                                                        \
  } while (0)

/* What the engine's publisher saw: batches, their next expected number, the events named. */
typedef struct sink {
  uint64_t next_seq;
  int gaps, batches, stored, removed, cleared;
} sink;

static int count(const uint8_t *p, size_t n, const char *word) {
  size_t k = strlen(word), i;
  int found = 0;
  for (i = 0; i + k <= n; i++) found += memcmp(p + i, word, k) == 0;
  return found;
}

/* A real engine sends each batch on: here the sink checks and counts it. */
static void publish(sink *s, uint64_t seq, const uint8_t *batch, size_t len) {
  if (seq != s->next_seq) s->gaps++;
  s->next_seq = seq + 1;
  s->batches++;
  EXPECT(len > 0 && batch[0] == 0x93); /* msgpack: [ts, [events], data_parallel_rank] */
  s->stored += count(batch, len, "BlockStored");
  s->removed += count(batch, len, "BlockRemoved");
  s->cleared += count(batch, len, "AllBlocksCleared");
}

/* doc:drain */
/* After each scheduler step: hand every pending batch to the publisher. The buffer grows
 * when a batch does not fit; nothing is lost meanwhile. */
static void drain_events(skv_cache *c, uint8_t **buf, size_t *cap, sink *s) {
  for (;;) {
    size_t len = 0;
    uint64_t seq = 0;
    skv_status st = skv_events_drain(c, *buf, *cap, &len, &seq);
    if (st == SKV_ERR_BUFFER) {
      uint8_t *bigger = realloc(*buf, len);
      if (!bigger) exit(1);
      *buf = bigger;
      *cap = len;
      continue;
    }
    TRY(st);
    if (len == 0) return; /* none pending */
    publish(s, seq, *buf, len);
  }
}
/* end:drain */

int main(void) {
  skv_cache_config cfg;
  skv_events_config ev;
  skv_cache *c = NULL;
  skv_req r;
  int32_t tokens[40];
  uint8_t *buf = NULL;
  size_t cap = 0;
  sink s = {0, 0, 0, 0, 0, 0};
  skv_status st;
  int i;
  memset(&cfg, 0, sizeof cfg);
  cfg.struct_size = sizeof cfg;
  cfg.page_size = 4;
  cfg.num_token_slots = 4096;
  cfg.num_rows = 8;
  cfg.max_context_len = 256;
  TRY(skv_cache_new(&cfg, &c));

  /* doc:enable */
  memset(&ev, 0, sizeof ev);
  ev.struct_size = sizeof ev;
  ev.data_parallel_rank = 0;
  ev.max_batches = 0;  /* 1024 */
  ev.endpoint = NULL;  /* drain only */
  st = skv_events_enable(c, &ev);
  /* end:enable */
  if (st == SKV_ERR_UNSUPPORTED) {
    /* A library built without the `events` feature: every call exists and says so. */
    size_t len = 0;
    uint64_t seq = 0;
    EXPECT(strstr(skv_last_error(), "built without the `events` feature") != NULL);
    EXPECT(skv_events_drain(c, NULL, 0, &len, &seq) == SKV_ERR_UNSUPPORTED);
    EXPECT(skv_events_session(c, 1, NULL, NULL) == SKV_ERR_UNSUPPORTED);
    TRY(skv_req_init(&r));
    tokens[0] = 1000;
    EXPECT(skv_events_tokens(c, 1, 0, &r, 0, tokens, 1) == SKV_ERR_UNSUPPORTED);
    skv_cache_free(c);
    printf("test_doc_events: a build without events (%d failures)\n", failures);
    return failures != 0;
  }
  TRY(st);

  for (i = 0; i < 40; i++) tokens[i] = 1000 + i;
  /* doc:turn */
  /* A first turn of session 7: a 30-token prompt in two chunks, then 6 output tokens. The
   * tokens go to libskv after each chunk's commit and once before the finish. */
  TRY(skv_req_init(&r));
  r.origin_input_len = 30;
  TRY(skv_alloc_row(c, &r));
  TRY(skv_alloc_extend(c, &r, 16, NULL));
  TRY(skv_commit(c, &r, 16));
  TRY(skv_events_tokens(c, 7, 0, &r, 0, tokens, 16));
  TRY(skv_alloc_extend(c, &r, 14, NULL));
  TRY(skv_commit(c, &r, 14));
  TRY(skv_events_tokens(c, 7, 0, &r, 16, tokens + 16, 14));
  drain_events(c, &buf, &cap, &s);
  /* ... decode steps: skv_alloc_extend_batch / skv_commit_batch, no events ... */
  TRY(skv_alloc_extend(c, &r, 6, NULL));
  TRY(skv_commit(c, &r, 6));
  r.output_len = 6;
  TRY(skv_events_tokens(c, 7, 0, &r, 30, tokens + 30, 6));
  TRY(skv_cache_finished_req(c, 7, 0, &r, 0));
  drain_events(c, &buf, &cap, &s);
  /* end:turn */
  EXPECT(s.batches == 4);
  EXPECT(s.cleared == 1 && s.stored == 3 && s.removed == 0);

  TRY(skv_release_session(c, 7)); /* an idle eviction, or the session's end */
  drain_events(c, &buf, &cap, &s);
  EXPECT(s.batches == 5 && s.removed == 1);
  EXPECT(s.gaps == 0 && s.next_seq == 5);
  free(buf);
  skv_cache_free(c);
  printf("test_doc_events: %d batches (%d failures)\n", s.batches, failures);
  return failures != 0;
}
