"""Continued pretraining from a stock Hugging Face model: folders built here by transformers from
small configs (random weights, `save_pretrained` with safetensors, a WordPiece vocab.txt written by
the test, or a byte-level BPE tokenizer.json trained on the spot: tests/test_stock_tokenizers.py)
of the classes we import:
BertForMaskedLM and BertForPreTraining (the bert_postln block, turing/arch/bert_postln/),
RobertaPreLayerNormForMaskedLM (our pre-LN block) and ModernBertForMaskedLM. Each is opened by
turing.pretrained, exported back without training with the stock model's logits, trained a few
steps by the real program with a job config that names only the folder (without dropout, its first
step's loss is transformers' on that batch; with dropout, a run resumed from an interval checkpoint
repeats the uninterrupted one bit for bit, and so does the trainer's own process SIGKILLed in its last
checkpoint and run again with --auto_resume), exported and fine-tuned a step; what we do not compute
is one error line. Nothing is downloaded."""
import json
import os
import signal
import subprocess
import sys
from types import SimpleNamespace

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from testkit.launcher import REPO, launch_env, progress  # noqa: E402
from tests.launch import (TINY_CFG, ds_config, event_files, expect_input_error, new_event_losses,  # noqa: E402
                          start_held_before_marker, tiny_argv, train_in_process, train_losses, wait_for_line)
from tests.test_modernbert import fine_tune_one_epoch  # noqa: E402
from turing.batch import Batch  # noqa: E402
from turing.checkpoint_files import complete_tags  # noqa: E402
from turing.errors import InputValueError  # noqa: E402
from turing.arch.hf_common import PADDED_ROW_BIAS  # noqa: E402
from turing.model_options import ModelOptions  # noqa: E402
from turing.modeling import BertForPreTrainingPreLN  # noqa: E402
from turing.arch import model_config_from_dict, pretraining_model  # noqa: E402
from turing.arch.modernbert.model import ModernForPreTraining  # noqa: E402
from turing.arch.bert_postln.model import BertForPreTrainingPostLN, PostLNConfig  # noqa: E402
from turing.pretrained import open_trained, read_weights  # noqa: E402
from turing.speedups import CPUAttention, Dropout, FusedMaskedLMLoss  # noqa: E402
from turing.tb_events import read_run  # noqa: E402
from turing.tokenization import load_vocab, special_token_ids  # noqa: E402

try:  # only the tests that build stock folders need it (needs_transformers)
    import transformers
    from safetensors.torch import load_file, save_file
except ImportError:
    transformers = None
needs_transformers = pytest.mark.skipif(transformers is None, reason="builds stock folders with transformers")

JOB = "tiny_bert"
EXTRA = ["[unused0]", "[unused1]", "[unused2]"]  # the data's 96 tokens + 3: 99, padded to 104 rows
VOCAB_REAL, VOCAB_ROWS = 99, 104
KINDS = ("bert_mlm", "bert_pretraining", "roberta", "modernbert")
ARCHITECTURE = {"bert_mlm": "bert_postln", "bert_pretraining": "bert_postln", "roberta": "bert",
                "modernbert": "modernbert"}


def hf_config(kind, dropout=0.0, **overrides):
    """A small transformers config of `kind`: 64 wide, 128-token sequences fit; [PAD] 0, [CLS] 2, [SEP] 3."""
    sizes = dict(vocab_size=VOCAB_REAL, hidden_size=64, num_attention_heads=2, pad_token_id=0)
    if kind == "modernbert":  # 3 layers: full, sliding (+-8), sliding
        values = dict(sizes, num_hidden_layers=3, intermediate_size=96, local_attention=16, max_position_embeddings=160,
                      bos_token_id=2, eos_token_id=3, cls_token_id=2, sep_token_id=3, embedding_dropout=dropout,
                      attention_dropout=dropout, mlp_dropout=dropout, norm_bias=True, attention_bias=True)
        return transformers.ModernBertConfig(**{**values, **overrides})
    values = dict(sizes, num_hidden_layers=2, intermediate_size=128, hidden_dropout_prob=dropout,
                  attention_probs_dropout_prob=dropout)
    if kind == "roberta":  # RoBERTa numbers positions from pad + 1: 161 rows are our 160
        return transformers.RobertaPreLayerNormConfig(**{**values, "max_position_embeddings": 161,
                                                         "bos_token_id": 2, "eos_token_id": 3, **overrides})
    return transformers.BertConfig(**{**values, "max_position_embeddings": 160, "layer_norm_eps": 1e-7, **overrides})


