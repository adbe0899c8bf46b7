"""CUDA-only checks: the paths the CPU suite cannot run (fp16, DeepSpeed's FusedLamb and
transformer kernel, FlexAttention sparse attention, SDPA kernels with --unpad, torch.compile on
a GPU). Skipped without a CUDA device; `bash scripts/gpu_check.sh` runs them together with the
GPU benchmark as one job.
"""
import argparse
import math

import pytest
import torch

from tests.launch import ds_config, train_in_process, train_losses
from tests.test_model_options import make_batch, tiny_config
from turing.modeling import BertForPreTrainingPreLN
from turing.tb_events import read_run

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

LAMB = {"type": "Lamb", "params": {"lr": 1e-2, "weight_decay": 0.01, "bias_correction": False,
                                   "max_coeff": 0.3, "min_coeff": 0.01}}


def cuda_batch(**kwargs):
    return tuple(t.cuda() for t in make_batch(**kwargs))


def plain_model(**args):
    torch.manual_seed(0)
    return BertForPreTrainingPreLN(tiny_config(), argparse.Namespace(**args)).cuda().eval()


def test_fp16_fused_lamb_trains(data_root, tmp_path):
    ds = ds_config(tmp_path, optimizer=LAMB, fp16={"enabled": True, "loss_scale": 0, "initial_scale_power": 12})
    state = train_in_process(data_root, tmp_path / "out", ds)
    assert state.global_step == 8
    losses = train_losses(tmp_path / "out")
    assert all(math.isfinite(v) for v in losses) and losses[-1] < losses[0]
    assert read_run(str(tmp_path / "out" / "runs" / "tiny_bert"))[1]["Train/lamb_coeffs"]                                    # FusedLamb's coefficients logged


def test_fp16_transformer_kernel_trains(data_root, tmp_path):
    ds = ds_config(tmp_path, fp16={"enabled": True, "loss_scale": 0, "initial_scale_power": 12})
    state = train_in_process(data_root, tmp_path / "out", ds, "--deepspeed_transformer_kernel")
    assert state.global_step == 8
    losses = train_losses(tmp_path / "out")
    assert all(math.isfinite(v) for v in losses) and losses[-1] < losses[0]


def test_transformer_kernel_matches_the_plain_layer_after_conversion():
    plain = plain_model()
    args = argparse.Namespace(deepspeed_transformer_kernel=True, train_micro_batch_size_per_gpu=4, local_rank=0,
                              seed=0, ds_config={})
    kernel = BertForPreTrainingPreLN(tiny_config(), args).cuda().eval()
    kernel.load_state_dict(plain.state_dict(), strict=True)               # SPEC names -> kernel layout
    batch = cuda_batch()
    with torch.no_grad():
        # the kernel's GELU is the tanh approximation: close, not equal
        assert kernel(batch).item() == pytest.approx(plain(batch).item(), abs=2e-3)
    back = BertForPreTrainingPreLN(tiny_config(), argparse.Namespace()).cuda().eval()
    back.load_state_dict(kernel.state_dict(), strict=True)                # and back
    with torch.no_grad():
        assert back(batch).item() == plain(batch).item()


def test_sparse_attention_on_cuda_dense_equals_plain_and_fixed_trains():
    plain = plain_model()
    batch = cuda_batch()
    dense = plain_model(deepspeed_sparse_attention=True, ds_config={"sparse_attention": {"mode": "dense", "block": 16}},
                        seed=0)
    dense.load_state_dict(plain.state_dict())
    with torch.no_grad():
        assert dense(batch).item() == pytest.approx(plain(batch).item(), abs=1e-4)
    fixed = plain_model(deepspeed_sparse_attention=True, seed=0, ds_config={"sparse_attention": {
        "mode": "fixed", "block": 16, "num_local_blocks": 2, "num_global_blocks": 1}}).train()
    loss = fixed(batch)
    loss.backward()
    assert math.isfinite(loss.item())
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in fixed.parameters() if p.requires_grad)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_unpad_on_cuda_gives_the_padded_loss(dtype):
    padded = plain_model().to(dtype)
    unpadded = plain_model(unpad=True).to(dtype)
    unpadded.load_state_dict(padded.state_dict())
    batch = cuda_batch()
    with torch.no_grad():
        tolerance = 1e-4 if dtype == torch.float32 else 3e-2
        assert unpadded(batch).float().item() == pytest.approx(padded(batch).float().item(), abs=tolerance)


def test_bf16_training_with_unpad_and_compile(data_root, tmp_path):
    ds = ds_config(tmp_path, bf16={"enabled": True})
    state = train_in_process(data_root, tmp_path / "out", ds, "--unpad", "--compile")
    assert state.global_step == 8
    losses = train_losses(tmp_path / "out")
    assert all(math.isfinite(v) for v in losses) and losses[-1] < losses[0]
