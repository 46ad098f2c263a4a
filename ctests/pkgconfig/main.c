/* A plain C program built with `cc main.c $(pkg-config --cflags --libs skv)`: one
 * owned-mode turn whose speculative overshoot is trimmed at finish, then the session's
 * release. Pages are 16 tokens. */
#include <skv.h>

#include <stdio.h>
#include <string.h>

#define OK(call)                                                                        \
  do {                                                                                  \
    skv_status s_ = (call);                                                             \
    if (s_ != SKV_OK) {                                                                 \
      fprintf(stderr, "%s:%d: %s: %s: %s\n", __FILE__, __LINE__, #call,                 \
              skv_status_str(s_), skv_last_error());                                    \
      return 1;                                                                         \
    }                                                                                   \
  } while (0)

#define EXPECT(cond)                                                                    \
  do {                                                                                  \
    if (!(cond)) {                                                                      \
      fprintf(stderr, "%s:%d: expected %s\n", __FILE__, __LINE__, #cond);               \
      return 1;                                                                         \
    }                                                                                   \
  } while (0)

int main(void) {
  skv_cache_config cfg;
  skv_cache *c = NULL;
  skv_req req;
  skv_match m;
  skv_stats st;

  memset(&cfg, 0, sizeof cfg);
  cfg.struct_size = sizeof cfg;
  cfg.page_size = 16;
  cfg.num_token_slots = 16 * 32;
  cfg.num_rows = 4;
  cfg.max_context_len = 256;
  OK(skv_cache_new(&cfg, &c));

  /* A 20-token prompt and 24 draft tokens of which 4 are real: target 24. */
  OK(skv_req_init(&req));
  req.origin_input_len = 20;
  OK(skv_match_prefix(c, 1, 0, &req, 19, 0, &m));
  EXPECT(m.hit == 0);
  OK(skv_alloc_row(c, &req));
  OK(skv_alloc_extend(c, &req, 44, NULL));
  OK(skv_commit(c, &req, 44));
  req.output_len = 24;
  req.finished_len = 4;
  OK(skv_cache_stats(c, &st));
  EXPECT(st.used_pages == 3);
  OK(skv_cache_finished_req(c, 1, 0, &req, 0));
  EXPECT(req.req_pool_idx == -1 && req.output_len == 4);
  OK(skv_cache_stats(c, &st));
  EXPECT(st.used_pages == 2); /* 24 tokens: the page of 32..43 went back */
  EXPECT(st.sessions == 1);

  OK(skv_release_session(c, 1));
  OK(skv_cache_stats(c, &st));
  EXPECT(st.used_pages == 0 && st.free_pages == 31 && st.free_rows == 4);
  skv_cache_free(c);
  printf("pkg-config consumer: libskv %s passed\n", skv_version());
  return 0;
}
