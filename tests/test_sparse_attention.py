"""turing.sparse_attention: DeepSpeed's block-sparse layouts and their FlexAttention compute,
checked against layouts written out by hand and against ordinary attention with the same mask."""
import warnings

import pytest
import torch
import torch.nn.functional as F

from turing.sparse_attention import (BigBirdSparsityConfig, BSLongformerSparsityConfig, DenseSparsityConfig,
                                     FixedSparsityConfig, SparseSelfAttention, SparsityConfigError,
                                     VariableSparsityConfig, sparse_attention, sparsity_config_from_ds,
                                     split_sparse_attention_config)

BLOCK = 16


def qkv(B=2, H=2, L=64, D=8, seed=0, requires_grad=False):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, L, D, generator=g).requires_grad_(requires_grad) for _ in range(3)]


def padding_mask(B, L, lengths):
    """(B, L) input_mask: 1 for the first lengths[b] tokens."""
    return (torch.arange(L)[None, :] < torch.tensor(lengths)[:, None]).long()


def written_out_mask(layout, block, input_mask, L):
    """The layout as a dense (B, H, L, L) boolean mask, by Kronecker product, with padded keys off."""
    dense = torch.stack([torch.kron(h, torch.ones(block, block, dtype=torch.int64)) for h in layout]).bool()
    dense = dense[:, :L, :L]
    return dense[None] & input_mask.bool()[:, None, None, :]


