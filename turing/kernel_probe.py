"""Probing DeepSpeed's fused transformer kernel in a child process before a run uses it.

On torch 2.11 / CUDA 13 DeepSpeed 0.19's `DeepSpeedTransformerLayer` builds, then segfaults when a
layer is created (bench/README.md, the first H200 session): a crash no rank can catch, which
would take every rank down at model building. `check_transformer_kernel` builds one layer of the
run's sizes and runs a forward and a backward in a child process (`python -m
turing.kernel_probe`); a child that crashes, hangs or fails refuses --deepspeed_transformer_kernel
before anything is built, in one line naming the torch, CUDA and DeepSpeed versions and the way
to train without the kernel. The probe runs once per process; a passing probe costs the kernel's
JIT build, which the run would pay anyway (cached after).
"""
import argparse
import json
import signal
import subprocess
import sys

import torch

from turing.errors import InputValueError

PROBE_SECONDS = 600  # the first JIT build of the kernel takes minutes


def probe_command(settings):
    return [sys.executable, "-m", "turing.kernel_probe", json.dumps(settings)]


def check_transformer_kernel(settings, command=None, timeout=PROBE_SECONDS):
    """Refuse --deepspeed_transformer_kernel (InputValueError) unless one layer with `settings`
    (DeepSpeedTransformerConfig's keyword arguments) runs in a child process; `command` replaces
    the child's command line (tests)."""
    command = command or probe_command(settings)
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        why = f"it did not finish within {timeout} s"
    else:
        if done.returncode == 0:
            return
        if done.returncode < 0:
            why = f"it was killed by {signal.Signals(-done.returncode).name}"
        else:
            why = f"exit code {done.returncode}: {(done.stderr.strip().splitlines() or ['no output'])[-1][:300]}"
    import deepspeed  # the versions for the message

    raise InputValueError(
        f"--deepspeed_transformer_kernel: DeepSpeed's fused transformer layer fails on this machine (a probe "
        f"layer in a child process: {why}; torch {torch.__version__}, CUDA {torch.version.cuda}, DeepSpeed "
        f"{deepspeed.__version__}). Train without the flag (the original's scripts: TRANSFORMER_KERNEL=0), on this "
        f"project's own layers")


def main(argv=None):
    """The child: one layer of the given settings, a forward and a backward on the GPU."""
    from deepspeed.ops.transformer import DeepSpeedTransformerConfig, DeepSpeedTransformerLayer  # CUDA-only op

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("settings", help="DeepSpeedTransformerConfig keyword arguments, as JSON")
    settings = json.loads(parser.parse_args(argv).settings)
    layer = DeepSpeedTransformerLayer(DeepSpeedTransformerConfig(**settings)).cuda()
    dtype = torch.float16 if settings.get("fp16") else torch.float32
    if settings.get("fp16"):
        layer = layer.half()
    x = torch.randn(settings["batch_size"], 128, settings["hidden_size"], device="cuda", dtype=dtype, requires_grad=True)
    mask = torch.zeros(settings["batch_size"], 1, 1, 128, device="cuda", dtype=dtype)
    layer(x, mask).float().sum().backward()
    torch.cuda.synchronize()
    print("transformer kernel probe: ok")


if __name__ == "__main__":
    main()
