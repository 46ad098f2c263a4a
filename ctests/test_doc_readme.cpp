// README.md's C++ example, compiled and run (ctests/test_doc_excerpts.c checks that the
// README shows it verbatim): an owned-mode turn through skv.hpp under a skv::TurnGuard; two
// turns of one session keep what they produced; a turn the engine unwinds out of is aborted,
// which releases the session.
#include "skv.hpp"

#include <cstdio>
#include <stdexcept>

namespace {

int passed = 0, failed = 0;

void record(bool ok, int line, const char *expr) {
  if (ok) {
    ++passed;
  } else {
    ++failed;
    std::fprintf(stderr, "%s:%d: FAILED: %s\n", __FILE__, line, expr);
  }
}
#define CHECK(cond) record((cond), __LINE__, #cond)

struct EngineFault : std::runtime_error {
  EngineFault() : std::runtime_error("the engine's forward pass failed") {}
};

// One turn: `new_tokens` decoded in one step; a fault thrown after the prefill when `fail`.
uint32_t one_turn(skv::Cache &cache, uint64_t session, uint32_t prompt_len,
                  uint32_t new_tokens, bool fail) {
  skv::Req req;
  req.set_origin_input_len(prompt_len);                  // the whole session history
  skv_match m = cache.match_prefix(session, 0, req, prompt_len - 1);
  skv::TurnGuard turn(cache, session, 0, req);           // from here an exception aborts the turn
  if (!m.hit) cache.alloc_row(req);                      // first turn: a fresh row
  cache.alloc_extend(req, prompt_len - req.kv_allocated_len());
  cache.commit(req, prompt_len - req.kv_committed_len());
  if (fail) throw EngineFault();
  cache.alloc_extend(req, new_tokens);                   // decode
  cache.commit(req, new_tokens);
  req.set_output_len(new_tokens);
  turn.finish();                                         // skv_cache_finished_req(aborted = 0)
  return prompt_len + new_tokens;
}

}  // namespace

int main() {
  skv::Cache cache(skv::make_config(16, 1u << 12, 8, 1024));  // owned mode
  uint32_t kept = one_turn(cache, 7, 100, 20, false);
  CHECK(kept == 120 && cache.stats().sessions == 1);
  skv_held held = cache.session_held();
  CHECK(held.full_tokens == 128 && held.rows == 1);  // ceil_align(120)
  kept = one_turn(cache, 7, kept + 10, 5, false);        // a hit: the row comes back
  CHECK(kept == 135 && cache.stats().sessions == 1);
  bool threw = false;
  try {
    one_turn(cache, 7, kept + 10, 5, true);
  } catch (const EngineFault &) {
    threw = true;
  }
  CHECK(threw);
  skv_stats s = cache.stats();
  CHECK(s.sessions == 0 && s.used_pages == 0 && s.free_rows == 8);  // the abort released it all
  CHECK(cache.check().violations == 0);
  std::printf("%d passed, %d failed\n", passed, failed);
  return failed != 0;
}
