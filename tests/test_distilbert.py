"""The distilbert architecture (turing/arch/distilbert/): stock DistilBERT folders built here by
transformers from a small config (random weights, safetensors, the data's WordPiece vocab.txt;
nothing downloaded), as tests/test_stock_models.py builds the other stock classes and with its
helpers. A DistilBertForMaskedLM opens and exports back with transformers' logits; a bare
DistilBertModel opens with a fresh head named in one warning; the real program's first step from
the folder is transformers' masked-LM loss on that batch; a run SIGKILLed in its last checkpoint
and run again with --auto_resume repeats the uninterrupted losses bit for bit; the trained
checkpoint exports and fine-tunes with transformers' DistilBertForSequenceClassification's logits;
--unpad and --checkpoint_activations give the padded loss; the FLOP count is torch's; what we do
not compute is one error line."""
import json
import os
from types import SimpleNamespace

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from tests import test_stock_models as stock  # noqa: E402
from tests.launch import ds_config, expect_input_error, train_in_process, train_losses  # noqa: E402
from tests.test_modernbert import fine_tune_one_epoch  # noqa: E402
from tests.test_stock_models import (EXTRA, VOCAB_REAL, VOCAB_ROWS, close, padded_batch,  # noqa: E402
                                     record_first_batch, stock_job, unpad_and_checkpointing_match)
from turing.arch import model_config_from_dict  # noqa: E402
from turing.arch.distilbert.model import DistilConfig, DistilForPreTraining  # noqa: E402
from turing.arch.hf_common import PADDED_ROW_BIAS  # noqa: E402
from turing.errors import InputValueError  # noqa: E402
from turing.glue import sequence_classifier  # noqa: E402
from turing.model_options import ModelOptions  # noqa: E402
from turing.pretrained import open_trained  # noqa: E402
from turing.tokenization import load_vocab, special_token_ids  # noqa: E402

try:  # only the tests that build stock folders need it (needs_transformers)
    import transformers
    from safetensors.torch import load_file, save_file
except ImportError:
    transformers = None
needs_transformers = pytest.mark.skipif(transformers is None, reason="builds stock folders with transformers")

MLM, BARE = "DistilBertForMaskedLM", "DistilBertModel"
WORD, BIAS = "bert.embeddings.word_embeddings.weight", "cls.predictions.bias"


def hf_config(dropout=0.0, **overrides):
    """DistilBERT 64 wide, 2 layers, 2 heads, 128-token sequences fit; [PAD] 0."""
    values = dict(vocab_size=VOCAB_REAL, dim=64, n_layers=2, n_heads=2, hidden_dim=128, max_position_embeddings=160,
                  dropout=dropout, attention_dropout=dropout, pad_token_id=0)
    return transformers.DistilBertConfig(**{**values, **overrides})


def distil_folder(folder, vocab_file, cls=MLM, dropout=0.0, seed=0):
    """A stock folder of transformers' `cls`: random weights, every bias and norm moved off its init
    (so that each parameter's role is compared), the data's vocab + EXTRA as its vocab.txt."""
    torch.manual_seed(seed)
    model = getattr(transformers, cls)(hf_config(dropout))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "bias" in name or "norm" in name.lower():
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(str(folder), safe_serialization=True)
    lines = open(vocab_file, encoding="utf-8").read().splitlines() + EXTRA
    (folder / "vocab.txt").write_text("\n".join(lines) + "\n")
    (folder / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True}))
    return folder


def mlm_logits(folder, batch):
    model = transformers.DistilBertForMaskedLM.from_pretrained(str(folder)).eval()
    with torch.no_grad():
        return model(input_ids=batch.input_ids, attention_mask=batch.input_mask).logits


@pytest.fixture(scope="module")
def folder(data_root, tmp_path_factory):
    """A stock DistilBertForMaskedLM without dropout (a training step is then transformers' forward)."""
    return distil_folder(tmp_path_factory.mktemp("distil") / "mlm", data_root / "vocab.txt")


# ---------------------------------------------------------------------------------------------
# Import and export, without training


