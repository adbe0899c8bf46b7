"""Training-step speed of our BERT against the original-style eager model and Hugging Face.

Owns nothing used in training. In one process it builds, at the same sizes, our model
(`turing.modeling.BertForPreTrainingPreLN`), the original-style eager model
(`testkit/reference_model.py`, loaded with our weights) and Hugging Face's
`BertForPreTraining` (attn_implementation="sdpa", built offline from a `BertConfig`), feeds
them one fixed batch, and times full training steps (forward, backward, AdamW step, zero
grad). Models run in alternating rounds (round r starts with a different model) so every
model sees the same machine load; a fp32/bf16 matmul peak is measured in the same run, once
per round. Reported per model: the median step time over all rounds (samples/s, tokens/s),
process CPU seconds per step, peak memory, and FLOP utilisation; then the speed of the first
model in --models (ours by default) over each other's: ratio of medians, and median of the
per-round ratios.

    python bench/bench_model.py                                  # the anchor: L4 H256 seq 128 batch 32
    python bench/bench_model.py --pad 0.5 --unpad
    python bench/bench_model.py --profile --models ours          # torch.profiler breakdown
    python bench/bench_model.py --pad 0.5 --models ours+unpad,ours                 # --unpad vs padded
    python bench/bench_model.py --models ours,ours+fused,reference                # A/B variants
    python bench/bench_model.py --device cuda --large --dtype bf16 --seq 128 --batch 64

Variants, joined to a model name with '+': `fused` / `foreach` (AdamW implementation),
`compile` (torch.compile), `unpad` (ours only: built with `unpad=True`, as `--unpad` does for
every "ours" entry). `--glibc_heap` is process-wide (glibc's mallopt
cannot be undone), so compare it across two runs.

Batch. Every row has round(seq * (1 - pad)) real tokens (segment A then B), the rest padding;
with `--lengths uniform` the row lengths spread evenly over [seq·(1 - 2·pad), seq] instead (same
mean, like real data). min(max_pred, max(1, round(real * 0.15))) positions per row are labelled
(the Bing provider's rule).

Precision. fp32: the models and AdamW in fp32. bf16 / fp16: the model is held in that dtype
(as DeepSpeed's bf16 and fp16 modes hold it) and AdamW updates fp32 master copies of the
weights; fp16 runs without loss scaling, which only matters for the numbers, not the time.

Model FLOPs of one training step (a multiply-add is 2 FLOPs; backward is twice the forward, so
a matmul with weights of P elements over T rows costs 6·P·T):
    encoder    6 · T · Lyr · (4·H² + 2·H·I)        QKV, attention output, FFN in and out
             + 12 · Lyr · H · Σ_rows n²            QKᵀ and probs·V (n = attended length)
    pooler+NSP 6 · B · (H² + 2·H)
    MLM head   6 · R_t · H² + 6 · R_d · H · V      transform dense on R_t rows, tied decoder on R_d
where T is the number of token rows entering the encoder, B the batch, V the vocab.
"Useful" FLOPs count real tokens only (T = Σ n, Σ n², R_t = R_d = masked positions):
the work any implementation must do. "Executed" FLOPs count what a model really computes:
    ours       T = B·seq, Σ = B·seq², R_t = R_d = masked   (with --unpad: T = Σ n, Σ = B·max(n)²)
    reference  T = B·seq, Σ = B·seq², R_t = B·seq, R_d = masked  (transform on every position)
    hf         T = B·seq, Σ = B·seq², R_t = R_d = B·seq          (vocab scores at every position)
MFU = useful FLOPs per step / step time / matmul peak; "executed utilisation" uses executed
FLOPs. Embedding lookups, LayerNorm, softmax, GELU and the optimizer are not counted.

Peak memory. On CPU each model also runs alone in a child process (build, warm-up, two steps)
and that process's peak RSS (VmHWM) is reported, since RSS cannot be split between models
sharing a process. On CUDA: the model's persistent tensors (weights, master
weights, optimizer state) plus the largest rise of `torch.cuda.max_memory_allocated` during
its steps, measured in-process.

`--unpad` (or the `unpad` variant) is passed to our model as `args.unpad`; the FLOP count
treats it as active when the model reports it honours it (`model.unpad` true).
"""
import argparse
import ctypes
import datetime
import json
import logging
import os
import resource
import statistics
import subprocess
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile, record_function

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from bench.common import append_json_lines, load_average, machine_description  # noqa: E402
from testkit import reference_model  # noqa: E402
from turing.modeling import BertConfig  # noqa: E402
from turing.arch import pretraining_model  # noqa: E402