HF_CLASSES = {"bert_mlm": "BertForMaskedLM", "bert_pretraining": "BertForPreTraining",
              "roberta": "RobertaPreLayerNormForMaskedLM", "modernbert": "ModernBertForMaskedLM"}


def stock_weights(kind, folder, dropout=0.0, seed=0, **overrides):
    """A stock folder of `kind` without a tokenizer: random weights, every bias and norm moved off
    its init so that each parameter's role is compared."""
    torch.manual_seed(seed)
    model = getattr(transformers, HF_CLASSES[kind])(hf_config(kind, dropout, **overrides))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "bias" in name or "norm" in name.lower():
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(str(folder), safe_serialization=True)
    return folder


def stock_folder(kind, folder, vocab_file, dropout=0.0, seed=0, **overrides):
    """A stock folder of `kind` (stock_weights) with the data's vocab + EXTRA as its vocab.txt."""
    stock_weights(kind, folder, dropout, seed, **overrides)
    lines = open(vocab_file, encoding="utf-8").read().splitlines() + EXTRA
    (folder / "vocab.txt").write_text("\n".join(lines) + "\n")
    (folder / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True}))
    return folder


def stock_model(folder, kind):
    """The folder opened by transformers' own class of `kind`, eval mode."""
    return getattr(transformers, HF_CLASSES[kind]).from_pretrained(str(folder)).eval()


def hf_logits(model, kind, ids, mask, segments):
    types = {} if kind == "modernbert" else {"token_type_ids": segments}
    out = model(input_ids=ids, attention_mask=mask, **types)
    return (out.prediction_logits, out.seq_relationship_logits) if kind == "bert_pretraining" else (out.logits, None)


