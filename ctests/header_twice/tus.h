/* What the two translation units export to main.c. */
#ifndef TUS_H
#define TUS_H
#include <stddef.h>
#include <stdint.h>

const char *tu_a_version(void);
size_t tu_a_req_size(void);
uint32_t tu_b_abi_version(void);
size_t tu_b_req_size(void);
#endif
