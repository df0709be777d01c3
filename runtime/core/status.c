#include "status_internal.h"
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static _Thread_local char last_message[2048];
static _Thread_local int last_code;

const char *sh_last_error(void) { return last_message; }
int sh_last_status(void) { return last_code; }
void sh_clear_error(void) { last_message[0] = 0; last_code = SH_OK; }

int sh_fail(int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_message, sizeof last_message, fmt, ap);
  va_end(ap);
  last_code = code;
  return code;
}

int sh_fail_context(const char *fmt, ...) {
  char prefix[512], old[sizeof last_message];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(prefix, sizeof prefix, fmt, ap);
  va_end(ap);
  memcpy(old, last_message, sizeof old);
  snprintf(last_message, sizeof last_message, "%s%s", prefix, old);
  return last_code ? last_code : SH_ERR_ARG;
}