def padded_batch(length=48, rows=(48, 33, 17, 6), seed=1):
    """Ids padded at the end (longer than the modern window), segments A/B, 3 masked positions a row."""
    g = torch.Generator().manual_seed(seed)
    mask = (torch.arange(length)[None] < torch.tensor(rows)[:, None]).long()
    ids = torch.randint(5, VOCAB_REAL, (len(rows), length), generator=g) * mask
    segments = ((torch.arange(length)[None] >= torch.tensor(rows)[:, None] // 2) * mask).long()
    labels = torch.full_like(ids, -1)
    for row, n in enumerate(rows):
        positions = torch.randperm(n - 2, generator=g)[:3] + 1
        labels[row, positions] = ids[row, positions]
    nsp = torch.tensor([0, 1, 1, 0])
    return Batch(torch.zeros(len(rows), dtype=torch.long), ids, mask, segments, nsp, labels)


def close(ours, theirs):
    """max |ours - theirs| and whether it is within 1e-5 x max(1, max |theirs|)."""
    diff = (ours - theirs).abs().max().item()
    return diff, diff <= 1e-5 * max(1.0, theirs.abs().max().item())


@pytest.fixture(scope="module")
def folders(data_root, tmp_path_factory):
    """Each kind's stock folder without dropout (so a training step is transformers' forward)."""
    root = tmp_path_factory.mktemp("stock")
    return {kind: stock_folder(kind, root / kind, data_root / "vocab.txt") for kind in KINDS}


@pytest.fixture(scope="module")
def dropout_folders(data_root, tmp_path_factory):
    """Each kind's stock folder with every dropout at 0.1 (so a resume must restore the RNG states)."""
    root = tmp_path_factory.mktemp("stock_dropout")
    return {kind: stock_folder(kind, root / kind, data_root / "vocab.txt", dropout=0.1) for kind in KINDS}


# ---------------------------------------------------------------------------------------------
# Import and export, without training


@needs_transformers
@pytest.mark.parametrize("kind", KINDS)
def test_import_then_export_gives_the_stock_models_logits(kind, folders, tmp_path):
    from tools.export_hf import hf_model_of

    folder = folders[kind]
    trained = open_trained(str(folder))
    assert (trained.kind, trained.architecture, trained.config.vocab_size) == ("export", ARCHITECTURE[kind], VOCAB_ROWS)
    assert trained.vocab_file == str(folder / "vocab.txt") and trained.nsp_head == (kind == "bert_pretraining")
    ours = trained.build().eval()
    state = ours.state_dict()
    word = "bert.embeddings.tok_embeddings.weight" if kind == "modernbert" else "bert.embeddings.word_embeddings.weight"
    bias = "cls.decoder.bias" if kind == "modernbert" else "cls.predictions.bias"
    assert state[word][VOCAB_REAL:].abs().sum() == 0 and (state[bias][VOCAB_REAL:] == PADDED_ROW_BIAS).all()

    hf, name, _ = hf_model_of(state, trained.config, VOCAB_REAL, special_token_ids(load_vocab(trained.vocab_file)))
    hf.save_pretrained(str(tmp_path / "export"), safe_serialization=True)
    exported = transformers.AutoModelForMaskedLM.from_pretrained(str(tmp_path / "export")).eval()
    assert type(exported).__name__ == ("BertForMaskedLM" if kind == "bert_pretraining" else HF_CLASSES[kind]) == name
    stock = stock_model(folder, kind)
    batch = padded_batch()
    real = batch.input_mask.bool()
    with torch.no_grad():
        theirs, their_nsp = hf_logits(stock, kind, batch.input_ids, batch.input_mask, batch.segment_ids)
        again, _ = hf_logits(exported, "bert_mlm" if kind == "bert_pretraining" else kind, batch.input_ids,
                             batch.input_mask, batch.segment_ids)
        scores, nsp = ours.predict(batch.input_ids, batch.segment_ids, batch.input_mask)
    diff, ok = close(again[real], theirs[real])
    ours_diff, ours_ok = close(scores[..., :VOCAB_REAL][real], theirs[real])
    print(f"\n{kind}: max |logit diff| at real positions: export vs stock {diff:.3g}, ours vs stock {ours_diff:.3g}")
    assert ok and ours_ok, (diff, ours_diff)
    if kind == "bert_pretraining":  # its NSP head came in too
        assert close(nsp, their_nsp)[1]


BARE_CLASSES = {"bert_mlm": "BertModel", "roberta": "RobertaPreLayerNormModel", "modernbert": "ModernBertModel"}


@needs_transformers
@pytest.mark.parametrize("kind", list(BARE_CLASSES))
@pytest.mark.parametrize("prefixed", [False, True], ids=["as_saved", "prefixed"])
def test_a_bare_encoder_opens_with_a_fresh_head_named_in_one_warning(kind, prefixed, data_root, tmp_path, caplog):
    """A headless folder (the bare encoder class, as embedding models are published; its keys as
    save_pretrained writes them, or under the masked-LM class's prefix) opens: the encoder is the
    folder's (our final hidden states equal transformers' last_hidden_state), the masked-LM head is
    created as transformers creates it (the decoder tied to the word embeddings, a zero bias), and
    one warning line names the fresh tensors."""
    folder = tmp_path / kind
    torch.manual_seed(0)
    bare = getattr(transformers, BARE_CLASSES[kind])(hf_config(kind))
    bare.save_pretrained(str(folder), safe_serialization=True)
    if prefixed:   # the keys of an encoder saved from inside its masked-LM class
        prefix = {"bert_mlm": "bert.", "roberta": "roberta_prelayernorm.", "modernbert": "model."}[kind]
        tensors = load_file(str(folder / "model.safetensors"))
        save_file({prefix + k: v for k, v in tensors.items()}, str(folder / "model.safetensors"))
    lines = open(data_root / "vocab.txt", encoding="utf-8").read().splitlines() + EXTRA
    (folder / "vocab.txt").write_text("\n".join(lines) + "\n")
    trained = open_trained(str(folder))
    assert trained.architecture == ARCHITECTURE[kind] and not trained.nsp_head
    with caplog.at_level("WARNING", logger="turing.pretrained"):
        ours = trained.build().eval()
    fresh = [r.getMessage() for r in caplog.records if "start fresh" in r.getMessage()]
    head = {"bert_mlm": "cls.predictions.transform.dense.weight", "roberta": "cls.predictions.transform.dense_act.weight",
            "modernbert": "cls.head.dense.weight"}[kind]
    assert len(fresh) == 1 and head in fresh[0] and str(folder) in fresh[0], fresh
    batch = padded_batch()
    real = batch.input_mask.bool()
    types = {} if kind == "modernbert" else {"token_type_ids": batch.segment_ids}
    with torch.no_grad():
        theirs = bare.eval()(input_ids=batch.input_ids, attention_mask=batch.input_mask, **types).last_hidden_state
        hidden = ours.encode(batch.input_ids, batch.segment_ids, batch.input_mask)
        scores, _ = ours.predict(batch.input_ids, batch.segment_ids, batch.input_mask)
    assert close(hidden[real], theirs[real])[1]
    bias = "cls.decoder.bias" if kind == "modernbert" else "cls.predictions.bias"
    assert (ours.state_dict()[bias][:VOCAB_REAL] == 0).all()
    word, decoder = (("bert.embeddings.tok_embeddings.weight", "cls.decoder.weight") if kind == "modernbert" else
                     ("bert.embeddings.word_embeddings.weight", "cls.predictions.decoder.weight"))
    state = ours.state_dict()
    assert state[decoder].data_ptr() == state[word].data_ptr()   # tied: one tensor
    assert torch.isfinite(scores).all()


@needs_transformers
def test_early_bert_checkpoints_layer_norm_names_and_tied_copies_are_read(folders, tmp_path):
    """bert-base-uncased's model.safetensors names its LayerNorms gamma/beta, as early BERT
    checkpoints did; tied copies and the position_ids buffer are in some files too."""
    folder = tmp_path / "legacy"
    folder.mkdir()
    for name in ("config.json", "vocab.txt"):
        (folder / name).write_bytes((folders["bert_pretraining"] / name).read_bytes())
    tensors = load_file(str(folders["bert_pretraining"] / "model.safetensors"))
    legacy = {k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v
              for k, v in tensors.items()}
    legacy["cls.predictions.decoder.weight"] = tensors["bert.embeddings.word_embeddings.weight"].clone()
    legacy["cls.predictions.decoder.bias"] = tensors["cls.predictions.bias"].clone()
    legacy["bert.embeddings.position_ids"] = torch.arange(160)[None]
    assert sum("gamma" in k for k in legacy) == 2 * 2 + 2  # 2 a layer, the embeddings' and the MLM head's
    save_file(legacy, str(folder / "model.safetensors"))
    ours, theirs = read_weights(str(folder)), read_weights(str(folders["bert_pretraining"]))
    assert set(ours) == set(theirs) and all(torch.equal(ours[k], theirs[k]) for k in theirs)

    legacy["cls.predictions.decoder.bias"] = tensors["cls.predictions.bias"] + 1   # a "tied" copy that is not
    save_file(legacy, str(folder / "model.safetensors"))
    with pytest.raises(InputValueError, match="cls.predictions.decoder.bias differs from cls.predictions.bias"):
        read_weights(str(folder))


def _edit_config(folder, **changes):
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config))


