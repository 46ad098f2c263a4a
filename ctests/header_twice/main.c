/* One program of three translation units that all include skv.h (and, as C++, skv.hpp):
 * it links only if the headers define nothing twice, and as C++ only if skv.h gives the
 * functions C linkage. */
#include <skv.h>

#include <stdio.h>
#include <string.h>

#include "tus.h"

int main(void) {
  int ok = strcmp(tu_a_version(), skv_version()) == 0 &&
           tu_b_abi_version() == skv_abi_version() && skv_abi_version() == SKV_ABI_VERSION &&
           tu_a_req_size() == sizeof(skv_req) && tu_b_req_size() == sizeof(skv_req);
  printf("header_twice: libskv %s, abi %u: %s\n", tu_a_version(),
         (unsigned)tu_b_abi_version(), ok ? "ok" : "MISMATCH");
  return ok ? 0 : 1;
}
