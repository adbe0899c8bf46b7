"""Speed-ups the builder applies to a model from outside (`apply_speedups`, called by
turing.arch.pretraining_model and turing.glue.sequence_classifier), so that the model files read
as the model: each swaps a parameter-free module for one that computes the same function with less
work on a CPU, keeping every state_dict key (the dropout draws the same keep rate from the
generator in another way, so a run with the speed-ups and one without differ in their masks). CUDA (and torch.compile, which fuses these itself)
keeps torch's own kernels: each swapped-in module dispatches by device.

- `Dropout` for nn.Dropout: on CPU one 32-bit draw from torch's default generator serves two
  elements and the mask is bool (`_keep_mask`): about 5x cheaper than torch's per-element
  Bernoulli, 13% -> 5% of a CPU training step, and `torch.manual_seed`, checkpointed RNG states and
  activation checkpointing's replay all hold.
- `CPUAttention` for the model's ScaledDotProductAttention: in training with dropout on a CPU,
  SDPA runs its unfused math path anyway (two q/k scalings, copies, torch's dropout); written out,
  with the cheaper dropout, it is the same math with less copying.
- `FusedMaskedLMLoss` for MaskedLMLoss: the vocab projection and the cross-entropy in one autograd
  function (`LinearCrossEntropy`) that keeps a single (N, V) buffer, forward and backward.

bench/bench_model.py measures what they buy (the model step against the original-style model).
"""
import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable

from turing.modeling import MaskedLMLoss, ScaledDotProductAttention


class LinearCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy of `hidden @ weight.T + bias` (N, V) against `target` (N,); 0 for N = 0.

    Same value and gradients as `F.cross_entropy(F.linear(hidden, weight, bias), target)`, but
    the vocab-sized scores exist once: log-softmax runs in place on them and the backward turns
    them into softmax - one_hot in place, where the autograd path allocates three more (N, V)
    buffers (log-probs, a zeroed NLL gradient, the log-softmax gradient). On CPU those fresh
    buffers cost more in page faults than the arithmetic on them.
    """

    @staticmethod
    def forward(ctx, hidden, weight, bias, target):
        scores = torch.addmm(bias, hidden, weight.t())  # (N, V)
        log_probs = torch.log_softmax(scores, -1, out=scores)  # row by row, so safe in place
        ctx.save_for_backward(hidden, weight, log_probs, target)
        # sum / max(N, 1): with no target the loss is 0 (not NaN) and every gradient is 0.
        return -log_probs.gather(1, target[:, None]).sum() / max(target.numel(), 1)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_loss):
        hidden, weight, log_probs, target = ctx.saved_tensors
        grad_scores = log_probs.exp_()  # softmax, reusing the saved buffer
        grad_scores[torch.arange(target.numel(), device=target.device), target] -= 1.0
        grad_scores.mul_(grad_loss / max(target.numel(), 1))
        grad_scores = grad_scores.to(hidden.dtype)  # scores may be lower precision under autocast
        grad_hidden = grad_scores @ weight.to(hidden.dtype) if ctx.needs_input_grad[0] else None
        # (autograd casts each gradient to its input's dtype)
        grad_weight = grad_scores.t() @ hidden if ctx.needs_input_grad[1] else None
        grad_bias = grad_scores.sum(0) if ctx.needs_input_grad[2] else None
        return grad_hidden, grad_weight, grad_bias, None


def _keep_mask(shape, p, device):
    """Bool mask, True with probability 1 - p (p rounded to a multiple of 2^-16).

    One int32 draw from torch's default generator gives two 16-bit uniforms, so
    `torch.manual_seed`, checkpoint RNG state and activation checkpointing's replay all hold.
    """
    n = math.prod(shape)
    bits = torch.empty((n + 1) // 2, dtype=torch.int32, device=device).random_(-2 ** 31, 2 ** 31)
    return bits.view(torch.int16)[:n].view(shape) >= (round(p * 65536) - 32768)


class _CPUDropoutFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, p):
        keep = _keep_mask(x.shape, p, x.device)
        ctx.save_for_backward(keep)
        ctx.scale = 1.0 / (1.0 - p)
        return torch.mul(x, keep).mul_(ctx.scale)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        (keep,) = ctx.saved_tensors
        return torch.mul(grad, keep).mul_(ctx.scale), None


def dropout(x, p, training):
    """F.dropout, with a cheaper mask on CPU.

    torch's CPU dropout draws one Bernoulli sample per element (single-threaded, ~6 ns an
    element) and keeps a float mask; here one 32-bit draw serves two elements and the mask is
    bool: about 5x cheaper, 13% -> 5% of a CPU training step. On other devices, and inside
    torch.compile (which fuses dropout into its kernels), torch's dropout is used as is.
    """
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu" or torch.compiler.is_compiling():
        return F.dropout(x, p, True)  # (inside torch.compile: fused into the graph, own RNG)
    return _CPUDropoutFunction.apply(x, p)


class Dropout(nn.Dropout):
    """nn.Dropout (same repr, no state) computed by `dropout` above."""

    def forward(self, x):
        return dropout(x, self.p, self.training)


class CPUAttention(ScaledDotProductAttention):
    """ScaledDotProductAttention, written out around the cheaper dropout in training on a CPU."""

    def forward(self, q, k, v, attention_mask, dropout_p):
        if dropout_p == 0.0 or q.device.type != "cpu":
            return super().forward(q, k, v, attention_mask, dropout_p)
        q = q * (1.0 / math.sqrt(q.size(-1)))                                 # (B, heads, L, d)
        scores = torch.matmul(q, k.transpose(-2, -1)).add_(attention_mask)    # (B, heads, L, L)
        return torch.matmul(dropout(torch.softmax(scores, -1), dropout_p, True), v)


class FusedMaskedLMLoss(MaskedLMLoss):
    """MaskedLMLoss through LinearCrossEntropy: one (N, V) buffer instead of four."""

    def forward(self, hidden, weight, bias, target):
        return LinearCrossEntropy.apply(hidden, weight, bias, target)


SWAPS = {nn.Dropout: lambda m: Dropout(m.p), ScaledDotProductAttention: lambda m: CPUAttention(),
         MaskedLMLoss: lambda m: FusedMaskedLMLoss()}


def apply_speedups(model):
    """`model` with every module of exactly a class in SWAPS replaced by its faster twin, in place
    (parameter-free modules: no state_dict key changes); returns it."""
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            swap = SWAPS.get(type(child))
            if swap is not None:
                replacement = swap(child)
                replacement.train(child.training)
                setattr(parent, name, replacement)
    return model