@needs_transformers
@pytest.mark.parametrize("kind, change, expected", [
    ("bert_mlm", {"position_embedding_type": "relative_key"}, "position_embedding_type must be 'absolute', got "
                                                              "'relative_key'"),
    ("bert_mlm", {"is_decoder": True}, "is_decoder is true"),
    ("bert_mlm", {"add_cross_attention": True}, "add_cross_attention is true"),
    ("bert_mlm", {"hidden_act": "gelu_new"}, "hidden_act 'gelu_new' is not one this block computes"),
    ("bert_mlm", {"architectures": ["BertForSequenceClassification"]}, "architectures "
                                                                       "['BertForSequenceClassification']"),
    ("bert_mlm", {"model_type": "deberta-v2"}, "config.json model_type 'deberta-v2' is not one this project imports"),
    ("bert_mlm", {"pad_token_id": 1}, "config.json pad_token_id is 1, but [PAD] is id 0 of vocab.txt"),
    ("bert_mlm", {"vocab_size": 98}, "vocab.txt has 99 tokens, config.json vocab_size is 98"),
    ("roberta", {"layer_norm_eps": 1e-5}, "layer_norm_eps 1e-05 differs from our model's 1e-12"),
    ("modernbert", {"rope_parameters": {"full_attention": {"rope_type": "yarn", "rope_theta": 1e4}}},
     "rope_parameters.full_attention.rope_type 'yarn'"),
    ("modernbert", {"is_decoder": True}, "is_decoder is true"),
])
def test_what_we_do_not_compute_is_one_error_line(kind, change, expected, folders, tmp_path):
    folder = tmp_path / kind
    folder.mkdir()
    for name in ("config.json", "vocab.txt", "model.safetensors"):
        (folder / name).write_bytes((folders[kind] / name).read_bytes())
    _edit_config(folder, **change)
    with pytest.raises(InputValueError) as error:
        open_trained(str(folder))
    assert expected in str(error.value) and "\n" not in str(error.value), str(error.value)