logger = logging.getLogger("bench_model")

MODELS = ("ours", "reference", "hf")
VARIANTS = ("fused", "foreach", "compile", "unpad")  # "ours+fused": ours with fused AdamW
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
LARGE = dict(layers=24, hidden=1024, heads=16, intermediate=4096)

# Profiler op name -> group of the breakdown (self CPU time). Matched by substring, first wins.
OP_GROUPS = (
    ("attention", ("scaled_dot_product", "_sdpa", "flash_attention", "efficient_attention")),
    ("softmax/log-softmax", ("softmax", "aten::exp")),
    ("matmul", ("addmm", "aten::mm", "bmm", "matmul", "aten::linear", "aten::baddbmm")),
    ("GELU", ("gelu", "erf")),
    ("LayerNorm", ("layer_norm",)),
    ("dropout RNG", ("bernoulli", "dropout", "uniform_", "rand")),
    ("optimizer", ("_foreach", "adam", "Optimizer", "lerp", "addcdiv", "addcmul")),
    ("copies/reshapes", ("copy_", "clone", "contiguous", "aten::cat", "index_select", "index_add",
                         "embedding", "aten::to", "_to_copy", "gather", "scatter", "nonzero",
                         "empty", "zero_", "fill_", "view", "reshape", "transpose", "permute",
                         "expand", "unbind", "select", "slice", "stack", "as_strided")),
    ("element-wise", ("aten::add", "aten::mul", "aten::div", "aten::sub", "tanh", "aten::sum",
                      "aten::neg", "aten::rsub", "where", "masked_fill")),
)