@needs_transformers
def test_import_then_export_gives_transformers_logits(folder, tmp_path):
    from tools.export_hf import hf_model_of

    trained = open_trained(str(folder))
    assert (trained.kind, trained.architecture, trained.config.vocab_size) == ("export", "distilbert", VOCAB_ROWS)
    assert not trained.nsp_head
    ours = trained.build().eval()
    state = ours.state_dict()
    assert state[WORD][VOCAB_REAL:].abs().sum() == 0 and (state[BIAS][VOCAB_REAL:] == PADDED_ROW_BIAS).all()
    assert not any("token_type" in k or "pooler" in k or "seq_relationship" in k for k in state)

    hf, name, _ = hf_model_of(state, trained.config, VOCAB_REAL, special_token_ids(load_vocab(trained.vocab_file)))
    hf.save_pretrained(str(tmp_path / "export"), safe_serialization=True)
    exported = transformers.AutoModelForMaskedLM.from_pretrained(str(tmp_path / "export")).eval()
    assert type(exported).__name__ == name == MLM
    batch = padded_batch()
    real = batch.input_mask.bool()
    theirs = mlm_logits(folder, batch)
    with torch.no_grad():
        again = exported(input_ids=batch.input_ids, attention_mask=batch.input_mask).logits
        scores, nsp = ours.predict(batch.input_ids, batch.segment_ids, batch.input_mask)
    diff, ok = close(again[real], theirs[real])
    ours_diff, ours_ok = close(scores[..., :VOCAB_REAL][real], theirs[real])
    print(f"\ndistilbert: max |logit diff| at real positions: export vs stock {diff:.3g}, "
          f"ours vs stock {ours_diff:.3g}")
    assert ok and ours_ok and nsp is None, (diff, ours_diff)
    # the segment ids are read by nothing: other ones give the same scores
    with torch.no_grad():
        assert torch.equal(ours.predict(batch.input_ids, 1 - batch.segment_ids, batch.input_mask)[0], scores)


@needs_transformers
@pytest.mark.parametrize("prefixed", [False, True], ids=["as_saved", "prefixed"])
def test_a_bare_distilbert_model_opens_with_a_fresh_head_named_in_one_warning(prefixed, data_root, tmp_path, caplog):
    """A DistilBertModel folder (keys as save_pretrained writes them, or under `distilbert.`): our
    encoder output is transformers' last_hidden_state, the masked-LM head is created as
    transformers creates it (decoder tied to the word embeddings, zero bias) and one warning line
    names the fresh tensors."""
    folder = distil_folder(tmp_path / "bare", data_root / "vocab.txt", cls=BARE)
    bare = transformers.DistilBertModel.from_pretrained(str(folder)).eval()   # read before any renaming
    if prefixed:
        tensors = load_file(str(folder / "model.safetensors"))
        save_file({"distilbert." + k: v for k, v in tensors.items()}, str(folder / "model.safetensors"))
    trained = open_trained(str(folder))
    assert trained.architecture == "distilbert" and not trained.nsp_head
    with caplog.at_level("WARNING", logger="turing.pretrained"):
        ours = trained.build().eval()
    fresh = [r.getMessage() for r in caplog.records if "start fresh" in r.getMessage()]
    assert len(fresh) == 1 and str(folder) in fresh[0], fresh
    assert all(f"cls.predictions.transform.{n}.{p}" in fresh[0] for n in ("dense", "LayerNorm")
               for p in ("weight", "bias")), fresh[0]
    batch = padded_batch()
    real = batch.input_mask.bool()
    with torch.no_grad():
        theirs = bare(input_ids=batch.input_ids, attention_mask=batch.input_mask).last_hidden_state
        hidden = ours.encode(batch.input_ids, batch.segment_ids, batch.input_mask)
    diff, ok = close(hidden[real], theirs[real])
    print(f"\ndistilbert ({'prefixed' if prefixed else 'as saved'}): max |ours - last_hidden_state| {diff:.3g}")
    assert ok, diff
    state = ours.state_dict()
    assert (state[BIAS][:VOCAB_REAL] == 0).all() and (state[BIAS][VOCAB_REAL:] == PADDED_ROW_BIAS).all()
    assert ours.cls.predictions.decoder.weight is ours.bert.embeddings.word_embeddings.weight
    transform = ours.cls.predictions.transform
    assert (transform.dense.bias == 0).all() and (transform.LayerNorm.weight == 1).all()
    assert (transform.LayerNorm.bias == 0).all() and abs(transform.dense.weight.std().item() - 0.02) < 0.002


# ---------------------------------------------------------------------------------------------
# The block


def small_config(**overrides):
    values = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=48,
                  max_position_embeddings=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return model_config_from_dict({"architecture": "distilbert", "vocab_size": 104, **values, **overrides})