@needs_transformers
def test_a_pytorch_model_bin_that_is_not_a_torch_file_is_one_error_line(folders, tmp_path):
    """pytorch_model.bin is read weights-only (tests/test_published_weights.py: as safetensors, and
    the pickles that would run code refused)."""
    folder = tmp_path / "pickled"
    folder.mkdir()
    (folder / "config.json").write_bytes((folders["bert_mlm"] / "config.json").read_bytes())
    (folder / "pytorch_model.bin").write_bytes(b"not a torch file")
    for reader in (open_trained, read_weights):
        with pytest.raises(InputValueError) as error:
            reader(str(folder))
        assert str(error.value).startswith(f"{folder / 'pytorch_model.bin'}: not a readable torch"), str(error.value)


def byte_level_bpe(folder, size):
    """A byte-level BPE tokenizer.json (ModernBERT's kind) trained here on a few sentences."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=size, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(["the cat sat on the mat", "a dog ran far away"] * 50, trainer)
    tokenizer.save(str(folder / "tokenizer.json"))
    return tokenizer.get_vocab_size()


@needs_transformers
def test_a_tokenizer_json_that_names_no_special_tokens_is_one_error_line(data_root, tmp_path, capsys):
    """A ModernBERT folder whose only tokenizer is a bare tokenizer.json (no post-processor, no
    tokenizer_config.json or special_tokens_map.json beside it) opens to nothing that could say
    which id is [MASK]: one line, for every reader (tests/test_stock_tokenizers.py: with them, it
    trains)."""
    folder = tmp_path / "modern_bpe"
    torch.manual_seed(0)
    transformers.ModernBertForMaskedLM(hf_config("modernbert", vocab_size=300)).save_pretrained(str(folder))
    assert byte_level_bpe(folder, 300) <= 300
    expected = (f"{folder / 'tokenizer.json'}: names no pad, unk, cls, sep, mask token; a tokenizer.json's special "
                f"tokens are read from special_tokens_map.json or tokenizer_config.json beside it")
    with pytest.raises(InputValueError) as error:
        open_trained(str(folder))
    assert str(error.value).startswith(expected) and "\n" not in str(error.value), str(error.value)
    job = stock_job(tmp_path, folder)
    line = expect_input_error(capsys, train_in_process, data_root, tmp_path / "out", ds_config(tmp_path),
                              "--use_pretrain", cf=job)
    assert f"bert_model_file {expected}" in line, line


# ---------------------------------------------------------------------------------------------
# The post-LN block


def small_postln(**overrides):
    values = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=48,
                  max_position_embeddings=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                  layer_norm_eps=1e-7)
    values.update(overrides)
    return model_config_from_dict({"architecture": "bert_postln", "vocab_size": 104, **values})


def unpad_and_checkpointing_match(model_class, config, batch):
    """`--unpad` with `--checkpoint_activations` gives a block's padded training loss and gradients
    (the same weights, a batch with padding)."""
    torch.manual_seed(0)
    padded = model_class(config)
    changed = model_class(config, SimpleNamespace(unpad=True, checkpoint_activations=True))
    changed.load_state_dict(padded.state_dict())
    losses = []
    for model in (padded, changed):
        loss = model.train()(batch)
        loss.backward()
        losses.append(loss)
    assert torch.allclose(losses[0], losses[1], atol=1e-6, rtol=0)
    for (name, p), q in zip(padded.named_parameters(), changed.parameters(), strict=True):
        assert torch.allclose(p.grad, q.grad, atol=1e-6, rtol=1e-4), name


def test_postln_unpad_and_checkpoint_activations_give_the_padded_loss_and_grads():
    unpad_and_checkpointing_match(BertForPreTrainingPostLN, small_postln(), padded_batch(length=64, rows=(40, 30, 17, 9)))


def test_postln_is_built_with_the_speedups_and_bert_stays_the_default():
    model = pretraining_model(small_postln(hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1))
    kinds = {type(m) for m in model.modules()}
    assert {Dropout, CPUAttention, FusedMaskedLMLoss} <= kinds and torch.nn.Dropout not in kinds
    assert isinstance(small_postln(), PostLNConfig) and small_postln().to_dict()["layer_norm_eps"] == 1e-7
    default = model_config_from_dict({"vocab_size_or_config_json_file": 96})
    assert default.architecture == "bert" and type(pretraining_model(default)) is BertForPreTrainingPreLN
    assert "layer_norm_eps" not in default.to_dict()  # the original's config, as before


@pytest.mark.parametrize("flag", ["progressive_layer_drop", "deepspeed_transformer_kernel",
                                  "deepspeed_sparse_attention"])
def test_postln_refuses_what_it_does_not_run(flag):
    with pytest.raises(ValueError, match=f"--{flag} does not apply to bert_model_config.architecture 'bert_postln'"):
        BertForPreTrainingPostLN(small_postln(), SimpleNamespace(**{flag: True}))
    ModelOptions(next_sentence_prediction=True).for_block(BertForPreTrainingPostLN)  # it has an NSP head
    with pytest.raises(ValueError, match="'modernbert' has no next-sentence head"):
        ModelOptions(next_sentence_prediction=True).for_block(ModernForPreTraining)


# ---------------------------------------------------------------------------------------------
# Through the program


def stock_job(folder_root, model_folder, **training):
    """The tiny job config with only its data and training sections and bert_model_file."""
    job = json.load(open(TINY_CFG))
    del job["bert_model_config"], job["bert_token_file"]
    job["bert_model_file"] = str(model_folder)
    job["mixed_seq_training"]["128"].update(training)
    path = folder_root / f"job_{os.path.basename(model_folder)}.json"
    path.write_text(json.dumps(job))
    return path


def record_first_batch(cls):
    """A wrapper of cls.forward that keeps the first training batch and its loss."""
    seen = []
    forward = cls.forward

    def recording(self, batch, **kwargs):
        loss = forward(self, batch, **kwargs)
        if not seen and batch[5] is not None and self.training:
            seen.append(([t.clone() for t in batch], loss.item()))
        return loss
    return recording, seen


MODEL_CLASSES = {"bert_mlm": BertForPreTrainingPostLN, "bert_pretraining": BertForPreTrainingPostLN,
                 "roberta": BertForPreTrainingPreLN, "modernbert": ModernForPreTraining}


@pytest.fixture(scope="module", params=KINDS)
def first_step(request, folders, data_root, tmp_path_factory):
    """One step from the kind's folder without dropout: the batch the model saw and its loss."""
    kind = request.param
    root = tmp_path_factory.mktemp(f"first_{kind}")
    recording, seen = record_first_batch(MODEL_CLASSES[kind])
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(MODEL_CLASSES[kind], "forward", recording)
        train_in_process(data_root, root / "out", ds_config(root / "ds"), "--use_pretrain", "--max_steps", 1,
                         cf=stock_job(root, folders[kind]))
    assert len(seen) == 1
    return {"kind": kind, "out": root / "out", "batch": seen[0][0], "loss": seen[0][1]}