class BenchError(ValueError):
    """A benchmark option that cannot be honoured; the message says which and why."""


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--seq", type=int, default=128)
    add("--batch", type=int, default=32)
    add("--pad", type=float, default=0.0, help="share of padding tokens per sequence, in [0, 1)")
    add("--lengths", choices=["fixed", "uniform"], default="fixed",
        help="fixed: every row has round(seq * (1 - pad)) real tokens; uniform: row lengths spread evenly "
             "over [seq * (1 - 2 pad), seq] (mean padding pad, like real data)")
    add("--max_pred", type=int, default=20, help="cap on masked positions per sequence")
    add("--layers", type=int, default=4)
    add("--hidden", type=int, default=256)
    add("--heads", type=int, default=4)
    add("--intermediate", type=int, default=1024)
    add("--vocab", type=int, default=30528)
    add("--large", action="store_true", help="BERT-large: 24 layers, 1024 hidden, 16 heads, 4096")
    add("--dropout", type=float, default=0.1, help="hidden and attention dropout")
    add("--dtype", choices=sorted(DTYPES), default="fp32")
    add("--device", choices=["cpu", "cuda"], default="cpu")
    add("--rounds", type=int, default=5, help="alternating rounds; every model runs --steps steps per round")
    add("--steps", type=int, default=3, help="timed steps per model per round")
    add("--unpad", action="store_true", help="ask our model to drop padding tokens (args.unpad)")
    add("--compile", action="store_true", help="torch.compile every model (skipped with a warning on failure)")
    add("--models", default="ours,reference,hf",
        help="comma-separated models: ours, reference, hf, each optionally with variants joined by '+': "
             "fused (fused AdamW), foreach (foreach AdamW), compile (torch.compile), unpad (ours only: "
             "drop padding tokens, like --unpad); e.g. ours,ours+fused or ours+unpad,ours")
    add("--glibc_heap", action="store_true",
        help="before anything else, make glibc malloc keep freed memory (no mmap, no trim) for the whole "
             "process; compare against a run without it (it cannot be undone inside a process)")
    add("--fused_adam", action="store_true", help="fused AdamW for every model (torch.optim.AdamW(fused=True))")
    add("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    add("--memory", choices=["auto", "isolated", "off"], default="auto",
        help="peak memory: auto = child processes on CPU, in-process on CUDA; off = skip")
    add("--profile", action="store_true",
        help="instead of timing rounds: torch.profiler over --steps steps of the first model, breakdown by op group")
    add("--output", default=None, help="append results as JSON lines to this file")
    add("--child_memory", default=None, help=argparse.SUPPRESS)  # internal: one model, report peak RSS
    args = parser.parse_args(argv)
    if args.large:
        for key, value in LARGE.items():
            setattr(args, key, value)
    args.models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = sorted(m for m in args.models
                     if m.split("+")[0] not in MODELS or not set(m.split("+")[1:]) <= set(VARIANTS))
    if unknown or not args.models or len(set(args.models)) < len(args.models):
        raise BenchError(f"--models: unknown or repeated {unknown or args.models}; expected distinct entries of "
                         f"{','.join(MODELS)}, each optionally followed by +{'/+'.join(VARIANTS)}")
    if any("unpad" in m.split("+")[1:] and m.split("+")[0] != "ours" for m in args.models):
        raise BenchError("--models: the unpad variant is an option of our model only (ours+unpad)")
    if not 0.0 <= args.pad < 1.0:
        raise BenchError(f"--pad must be in [0, 1), got {args.pad}")
    if args.vocab < 8:
        raise BenchError(f"--vocab must be at least 8, got {args.vocab}")
    if args.hidden % args.heads:
        raise BenchError(f"--hidden {args.hidden} is not a multiple of --heads {args.heads}")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise BenchError("--device cuda: no CUDA device is available to torch")
    if args.rounds < 1 or args.steps < 1:
        raise BenchError("--rounds and --steps must be at least 1")
    return args


# ---------------------------------------------------------------------------------------------
# Batch, models, optimizer


def real_length(args):
    return max(4, round(args.seq * (1.0 - args.pad)))


def row_lengths(args):
    """Real tokens of every row (a list of B ints)."""
    n = real_length(args)
    if args.lengths == "fixed" or n == args.seq:
        return [n] * args.batch
    low = max(4, 2 * n - args.seq)  # evenly from low to seq: mean n
    return [round(low + (args.seq - low) * i / max(1, args.batch - 1)) for i in range(args.batch)]


def masked_per_row(n, args):
    return min(args.max_pred, max(1, round(n * 0.15)))


