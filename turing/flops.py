"""Model FLOPs utilisation (MFU): the FLOPs a BERT training step needs, and the peak FLOP rate of
the device it runs on.

FLOPs of one training sequence (`turing.arch.training_flops`, which takes each architecture's
formula from the registry: `bert_training_flops` for the BERT blocks, `modern_training_flops`),
counting the matrix multiplications
only (2 FLOPs per multiply-add; embeddings are lookups, LayerNorm, softmax, GELU and dropout are
elementwise and left out, as in every published MFU), for sequence length s, hidden size h,
intermediate size i, n layers, vocab V and p predicted (masked) tokens per sequence:

    per encoder layer, forward:  Q, K, V and output projections   4 x 2 s h h  = 8 s h^2
                                 feed-forward (h -> i -> h)       2 x 2 s h i  = 4 s h i
                                 scores Q K^T and scores x V      2 x 2 s s h  = 4 s^2 h
    heads, forward:              MLM transform and decoder on the p masked rows only (the model
                                 gathers them first): p (2 h h + 2 h V); pooler + NSP: 2 h h + 4 h
    training = 3 x forward       (the backward pass computes the gradients of the activations
                                 and of the weights: two matmuls for every forward one)

so 3 [n (8 s h^2 + 4 s h i + 4 s^2 h) + p (2 h^2 + 2 h V) + 2 h^2 + 4 h]. The bert_postln block
(turing/arch/bert_postln/) has the same matmuls (its LayerNorms sit elsewhere), so the same count;
the roberta and distilbert blocks (turing/arch/roberta/, distilbert/) too, less the pooler and NSP head's 2 h^2 + 4 h.

The modernbert block (turing/arch/modernbert/) differs in three places:
- feed-forward: GeGLU, Wi (h -> 2i) then Wo (i -> h): three h x i matmuls, 2 x 2 s h (2i) +
  2 s i h = 6 s h i (the gate product is elementwise);
- attention in a sliding-window layer: a query sees the keys within local_attention // 2 = w
  positions, so the two score matmuls count 4 h per attended (query, key) pair, 4 h a(s, w)
  with a(s, w) = s (2w + 1) - w (w + 1) pairs (s^2 once w >= s - 1); full-attention layers
  count 4 s^2 h as above. (On CPU the band is a dense mask, so the matmuls there compute all
  s^2 pairs: the hardware does more than the model's count, which leaves those out.)
- heads: the MLM head's dense and decoder on the p masked rows; no pooler, no NSP head.
so 3 [n (8 s h^2 + 6 s h i) + 4 h (sum over layers of the attended pairs) + p (2 h^2 + 2 h V)].
RoPE, the embedding norm and the gate are elementwise. Recomputation
(--checkpoint_activations) is not counted: MFU measures the model's FLOPs, not the hardware's.
Padding counts as tokens (s is the padded length), as in NVIDIA's and MosaicML's BERT figures.

MFU = (sequences/s x FLOPs per sequence) / (ranks x peak FLOP/s of one device). The peak is
--peak_tflops, else the dense tensor-core figure of a known GPU (PEAK_TFLOPS), else (the CPU, an
unknown GPU, or --peak_tflops measure) the rate of a large matmul measured here. A measured peak
is only a lower bound of what the device can do (measured under whatever else runs at the time):
when the run's own model FLOP rate exceeds it, the reporter measures again and takes the larger
of the two rates, so a measured MFU never exceeds 100% (turing.reporting). The MFU against a
measured peak moves with the machine's load (other work slows the model, and raises the peak when
it leaves): the reporter says so once, with the first progress line, and raises the peak silently.
"""
import functools
import time

import torch

# Dense peak TFLOP/s by device name fragment and precision (vendor data sheets; SXM parts; fp32
# without TF32, which torch leaves off for matmuls by default). First match wins.
PEAK_TFLOPS = (
    ("H200", {"bf16": 989.4, "fp16": 989.4, "fp32": 66.9}),
    ("H100 PCIe", {"bf16": 756.0, "fp16": 756.0, "fp32": 51.2}),
    ("H100", {"bf16": 989.4, "fp16": 989.4, "fp32": 66.9}),
    ("A100", {"bf16": 312.0, "fp16": 312.0, "fp32": 19.5}),
    ("V100", {"fp16": 125.0, "fp32": 15.7}),
)
MEASURE = "measure"