@needs_transformers
def test_first_step_loss_is_transformers_loss_on_that_batch(first_step, folders):
    kind, loss = first_step["kind"], first_step["loss"]
    _, ids, mask, segments, nsp_labels, labels = first_step["batch"]
    stock = stock_model(folders[kind], kind)
    with torch.no_grad():
        logits, nsp = hf_logits(stock, kind, ids, mask, segments)
    masked = labels != -1
    expected = F.cross_entropy(logits[masked], labels[masked])
    if kind == "bert_pretraining":  # its NSP head is trained too: next_sentence_prediction defaults on
        expected = expected + F.cross_entropy(nsp, nsp_labels.reshape(-1))
    print(f"\n{kind}: first-step loss {loss:.7f}, transformers' {expected.item():.7f}, "
          f"difference {abs(loss - expected.item()):.3g}")
    assert abs(loss - expected.item()) <= 1e-5 * max(1.0, expected.item())
    assert train_losses(first_step["out"]) == [pytest.approx(loss, abs=1e-6)]


@pytest.fixture(scope="module", params=KINDS)
def stock_run(request, dropout_folders, data_root, tmp_path_factory):
    """4 steps (one epoch of the NVIDIA shards) from the kind's folder with dropout, a checkpoint
    every 2 steps."""
    kind = request.param
    root = tmp_path_factory.mktemp(f"run_{kind}")
    cf, ds, out = stock_job(root, dropout_folders[kind]), ds_config(root / "ds"), root / "out"
    state = train_in_process(data_root, out, ds, "--use_pretrain", "--max_steps", 4, "--checkpoint_every_steps", 2,
                             cf=cf)
    assert state.global_step == 4
    return {"kind": kind, "folder": dropout_folders[kind], "cf": cf, "ds": ds, "out": out,
            "ckpt": out / "saved_models" / JOB}


