"""Portable LAMB: DeepSpeed FusedLamb's update in plain PyTorch, for machines without CUDA.

DeepSpeed's `FusedLamb` (optimizer type "Lamb" in the DeepSpeed config) is a CUDA kernel. This
module owns a drop-in `Lamb` that performs the same update on any device (CPU, or any
accelerator PyTorch supports), and `build_lamb_if_needed`, which decides from the DeepSpeed
config and the accelerator whether DeepSpeed builds its FusedLamb or this one is handed to
`deepspeed.initialize`.

The update is the one of DeepSpeed's `fused_lamb_cuda_kernel.cu`, per parameter p with
gradient g at step t (all in fp32):

    m = b1 m + (1 - b1) g                    v = b2 v + (1 - b2) g^2
    u = m / (sqrt(v) + eps) + wd p           (eps_inside_sqrt: m / sqrt(v + eps) + wd p)
    c = clip(||p|| / ||u||, min_coeff, max_coeff), or 1 when ||p|| or ||u|| is 0
    p = p - lr_t c u,  lr_t = lr sqrt(1 - b2^t) / (1 - b1^t) with bias_correction, else lr

Two details follow the kernel rather than the LAMB paper: bias correction is folded into the
step size (so the trust ratio c is computed from the uncorrected moments, and the weight-decay
term is scaled by it too), and the decoupled weight decay is part of the update whose norm
sets c. With `bias_correction=False` (the Bing BERT recipe) the two readings coincide.
"""
import copy
import logging
import math

import torch
from deepspeed import accelerator

from turing.errors import InputFileNotFoundError, InputValueError
from turing.jsonfile import read_json

logger = logging.getLogger(__name__)

# FusedLamb's constructor arguments; a DeepSpeed "Lamb" params block may use only these.
LAMB_PARAMS = ("lr", "bias_correction", "betas", "eps", "eps_inside_sqrt", "weight_decay",
               "max_grad_norm", "max_coeff", "min_coeff", "amsgrad")


class LambConfigError(InputValueError):
    """A DeepSpeed config asks for Lamb with parameters this optimizer cannot take."""


def _compute_dtype(p):
    """fp32 for half-precision parameters (as FusedLamb's fp32 math), else the parameter's own."""
    return p.dtype if p.dtype in (torch.float32, torch.float64) else torch.float32


class Lamb(torch.optim.Optimizer):
    """LAMB with DeepSpeed FusedLamb's arguments, update and `get_lamb_coeffs()`.

    Moments and the update are computed in fp32 (fp64 for fp64 parameters); a bf16/fp16
    parameter is updated through an fp32 copy and written back. `max_grad_norm` is accepted
    for signature compatibility and ignored: DeepSpeed clips gradients (`gradient_clipping`)
    before the optimizer sees them.
    """

    def __init__(self, params, lr=1e-3, bias_correction=True, betas=(0.9, 0.999), eps=1e-8,
                 eps_inside_sqrt=False, weight_decay=0.0, max_grad_norm=0.0, max_coeff=10.0,
                 min_coeff=0.01, amsgrad=False):
        if amsgrad:
            raise LambConfigError("Lamb: amsgrad=True is not supported (FusedLamb has no AMSGrad variant)")
        if not lr >= 0.0:
            raise LambConfigError(f"Lamb: lr must be >= 0, got {lr}")
        if not eps >= 0.0:
            raise LambConfigError(f"Lamb: eps must be >= 0, got {eps}")
        if len(betas) != 2 or not all(0.0 <= b < 1.0 for b in betas):
            raise LambConfigError(f"Lamb: betas must be two numbers in [0, 1), got {betas}")
        if not weight_decay >= 0.0:
            raise LambConfigError(f"Lamb: weight_decay must be >= 0, got {weight_decay}")
        if not 0.0 <= min_coeff <= max_coeff:
            raise LambConfigError(f"Lamb: need 0 <= min_coeff <= max_coeff, got min_coeff {min_coeff}, "
                                  f"max_coeff {max_coeff}")
        defaults = dict(lr=lr, bias_correction=bias_correction, betas=tuple(betas), eps=eps,
                        weight_decay=weight_decay, max_grad_norm=max_grad_norm,
                        max_coeff=max_coeff, min_coeff=min_coeff)
        super().__init__(params, defaults)
        self.eps_inside_sqrt = eps_inside_sqrt
        # Trust ratios of the last step, as 0-d tensors: reading them is one sync, on demand.
        self.lamb_coeffs = []

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.lamb_coeffs = []
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError("Lamb does not support sparse gradients")
                state = self.state[p]
                if len(state) == 0:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p, dtype=_compute_dtype(p))
                    state["exp_avg_sq"] = torch.zeros_like(p, dtype=_compute_dtype(p))
                state["step"] += 1
                self.lamb_coeffs.append(self._update(p, state, group, beta1, beta2))
        return loss

    def _update(self, p, state, group, beta1, beta2):
        """One FusedLamb step for parameter p; returns its trust ratio (0-d tensor)."""
        dtype = _compute_dtype(p)
        grad = p.grad.to(dtype)
        weight = p if p.dtype == dtype else p.to(dtype)
        exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
        exp_avg.mul_(beta1).add_(grad, alpha=1.0 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1.0 - beta2)
        if self.eps_inside_sqrt:
            denom = (exp_avg_sq + group["eps"]).sqrt_()
        else:
            denom = exp_avg_sq.sqrt().add_(group["eps"])
        update = exp_avg / denom
        if group["weight_decay"] != 0.0:
            update.add_(weight, alpha=group["weight_decay"])

        weight_norm = weight.norm()
        update_norm = update.norm()
        # The ratio is left on the device (no .item()): a host sync per parameter would stall
        # an accelerator for every one of BERT's ~200 tensors.
        ratio = (weight_norm / update_norm).clamp(group["min_coeff"], group["max_coeff"])
        coeff = torch.where((weight_norm > 0) & (update_norm > 0), ratio, torch.ones_like(ratio))

        step_size = group["lr"]
        if group["bias_correction"]:
            t = state["step"]
            step_size = step_size * math.sqrt(1.0 - beta2 ** t) / (1.0 - beta1 ** t)
        weight.sub_(update.mul_(coeff), alpha=step_size)
        if weight is not p:
            p.copy_(weight)
        return coeff

    def get_lamb_coeffs(self):
        """Trust ratios (floats) of the parameters updated by the last step, in group order."""
        if not self.lamb_coeffs:
            return []
        return torch.stack(self.lamb_coeffs).tolist()


