"""The model: checkpoint compatibility and numerical parity with the original, loss, init, PLD,
activation checkpointing, flag checks, and BertMultiTask."""
import argparse
import json
import math

import pytest
import torch
import torch.nn.functional as F

from testkit import reference_model
from turing.batch import Batch, BatchType
from turing.modeling import BertConfig, BertConfigError, BertForPreTrainingPreLN
from turing.speedups import LinearCrossEntropy, dropout
from turing.models import BertMultiTask
from turing.pretrained import ModelSourceError

VOCAB, HIDDEN, LAYERS, HEADS, INTER, SEQ, BATCH = 96, 64, 2, 4, 128, 32, 4


@pytest.fixture(autouse=True)
def one_thread():
    """These tensors are tiny: a second intra-op thread only adds OpenMP barriers, which cost
    seconds per test when the 2-core machine is shared with other processes."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def make_config(**overrides):
    fields = dict(hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                  intermediate_size=INTER, max_position_embeddings=64)
    fields.update(overrides)
    return BertConfig(VOCAB, **fields)


def make_batch(seed=0, with_masks=True):
    """Padded batch: rows of different lengths, a few masked positions in the real tokens."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([SEQ, 20, 27, 9])
    input_mask = (torch.arange(SEQ)[None] < lengths[:, None]).long()
    input_ids = torch.randint(5, VOCAB, (BATCH, SEQ), generator=g) * input_mask
    segment_ids = (torch.arange(SEQ)[None] >= (lengths // 2)[:, None]).long() * input_mask
    labels = torch.full((BATCH, SEQ), -1)
    if with_masks:
        for row, length in enumerate(lengths.tolist()):
            positions = torch.randperm(length - 2, generator=g)[:3] + 1
            labels[row, positions] = input_ids[row, positions]
    nsp = torch.tensor([0, 1, 1, 0])
    return Batch(torch.full((BATCH,), int(BatchType.PRETRAIN_BATCH)), input_ids, input_mask,
                 segment_ids, nsp, labels)


def spec_keys(num_layers):
    """The original model's key list, written out."""
    keys = [f"bert.embeddings.{n}_embeddings.weight" for n in ("word", "position", "token_type")]
    keys += ["bert.embeddings.LayerNorm.weight", "bert.embeddings.LayerNorm.bias",
             "bert.encoder.FinalLayerNorm.weight", "bert.encoder.FinalLayerNorm.bias"]
    for n in range(num_layers):
        p = f"bert.encoder.layer.{n}."
        for name in ("attention.self.query", "attention.self.key", "attention.self.value",
                     "attention.output.dense", "PreAttentionLayerNorm", "PostAttentionLayerNorm",
                     "intermediate.dense_act", "output.dense"):
            keys += [p + name + ".weight", p + name + ".bias"]
    keys += ["bert.pooler.dense_act.weight", "bert.pooler.dense_act.bias",
             "cls.predictions.bias", "cls.predictions.transform.dense_act.weight",
             "cls.predictions.transform.dense_act.bias", "cls.predictions.transform.LayerNorm.weight",
             "cls.predictions.transform.LayerNorm.bias", "cls.predictions.decoder.weight",
             "cls.seq_relationship.weight", "cls.seq_relationship.bias"]
    return keys


@pytest.fixture
def models():
    """Ours and the reference with identical weights, both in eval mode (dropout off)."""
    torch.manual_seed(0)
    config = make_config()
    ours = BertForPreTrainingPreLN(config, argparse.Namespace())
    # Non-trivial biases and LayerNorm affines, so parity covers every parameter's role.
    with torch.no_grad():
        for name, p in ours.named_parameters():
            if "bias" in name or "LayerNorm" in name:
                p.add_(torch.randn_like(p) * 0.1)
    ref = reference_model.BertForPreTrainingPreLN(config)
    ref.load_state_dict(ours.state_dict(), strict=True)
    return ours.eval(), ref.eval()


def test_state_dict_keys_are_the_spec_list():
    model = BertForPreTrainingPreLN(make_config(), argparse.Namespace())
    keys = list(model.state_dict())
    assert sorted(keys) == sorted(spec_keys(LAYERS))
    assert len(keys) == len(set(keys))


def test_checkpoints_load_both_ways_strict():
    config = make_config()
    ours = BertForPreTrainingPreLN(config, argparse.Namespace())
    ref = reference_model.BertForPreTrainingPreLN(config)
    ours.load_state_dict(ref.state_dict(), strict=True)
    for name, tensor in ref.state_dict().items():
        assert torch.equal(ours.state_dict()[name], tensor), name
    fresh_ref = reference_model.BertForPreTrainingPreLN(config)
    fresh_ref.load_state_dict(ours.state_dict(), strict=True)


def test_loss_and_logits_match_reference(models):
    ours, ref = models
    batch = make_batch()
    with torch.no_grad():
        assert torch.allclose(ours(batch), ref(batch), atol=1e-5, rtol=0)
        unlabelled = batch._replace(masked_lm_labels=None)
        our_scores, our_nsp = ours(unlabelled)
        ref_scores, ref_nsp = ref(unlabelled)
    assert our_scores.shape == (BATCH, SEQ, VOCAB) and our_nsp.shape == (BATCH, 2)
    assert torch.allclose(our_scores, ref_scores, atol=1e-5, rtol=0)
    assert torch.allclose(our_nsp, ref_nsp, atol=1e-5, rtol=0)


def test_loss_is_masked_lm_plus_next_sentence_cross_entropy(models):
    ours, _ = models
    batch = make_batch(seed=3)
    with torch.no_grad():
        loss = ours(list(batch))  # a plain list works like the Batch
        scores, nsp_scores = ours.predict(batch.input_ids, batch.segment_ids, batch.input_mask)
    masked = batch.masked_lm_labels != -1
    log_probs = scores[masked].log_softmax(-1)
    mlm = -log_probs.gather(1, batch.masked_lm_labels[masked][:, None]).mean()
    nsp = -nsp_scores.log_softmax(-1).gather(1, batch.next_sentence_labels[:, None]).mean()
    assert masked.sum() == 12
    assert torch.allclose(loss, mlm + nsp, atol=1e-5, rtol=0)


def test_gradients_match_reference(models):
    ours, ref = models
    batch = make_batch(seed=1)
    ours(batch).backward()
    ref(batch).backward()
    our_params, ref_params = dict(ours.named_parameters()), dict(ref.named_parameters())
    for name in ("bert.embeddings.word_embeddings.weight", "bert.embeddings.position_embeddings.weight",
                 "bert.encoder.layer.0.attention.self.query.weight",
                 "bert.encoder.layer.0.attention.self.value.bias",
                 "bert.encoder.layer.1.intermediate.dense_act.weight",
                 "bert.encoder.layer.1.PreAttentionLayerNorm.weight",
                 "cls.predictions.transform.dense_act.weight", "cls.predictions.bias",
                 "bert.pooler.dense_act.weight"):
        ours_grad, ref_grad = our_params[name].grad, ref_params[name].grad
        assert ours_grad.abs().max() > 0, name
        assert torch.allclose(ours_grad, ref_grad, atol=1e-5, rtol=0), name


def test_decoder_weight_is_the_word_embedding():
    model = BertForPreTrainingPreLN(make_config(), argparse.Namespace())
    decoder = model.cls.predictions.decoder.weight
    embedding = model.bert.embeddings.word_embeddings.weight
    assert decoder is embedding
    assert decoder.data_ptr() == embedding.data_ptr()


def test_initialisation_follows_spec():
    torch.manual_seed(0)
    config = make_config(initializer_range=0.02)
    model = BertForPreTrainingPreLN(config, argparse.Namespace())
    residual_std = 0.02 / math.sqrt(2 * LAYERS)
    for name, p in model.named_parameters():
        if name.endswith("attention.output.dense.weight") or name.endswith("output.dense.weight"):
            assert p.std().item() == pytest.approx(residual_std, rel=0.1), name
        elif p.dim() == 2:
            assert p.std().item() == pytest.approx(0.02, rel=0.1), name
            assert abs(p.mean().item()) < 0.002, name
        elif "LayerNorm.weight" in name:
            assert torch.all(p == 1), name
        else:  # biases, LayerNorm biases, the MLM output bias
            assert torch.all(p == 0), name


def test_pld_with_theta_one_equals_no_pld():
    torch.manual_seed(0)
    model = BertForPreTrainingPreLN(make_config(), argparse.Namespace()).train()
    batch = make_batch()
    torch.manual_seed(5)
    plain = model(batch)
    torch.manual_seed(5)
    with_pld = model(batch, progressive_layer_drop=True, pld_theta=1.0)
    assert model.bert.encoder.last_layers_run == LAYERS
    assert torch.equal(plain, with_pld)


def test_pld_drops_deeper_layers_in_training_only():
    layers, theta, steps = 4, 0.2, 300
    torch.manual_seed(0)
    model = BertForPreTrainingPreLN(make_config(num_hidden_layers=layers, intermediate_size=64),
                                    argparse.Namespace()).train()
    batch = Batch(*(t[:1, :8] if t.dim() == 2 else t[:1] for t in make_batch()))  # cheap: 1 x 8 tokens
    keep_probs_seen = {i: set() for i in range(layers)}
    runs = [0] * layers
    for i, layer in enumerate(model.bert.encoder.layer):
        def record(module, args, i=i):
            keep_probs_seen[i].add(args[2])
            runs[i] += 1
        layer.register_forward_pre_hook(record)

    total = 0
    with torch.no_grad():
        for _ in range(steps):
            model(batch, progressive_layer_drop=True, pld_theta=theta)
            total += model.bert.encoder.last_layers_run
    expected_p = [1 - i * (1 - theta) / layers for i in range(layers)]  # 1, .8, .6, .4
    assert total == sum(runs)
    assert total / steps == pytest.approx(sum(expected_p), abs=0.2)
    assert runs[0] == steps  # p_0 = 1: the first layer always runs
    for i in range(1, layers):
        # each layer gets its own keep probability (for the 1/p scaling), and keeps at about that rate
        assert len(keep_probs_seen[i]) == 1
        assert keep_probs_seen[i].pop() == pytest.approx(expected_p[i])
        assert runs[i] / steps == pytest.approx(expected_p[i], abs=0.12)

    model.eval()
    with torch.no_grad():
        for _ in range(20):
            model(batch, progressive_layer_drop=True, pld_theta=theta)
            assert model.bert.encoder.last_layers_run == layers


def test_kept_layer_scales_its_residual_branches_by_one_over_keep_prob():
    torch.manual_seed(0)
    model = BertForPreTrainingPreLN(make_config(), argparse.Namespace()).eval()
    layer = model.bert.encoder.layer[1]
    x = torch.randn(BATCH, SEQ, HIDDEN)
    mask = torch.zeros(BATCH, 1, 1, SEQ)
    p = 0.6
    with torch.no_grad():
        h = x + layer.attention(layer.PreAttentionLayerNorm(x), mask) / p
        expected = h + layer.output(layer.intermediate(layer.PostAttentionLayerNorm(h))) / p
        assert torch.allclose(layer(x, mask, p), expected, atol=1e-5)


def test_batch_without_masked_positions_gives_nsp_loss_only(models):
    ours, _ = models
    batch = make_batch(with_masks=False)
    ours.train()
    loss = ours(batch)
    loss.backward()
    ours.eval()
    with torch.no_grad():
        _, nsp_scores = ours.predict(batch.input_ids, batch.segment_ids, batch.input_mask)
        assert torch.allclose(ours(batch), F.cross_entropy(nsp_scores, batch.next_sentence_labels), atol=1e-6)
    assert torch.isfinite(loss)
    assert ours.cls.seq_relationship.weight.grad.abs().max() > 0
    # the MLM head stays in the graph with zero gradients (optimizers see every parameter)
    assert torch.all(ours.cls.predictions.bias.grad == 0)
    assert torch.all(ours.cls.predictions.transform.dense_act.weight.grad == 0)


def test_fused_vocab_projection_and_cross_entropy_match_autograd():
    g = torch.Generator().manual_seed(0)
    hidden = (torch.randn(7, 16, generator=g) * 3).requires_grad_()
    weight = torch.randn(40, 16, generator=g).requires_grad_()
    bias = torch.randn(40, generator=g).requires_grad_()
    target = torch.randint(0, 40, (7,), generator=g)
    expected = F.cross_entropy(F.linear(hidden, weight, bias), target)
    expected_grads = torch.autograd.grad(expected * 2.5, (hidden, weight, bias))
    loss = LinearCrossEntropy.apply(hidden, weight, bias, target)
    grads = torch.autograd.grad(loss * 2.5, (hidden, weight, bias))
    assert torch.allclose(loss, expected, atol=1e-5)
    for got, want in zip(grads, expected_grads):
        assert torch.allclose(got, want, atol=1e-5)


def test_engine_kwargs_are_accepted(models):
    ours, _ = models
    batch = make_batch()
    with torch.no_grad():
        plain = ours(batch)
        assert torch.equal(ours(batch, progressive_layer_drop=False, pld_theta=0.5, log=True), plain)
        assert torch.equal(ours(batch, progressive_layer_drop=True, pld_theta=0.5), plain)  # eval
    with pytest.raises(ValueError, match="pld_theta"):
        ours(batch, progressive_layer_drop=True)


def test_activation_checkpointing_gives_same_loss_and_grads():
    config = make_config()
    torch.manual_seed(0)
    plain = BertForPreTrainingPreLN(config, argparse.Namespace()).train()
    ckpt = BertForPreTrainingPreLN(config, argparse.Namespace(checkpoint_activations=True)).train()
    ckpt.load_state_dict(plain.state_dict())
    batch = make_batch()
    losses, layer_calls = [], []
    for model in (plain, ckpt):
        calls = []
        model.bert.encoder.layer[0].register_forward_pre_hook(lambda *_: calls.append(1))
        torch.manual_seed(7)  # same dropout masks; checkpointing replays the RNG on recompute
        loss = model(batch)
        loss.backward()
        losses.append(loss)
        layer_calls.append(len(calls))
    assert layer_calls == [1, 2]  # the checkpointed layer is recomputed in backward
    assert torch.equal(losses[0], losses[1])
    for (name, p), q in zip(plain.named_parameters(), ckpt.parameters()):
        assert torch.allclose(p.grad, q.grad, atol=1e-6, rtol=0), name


def test_cpu_dropout_drops_p_scales_the_rest_and_replays_with_the_seed():
    x = torch.ones(1000, 1000, requires_grad=True)
    torch.manual_seed(3)
    y = dropout(x, 0.1, True)
    kept = y != 0
    assert abs(1.0 - kept.float().mean().item() - 0.1) < 0.002           # 1M draws: 0.1 within 6 sigma
    assert torch.allclose(y[kept], torch.full_like(y[kept], 1 / 0.9))
    y.sum().backward()
    assert torch.equal(x.grad, y.detach())                                # same mask, same scale
    torch.manual_seed(3)
    assert torch.equal(dropout(x, 0.1, True), y)                          # the torch generator drives it
    assert dropout(x, 0.1, False) is x and dropout(x, 0.0, True) is x
    rows = dropout(torch.ones(64, 4096), 0.5, True).ne(0).float().mean(1)
    assert rows.min() > 0.4 and rows.max() < 0.6                          # no structure across rows


def test_training_attention_matches_sdpa_when_dropout_is_zero(models):
    """The written-out CPU attention (used in training with dropout) is SDPA's math."""
    ours, _ = models
    batch = make_batch()
    eval_loss = ours(batch)
    for module in ours.modules():
        if hasattr(module, "dropout_p"):
            module.dropout_p = 1e-9                                       # take the training path
    ours.train()
    for module in ours.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    assert torch.allclose(ours(batch), eval_loss, atol=1e-5, rtol=0)


@pytest.mark.parametrize("layers_to_checkpoint", [False, True])
def test_unpad_gives_the_padded_models_loss_and_grads(models, layers_to_checkpoint):
    padded, _ = models
    unpadded = BertForPreTrainingPreLN(make_config(), argparse.Namespace(
        unpad=True, checkpoint_activations=layers_to_checkpoint)).eval()
    unpadded.load_state_dict(padded.state_dict())
    assert unpadded.unpad and not padded.unpad
    batch = make_batch()
    labels = batch.masked_lm_labels.clone()
    labels[3, 12] = 7                                                     # a label on a padding position
    batch = batch._replace(masked_lm_labels=labels)
    losses = []
    for model in (padded, unpadded):
        loss = model(batch)
        loss.backward()
        losses.append(loss)
    assert torch.allclose(losses[0], losses[1], atol=1e-6, rtol=0)
    for (name, p), q in zip(padded.named_parameters(), unpadded.parameters()):
        assert torch.allclose(p.grad, q.grad, atol=1e-6, rtol=1e-4), name
    # In training it runs the encoder on fewer tokens, with its own dropout draws, deterministically.
    unpadded.train()
    torch.manual_seed(5)
    first = unpadded(batch)
    torch.manual_seed(5)
    assert torch.equal(unpadded(batch), first) and math.isfinite(first.item())


def test_unpad_leaves_full_batches_and_predict_alone(models):
    padded, _ = models
    unpadded = BertForPreTrainingPreLN(make_config(), argparse.Namespace(unpad=True)).eval()
    unpadded.load_state_dict(padded.state_dict())
    batch = make_batch()
    full = batch._replace(input_mask=torch.ones_like(batch.input_mask))
    assert torch.equal(unpadded(full), padded(full))
    for a, b in zip(unpadded.predict(batch.input_ids, batch.segment_ids, batch.input_mask),
                    padded.predict(batch.input_ids, batch.segment_ids, batch.input_mask)):
        assert torch.equal(a, b)


@pytest.mark.parametrize("flag", ["deepspeed_sparse_attention", "deepspeed_transformer_kernel"])
def test_unpad_with_attention_options_is_a_clear_error(flag):
    with pytest.raises(ValueError, match=f"--unpad cannot be combined with --{flag}"):
        BertForPreTrainingPreLN(make_config(), argparse.Namespace(unpad=True, **{flag: True}))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only error")
def test_transformer_kernel_flag_without_cuda_is_a_clear_error():
    with pytest.raises(ValueError, match="--deepspeed_transformer_kernel needs a CUDA GPU"):
        BertForPreTrainingPreLN(make_config(), argparse.Namespace(deepspeed_transformer_kernel=True))


def test_config_dict_round_trip_and_unknown_key():
    config = make_config(hidden_dropout_prob=0.2)
    again = BertConfig.from_dict(json.loads(config.to_json_string()))
    assert again.to_dict() == config.to_dict()
    with pytest.raises(BertConfigError, match="num_hiden_layers"):
        BertConfig.from_dict({"vocab_size_or_config_json_file": 96, "num_hiden_layers": 2})
    with pytest.raises(BertConfigError, match="multiple of num_attention_heads"):
        BertConfig(96, hidden_size=64, num_attention_heads=5)


@pytest.fixture
def multitask_args(tmp_path):
    vocab_file = tmp_path / "vocab.txt"
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"tok{i}" for i in range(85)]
    vocab_file.write_text("\n".join(tokens) + "\n", encoding="utf-8")  # 90 tokens
    model_config = {"vocab_size_or_config_json_file": 30522, "hidden_size": HIDDEN,
                    "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
                    "intermediate_size": INTER, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
                    "attention_probs_dropout_prob": 0.1, "max_position_embeddings": 64,
                    "type_vocab_size": 2, "initializer_range": 0.02}
    return argparse.Namespace(config={"bert_model_config": model_config}, vocab_file=str(vocab_file))


def test_multitask_builds_from_job_config_and_round_trips_weights(multitask_args, tmp_path):
    torch.manual_seed(0)
    model = BertMultiTask(multitask_args)
    assert model.config.vocab_size == 96  # 90 lines rounded up to a multiple of 8, config's 30522 ignored
    assert model.network.bert.embeddings.word_embeddings.weight.shape == (96, HIDDEN)
    path = tmp_path / "weights.pt"
    model.save(str(path))

    torch.manual_seed(1)
    other = BertMultiTask(multitask_args)
    other.load(str(path))
    for (name, p), q in zip(model.network.state_dict().items(), other.network.state_dict().values()):
        assert torch.equal(p, q), name
    batch = make_batch()
    model.eval()
    other.eval()
    moved = other.move_batch(batch)
    assert isinstance(moved, Batch)
    with torch.no_grad():
        assert torch.equal(model.network(batch), other.network(moved))


def test_multitask_load_names_the_file_on_mismatch(multitask_args, tmp_path):
    model = BertMultiTask(multitask_args)
    state = model.network.state_dict()
    state["bert.extra.weight"] = torch.zeros(1)
    del state["cls.seq_relationship.bias"]
    path = tmp_path / "bad.pt"
    torch.save(state, path)
    with pytest.raises(ModelSourceError, match="bad.pt.*cls.seq_relationship.bias.*bert.extra.weight"):
        model.load(str(path))
    with pytest.raises(FileNotFoundError, match="missing.pt"):
        model.load(str(tmp_path / "missing.pt"))


def test_the_builders_speedups_swap_modules_and_keep_keys_and_values():
    """turing.speedups swaps parameter-free modules only: the same state_dict keys, and with
    dropout at 0 the same training loss and gradients as the model as written (torch's SDPA and
    cross-entropy); with dropout, the same keep rate from the cheaper mask."""
    import copy

    from turing.arch import pretraining_model
    from turing.speedups import CPUAttention, Dropout, FusedMaskedLMLoss, apply_speedups

    torch.manual_seed(0)
    config = make_config(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    plain = BertForPreTrainingPreLN(config, argparse.Namespace()).train()
    fast = apply_speedups(copy.deepcopy(plain))
    assert list(fast.state_dict()) == list(plain.state_dict())
    kinds = [type(m) for m in fast.modules()]
    assert kinds.count(CPUAttention) == config.num_hidden_layers and kinds.count(FusedMaskedLMLoss) == 1
    assert kinds.count(Dropout) == 1 + 2 * config.num_hidden_layers and torch.nn.Dropout not in kinds
    batch = make_batch()
    losses = []
    for model in (plain, fast):
        loss = model(batch)
        loss.backward()
        losses.append((loss.detach(), [p.grad.clone() for p in model.parameters()]))
    assert torch.allclose(losses[0][0], losses[1][0], atol=1e-6)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(losses[0][1], losses[1][1]))
    built = pretraining_model(make_config())
    assert type(built.bert.embeddings.dropout) is Dropout and type(built.mlm_loss) is FusedMaskedLMLoss
