/* backend.c: the kernel table's slot names and coverage check, the tables as the layers above
 * hand them down, and the copies a kernel may ask of its own device (core/backend_internal.h). */
#include <string.h>
#include "backend_internal.h"
#include "tensor_internal.h"
#include "meta_internal.h"

static const char *const slot_names[] = {
#define SH_KERNEL_SLOT(name, params) #name,
  SH_KERNELS(SH_KERNEL_SLOT)
#undef SH_KERNEL_SLOT
};

const char *sh_backend_slot_name(int slot) {
  return slot >= 0 && slot < SH_SLOT_COUNT ? slot_names[slot] : "?";
}

int sh_backend_has(const sh_backend *b, int slot) {
  switch (slot) {
#define SH_KERNEL_SLOT(name, params) case SH_SLOT_##name: return b->name != NULL;
    SH_KERNELS(SH_KERNEL_SLOT)
#undef SH_KERNEL_SLOT
  }
  return 0;
}

/* Whether word is one of the space-separated words of list. */
static int listed(const char *list, const char *word) {
  size_t n = strlen(word);
  for (const char *p = list; p && *p;) {
    while (*p == ' ') p++;
    size_t len = strcspn(p, " ");
    if (len == n && strncmp(p, word, n) == 0) return 1;
    p += len;
  }
  return 0;
}

const char *sh_backend_unfilled(const sh_backend *b) {
  for (int s = 0; s < SH_SLOT_COUNT; s++)
    if (!sh_backend_has(b, s) && !listed(b->absent, slot_names[s])) return slot_names[s];
  return NULL;
}

int sh_backend_missing(const sh_backend *b, const char *op, const char *kernel) {
  return sh_fail(SH_ERR_DEVICE, "%s: the %s backend has no %s kernel", op, b->name, kernel);
}

static const sh_backend *tables[SH_BACKEND_KINDS];

void sh_backend_register(int kind, const sh_backend *b) {
  if (kind >= 0 && kind < SH_BACKEND_KINDS) __atomic_store_n(&tables[kind], b, __ATOMIC_RELEASE);
}

int sh_backend_kind(int device) {
  return sh_is_meta(device) ? SH_BACKEND_META : device < 0 ? SH_BACKEND_CPU : SH_BACKEND_CUDA;
}

const sh_backend *sh_backend_of(int device) {
  return __atomic_load_n(&tables[sh_backend_kind(device)], __ATOMIC_ACQUIRE);
}

/* The table of t's device; fails naming op when none is registered or it lacks the kernel. */
static int table_with(const sh_backend **b, const sh_tensor *t, const char *op, int has) {
  *b = sh_backend_of(t->device);
  if (!*b) return sh_fail(SH_ERR_DEVICE, "%s: device %d has no kernel table", op, t->device);
  return has ? SH_OK : sh_backend_missing(*b, op, op);
}

int sh_kernel_copy_(sh_tensor *dst, const sh_tensor *src) {
  const sh_backend *b = sh_backend_of(dst->device);
  if (src->device != dst->device) return sh_fail(SH_ERR_DEVICE, "copy_: %s -> %s crosses devices inside a kernel", sh_desc(src), sh_desc(dst));
  SH_TRY(table_with(&b, dst, "copy_", b && b->copy_));
  dst->version++;
  return b->copy_(dst, src);
}

int sh_kernel_fill_(sh_tensor *t, double value) {
  const sh_backend *b = sh_backend_of(t->device);
  SH_TRY(table_with(&b, t, "fill_", b && b->fill_));
  t->version++;
  return b->fill_(t, value);
}

int sh_kernel_to(sh_tensor **out, const sh_tensor *t, int dtype) {
  SH_TRY(sh_tensor_empty(out, t->ndim, t->shape, dtype, t->device));
  int rc = sh_kernel_copy_(*out, t);
  if (rc) { sh_tensor_destroy(*out); *out = NULL; }
  return rc;
}

int sh_kernel_contiguous_as(sh_tensor **out, const sh_tensor *t, int dtype) {
  if (t->dtype == dtype && sh_tensor_is_contiguous(t)) return sh_tensor_alias(out, t);
  return sh_kernel_to(out, t, dtype);
}
