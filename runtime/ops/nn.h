/* nn.h: the fused forward and backward kernels behind shard's differentiable layers.
 * Forward functions return their output (and what backward needs) through out-parameters;
 * backward functions return input gradients through out-parameters (pass NULL for one that
 * is not wanted) and ACCUMULATE parameter gradients into the given tensors (dw += ...), so
 * gradient accumulation over micro-batches needs no extra copies. Rows are the last dim.
 * f32 throughout on the CPU; bf16/f16 inputs are computed in f32. */
#pragma once
#include <stdint.h>

/* y = x @ w^T + b; x [..., in], w [out, in], b [out] or NULL. */
int sh_linear_forward(sh_tensor **y, const sh_tensor *x, const sh_tensor *w, const sh_tensor *b);
int sh_linear_backward(sh_tensor **dx, sh_tensor *dw, sh_tensor *db, const sh_tensor *dy,
                       const sh_tensor *x, const sh_tensor *w);
/* Fusions that equal their compositions (one cuBLASLt call with an epilogue on CUDA):
 * - linear_gelu_forward: pre = x @ w^T + b and y = gelu(pre).
 * - linear_backward_dgelu: the backward of a linear layer whose input x was gelu(pre):
 *   dw += dy^T x, db += colsum(dy), and instead of dx, dpre = (dy @ w) * gelu'(pre). */
int sh_linear_gelu_forward(sh_tensor **y, sh_tensor **pre, const sh_tensor *x, const sh_tensor *w,
                           const sh_tensor *b);
int sh_linear_backward_dgelu(sh_tensor **dpre, sh_tensor *dw, sh_tensor *db, const sh_tensor *dy,
                             const sh_tensor *x, const sh_tensor *w, const sh_tensor *pre);
/* sh_linear_backward (pre NULL) or sh_linear_backward_dgelu (dx is then dpre) with dw and db
 * written instead of summed into: a parameter's first gradient of a step, into a buffer whose
 * contents are never read (so it need not be zero-filled first, and the dw product runs with
 * beta 0). */
int sh_linear_backward_set(sh_tensor **dx, sh_tensor *dw, sh_tensor *db, const sh_tensor *dy,
                           const sh_tensor *x, const sh_tensor *w, const sh_tensor *pre);

/* layernorm over the last dim; mean and rstd [rows] (f32) are saved for backward. */
int sh_layernorm_forward(sh_tensor **y, sh_tensor **mean, sh_tensor **rstd, const sh_tensor *x,
                         const sh_tensor *w, const sh_tensor *b, double eps);
int sh_layernorm_backward(sh_tensor **dx, sh_tensor *dw, sh_tensor *db, const sh_tensor *dy,
                          const sh_tensor *x, const sh_tensor *w, const sh_tensor *mean,
                          const sh_tensor *rstd);
/* r = x + res and y = layernorm(r) in one pass; r feeds the next residual. */
int sh_layernorm_residual_forward(sh_tensor **y, sh_tensor **r, sh_tensor **mean, sh_tensor **rstd,
                                  const sh_tensor *x, const sh_tensor *res, const sh_tensor *w,
                                  const sh_tensor *b, double eps);
int sh_rmsnorm_forward(sh_tensor **y, sh_tensor **rstd, const sh_tensor *x, const sh_tensor *w, double eps);
int sh_rmsnorm_backward(sh_tensor **dx, sh_tensor *dw, const sh_tensor *dy, const sh_tensor *x,
                        const sh_tensor *w, const sh_tensor *rstd);

/* activations: gelu is GPT-2's tanh form */
int sh_gelu_forward(sh_tensor **y, const sh_tensor *x);
int sh_gelu_backward(sh_tensor **dx, const sh_tensor *dy, const sh_tensor *x);
int sh_silu_forward(sh_tensor **y, const sh_tensor *x);
int sh_silu_backward(sh_tensor **dx, const sh_tensor *dy, const sh_tensor *x);
/* SwiGLU's gate: y = silu(a) * b */
int sh_swiglu_forward(sh_tensor **y, const sh_tensor *a, const sh_tensor *b);
int sh_swiglu_backward(sh_tensor **da, sh_tensor **db, const sh_tensor *dy, const sh_tensor *a, const sh_tensor *b);

/* softmax over the last dim */
int sh_softmax_forward(sh_tensor **y, const sh_tensor *x);
int sh_softmax_backward(sh_tensor **dx, const sh_tensor *dy, const sh_tensor *y);

