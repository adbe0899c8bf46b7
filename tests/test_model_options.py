"""Model options: block-sparse self-attention inside the model, the DeepSpeed
transformer kernel (flag checks, its wiring through a stand-in layer, the weight layout
conversion both ways), and a sparse-attention training run through the real entry point.

The real DeepSpeedTransformerLayer needs CUDA; here a PyTorch stand-in with the kernel's
parameter names and its pre-LN computation (ds_transformer_cuda.cpp, Forward) takes its place,
so what is checked is our side: construction, the config we pass, init, the forward call and
loading weights of either layout.
"""
import argparse
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests.launch import ds_config, plain_model_from_checkpoint, train_in_process, train_losses
from turing.errors import ConversionError
from turing.kernel_layout import from_transformer_kernel_layout, to_transformer_kernel_layout
from turing.model_options import check_model_flags
from turing.modeling import LAYER_NORM_EPS, BertConfig, BertForPreTrainingPreLN

VOCAB = 96
SEQ = 64
KERNEL_NAMES = ("attn_qkvw", "attn_qkvb", "attn_ow", "attn_ob", "attn_nw", "attn_nb", "inter_w", "inter_b",
                "output_w", "output_b", "norm_w", "norm_b")


def tiny_config():
    return BertConfig(VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
                      max_position_embeddings=SEQ)


def sparse_args(block, **extra):
    return argparse.Namespace(deepspeed_sparse_attention=True, ds_config={"sparse_attention": block}, seed=0,
                              **extra)