def make_batch(args, seed=1):
    """(batch_type, input_ids, input_mask, segment_ids, nsp_labels, mlm_labels), all (B, seq) int64."""
    g = torch.Generator().manual_seed(seed)
    B, L = args.batch, args.seq
    lengths = torch.tensor(row_lengths(args))
    input_mask = (torch.arange(L)[None] < lengths[:, None]).long()
    low = min(1000, args.vocab // 2)  # ordinary word pieces sit above the specials in a BERT vocab
    input_ids = torch.randint(low, args.vocab, (B, L), generator=g) * input_mask
    input_ids[:, 0] = 101  # [CLS]-like first token; the value does not matter for speed
    segment_ids = (torch.arange(L)[None] >= (lengths // 2)[:, None]).long() * input_mask
    labels = torch.full((B, L), -1, dtype=torch.long)
    for row, n in enumerate(lengths.tolist()):
        positions = torch.randperm(n - 2, generator=g)[:masked_per_row(n, args)] + 1
        labels[row, positions] = input_ids[row, positions]
    nsp = torch.randint(0, 2, (B,), generator=g)
    return (torch.full((B,), 2, dtype=torch.long), input_ids, input_mask, segment_ids, nsp, labels)


def our_config(args):
    return BertConfig(args.vocab, hidden_size=args.hidden, num_hidden_layers=args.layers,
                      num_attention_heads=args.heads, intermediate_size=args.intermediate,
                      hidden_dropout_prob=args.dropout, attention_probs_dropout_prob=args.dropout,
                      max_position_embeddings=max(512, args.seq))


def split_spec(spec):
    """'ours+fused+compile' -> ('ours', {'fused', 'compile'})."""
    base, *variants = spec.split("+")
    return base, set(variants)


def build_model(spec, args, device, dtype, our_state=None):
    """-> (module, loss_fn(batch) -> scalar loss). Ours and reference share weights."""
    name, variants = split_spec(spec)
    torch.manual_seed(0)
    if name == "ours":
        unpad = args.unpad or "unpad" in variants
        model = pretraining_model(our_config(args), argparse.Namespace(unpad=unpad))  # with turing.speedups
    elif name == "reference":
        model = reference_model.BertForPreTrainingPreLN(our_config(args))
        if our_state is not None:
            model.load_state_dict(our_state, strict=True)
    else:
        from transformers import BertConfig as HFBertConfig  # optional: only for --models hf, slow to import
        from transformers import BertForPreTraining

        hf_config = HFBertConfig(vocab_size=args.vocab, hidden_size=args.hidden, num_hidden_layers=args.layers,
                                 num_attention_heads=args.heads, intermediate_size=args.intermediate,
                                 hidden_act="gelu", hidden_dropout_prob=args.dropout,
                                 attention_probs_dropout_prob=args.dropout,
                                 max_position_embeddings=max(512, args.seq), type_vocab_size=2,
                                 layer_norm_eps=1e-12, attn_implementation="sdpa")
        model = BertForPreTraining(hf_config)
    model = model.to(device=device, dtype=dtype).train()
    runner = model
    if args.compile or "compile" in variants:
        runner = CompiledOrEager(model, spec)
    if name == "hf":
        def loss_fn(batch):
            labels = batch[5].masked_fill(batch[5] == -1, -100)  # HF ignores -100
            return runner(input_ids=batch[1], attention_mask=batch[2], token_type_ids=batch[3],
                          labels=labels, next_sentence_label=batch[4]).loss
    else:
        def loss_fn(batch):
            return runner(batch)
    return model, loss_fn


class CompiledOrEager:
    """torch.compile(model); compilation happens at the first call, so a failure there is
    logged and the eager model is used from then on."""

    def __init__(self, model, spec):
        self.model, self.spec = model, spec
        self.compiled = torch.compile(model)

    def __call__(self, *args, **kwargs):
        if self.compiled is not None:
            try:
                return self.compiled(*args, **kwargs)
            except Exception as e:  # noqa: BLE001 - any compile failure falls back to eager
                logger.warning("torch.compile(%s) failed, running eager: %s", self.spec, str(e).splitlines()[0])
                self.compiled = None
        return self.model(*args, **kwargs)


class MasterWeightAdamW:
    """AdamW on fp32 master copies of low-precision weights (what DeepSpeed's bf16/fp16 modes do)."""

    def __init__(self, params, **kwargs):
        self.params = [p for p in params if p.requires_grad]
        self.master = [p.detach().float().clone().requires_grad_(True) for p in self.params]
        self.optimizer = torch.optim.AdamW(self.master, **kwargs)

    def step(self):
        for p, m in zip(self.params, self.master):
            m.grad = None if p.grad is None else p.grad.float()
        self.optimizer.step()
        with torch.no_grad():
            torch._foreach_copy_(self.params, self.master)

    def zero_grad(self, set_to_none=True):
        for p in self.params:
            p.grad = None

    def state_bytes(self):
        return tensor_bytes(self.master) + optimizer_state_bytes(self.optimizer)


def tensor_bytes(tensors):
    return sum(t.numel() * t.element_size() for t in tensors)


def optimizer_state_bytes(optimizer):
    return sum(tensor_bytes(v for v in state.values() if torch.is_tensor(v)) for state in optimizer.state.values())


def make_optimizer(model, dtype, spec="", fused_adam=False):
    """AdamW as the DeepSpeed configs set it up (torch's, per-parameter loop on CPU by default)."""
    kwargs = dict(lr=1e-4, weight_decay=0.01, betas=(0.9, 0.999), eps=1e-6)
    variants = split_spec(spec)[1]
    if fused_adam or "fused" in variants:
        kwargs["fused"] = True
    elif "foreach" in variants:
        kwargs["foreach"] = True
    if dtype == torch.float32:
        return torch.optim.AdamW(model.parameters(), **kwargs)
    return MasterWeightAdamW(model.parameters(), **kwargs)


def persistent_bytes(model, optimizer):
    extra = optimizer.state_bytes() if isinstance(optimizer, MasterWeightAdamW) else optimizer_state_bytes(optimizer)
    return tensor_bytes(model.parameters()) + extra


# ---------------------------------------------------------------------------------------------
# FLOPs, matmul peak


def step_flops(args, spec, unpad_active):
    """(useful, executed) model FLOPs of one training step; the formula is in the module docstring."""
    name = split_spec(spec)[0]
    B, S, lengths = args.batch, args.seq, row_lengths(args)
    H, I, V, Lyr = args.hidden, args.intermediate, args.vocab, args.layers
    masked = sum(masked_per_row(n, args) for n in lengths)
    tokens, sum_sq = sum(lengths), sum(n * n for n in lengths)

    def flops(tokens, sum_sq, rows_transform, rows_decoder):
        encoder = 6 * tokens * Lyr * (4 * H * H + 2 * H * I) + 12 * Lyr * H * sum_sq
        heads = 6 * B * (H * H + 2 * H) + 6 * rows_transform * H * H + 6 * rows_decoder * H * V
        return encoder + heads

    useful = flops(tokens, sum_sq, masked, masked)
    if name == "ours":
        # unpadded attention runs over the longest row's length
        executed = flops(tokens, B * max(lengths) ** 2, masked, masked) if unpad_active else \
            flops(B * S, B * S * S, masked, masked)
    elif name == "reference":
        executed = flops(B * S, B * S * S, B * S, masked)
    else:
        executed = flops(B * S, B * S * S, B * S, B * S)
    return useful, executed


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def matmul_peak(device, dtype, repeats=5):
    """Best FLOP/s of a large square matmul in `dtype` (the denominator of MFU)."""
    n = 8192 if device.type == "cuda" else 2048
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    out = torch.empty(n, n, device=device, dtype=dtype)
    inner = 10 if device.type == "cuda" else 1
    torch.mm(a, b, out=out)
    sync(device)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(inner):
            torch.mm(a, b, out=out)
        sync(device)
        best = min(best, (time.perf_counter() - start) / inner)
    return 2 * n ** 3 / best


# ---------------------------------------------------------------------------------------------
# Measurement helpers


def cpu_seconds():
    """(user + system, system) CPU seconds of this process; system time is mostly page faults here."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime, usage.ru_stime


def make_step(model, loss_fn, optimizer, batch):
    def step():
        loss = loss_fn(batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return step


def use_glibc_heap():
    """glibc malloc serves every size from its heap and never returns freed memory to the OS
    (mallopt M_MMAP_MAX = 0, M_TRIM_THRESHOLD = 1 GiB), so a step's large buffers reuse pages
    already mapped instead of page-faulting fresh ones each step. mallopt also switches off
    glibc's dynamic mmap threshold for good, so this is a whole-process setting. -> applied?"""
    try:
        libc = ctypes.CDLL("libc.so.6")
        return libc.mallopt(-4, 0) == 1 and libc.mallopt(-1, 1 << 30) == 1  # M_MMAP_MAX, M_TRIM_THRESHOLD
    except (OSError, AttributeError):
        return False


def peak_rss_bytes():
    """This process's peak resident set. VmHWM belongs to the process image, whereas getrusage's
    ru_maxrss survives exec and would include the parent's RSS at fork."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def child_peak_memory(args, argv, name):
    """Run one model alone in a child process; -> its JSON report (peak RSS) or None on failure."""
    cmd = [sys.executable, os.path.abspath(__file__)] + list(argv) + ["--child_memory", name]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        logger.warning("memory child for %s failed: %s", name, done.stderr.strip().splitlines()[-1:])
        return None
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_child_memory(args, device, dtype):
    """Child process: build one model, warm up, two steps; print peak RSS as one JSON line."""
    name = args.child_memory
    batch = tuple(t.to(device) for t in make_batch(args))
    rss_start = peak_rss_bytes()
    model, loss_fn = build_model(name, args, device, dtype)
    optimizer = make_optimizer(model, dtype, name, args.fused_adam)
    step = make_step(model, loss_fn, optimizer, batch)
    for _ in range(3):
        step()
    sync(device)
    print(json.dumps({"model": name, "peak_rss_bytes": peak_rss_bytes(), "rss_before_model_bytes": rss_start,
                      "persistent_bytes": persistent_bytes(model, optimizer)}))


# ---------------------------------------------------------------------------------------------
# Profile


def op_group(name):
    for group, keys in OP_GROUPS:
        if any(k in name for k in keys):
            return group
    return "other"


PHASES = ("forward", "backward", "optimizer")


def make_phased_step(model, loss_fn, optimizer, batch):
    """The training step with each phase under a profiler label, so ops can be attributed to it."""
    def step():
        with record_function("phase: forward"):
            loss = loss_fn(batch)
        with record_function("phase: backward"):
            loss.backward()
        with record_function("phase: optimizer"):
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    return step


def top_label(event):
    while event.cpu_parent is not None:
        event = event.cpu_parent
    return event.name


def run_profile(args, device, dtype, batch):
    """torch.profiler over --steps steps: self CPU time by phase, by op group, and the top ops.

    Every op of the optimizer phase counts as "optimizer" whatever its name (AdamW's per-tensor
    loop is made of mul_/add_/sqrt/addcdiv_); forward and backward ops are grouped by name."""
    name = args.models[0]
    model, loss_fn = build_model(name, args, device, dtype)
    optimizer = make_optimizer(model, dtype, name, args.fused_adam)
    step = make_phased_step(model, loss_fn, optimizer, batch)
    step()  # warm-up: optimizer state, allocator
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    start, (cpu0, sys0) = time.perf_counter(), cpu_seconds()
    with profile(activities=activities) as prof:
        for _ in range(args.steps):
            step()
        sync(device)
    wall = (time.perf_counter() - start) / args.steps
    cpu1, sys1 = cpu_seconds()
    phases = {p: 0.0 for p in PHASES}
    groups = {}
    for event in prof.events():
        if event.device_type.name != "CPU" or event.name.startswith("phase: "):
            continue
        label = top_label(event)
        phase = label[len("phase: "):] if label.startswith("phase: ") else "other"
        phases[phase] = phases.get(phase, 0.0) + event.self_cpu_time_total
        group = "optimizer" if phase == "optimizer" else op_group(event.name)
        groups[group] = groups.get(group, 0.0) + event.self_cpu_time_total
    total = sum(groups.values())
    per_step = lambda us: us / 1e3 / args.steps  # noqa: E731 - microseconds in all steps -> ms per step
    print(f"profile of {name}: {args.steps} steps, {wall:.3f} s/step with the profiler on; process CPU "
          f"{(cpu1 - cpu0) / args.steps:.3f} s/step of which system {(sys1 - sys0) / args.steps:.3f}; "
          f"ops' self time {per_step(total):.0f} ms/step")
    print("by phase: " + ", ".join(f"{p} {per_step(us):.0f} ms ({100 * us / total:.0f}%)"
                                   for p, us in phases.items() if us))
    print(f"{'group':<22} {'ms/step':>9} {'share':>7}")
    for group, us in sorted(groups.items(), key=lambda kv: -kv[1]):
        print(f"{group:<22} {per_step(us):>9.1f} {100 * us / total:>6.1f}%")
    events = prof.key_averages()
    print("\ntop ops by self CPU time (all phases):")
    print(events.table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=48))
    top = sorted((e for e in events if not e.key.startswith("phase: ")), key=lambda e: -e.self_cpu_time_total)[:25]
    return {"bench": "model_profile", "model": name, "steps": args.steps,
            "wall_s_per_step_profiled": wall, "cpu_s_per_step": (cpu1 - cpu0) / args.steps,
            "sys_cpu_s_per_step": (sys1 - sys0) / args.steps,
            "phases_ms_per_step": {p: per_step(us) for p, us in phases.items()},
            "groups_ms_per_step": {g: per_step(us) for g, us in groups.items()},
            "top_ops_ms_per_step": [[e.key, per_step(e.self_cpu_time_total), e.count // args.steps] for e in top]}


# ---------------------------------------------------------------------------------------------
# Main


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        args = parse_args(argv)
    except BenchError as e:
        print(f"bench_model.py: error: {e}", file=sys.stderr)
        return 2
    if args.glibc_heap and not use_glibc_heap():
        logger.warning("--glibc_heap needs glibc's mallopt; running with the default allocator settings")
    if args.threads:
        torch.set_num_threads(args.threads)
    device, dtype = torch.device(args.device), DTYPES[args.dtype]
    if args.child_memory:
        run_child_memory(args, device, dtype)
        return 0

    batch = tuple(t.to(device) for t in make_batch(args))
    n = sum(row_lengths(args)) / args.batch  # mean real tokens per row
    masked_rows = int((batch[5] != -1).sum())
    shape = (f"L={args.layers} H={args.hidden} A={args.heads} I={args.intermediate} V={args.vocab} "
             f"seq={args.seq} real={n:g} ({args.lengths}) batch={args.batch} masked rows={masked_rows} {args.dtype} "
             f"{args.device} threads={torch.get_num_threads()}")
    common = {"date": datetime.datetime.now().isoformat(timespec="seconds"),
              "machine": machine_description(device.type),
              "command": "python bench/bench_model.py " + " ".join(argv),
              "layers": args.layers, "hidden": args.hidden, "heads": args.heads,
              "intermediate": args.intermediate, "vocab": args.vocab, "seq": args.seq, "batch": args.batch,
              "pad": args.pad, "lengths": args.lengths, "real_tokens_per_seq": n, "masked_rows": masked_rows,
              "dtype": args.dtype,
              "device": args.device, "threads": torch.get_num_threads(), "unpad": args.unpad,
              "compile": args.compile, "glibc_heap": args.glibc_heap}
    records = []
    if args.profile:
        print(shape)
        records.append({**common, **run_profile(args, device, dtype, batch), "loadavg": load_average()})
        append_json_lines(args.output, records)
        return 0

    load_start = load_average()
    models, steps, persistent = {}, {}, {}
    our_state = None
    for name in args.models:  # "ours" first in the list gives the reference our weights
        model, loss_fn = build_model(name, args, device, dtype, our_state)
        if split_spec(name)[0] == "ours" and our_state is None:
            our_state = model.state_dict()
        optimizer = make_optimizer(model, dtype, name, args.fused_adam)
        models[name] = (model, optimizer)
        steps[name] = make_step(model, loss_fn, optimizer, batch)
    unpad_active = {m: bool(getattr(models[m][0], "unpad", False)) for m in models}

    for name in args.models:  # warm-up: optimizer state, allocator, compile (cuBLAS heuristics on CUDA)
        for _ in range(3 if device.type == "cuda" else 1):
            steps[name]()
        persistent[name] = persistent_bytes(*models[name])
    sync(device)

    times = {name: [] for name in args.models}
    cpu = {name: [] for name in args.models}
    sys_cpu = {name: [] for name in args.models}
    round_medians = {name: [] for name in args.models}
    mem_rise = {name: 0 for name in args.models}
    peaks = []
    for r in range(args.rounds):
        peaks.append(matmul_peak(device, dtype))
        order = args.models[r % len(args.models):] + args.models[:r % len(args.models)]
        for name in order:
            if device.type == "cuda":
                before = torch.cuda.memory_allocated()
                torch.cuda.reset_peak_memory_stats()
            this_round = []
            for _ in range(args.steps):
                sync(device)
                t0, (c0, s0) = time.perf_counter(), cpu_seconds()
                steps[name]()
                sync(device)
                this_round.append(time.perf_counter() - t0)
                c1, s1 = cpu_seconds()
                cpu[name].append(c1 - c0)
                sys_cpu[name].append(s1 - s0)
            times[name] += this_round
            round_medians[name].append(statistics.median(this_round))
            if device.type == "cuda":
                mem_rise[name] = max(mem_rise[name], torch.cuda.max_memory_allocated() - before)
        logger.info("round %d/%d: %s", r + 1, args.rounds,
                    ", ".join(f"{m} {args.batch / round_medians[m][-1]:.1f}" for m in args.models) + " samples/s")
    load_end = load_average()
    peak = max(peaks)

    memory = {}
    mode = args.memory if args.memory != "auto" else ("isolated" if device.type == "cpu" else "inprocess")
    if mode == "isolated":
        for name in args.models:
            report = child_peak_memory(args, [a for a in argv if a != "--profile"], name)
            memory[name] = report["peak_rss_bytes"] if report else None
    elif mode == "inprocess":
        memory = {name: persistent[name] + mem_rise[name] for name in args.models}

    print(shape)
    print(f"load average {load_start} -> {load_end}; matmul peak {peak / 1e9:.1f} GFLOP/s "
          f"({args.dtype}, best of {len(peaks)} rounds; median {statistics.median(peaks) / 1e9:.1f})")
    print(f"{'model':>9} {'samples/s':>10} {'tokens/s':>10} {'s/step':>8} {'CPU s/step':>10} {'sys':>5} "
          f"{'peak mem GiB':>12} {'MFU':>6} {'exec util':>9} {'useful GFLOP':>12} {'exec GFLOP':>10}")
    for name in args.models:
        med = statistics.median(times[name])
        useful, executed = step_flops(args, name, unpad_active[name])
        mem = memory.get(name)
        rec = {**common, "bench": "model", "model": name,
               "unpad_active": unpad_active[name],
               "rounds": args.rounds, "steps_per_round": args.steps,
               "median_step_s": med, "min_step_s": min(times[name]), "max_step_s": max(times[name]),
               "samples_per_s": args.batch / med, "tokens_per_s": args.batch * args.seq / med,
               "real_tokens_per_s": args.batch * n / med,
               "cpu_s_per_step": statistics.median(cpu[name]),
               "sys_cpu_s_per_step": statistics.median(sys_cpu[name]),
               "peak_memory_bytes": mem, "memory_mode": mode,
               "useful_flops_per_step": useful, "executed_flops_per_step": executed,
               "matmul_peak_flops": peak, "mfu": useful / med / peak, "executed_utilisation": executed / med / peak,
               "loadavg_start": load_start, "loadavg_end": load_end}
        records.append(rec)
        mem_text = f"{mem / 2 ** 30:.2f}" if mem else "-"
        print(f"{name:>9} {rec['samples_per_s']:>10.1f} {rec['tokens_per_s']:>10,.0f} {med:>8.3f} "
              f"{rec['cpu_s_per_step']:>10.3f} {rec['sys_cpu_s_per_step']:>5.2f} {mem_text:>12} {100 * rec['mfu']:>5.1f}% "
              f"{100 * rec['executed_utilisation']:>8.1f}% {useful / 1e9:>12.1f} {executed / 1e9:>10.1f}")
    summary = {**common, "bench": "model_ratios", "loadavg_start": load_start, "loadavg_end": load_end}
    first = args.models[0]  # ratios are the first model's speed over each other's ("ours" by default)
    for other in args.models[1:]:
        of_medians = statistics.median(times[other]) / statistics.median(times[first])
        per_round = statistics.median(o / u for o, u in zip(round_medians[other], round_medians[first]))
        summary[f"{first}_over_{other}"] = of_medians
        summary[f"{first}_over_{other}_per_round_median"] = per_round
        print(f"speed-up {first}/{other}: {of_medians:.2f}x (ratio of medians), "
              f"{per_round:.2f}x (median of per-round ratios, {args.rounds} rounds)")
    if len(args.models) > 1:
        records.append(summary)
    append_json_lines(args.output, records)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