/* Causal scaled-dot-product attention, q [B, H, T, D] and k v [B, Hkv, T, D]: out [B, H, T, D]
 * and the row log-sum-exp lse [B, H, T] (f32) for backward. Blocked like flash attention: at
 * most one block of the T x T scores per head is ever held. scale <= 0 means 1/sqrt(D).
 * Grouped-query attention when Hkv < H (Hkv divides H): query head h reads key/value head
 * h / (H / Hkv), shared in place, never repeated; dk and dv sum over the group. */
int sh_attention_forward(sh_tensor **out, sh_tensor **lse, const sh_tensor *q, const sh_tensor *k,
                         const sh_tensor *v, double scale);
int sh_attention_backward(sh_tensor **dq, sh_tensor **dk, sh_tensor **dv, const sh_tensor *dout,
                          const sh_tensor *q, const sh_tensor *k, const sh_tensor *v,
                          const sh_tensor *out, const sh_tensor *lse, double scale);
/* The same into the caller's tensors: out and dq, dk, dv (NULL: not wanted) have the shape and
 * dtype of q, k, v and may be strided views (e.g. the heads of a fused [B, T, 3C] gradient or
 * of a [B, T, C] output, so no layout copy follows); lse is contiguous f32 [B, H, T]. The
 * gradients are written, not summed into. */
int sh_attention_forward_into(sh_tensor *out, sh_tensor *lse, const sh_tensor *q, const sh_tensor *k,
                              const sh_tensor *v, double scale);
int sh_attention_backward_into(sh_tensor *dq, sh_tensor *dk, sh_tensor *dv, const sh_tensor *dout,
                               const sh_tensor *q, const sh_tensor *k, const sh_tensor *v,
                               const sh_tensor *out, const sh_tensor *lse, double scale);

/* Rotary position embedding of x [B, H, T, D] (D even) at positions t = 0..T-1, in Hugging
 * Face's rotate_half layout (so their q_proj/k_proj weights load unpermuted): for i < D/2 and
 * angle a = t * theta^(-2i/D) (computed in double),
 *   y_i = x_i cos a - x_{i+D/2} sin a,   y_{i+D/2} = x_{i+D/2} cos a + x_i sin a.
 * backward rotates dy back (the transpose). y has x's dtype and is contiguous. */
int sh_rope_forward(sh_tensor **y, const sh_tensor *x, double theta);
int sh_rope_backward(sh_tensor **dx, const sh_tensor *dy, double theta);
/* attention(rope(q), rope(k), v) as one op: the rotated q and k are scratch of the call,
 * never kept; backward recomputes them and returns the gradients of the unrotated q and k. */
int sh_attention_rope_forward(sh_tensor **out, sh_tensor **lse, const sh_tensor *q, const sh_tensor *k,
                              const sh_tensor *v, double scale, double theta);
int sh_attention_rope_backward(sh_tensor **dq, sh_tensor **dk, sh_tensor **dv, const sh_tensor *dout,
                               const sh_tensor *q, const sh_tensor *k, const sh_tensor *v,
                               const sh_tensor *out, const sh_tensor *lse, double scale, double theta);

/* embedding: idx (i64 or i32) [...], w [V, C] -> y [..., C]; backward scatter-adds into dw.
 * An index outside [0, V) is an error naming it. */
int sh_embedding_forward(sh_tensor **y, const sh_tensor *idx, const sh_tensor *w);
int sh_embedding_backward(sh_tensor *dw, const sh_tensor *dy, const sh_tensor *idx);

/* Cross-entropy of logits [N, V] against targets [N] (i64/i32), mean over the targets that
 * are not ignore_index. Forward saves the row log-sum-exp [N]; backward writes
 * dlogits = (softmax - onehot) * dloss / count without materialising the softmax twice. */
int sh_cross_entropy_forward(sh_tensor **loss, sh_tensor **lse, const sh_tensor *logits,
                             const sh_tensor *targets, int64_t ignore_index);
int sh_cross_entropy_backward(sh_tensor **dlogits, const sh_tensor *logits, const sh_tensor *targets,
                              const sh_tensor *lse, double dloss, int64_t ignore_index);
/* The same gradient written over logits (contiguous), for a caller that needs the logits no
 * more: the largest activation of a language model is not allocated twice. */
int sh_cross_entropy_backward_(sh_tensor *logits, const sh_tensor *targets, const sh_tensor *lse, double dloss,
                               int64_t ignore_index);

/* Dropout with the counter-based generator: the mask is recomputed in backward from
 * (seed, offset), never stored. p in [0, 1). */
int sh_dropout_forward(sh_tensor **y, const sh_tensor *x, double p, uint64_t seed, uint64_t offset);
int sh_dropout_backward(sh_tensor **dx, const sh_tensor *dy, double p, uint64_t seed, uint64_t offset);