def make_batch(batch_size=4, seq_len=SEQ, seed=0):
    """Random tokens with rows of different real lengths (padding at the end), ~15% labelled."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([seq_len, seq_len - 9, 37, 20][:batch_size])
    positions = torch.arange(seq_len)
    input_mask = (positions[None, :] < lengths[:, None]).long()
    input_ids = torch.randint(5, VOCAB, (batch_size, seq_len), generator=g) * input_mask
    segment_ids = ((positions[None, :] >= lengths[:, None] // 2).long()) * input_mask
    labelled = (torch.rand(batch_size, seq_len, generator=g) < 0.15) & input_mask.bool()
    labelled[:, 1] = True  # at least one label per row
    masked_lm_labels = torch.where(labelled, input_ids, torch.full_like(input_ids, -1))
    next_sentence_labels = torch.randint(0, 2, (batch_size,), generator=g)
    return (torch.full((batch_size,), 2), input_ids, input_mask, segment_ids, next_sentence_labels, masked_lm_labels)


@pytest.fixture(scope="module")
def plain():
    torch.manual_seed(0)
    return BertForPreTrainingPreLN(tiny_config()).eval()


def loss_of(model, batch):
    with torch.no_grad():
        return model(batch).item()


# --------------------------------------------------------------------------------------------
# Sparse attention


@pytest.mark.parametrize("seq_len", [SEQ, 50])  # 50: padded up to the block size inside
def test_dense_sparsity_gives_the_plain_models_loss(plain, seq_len):
    model = BertForPreTrainingPreLN(tiny_config(), sparse_args({"mode": "dense", "block": 16})).eval()
    model.load_state_dict(plain.state_dict(), strict=True)
    batch = make_batch(seq_len=seq_len)
    assert loss_of(model, batch) == pytest.approx(loss_of(plain, batch), abs=1e-5)
    input_ids, input_mask, segment_ids = batch[1], batch[2], batch[3]
    with torch.no_grad():
        scores, _ = model.predict(input_ids, segment_ids, input_mask)
        plain_scores, _ = plain.predict(input_ids, segment_ids, input_mask)
    real = input_mask.bool()
    torch.testing.assert_close(scores[real], plain_scores[real], rtol=1e-5, atol=1e-5)


def test_fixed_sparsity_keeps_the_keys_changes_attention_and_trains(plain):
    torch.manual_seed(1)
    model = BertForPreTrainingPreLN(tiny_config(), sparse_args(
        {"mode": "fixed", "block": 16, "num_local_blocks": 2, "num_global_blocks": 1}))
    assert list(model.state_dict()) == list(plain.state_dict())     # the original's keys, nothing added
    model.load_state_dict(plain.state_dict(), strict=True)
    model.eval()
    batch = make_batch()
    # Blocks outside the pattern really are left out: the outputs differ from dense attention.
    sparse_out, _ = model.bert(batch[1], batch[3], batch[2])
    dense_out, _ = plain.bert(batch[1], batch[3], batch[2])
    assert (sparse_out - dense_out)[batch[2].bool()].abs().max() > 1e-3

    before = loss_of(model, batch)
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)
    for _ in range(6):
        optimizer.zero_grad()
        model(batch).backward()
        optimizer.step()
    assert model.bert.encoder.layer[0].attention.self.query.weight.grad.abs().sum() > 0
    model.eval()
    assert loss_of(model, batch) < before - 0.1


@pytest.mark.parametrize("block", [
    {"mode": "bigbird", "block": 16, "num_random_blocks": 1, "num_sliding_window_blocks": 1, "num_global_blocks": 1},
    {"mode": "bslongformer", "block": 16, "num_sliding_window_blocks": 1, "global_block_indices": [0]},
    {"mode": "variable", "block": 16, "num_random_blocks": 1, "local_window_blocks": [1, 2],
     "global_block_indices": [0]},
], ids=lambda b: b["mode"])
def test_other_sparsity_modes_build_and_run(plain, block):
    model = BertForPreTrainingPreLN(tiny_config(), sparse_args(block))
    model.load_state_dict(plain.state_dict(), strict=True)
    layout = model.bert.encoder.layer[0].attention.self.sparse_attention.master_layout
    assert not layout.all()                                            # a real sparse pattern
    loss = model(make_batch(seq_len=50))
    loss.backward()
    assert torch.isfinite(loss)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_one_sparse_attention_is_shared_by_all_layers():
    model = BertForPreTrainingPreLN(tiny_config(), sparse_args({"mode": "fixed", "block": 16}))
    shared = {id(layer.attention.self.sparse_attention) for layer in model.bert.encoder.layer}
    assert len(shared) == 1 and None not in shared


def test_bad_sparse_attention_block_names_the_key():
    with pytest.raises(ValueError, match=r"sparse_attention: unknown key\(s\) num_sliding_window_blocks"):
        BertForPreTrainingPreLN(tiny_config(), sparse_args({"mode": "fixed", "num_sliding_window_blocks": 3}))


# --------------------------------------------------------------------------------------------
# Transformer kernel: flag checks


def test_sparse_attention_and_transformer_kernel_together_is_an_error():
    args = argparse.Namespace(deepspeed_sparse_attention=True, deepspeed_transformer_kernel=True)
    with pytest.raises(ValueError, match="^--deepspeed_sparse_attention cannot be combined with "
                                         "--deepspeed_transformer_kernel$"):
        BertForPreTrainingPreLN(tiny_config(), args)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only error")
def test_transformer_kernel_on_cpu_is_one_line_at_construction(monkeypatch):
    args = argparse.Namespace(deepspeed_transformer_kernel=True, train_micro_batch_size_per_gpu=4)
    with pytest.raises(ValueError, match="needs a CUDA GPU") as error:
        check_model_flags(args)
    assert "\n" not in str(error.value)

    def no_weights(*_, **__):
        raise AssertionError("weights were allocated before the flag check")
    monkeypatch.setattr("turing.modeling.BertModel", no_weights)
    with pytest.raises(ValueError, match="^--deepspeed_transformer_kernel needs a CUDA GPU"):
        BertForPreTrainingPreLN(tiny_config(), args)


# --------------------------------------------------------------------------------------------
# Transformer kernel: layout conversion and wiring (stand-in layer)


def test_kernel_layout_round_trip(plain):
    state = plain.state_dict()
    kernel = to_transformer_kernel_layout(state)
    for i in range(2):
        prefix = f"bert.encoder.layer.{i}."
        assert sorted(k[len(prefix):] for k in kernel if k.startswith(prefix)) == sorted(KERNEL_NAMES)
        assert kernel[prefix + "attn_qkvw"].shape == (3 * 64, 64)
        torch.testing.assert_close(kernel[prefix + "attn_qkvw"][64:128], state[prefix + "attention.self.key.weight"],
                                   rtol=0, atol=0)
        assert torch.equal(kernel[prefix + "norm_w"], state[prefix + "PreAttentionLayerNorm.weight"])
        assert torch.equal(kernel[prefix + "attn_nw"], state[prefix + "PostAttentionLayerNorm.weight"])
    assert to_transformer_kernel_layout(kernel).keys() == kernel.keys()   # already kernel layout
    back = from_transformer_kernel_layout(kernel)
    assert back.keys() == state.keys()
    for key, value in state.items():
        assert torch.equal(back[key], value), key

    partial = {k: v for k, v in state.items() if k != "bert.encoder.layer.1.attention.self.value.bias"}
    with pytest.raises(ConversionError, match=r"bert\.encoder\.layer\.1\.attention\.self\.value\.bias: missing"):
        to_transformer_kernel_layout(partial)


def test_plain_model_loads_kernel_layout_weights(plain):
    model = BertForPreTrainingPreLN(tiny_config()).eval()
    model.load_state_dict(to_transformer_kernel_layout(plain.state_dict()), strict=True)
    batch = make_batch()
    assert loss_of(model, batch) == loss_of(plain, batch)


class StandInKernelLayer(nn.Module):
    """DeepSpeedTransformerLayer's parameters and pre-LN forward, in PyTorch (erf GELU, where the
    CUDA kernel uses the tanh approximation), for checking the model's side on CPU."""

    configs = []

    def __init__(self, config):
        super().__init__()
        StandInKernelLayer.configs.append(config)
        self.config = config
        H, inter = config.hidden_size, config.intermediate_size
        for name, shape in (("attn_qkvw", (3 * H, H)), ("attn_qkvb", (3 * H,)), ("attn_ow", (H, H)),
                            ("attn_ob", (H,)), ("attn_nw", (H,)), ("attn_nb", (H,)), ("inter_w", (inter, H)),
                            ("inter_b", (inter,)), ("output_w", (H, inter)), ("output_b", (H,)),
                            ("norm_w", (H,)), ("norm_b", (H,))):
            setattr(self, name, nn.Parameter(torch.full(shape, float("nan"))))  # DeepSpeed: torch.Tensor

    def forward(self, hidden_states, attention_mask=None):
        B, L, H = hidden_states.shape
        heads, eps = self.config.heads, self.config.layer_norm_eps
        x = F.layer_norm(hidden_states, (H,), self.norm_w, self.norm_b, eps)
        q, k, v = F.linear(x, self.attn_qkvw, self.attn_qkvb).view(B, L, 3, heads, H // heads).permute(2, 0, 3, 1, 4)
        probs = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(H // heads) + attention_mask, -1)
        context = (probs @ v).transpose(1, 2).reshape(B, L, H)
        hidden_states = hidden_states + F.linear(context, self.attn_ow, self.attn_ob)
        x = F.layer_norm(hidden_states, (H,), self.attn_nw, self.attn_nb, eps)
        return hidden_states + F.linear(F.gelu(F.linear(x, self.inter_w, self.inter_b)), self.output_w, self.output_b)


@pytest.fixture
def stand_in_kernel(monkeypatch):
    import deepspeed.ops.transformer as ds_transformer

    StandInKernelLayer.configs = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(ds_transformer, "DeepSpeedTransformerLayer", StandInKernelLayer)
    return StandInKernelLayer


def kernel_args(**extra):
    values = dict(deepspeed_transformer_kernel=True, train_micro_batch_size_per_gpu=4, local_rank=-1, seed=7,
                  ds_config={"fp16": {"enabled": True}}, gelu_checkpoint=True, normalize_invertible=False,
                  attention_dropout_checkpoint=True, stochastic_mode=False)
    values.update(extra)
    return argparse.Namespace(**values)


def test_kernel_model_is_built_from_the_configs_and_loads_either_layout(plain, stand_in_kernel):
    torch.manual_seed(2)
    model = BertForPreTrainingPreLN(tiny_config(), kernel_args())
    configs = stand_in_kernel.configs
    assert len(configs) == 2 and configs[0] is not configs[1]          # one config per layer (own layer id)
    c = configs[0]
    assert (c.batch_size, c.hidden_size, c.intermediate_size, c.heads, c.num_hidden_layers) == (4, 64, 128, 2, 2)
    assert (c.attn_dropout_ratio, c.hidden_dropout_ratio, c.initializer_range) == (0.1, 0.1, 0.02)
    assert c.pre_layer_norm and c.fp16 and c.seed == 7 and c.local_rank == 0 and c.layer_norm_eps == LAYER_NORM_EPS
    assert (c.gelu_checkpoint, c.attn_dropout_checkpoint, c.normalize_invertible, c.stochastic_mode) == (
        True, True, False, False)
    # the model's init, also for the kernel's parameters (the stand-in starts them as NaN)
    layer = model.bert.encoder.layer[1]
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert (layer.norm_w == 1).all() and (layer.attn_nb == 0).all() and (layer.attn_qkvb == 0).all()
    assert layer.attn_ow.std().item() == pytest.approx(0.02 / math.sqrt(4), rel=0.2)

    # The kernel's keys; plain-layout weights load into it and give the plain model's loss ...
    assert set(model.state_dict()) == set(to_transformer_kernel_layout(plain.state_dict()))
    model.load_state_dict(plain.state_dict(), strict=True)
    model.eval()
    batch = make_batch()
    assert loss_of(model, batch) == pytest.approx(loss_of(plain, batch), abs=1e-5)
    # ... and its own weights load back into a plain model.
    back = BertForPreTrainingPreLN(tiny_config()).eval()
    back.load_state_dict(model.state_dict(), strict=True)
    assert loss_of(back, batch) == pytest.approx(loss_of(plain, batch), abs=1e-5)


@pytest.mark.parametrize("extra, message", [
    ({"progressive_layer_drop": True}, "--progressive_layer_drop cannot be combined"),
    ({"checkpoint_activations": True}, "--checkpoint_activations cannot be combined"),
    ({"ds_config": {"bf16": {"enabled": True}}}, "fp32 or fp16 only"),
])
def test_kernel_rejects_what_it_cannot_run(stand_in_kernel, extra, message):
    with pytest.raises(ValueError, match=message):
        BertForPreTrainingPreLN(tiny_config(), kernel_args(**extra))
    assert stand_in_kernel.configs == []


# --------------------------------------------------------------------------------------------
# Through the training entry point


def run_main(data_root, tmp_path, ds, *extra):
    return train_in_process(data_root, tmp_path / "out", ds_config(tmp_path, **ds), *extra)


def test_training_run_with_fixed_sparse_attention(data_root, tmp_path):
    sparse = {"mode": "fixed", "block": 16, "num_local_blocks": 2, "num_global_blocks": 1}
    state = run_main(data_root, tmp_path, {"sparse_attention": sparse}, "--deepspeed_sparse_attention")
    assert state.global_step == 8                                       # 2 epochs of 4 steps
    losses = train_losses(tmp_path / "out")
    assert len(losses) == 8 and all(math.isfinite(v) for v in losses)
    assert losses[-1] < losses[0]
    plain_model_from_checkpoint(tmp_path / "out")  # strict load: sparse attention adds no keys


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only error")
def test_transformer_kernel_flag_on_cpu_exits_with_one_line(data_root, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        run_main(data_root, tmp_path, {}, "--deepspeed_transformer_kernel")
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--deepspeed_transformer_kernel needs a CUDA GPU" in err[0]
