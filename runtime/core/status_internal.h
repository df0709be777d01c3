/* status_internal.h: setting the error message (C side only; not part of the FFI). */
#pragma once
#include "status.h"

/* Formats the thread's error message and returns the code, so a check reads
 *   if (bad) return sh_fail(SH_ERR_ARG, "add: shapes %s and %s do not broadcast", ...); */
int sh_fail(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Prefixes the current message with context ("adamw: " + message) and returns its code. */
int sh_fail_context(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#define SH_TRY(expr) do { int sh_try_rc_ = (expr); if (sh_try_rc_) return sh_try_rc_; } while (0)