@needs_transformers
def test_resume_from_the_interval_checkpoint_is_bit_for_bit(stock_run, data_root, tmp_path):
    whole = train_losses(stock_run["out"])
    assert len(whole) == 4 and whole[-1] < whole[0]
    train_in_process(data_root, tmp_path / "out", stock_run["ds"], "--use_pretrain", "--max_steps", 2,
                     "--load_training_checkpoint", stock_run["ckpt"], "--load_checkpoint_id", "step2",
                     cf=stock_run["cf"])
    assert train_losses(tmp_path / "out") == whole[2:]
    job_config = json.loads((stock_run["ckpt"] / "step2" / "job_config.json").read_text())
    assert job_config["bert_model_config"]["architecture"] == ARCHITECTURE[stock_run["kind"]]  # from config.json
    assert job_config["bert_token_file"] == str(stock_run["folder"] / "vocab.txt")


@needs_transformers
@pytest.mark.parametrize("stock_run", ["bert_mlm", "roberta", "modernbert"], indirect=True)  # one a block
def test_sigkill_during_a_checkpoint_then_auto_resume_repeats_the_run(stock_run, data_root, tmp_path):
    """The trainer as its own process from the folder, SIGKILLed while it writes its last
    checkpoint (its files there, its completion marker not), then the same command again:
    it resumes from the step-2 checkpoint and trains steps 3 and 4 to the uninterrupted run's
    losses, bit for bit, and to its final weights. The run is one epoch long (4 steps), the
    reference's --max_steps 4, which a resumed session would count from its restore."""
    reference = read_run(str(stock_run["out"] / "runs" / JOB))[0]["Train/Samples/train_loss"]
    assert [samples for samples, _ in reference] == [16, 32, 48, 64]
    last = complete_tags(str(stock_run["ckpt"]))[-1]
    assert last == "epoch1_step4"
    out = tmp_path / "out"
    args = tiny_argv(data_root, out, "--use_pretrain", "--checkpoint_every_steps", 2, "--print_steps", 1,
                     "--auto_resume", cf=stock_job(tmp_path, stock_run["folder"], num_epochs=1), ds=stock_run["ds"])
    log = tmp_path / "killed.log"
    proc = start_held_before_marker(args, log, last)
    wait_for_line(proc, log, "PAUSED")
    os.killpg(proc.pid, signal.SIGKILL)       # no chance to clean up
    proc.wait()
    ckpt = out / "saved_models" / JOB
    assert complete_tags(str(ckpt)) == ["step2"] and (ckpt / last).is_dir()    # cut short in its last checkpoint
    before = event_files(out)
    again = subprocess.run([sys.executable, os.path.join(REPO, "deepspeed_train.py"), *args], cwd=REPO,
                           env=launch_env(), capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert [row[0] for row in progress(again.stdout + again.stderr)] == [3, 4]
    assert new_event_losses(out, before) == reference[2:]
    assert complete_tags(str(ckpt)) == ["step2", last]
    ours, theirs = (torch.load(str(folder / last / "mp_rank_00_model_states.pt"), weights_only=False)["module"]
                    for folder in (ckpt, stock_run["ckpt"]))
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in theirs)


