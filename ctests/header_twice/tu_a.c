/* First translation unit: skv.h twice (its include guard), then, as C++, skv.hpp. */
#include <skv.h>
#include <skv.h>
#ifdef __cplusplus
#include <skv.hpp>
#endif

#include "tus.h"

const char *tu_a_version(void) {
#ifdef __cplusplus
  return skv::version();
#else
  return skv_version();
#endif
}

size_t tu_a_req_size(void) { return sizeof(skv_req); }
