/* status.h: how every runtime call reports failure.
 * Each function returns SH_OK (0) or an error code, and leaves a message naming the op,
 * the shapes and dtypes, and why, readable through sh_last_error(). Nothing aborts on
 * bad input: Lua turns a non-zero status into a Lua error carrying the message. */
#pragma once

typedef enum sh_status {
  SH_OK = 0,
  SH_ERR_ARG = 1,      /* bad shape, dtype, index or option */
  SH_ERR_OOM = 2,      /* an allocation failed or passed the memory limit */
  SH_ERR_FREED = 3,    /* a tensor was used after :free() */
  SH_ERR_DEVICE = 4,   /* device missing, or shard built without its backend */
  SH_ERR_COMM = 5,     /* a collective failed or timed out */
  SH_ERR_IO = 6        /* a file could not be read or written */
} sh_status;

const char *sh_last_error(void);
int sh_last_status(void);
void sh_clear_error(void);