def test_config_round_trips_and_refuses_token_types():
    config = small_config(seq_classif_dropout=0.3)
    assert isinstance(config, DistilConfig) and config.layer_norm_eps == 1e-12
    assert model_config_from_dict(config.to_dict()).to_dict() == config.to_dict()
    assert "type_vocab_size" not in config.to_dict() and config.to_dict()["seq_classif_dropout"] == 0.3
    with pytest.raises(InputValueError, match="key 'type_vocab_size' is the original BERT's; DistilBERT has no token "
                                              "type embeddings"):
        small_config(type_vocab_size=2)


def test_unpad_and_checkpoint_activations_give_the_padded_loss_and_grads():
    unpad_and_checkpointing_match(DistilForPreTraining, small_config(), padded_batch(length=64, rows=(40, 30, 17, 9)))


@pytest.mark.parametrize("flag", ["progressive_layer_drop", "deepspeed_transformer_kernel",
                                  "deepspeed_sparse_attention"])
def test_what_the_post_ln_block_refuses_is_refused(flag):
    with pytest.raises(ValueError, match=f"--{flag} does not apply to bert_model_config.architecture 'distilbert'"):
        DistilForPreTraining(small_config(), SimpleNamespace(**{flag: True}))
    assert not DistilForPreTraining(small_config()).next_sentence_prediction   # off where nothing says
    with pytest.raises(ValueError, match="'distilbert' has no next-sentence head"):
        ModelOptions(next_sentence_prediction=True).for_block(DistilForPreTraining)


# ---------------------------------------------------------------------------------------------
# Through the program


@needs_transformers
def test_first_step_loss_is_transformers_masked_lm_loss_on_that_batch(folder, data_root, tmp_path):
    recording, seen = record_first_batch(DistilForPreTraining)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(DistilForPreTraining, "forward", recording)
        train_in_process(data_root, tmp_path / "out", ds_config(tmp_path / "ds"), "--use_pretrain", "--max_steps", 1,
                         cf=stock_job(tmp_path, folder))
    assert len(seen) == 1
    (_, ids, mask, _, _, labels), loss = seen[0]
    logits = mlm_logits(folder, SimpleNamespace(input_ids=ids, input_mask=mask))
    masked = labels != -1
    expected = F.cross_entropy(logits[masked], labels[masked]).item()
    print(f"\ndistilbert: first-step loss {loss:.7f}, transformers' {expected:.7f}, "
          f"difference {abs(loss - expected):.3g}")
    assert abs(loss - expected) <= 1e-5 * max(1.0, expected)
    assert train_losses(tmp_path / "out") == [pytest.approx(loss, abs=1e-6)]


@pytest.fixture(scope="module")
def distil_run(data_root, tmp_path_factory):
    """4 steps (one epoch of the NVIDIA shards) from a stock folder with dropout 0.1, a checkpoint
    every 2 steps: test_stock_models.py's stock_run, for DistilBERT."""
    root = tmp_path_factory.mktemp("distil_run")
    folder = distil_folder(root / "stock", data_root / "vocab.txt", dropout=0.1)
    cf, ds, out = stock_job(root, folder), ds_config(root / "ds"), root / "out"
    state = train_in_process(data_root, out, ds, "--use_pretrain", "--max_steps", 4, "--checkpoint_every_steps", 2,
                             cf=cf)
    assert state.global_step == 4
    return {"kind": "distilbert", "folder": folder, "cf": cf, "ds": ds, "out": out,
            "ckpt": out / "saved_models" / stock.JOB}


@needs_transformers
def test_sigkill_during_the_last_checkpoint_then_auto_resume_repeats_the_run(distil_run, data_root, tmp_path):
    losses = train_losses(distil_run["out"])
    assert len(losses) == 4 and losses[-1] < losses[0]
    job_config = json.loads((distil_run["ckpt"] / "step2" / "job_config.json").read_text())
    assert job_config["bert_model_config"]["architecture"] == "distilbert"   # from config.json
    stock.test_sigkill_during_a_checkpoint_then_auto_resume_repeats_the_run(distil_run, data_root, tmp_path)


