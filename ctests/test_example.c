/* README.md's streaming-turn example, compiled and run (ctests/test_doc_excerpts.c checks that
 * the README shows it verbatim): two turns of one session in owned mode, each overshooting
 * max_new_tokens under speculative decoding and trimmed at finish. */
#include <stdio.h>
#include <stdlib.h>

#include "skv.h"

#define TRY(call)                                                         \
  do {                                                                    \
    if ((call) != SKV_OK) {                                               \
      fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, skv_last_error()); \
      exit(1);                                                            \
    }                                                                     \
  } while (0)

/* One turn: restore or start the session's row, prefill, decode k+1 slots a round until
 * max_new_tokens is reached, finish with a trim. Returns the tokens kept by the session. */
static uint32_t turn(skv_cache *c, uint64_t session, uint32_t prompt_len, uint32_t max_new) {
  const uint32_t k = 4, accepted = 3; /* each verify round accepts 3 drafts + 1 bonus token */
  skv_req req;
  skv_match m;
  TRY(skv_req_init(&req));
  req.origin_input_len = prompt_len; /* the whole session history */
  TRY(skv_match_prefix(c, session, 0, &req, prompt_len - 1, 0, &m));
  if (!m.hit) TRY(skv_alloc_row(c, &req)); /* first turn: a fresh row */
  TRY(skv_alloc_extend(c, &req, prompt_len - req.kv_allocated_len, NULL)); /* prefill the rest */
  TRY(skv_commit(c, &req, prompt_len - req.kv_committed_len));
  while (req.output_len < max_new) {
    TRY(skv_alloc_extend(c, &req, k + 1, NULL)); /* KV for the drafts and the bonus token */
    TRY(skv_commit(c, &req, accepted + 1));
    req.output_len += accepted + 1;
    TRY(skv_free_tail(c, &req, req.kv_committed_len)); /* rejected drafts' slots */
  }
  /* the last round overshot: the turn really produced max_new tokens */
  req.finished_len = (int32_t)max_new;
  TRY(skv_cache_finished_req(c, session, 0, &req, /*aborted=*/0));
  return prompt_len + max_new;
}

int main(void) {
  skv_stats s;
  skv_check_report rep;
  uint32_t kept;
  skv_cache_config cfg = {.struct_size = sizeof cfg, .page_size = 16,
                          .num_token_slots = 1u << 16, .num_rows = 64,
                          .max_context_len = 8192}; /* every other field 0 */
  skv_cache *c;
  TRY(skv_cache_new(&cfg, &c));
  kept = turn(c, 42, 100, 30);              /* 100 + 30 = 130 tokens kept */
  kept = turn(c, 42, kept + 20, 30);        /* next prompt: history + 20 new user tokens */
  TRY(skv_cache_stats(c, &s));
  TRY(skv_cache_check(c, &rep));
  printf("kept %u tokens, trimmed %llu, %llu pages used, %llu violations\n", kept,
         (unsigned long long)s.trimmed_tokens, (unsigned long long)s.used_pages,
         (unsigned long long)rep.violations);
  if (kept != 180 || s.trimmed_tokens != 4 || s.used_pages != (180 + 15) / 16 || rep.violations) {
    printf("0 passed, 1 failed\n");
    return 1;
  }
  TRY(skv_release_session(c, 42));
  TRY(skv_cache_stats(c, &s));
  skv_cache_free(c);
  if (s.free_pages != s.total_pages - 1) {
    printf("0 passed, 1 failed\n");
    return 1;
  }
  printf("1 passed, 0 failed\n");
  return 0;
}