def attended_pairs(seq_length, window_half):
    """(query, key) pairs of a length-s sequence with |query - key| <= window_half."""
    s, w = seq_length, min(window_half, seq_length - 1)
    return s * (2 * w + 1) - w * (w + 1)


def bert_training_flops(config, seq_length, predictions, pooler=True):
    """FLOPs of training a BERT block on one sequence (forward + backward; see the module docstring).
    `config`: a BertConfig (hidden_size, intermediate_size, num_hidden_layers, vocab_size), or the
    bert_postln architecture's PostLNConfig (the same count); `pooler` false: a block without the
    pooler and the NSP head (the roberta and distilbert ones)."""
    s, h, i, n, v, p = (seq_length, config.hidden_size, config.intermediate_size, config.num_hidden_layers,
                        config.vocab_size, predictions)
    layer = 8 * s * h * h + 4 * s * h * i + 4 * s * s * h
    heads = p * (2 * h * h + 2 * h * v) + (2 * h * h + 4 * h if pooler else 0)
    return 3 * (n * layer + heads)


def modern_training_flops(config, seq_length, predictions):
    """bert_training_flops of the modernbert block (its part of the module docstring)."""
    s, h, i, v, p = seq_length, config.hidden_size, config.intermediate_size, config.vocab_size, predictions
    pairs = sum(s * s if kind == "full_attention" else attended_pairs(s, config.local_attention // 2)
                for kind in config.layer_types)
    forward = config.num_hidden_layers * (8 * s * h * h + 6 * s * h * i) + 4 * h * pairs + p * (2 * h * h + 2 * h * v)
    return 3 * forward


def table_peak_tflops(device_name, precision):
    """The PEAK_TFLOPS entry of a device name and precision, or None."""
    for fragment, peaks in PEAK_TFLOPS:
        if fragment in device_name:
            return peaks.get(precision)
    return None


@functools.lru_cache(maxsize=None)
def measured_peak_tflops(device_type, precision):
    """TFLOP/s of a square matmul on this device in this precision (largest of a few timed runs;
    about a second on a GPU, a fraction of one on a CPU), once per process (`measure_matmul_tflops`
    measures again)."""
    return measure_matmul_tflops(device_type, precision)


def measure_matmul_tflops(device_type, precision):
    """TFLOP/s of a square matmul, measured now (on this process's torch threads)."""
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[precision]
    size = 8192 if device_type == "cuda" else 512
    generator = torch.Generator(device_type).manual_seed(0)  # not the global one: dropout draws from that
    a = torch.randn(size, size, device=device_type, dtype=dtype, generator=generator)
    b = torch.randn(size, size, device=device_type, dtype=dtype, generator=generator)
    best = 0.0
    for _ in range(5):
        if device_type == "cuda":
            torch.cuda.synchronize()
        started, repeats = time.perf_counter(), 0
        while time.perf_counter() - started < 0.05 or repeats < 2:
            a @ b
            repeats += 1
            if device_type == "cuda":
                torch.cuda.synchronize()
        best = max(best, 2 * size ** 3 * repeats / (time.perf_counter() - started))
    return best / 1e12


MEASURED_SOURCE = "measured {precision} matmul on {name}"


def peak_tflops(device, precision, requested=None, again=False):
    """(peak TFLOP/s of one device, where the figure comes from): `requested` (a number, or
    MEASURE), else the table for a known GPU, else a measured matmul (`again`: measured now,
    not the process's first measurement)."""
    if requested not in (None, MEASURE):
        return float(requested), "--peak_tflops"
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    peak = table_peak_tflops(name, precision) if requested is None and device.type == "cuda" else None
    if peak is not None:
        return peak, f"{name} {precision} data sheet"
    measure = measure_matmul_tflops if again else measured_peak_tflops
    return measure(device.type, precision), MEASURED_SOURCE.format(precision=precision, name=name)


def is_measured(source):
    """Whether a peak's source (peak_tflops' second value) is a measurement, a lower bound."""
    return source.startswith("measured")