@needs_transformers
def test_trained_checkpoint_exports_and_fine_tunes_with_transformers_classifier_logits(distil_run, tmp_path):
    from tools import export_hf

    export = tmp_path / "hf"
    assert export_hf.main(["--checkpoint_dir", str(distil_run["ckpt"]), "--output_dir", str(export)]) == 0
    config = json.loads((export / "config.json").read_text())
    assert config["architectures"] == [MLM] and config["vocab_size"] == VOCAB_REAL
    assert not config["sinusoidal_pos_embds"] and config["tie_word_embeddings"]
    assert (config["dim"], config["n_layers"], config["hidden_dim"], config["dropout"]) == (64, 2, 128, 0.1)
    encoded = transformers.AutoTokenizer.from_pretrained(str(export))("the cat", "sat")
    assert "token_type_ids" not in encoded   # DistilBERT reads none

    trained = open_trained(str(export))
    assert trained.architecture == "distilbert" and trained.config.vocab_size == VOCAB_ROWS
    torch.manual_seed(0)
    ours = sequence_classifier(trained.build(), trained.config, 2).eval()
    head = {name: p for name, p in ours.named_parameters() if not name.startswith("bert.")}
    assert sorted(head) == ["classifier.bias", "classifier.weight", "pre_classifier.bias", "pre_classifier.weight"]
    assert all((head[f"{n}.bias"] == 0).all() for n in ("classifier", "pre_classifier"))   # transformers' init
    assert abs(head["pre_classifier.weight"].std().item() - trained.config.initializer_range) < 0.002
    theirs = transformers.DistilBertForSequenceClassification.from_pretrained(str(export), num_labels=2).eval()
    assert ours.dropout.p == theirs.dropout.p == trained.config.seq_classif_dropout == 0.2
    theirs.load_state_dict({k: v.detach() for k, v in head.items()}, strict=False)
    batch = padded_batch()
    with torch.no_grad():
        logits = ours(batch.input_ids, batch.input_mask, batch.segment_ids)
        expected = theirs(input_ids=batch.input_ids, attention_mask=batch.input_mask).logits
    diff, ok = close(logits, expected)
    print(f"\ndistilbert: fine-tuning logits, max |ours - DistilBertForSequenceClassification| {diff:.3g}")
    assert ok, diff
    fine_tune_one_epoch(export, tmp_path)  # one step, its score the dev predictions' accuracy


# ---------------------------------------------------------------------------------------------
# Bad input: one error line


def _copy_folder(source, target, config=None, drop=None):
    target.mkdir()
    for name in ("vocab.txt", "model.safetensors", "config.json"):
        (target / name).write_bytes((source / name).read_bytes())
    if config:
        (target / "config.json").write_text(json.dumps({**json.loads((source / "config.json").read_text()), **config}))
    if drop:
        tensors = load_file(str(source / "model.safetensors"))
        save_file({k: v for k, v in tensors.items() if k != drop}, str(target / "model.safetensors"))
    return target


@needs_transformers
@pytest.mark.parametrize("config, drop, expected", [
    ({"hidden_dim": 96}, None, "shapes differ from bert_model_config and the vocab: "
                               "bert.encoder.layer.0.intermediate.dense.weight (128, 64) (model (96, 64))"),
    (None, "distilbert.transformer.layer.1.ffn.lin2.weight",
     "keys do not match (missing: distilbert.transformer.layer.1.ffn.lin2.weight; unexpected: none)"),
    ({"sinusoidal_pos_embds": True}, None, "sinusoidal_pos_embds is true; the distilbert block has a learned position "
                                           "table"),
    ({"activation": "gelu_new"}, None, "activation 'gelu_new' is not one this block computes"),
], ids=["shape", "missing_tensor", "sinusoidal", "activation"])
def test_config_and_weights_that_do_not_fit_are_one_error_line(config, drop, expected, folder, tmp_path):
    bad = _copy_folder(folder, tmp_path / "bad", config, drop)
    with pytest.raises(InputValueError) as error:
        open_trained(str(bad)).build()
    assert expected in str(error.value) and "\n" not in str(error.value), str(error.value)


@needs_transformers
def test_next_sentence_prediction_on_is_one_error_line(folder, data_root, tmp_path, capsys):
    cf = stock_job(tmp_path, folder, next_sentence_prediction=True)
    line = expect_input_error(capsys, train_in_process, data_root, tmp_path / "out", ds_config(tmp_path),
                              "--use_pretrain", cf=cf)
    assert "next_sentence_prediction is true, but bert_model_config.architecture 'distilbert' has no next-sentence " \
           "head" in line, line
