"""The FLOP count behind the logged MFU: by hand for a tiny config, and against torch's own FLOP
counter over a real training step (forward and backward) of the model; the peak table."""
import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from turing.batch import Batch
from turing.arch import ARCHITECTURES, model_config_from_dict, training_flops
from turing.flops import peak_tflops, table_peak_tflops


def config(hidden, layers, intermediate, vocab, heads=2, architecture="bert"):
    return model_config_from_dict({"architecture": architecture, "vocab_size_or_config_json_file": vocab,
                                   "hidden_size": hidden, "num_hidden_layers": layers, "num_attention_heads": heads,
                                   "intermediate_size": intermediate, "hidden_act": "gelu", "hidden_dropout_prob": 0.0,
                                   "attention_probs_dropout_prob": 0.0, "max_position_embeddings": 64,
                                   "initializer_range": 0.02})   # each architecture's default token types


def test_hand_count_of_a_tiny_config():
    # h=4, i=8, one layer, s=3 tokens, V=10, p=2 masked tokens. Forward, 2 FLOPs per multiply-add:
    #   Q, K, V, output projections 4 x 2*3*4*4 = 384; feed-forward 2 x 2*3*4*8 = 384;
    #   Q K^T and scores x V 2 x 2*3*3*4 = 144; MLM transform + decoder on 2 rows 2 x (32 + 80) = 224;
    #   pooler 32 + NSP 16 = 48. Forward 1184, training 3 x 1184.
    assert training_flops(config(4, 1, 8, 10), seq_length=3, predictions=2) == 3 * 1184


@pytest.mark.parametrize("architecture", ["bert", "bert_postln", "roberta", "distilbert"])  # each spec's formula
def test_the_count_equals_torchs_flop_counter_on_a_training_step(architecture):
    cfg = config(64, 2, 256, 96, architecture=architecture)
    model = ARCHITECTURES[architecture].model(cfg)
    batch_size, length, predictions = 4, 32, 5
    ids = torch.randint(5, 96, (batch_size, length))
    labels = torch.full((batch_size, length), -1)
    labels[:, 1:1 + predictions] = ids[:, 1:1 + predictions]
    zeros = torch.zeros(batch_size, dtype=torch.long)
    batch = Batch(zeros, ids, torch.ones_like(ids), torch.zeros_like(ids), zeros, labels)
    # the math backend runs attention as matmuls the counter sees
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        model(batch).backward()
    assert counter.get_total_flops() == batch_size * training_flops(cfg, length, predictions)


def test_peaks_of_known_devices_and_the_override():
    assert table_peak_tflops("NVIDIA H200", "bf16") == 989.4
    assert table_peak_tflops("NVIDIA H100 PCIe", "bf16") == 756.0
    assert table_peak_tflops("NVIDIA A100-SXM4-80GB", "fp16") == 312.0
    assert table_peak_tflops("Tesla V100-SXM2-32GB", "bf16") is None    # no bf16 on a V100
    assert table_peak_tflops("AMD Instinct MI300X", "bf16") is None
    assert peak_tflops(torch.device("cpu"), "fp32", 12.5) == (12.5, "--peak_tflops")
    measured, source = peak_tflops(torch.device("cpu"), "fp32")
    assert measured > 0 and source == "measured fp32 matmul on cpu"


def test_peak_tflops_flag_is_checked(data_root, tmp_path, capsys):
    from tests.launch import ds_config, expect_input_error, train_in_process

    for value, expected in (("fast", "--peak_tflops must be a number or 'measure', got 'fast'"),
                            ("0", "--peak_tflops must be > 0, got 0.0"), ("nan", "--peak_tflops must be a number")):
        line = expect_input_error(capsys, train_in_process, data_root, tmp_path / "out", ds_config(tmp_path),
                                  "--peak_tflops", value)
        assert expected in line, line


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_measured_peak_leaves_the_global_generator_alone(precision):
    """Dropout draws from torch's global generator: measuring the peak must not move it, or a
    run's losses would depend on when its first progress line came."""
    from turing.flops import measured_peak_tflops

    measured_peak_tflops.cache_clear()
    before = torch.get_rng_state()
    measured_peak_tflops("cpu", precision)
    assert torch.equal(torch.get_rng_state(), before)


def test_a_measured_peak_below_the_runs_own_rate_is_raised_never_mfu_above_100(data_root, tmp_path, capsys,
                                                                              monkeypatch):
    """A peak measured while the machine was busy (here: as if it had measured a thousandth of a
    GFLOP/s) is measured again, and raised to the model's own rate where that is higher: the
    progress lines never print an MFU above 100%. Issue 43: on a loaded machine that happened at
    one progress line after another, each with a warning, and the MFU swung from 9.6% to 53%: the
    run says once, with the first progress line, that the peak is measured and the MFU moves with
    the load, and raises it without a warning."""
    from tests.launch import ds_config, train_in_process
    from testkit.launcher import PROGRESS_MFU
    from turing import flops

    monkeypatch.setattr(flops, "measured_peak_tflops", lambda device_type, precision: 1e-12)
    measured_again = []
    monkeypatch.setattr(flops, "measure_matmul_tflops", lambda *a: measured_again.append(a) or 2e-12)
    train_in_process(data_root, tmp_path / "out", ds_config(tmp_path), "--log_level", "info", "--max_steps", 4,
                     "--peak_tflops", "measure")
    err = capsys.readouterr().err
    mfus = [float(m) for m in PROGRESS_MFU.findall(err)]
    assert len(mfus) == 4 and max(mfus) <= 100.0
    assert measured_again                                    # the busy machine's figure was measured again
    assert err.count("MFU: the peak is measured on this machine as loaded now, so the MFU moves with the load") == 1
    assert "MFU against a peak of 1e-12 TFLOP/s per device (measured" in err
    assert not [line for line in err.splitlines() if "WARNING" in line and "MFU" in line], err