def find_lamb_coeffs(optimizer):
    """The last step's LAMB coefficients from an optimizer or a DeepSpeed engine, or None.

    DeepSpeed wraps the basic optimizer (BF16_Optimizer, FP16_UnfusedOptimizer, ...); the
    wrapper keeps it in `.optimizer`, the engine in `.optimizer` / `.basic_optimizer`.
    Works for this Lamb and for DeepSpeed's FusedLamb alike.
    """
    seen = set()
    todo = [optimizer]
    while todo:
        obj = todo.pop(0)
        if obj is None or id(obj) in seen:
            continue
        seen.add(id(obj))
        getter = getattr(obj, "get_lamb_coeffs", None)
        if callable(getter):
            return getter()
        todo += [getattr(obj, "optimizer", None), getattr(obj, "basic_optimizer", None)]
    return None


def _read_ds_config(ds_config):
    if isinstance(ds_config, dict):
        return ds_config
    return read_json(ds_config, "DeepSpeed config", LambConfigError, InputFileNotFoundError)


def lamb_kwargs_from_ds(params, where="optimizer.params"):
    """FusedLamb keyword arguments from a DeepSpeed "Lamb" params block, checked."""
    if not isinstance(params, dict):
        raise LambConfigError(f"{where}: expected a JSON object of Lamb parameters, got {params!r}")
    unknown = sorted(set(params) - set(LAMB_PARAMS))
    if unknown:
        raise LambConfigError(f"{where}: unknown Lamb parameter(s) {', '.join(unknown)}; "
                              f"expected some of {', '.join(LAMB_PARAMS)}")
    if "max_grad_norm" in params:
        # DeepSpeed's engine refuses it for its own Lamb too; clipping is an engine setting.
        raise LambConfigError(f"{where}: 'max_grad_norm' is not supported as an optimizer parameter; "
                              f"use the DeepSpeed config's 'gradient_clipping' instead")
    kwargs = dict(params)
    if "betas" in kwargs:
        kwargs["betas"] = tuple(kwargs["betas"])
    return kwargs


def build_lamb_if_needed(ds_config, model_parameters):
    """Our Lamb when the DeepSpeed config asks for "Lamb" and the accelerator is not CUDA.

    ds_config: the DeepSpeed config as a dict (or a path to its JSON file).
    Returns (optimizer, config): on CUDA, or when the config asks for another optimizer,
    (None, ds_config) and DeepSpeed builds its own; otherwise (Lamb(...), a copy of the
    config without its "optimizer" entry), to be passed on as
    `deepspeed.initialize(model=..., optimizer=optimizer, config=config)`.
    """
    config = _read_ds_config(ds_config)
    opt = config.get("optimizer")
    if not isinstance(opt, dict) or str(opt.get("type", "")).lower() != "lamb":
        return None, config
    device = accelerator.get_accelerator().device_name()
    if device == "cuda":
        return None, config
    kwargs = lamb_kwargs_from_ds(opt.get("params", {}))
    optimizer = Lamb(model_parameters, **kwargs)
    rest = copy.deepcopy({k: v for k, v in config.items() if k != "optimizer"})
    logger.info("DeepSpeed's FusedLamb needs CUDA and the accelerator is %s: using the portable "
                "turing.lamb.Lamb (same update) with %s", device, kwargs)
    return optimizer, rest
