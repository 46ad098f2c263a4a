/* The code shown in docs/ and README.md is the code the C suite runs: every fenced block
 * (```c or ```cpp) that follows a `<!-- excerpt: ctests/FILE -->` line must appear verbatim
 * in that file, and each page must hold at least the excerpts counted here. Paths are found
 * from this file's own location. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int passed, failed;

static char *slurp(const char *path) {
  FILE *f = fopen(path, "rb");
  char *buf;
  long n;
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  n = ftell(f);
  fseek(f, 0, SEEK_SET);
  buf = (char *)malloc((size_t)n + 1);
  if (fread(buf, 1, (size_t)n, f) != (size_t)n) n = 0;
  buf[n] = '\0';
  fclose(f);
  return buf;
}

static void check(int ok, const char *what, const char *detail) {
  if (ok) {
    passed++;
  } else {
    failed++;
    fprintf(stderr, "FAILED: %s: %s\n", what, detail);
  }
}

/* Checks every excerpt of one page; returns how many it found. */
static int check_page(const char *root, const char *page) {
  char path[4096];
  char *text, *at;
  int found = 0;
  const char *marker = "<!-- excerpt: ";
  snprintf(path, sizeof path, "%s/%s", root, page);
  text = slurp(path);
  if (!text) {
    check(0, page, "cannot be read");
    return 0;
  }
  for (at = strstr(text, marker); at; at = strstr(at + 1, marker)) {
    char file[512], src_path[4096];
    char *end, *open, *body, *close, *src;
    size_t len;
    const char *name = at + strlen(marker);
    end = strstr(name, " -->");
    open = strstr(name, "```");
    if (!end || !open || (size_t)(end - name) >= sizeof file ||
        (strncmp(open, "```c\n", 5) != 0 && strncmp(open, "```cpp\n", 7) != 0)) {
      check(0, page, "a malformed excerpt marker (or its next block is not ```c or ```cpp)");
      break;
    }
    memcpy(file, name, (size_t)(end - name));
    file[end - name] = '\0';
    body = strchr(open, '\n') + 1;
    close = strstr(body, "```");
    if (!close) {
      check(0, page, "an excerpt without its closing fence");
      break;
    }
    len = (size_t)(close - body);
    snprintf(src_path, sizeof src_path, "%s/%s", root, file);
    src = slurp(src_path);
    if (!src) {
      check(0, page, file);
    } else {
      char saved = body[len];
      body[len] = '\0';
      check(strstr(src, body) != NULL, page, file);
      if (!strstr(src, body)) fprintf(stderr, "    this block is not in %s:\n%s\n", file, body);
      body[len] = saved;
      free(src);
    }
    found++;
  }
  free(text);
  return found;
}

int main(void) {
  char root[4096];
  char *slash;
  /* __FILE__ is .../ctests/test_doc_excerpts.c: the repository root is two levels up */
  snprintf(root, sizeof root, "%s", __FILE__);
  slash = strrchr(root, '/');
  if (!slash) {
    snprintf(root, sizeof root, ".."); /* compiled from inside ctests/ */
  } else {
    *slash = '\0';
    slash = strrchr(root, '/');
    if (slash) *slash = '\0';
    else snprintf(root, sizeof root, "."); /* compiled as ctests/test_doc_excerpts.c */
  }
  check(check_page(root, "docs/recipes.md") >= 8, "recipes.md", "fewer excerpts than expected");
  check(check_page(root, "docs/external-mode.md") >= 2, "external-mode.md", "fewer excerpts than expected");
  check(check_page(root, "docs/conventions.md") >= 1, "conventions.md", "fewer excerpts than expected");
  check(check_page(root, "docs/hybrid.md") >= 2, "hybrid.md", "fewer excerpts than expected");
  check(check_page(root, "docs/events.md") >= 2, "events.md", "fewer excerpts than expected");
  check(check_page(root, "docs/tiers.md") >= 5, "tiers.md", "fewer excerpts than expected");
  check(check_page(root, "docs/transfer.md") >= 2, "transfer.md", "fewer excerpts than expected");
  check(check_page(root, "README.md") >= 3, "README.md", "fewer excerpts than expected");
  printf("%d passed, %d failed\n", passed, failed);
  return failed != 0;
}