@needs_transformers
def test_trained_checkpoint_exports_to_its_stock_class_and_fine_tunes(stock_run, tmp_path):
    from tools import export_hf

    kind, export = stock_run["kind"], tmp_path / "hf"
    assert export_hf.main(["--checkpoint_dir", str(stock_run["ckpt"]), "--output_dir", str(export)]) == 0
    config = json.loads((export / "config.json").read_text())
    assert config["architectures"] == ["BertForMaskedLM" if kind == "bert_pretraining" else HF_CLASSES[kind]]
    assert config["vocab_size"] == VOCAB_REAL and "auto_map" not in config
    trained = open_trained(str(export))
    assert trained.architecture == ARCHITECTURE[kind] and trained.config.vocab_size == VOCAB_ROWS
    fine_tune_one_epoch(export, tmp_path)  # one step, its score the dev predictions' accuracy


@pytest.fixture(scope="module")
def headless_bin_run(data_root, tmp_path_factory):
    """4 steps, a checkpoint every 2, from a bare BertModel folder whose weights are only a
    pytorch_model.bin (as domain models such as BioBERT are published), dropout 0.1: stock_run's
    layout, so that the same kill and export tests run on it."""
    root = tmp_path_factory.mktemp("run_headless_bin")
    folder = root / "bert_headless_bin"
    torch.manual_seed(0)
    bare = transformers.BertModel(hf_config("bert_mlm", dropout=0.1))
    bare.save_pretrained(str(folder))   # config.json (transformers of today writes safetensors only) ...
    os.remove(folder / "model.safetensors")
    torch.save(bare.state_dict(), folder / "pytorch_model.bin")   # ... and the weights as older ones did
    lines = open(data_root / "vocab.txt", encoding="utf-8").read().splitlines() + EXTRA
    (folder / "vocab.txt").write_text("\n".join(lines) + "\n")
    cf, ds, out = stock_job(root, folder), ds_config(root / "ds"), root / "out"
    state = train_in_process(data_root, out, ds, "--use_pretrain", "--max_steps", 4, "--checkpoint_every_steps", 2,
                             cf=cf)
    assert state.global_step == 4
    return {"folder": folder, "cf": cf, "ds": ds, "out": out, "ckpt": out / "saved_models" / JOB}


@needs_transformers
def test_a_bare_encoder_as_pytorch_model_bin_kill_resumes_bit_for_bit_and_exports(headless_bin_run, data_root,
                                                                                   tmp_path):
    """The fresh heads a bare encoder gets (MLM transform and bias, NSP) are part of the run's
    state like any weight: SIGKILLed in its last checkpoint and run again, the run repeats the
    uninterrupted losses and weights; the trained model exports to BertForMaskedLM."""
    from tools import export_hf

    test_sigkill_during_a_checkpoint_then_auto_resume_repeats_the_run(headless_bin_run, data_root, tmp_path)
    export = tmp_path / "hf"
    assert export_hf.main(["--checkpoint_dir", str(headless_bin_run["ckpt"]), "--output_dir", str(export)]) == 0
    assert json.loads((export / "config.json").read_text())["architectures"] == ["BertForMaskedLM"]
    assert open_trained(str(export)).architecture == "bert_postln"


@needs_transformers
@pytest.mark.parametrize("job, expected", [
    ({"bert_model_config": {"architecture": "bert_postln", "vocab_size": 99, "hidden_size": 64,
                            "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 128,
                            "max_position_embeddings": 160, "hidden_dropout_prob": 0.1}},
     "bert_model_config differs from {folder}/config.json: attention_probs_dropout_prob 0.1 (the folder's 0.0), "
     "hidden_dropout_prob 0.1 (the folder's 0.0), layer_norm_eps 1e-12 (the folder's 1e-07); leave "
     "bert_model_config out to take the folder's"),
    ({"bert_token_file": "vocab.txt"}, "bert_token_file {data}/vocab.txt is not the tokenizer of {folder}/vocab.txt: "
                                       "vocab size 96 (the folder's 99); leave bert_token_file out to take the folder's"),
])
def test_job_config_values_that_differ_from_the_folder_are_one_error_line(job, expected, folders, data_root,
                                                                          tmp_path, capsys):
    folder = folders["bert_mlm"]
    cf = stock_job(tmp_path, folder, **job.pop("training", {}))
    cf.write_text(json.dumps({**json.loads(cf.read_text()), **job}))
    line = expect_input_error(capsys, train_in_process, data_root, tmp_path / "out", ds_config(tmp_path),
                              "--use_pretrain", cf=cf)
    assert expected.format(folder=folder, data=data_root) in line, line