def flex_forward(*args, **kwargs):
    """FlexAttention on CPU runs eagerly (forward only) and warns that it is not compiled."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.no_grad():
            return sparse_attention(*args, backend="flex", **kwargs)


# ---------------------------------------------------------------------------------------------
# layouts


def test_fixed_layout_bidirectional_by_hand():
    # 5 blocks, windows of 2: [0 1] [2 3] [4]; global = last block of each window (1, 3) and,
    # for the short last window, block 4; global columns are seen by every row.
    layout = FixedSparsityConfig(num_heads=2, block=BLOCK, num_local_blocks=2,
                                 num_global_blocks=1).make_layout(5 * BLOCK)
    expected = torch.tensor([[1, 1, 0, 1, 1],
                             [1, 1, 0, 1, 1],
                             [0, 1, 1, 1, 1],
                             [0, 1, 1, 1, 1],
                             [0, 1, 0, 1, 1]])
    assert layout.shape == (2, 5, 5)
    assert torch.equal(layout[0], expected) and torch.equal(layout[1], expected)


def test_fixed_layout_unidirectional_and_horizontal_by_hand():
    uni = FixedSparsityConfig(num_heads=1, block=BLOCK, num_local_blocks=2, num_global_blocks=1,
                              attention="unidirectional").make_layout(5 * BLOCK)
    assert torch.equal(uni[0], torch.tensor([[1, 0, 0, 0, 0],
                                             [1, 1, 0, 0, 0],
                                             [0, 1, 1, 0, 0],
                                             [0, 1, 1, 1, 0],
                                             [0, 1, 0, 1, 1]]))
    horizontal = FixedSparsityConfig(num_heads=1, block=BLOCK, num_local_blocks=2, num_global_blocks=1,
                                     horizontal_global_attention=True).make_layout(5 * BLOCK)
    assert torch.equal(horizontal[0], torch.tensor([[1, 1, 0, 1, 1],
                                                    [1, 1, 1, 1, 1],
                                                    [0, 1, 1, 1, 1],
                                                    [1, 1, 1, 1, 1],
                                                    [1, 1, 1, 1, 1]]))


def test_fixed_different_global_patterns_per_head():
    # windows of 4 blocks; head 0 takes block 3 of each window as global, head 1 block 2
    layout = FixedSparsityConfig(num_heads=2, block=BLOCK, different_layout_per_head=True, num_local_blocks=4,
                                 num_global_blocks=1, num_different_global_patterns=2).make_layout(8 * BLOCK)
    assert layout[0, :, 3].all() and layout[0, :, 7].all() and not layout[0, 4:, 2].any()
    assert layout[1, :, 2].all() and layout[1, :, 6].all() and not layout[1, 4:, 3].any()
    with pytest.raises(SparsityConfigError, match="different_layout_per_head"):
        FixedSparsityConfig(num_heads=2, num_different_global_patterns=2)


def test_bslongformer_layout():
    layout = BSLongformerSparsityConfig(num_heads=2, block=BLOCK, num_sliding_window_blocks=3,
                                        global_block_indices=[0, 5]).make_layout(8 * BLOCK)
    band = (torch.arange(8)[:, None] - torch.arange(8)[None, :]).abs() <= 1
    expected = band.clone()
    expected[[0, 5], :] = True
    expected[:, [0, 5]] = True
    assert layout.shape == (2, 8, 8)
    assert torch.equal(layout[0].bool(), expected) and torch.equal(layout[1].bool(), expected)


def test_bigbird_layout_is_seeded_and_has_window_globals_and_random_blocks():
    make = lambda seed: BigBirdSparsityConfig(num_heads=4, block=BLOCK, different_layout_per_head=True,
                                              num_random_blocks=2, num_sliding_window_blocks=3,
                                              num_global_blocks=1, seed=seed).make_layout(12 * BLOCK)
    a, b, c = make(1), make(1), make(2)
    assert a.shape == (4, 12, 12)
    assert torch.equal(a, b) and not torch.equal(a, c)        # every rank builds the same layout
    band = (torch.arange(12)[:, None] - torch.arange(12)[None, :]).abs() <= 1
    for h in range(4):
        assert a[h][band].all() and a[h, 0, :].all() and a[h, :, 0].all()
    # 2 random blocks per row on top of window + global: rows have more than the deterministic part
    deterministic = band.clone()
    deterministic[0, :] = True
    deterministic[:, 0] = True
    assert (a.bool() & ~deterministic).any()
    assert not torch.equal(a[0], a[1])                           # heads differ when asked to


def test_variable_layout_windows_and_globals():
    layout = VariableSparsityConfig(num_heads=1, block=BLOCK, local_window_blocks=[1, 3],
                                    global_block_indices=[4], global_block_end_indices=[6],
                                    horizontal_global_attention=True).make_layout(9 * BLOCK)
    # windows: [0] [1 2 3] then the last size repeats: [4 5 6] [7 8]; blocks 4, 5 global
    expected = torch.zeros(9, 9, dtype=torch.int64)
    for s, e in ((0, 1), (1, 4), (4, 7), (7, 9)):
        expected[s:e, s:e] = 1
    expected[:, 4:6] = 1
    expected[4:6, :] = 1
    assert torch.equal(layout[0], expected)


def test_sparsity_config_from_ds_modes_defaults_and_errors():
    fixed = sparsity_config_from_ds({"block": 16}, num_heads=4)         # mode defaults to fixed
    assert isinstance(fixed, FixedSparsityConfig)
    assert (fixed.num_local_blocks, fixed.num_global_blocks, fixed.attention) == (4, 1, "bidirectional")
    assert isinstance(sparsity_config_from_ds(None, num_heads=4), FixedSparsityConfig)
    classes = {"dense": DenseSparsityConfig, "variable": VariableSparsityConfig,
               "bigbird": BigBirdSparsityConfig, "bslongformer": BSLongformerSparsityConfig}
    for mode, cls in classes.items():
        cfg = sparsity_config_from_ds({"mode": mode, "block": 32, "different_layout_per_head": True}, 4)
        assert type(cfg) is cls and cfg.block == 32 and cfg.num_layout_heads == 4
    cfg = sparsity_config_from_ds({"mode": "fixed", "num_local_blocks": 8, "num_global_blocks": 2,
                                   "attention": "unidirectional"}, 2)
    assert (cfg.num_local_blocks, cfg.num_global_blocks, cfg.attention) == (8, 2, "unidirectional")

    with pytest.raises(SparsityConfigError, match=r"sparse_attention\.mode.*'sliding'.*fixed.*bigbird"):
        sparsity_config_from_ds({"mode": "sliding"}, 4)
    with pytest.raises(SparsityConfigError, match="num_local_block"):
        sparsity_config_from_ds({"mode": "fixed", "num_local_block": 4}, 4)
    with pytest.raises(SparsityConfigError, match="num_global_blocks"):
        sparsity_config_from_ds({"num_local_blocks": 4, "num_global_blocks": 3}, 4)
    with pytest.raises(SparsityConfigError, match="attention"):
        sparsity_config_from_ds({"attention": "sideways"}, 4)


def test_split_sparse_attention_config():
    ds = {"train_batch_size": 8, "sparse_attention": {"mode": "dense"}}
    block, rest = split_sparse_attention_config(ds)
    assert block == {"mode": "dense"} and rest == {"train_batch_size": 8}
    assert "sparse_attention" in ds
    assert split_sparse_attention_config(rest) == (None, rest)


# ---------------------------------------------------------------------------------------------
# compute


def test_dense_layout_equals_normal_attention():
    B, H, L = 3, 2, 64
    q, k, v = qkv(B, H, L, requires_grad=True)
    input_mask = padding_mask(B, L, [64, 40, 17])
    attn = SparseSelfAttention(DenseSparsityConfig(num_heads=H, block=BLOCK), max_seq_length=L)
    out = attn(q, k, v, key_padding_mask=input_mask)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=input_mask.bool()[:, None, None, :])
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    # the model's additive form: same at every position (each row has real keys)
    additive = (1.0 - input_mask[:, None, None, :].float()) * -10000.0
    torch.testing.assert_close(attn(q, k, v, key_padding_mask=additive), out, atol=1e-5, rtol=1e-5)
    ref_add = F.scaled_dot_product_attention(q, k, v, attn_mask=additive)
    torch.testing.assert_close(out, ref_add, atol=1e-5, rtol=1e-5)
    # the FlexAttention kernel with the BlockMask gives the same
    flex = flex_forward(q, k, v, attn.master_layout, BLOCK, key_padding_mask=input_mask)
    torch.testing.assert_close(flex, ref.detach(), atol=1e-5, rtol=1e-5)


def test_fixed_layout_equals_attention_with_the_mask_written_out():
    B, H, L = 2, 2, 96
    cfg = FixedSparsityConfig(num_heads=H, block=BLOCK, num_local_blocks=2, num_global_blocks=1)
    layout = cfg.make_layout(L)
    q, k, v = qkv(B, H, L, seed=1, requires_grad=True)
    input_mask = padding_mask(B, L, [96, 70])
    mask = written_out_mask(layout, BLOCK, input_mask, L)
    assert not mask.all()                                          # really sparse
    attn = SparseSelfAttention(cfg, max_seq_length=L)
    out = attn(q, k, v, key_padding_mask=input_mask)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    # gradients flow to q, k, v and equal the reference's
    grads = torch.autograd.grad(out.square().sum(), (q, k, v))
    ref_grads = torch.autograd.grad(ref.square().sum(), (q, k, v))
    for g, rg in zip(grads, ref_grads):
        assert g.abs().sum() > 0
        torch.testing.assert_close(g, rg, atol=1e-5, rtol=1e-5)
    flex = flex_forward(q, k, v, layout, BLOCK, key_padding_mask=input_mask)
    torch.testing.assert_close(flex, ref.detach(), atol=1e-5, rtol=1e-5)


def test_per_head_layouts_are_applied_per_head():
    B, H, L = 1, 2, 128
    cfg = FixedSparsityConfig(num_heads=H, block=BLOCK, different_layout_per_head=True, num_local_blocks=4,
                              num_global_blocks=1, num_different_global_patterns=2)
    layout = cfg.make_layout(L)
    assert not torch.equal(layout[0], layout[1])
    q, k, v = qkv(B, H, L, seed=2)
    input_mask = torch.ones(B, L, dtype=torch.long)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=written_out_mask(layout, BLOCK, input_mask, L))
    out = SparseSelfAttention(cfg, max_seq_length=L)(q, k, v)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(flex_forward(q, k, v, layout, BLOCK), ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("mode", ["bigbird", "bslongformer", "variable"])
def test_other_modes_run_and_match_their_mask(mode):
    B, H, L = 2, 2, 128
    ds = {"bigbird": {"mode": "bigbird", "num_random_blocks": 1},
          "bslongformer": {"mode": "bslongformer", "global_block_indices": [0, 4]},
          "variable": {"mode": "variable", "num_random_blocks": 1, "local_window_blocks": [2, 4]}}[mode]
    cfg = sparsity_config_from_ds(ds, num_heads=H, seed=7)
    attn = SparseSelfAttention(cfg, max_seq_length=L)
    layout = cfg.make_layout(L)
    assert layout.shape == (H, L // BLOCK, L // BLOCK)
    assert torch.equal(attn.master_layout.long()[0], layout[0])     # seeded: rebuilt identically
    q, k, v = qkv(B, H, L, seed=3, requires_grad=True)
    input_mask = padding_mask(B, L, [128, 90])
    out = attn(q, k, v, key_padding_mask=input_mask)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=written_out_mask(layout, BLOCK, input_mask, L))
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    out.sum().backward()
    assert q.grad is not None and torch.isfinite(q.grad).all() and q.grad.abs().sum() > 0


def test_length_not_a_multiple_of_the_block_is_padded_and_cut_back():
    B, H, L = 2, 2, 40                                              # 2.5 blocks of 16
    cfg = FixedSparsityConfig(num_heads=H, block=BLOCK, num_local_blocks=2, num_global_blocks=1)
    attn = SparseSelfAttention(cfg, max_seq_length=64)
    q, k, v = qkv(B, H, L, seed=4, requires_grad=True)
    input_mask = padding_mask(B, L, [40, 33])
    out = attn(q, k, v, key_padding_mask=input_mask)
    assert out.shape == (B, H, L, 8)
    # reference: the layout for 48 tokens cut to 40, the padding keys never seen
    mask = written_out_mask(cfg.make_layout(64), BLOCK, input_mask, L)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    out.sum().backward()
    assert torch.isfinite(k.grad).all() and k.grad[1, :, 33:].abs().sum() == 0   # padded keys get no grad
    torch.testing.assert_close(flex_forward(q, k, v, attn.master_layout, BLOCK, key_padding_mask=input_mask),
                               ref.detach(), atol=1e-5, rtol=1e-5)
    # no padding mask at all: the block padding alone is masked
    ref_nomask = F.scaled_dot_product_attention(q, k, v, attn_mask=written_out_mask(
        cfg.make_layout(64), BLOCK, torch.ones(B, L), L))
    torch.testing.assert_close(attn(q, k, v), ref_nomask, atol=1e-5, rtol=1e-5)


def test_fully_padded_rows_give_zero_not_nan():
    # Query block 2 only sees blocks {1, 2} (fixed, windows of 2, bidirectional, 4 blocks: global
    # columns 1 and 3); with 16 real tokens every key it may see is padding: output 0, finite grads.
    B, H, L = 1, 1, 64
    cfg = FixedSparsityConfig(num_heads=H, block=BLOCK, num_local_blocks=2, num_global_blocks=1)
    layout = cfg.make_layout(L)
    assert layout[0, 2].tolist() == [0, 1, 1, 1]
    q, k, v = qkv(B, H, L, seed=5, requires_grad=True)
    input_mask = padding_mask(B, L, [16])
    out = SparseSelfAttention(cfg, max_seq_length=L)(q, k, v, key_padding_mask=input_mask)
    assert torch.isfinite(out).all()
    assert out[0, 0, 32:48].abs().sum() == 0
    out.sum().backward()
    assert torch.isfinite(q.grad).all() and torch.isfinite(v.grad).all()


def test_mask_is_built_once_per_mask_tensor():
    B, H, L = 2, 2, 64
    attn = SparseSelfAttention(FixedSparsityConfig(num_heads=H, block=BLOCK, num_local_blocks=2), max_seq_length=L)
    q, k, v = qkv(B, H, L)
    input_mask = padding_mask(B, L, [64, 30])
    first = attn(q, k, v, key_padding_mask=input_mask)
    built = attn._cached[2]
    attn(q, k, v, key_padding_mask=input_mask)                     # the next layer, same mask
    assert attn._cached[2] is built
    input_mask[1, 30:50] = 1                                       # changed in place: rebuilt
    changed = attn(q, k, v, key_padding_mask=input_mask)
    assert attn._cached[2] is not built and not torch.allclose(changed[1], first[1])


def test_module_has_no_state_and_refuses_bad_input():
    attn = SparseSelfAttention(FixedSparsityConfig(num_heads=2, block=BLOCK), max_seq_length=64)
    assert attn.state_dict() == {}                                 # model checkpoints keep their keys
    q, k, v = qkv(1, 2, 80)
    with pytest.raises(ValueError, match="max_seq_length"):
        attn(q, k, v)
    q, k, v = qkv(1, 2, 32)
    with pytest.raises(ValueError, match="key_padding_mask"):
        attn(q, k, v, key_padding_mask=torch.ones(1, 2, 32))
    with pytest.raises(ValueError, match="heads"):
        attn(*qkv(1, 3, 32))
    q.requires_grad_()
    with pytest.raises(NotImplementedError, match="backward on CPU"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            sparse_attention(q, k, v, attn.master_layout, BLOCK, backend="flex")
