/* Second translation unit: the C++ wrapper first (it brings skv.h), then skv.h again. */
#ifdef __cplusplus
#include <skv.hpp>
#endif
#include <skv.h>

#include "tus.h"

uint32_t tu_b_abi_version(void) {
#ifdef __cplusplus
  return skv::abi_version();
#else
  return skv_abi_version();
#endif
}

size_t tu_b_req_size(void) { return sizeof(skv_req); }
