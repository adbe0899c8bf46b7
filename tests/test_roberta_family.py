"""The RoBERTa family (turing/arch/roberta/): stock folders built here by transformers from small
configs (random weights, safetensors) of the six classes we import, RobertaForMaskedLM,
XLMRobertaForMaskedLM, CamembertForMaskedLM and their bare encoders, each with its kind of
tokenizer saved by transformers' own tokenizer class: a byte-level BPE tokenizer.json (RoBERTa's,
trained here, with the vocab.json and merges.txt a stock folder has beside it) or a
SentencePiece-style one (XLM-R's and CamemBERT's: a Unigram model over Metaspace pieces, with their
special tokens' ids). Each class opens through turing.pretrained and exports back to the masked-LM
class of its model type with transformers' logits; a bare encoder's head starts fresh, named in one
warning; the fine-tuning head is transformers'. Through the real program, for RoBERTa and XLM-R:
prepare_data with the folder's tokenizer makes `<s> A </s> B </s>` shards on which the first step's
loss is transformers'; a run SIGKILLed in its last checkpoint and run again with --auto_resume
repeats the uninterrupted one (tests/test_stock_models.py's test, called on these runs); the trained
checkpoint exports to its class and fine-tunes a step. What we do not compute is one error line.
Nothing is downloaded."""
import collections
import copy
import functools
import json
import math
import os
from types import SimpleNamespace

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from tests.launch import TINY_CFG, ds_config, expect_input_error, train_in_process, train_losses  # noqa: E402
from tests.test_modernbert import fine_tune_one_epoch  # noqa: E402
from tests.test_stock_models import (close, needs_transformers, padded_batch, record_first_batch,  # noqa: E402
                                     stock_job, test_sigkill_during_a_checkpoint_then_auto_resume_repeats_the_run
                                     as sigkill_then_auto_resume, unpad_and_checkpointing_match)
from tests.test_stock_tokenizers import (corpus_documents, in_text, job_for, nvidia_pairs, prepare,  # noqa: E402
                                         write_corpus)
from turing.arch import ARCHITECTURES, hf_spec, model_config_from_dict  # noqa: E402
from turing.arch.hf_common import PADDED_ROW_BIAS  # noqa: E402
from turing.arch.roberta.model import RobertaForPreTraining  # noqa: E402
from turing.errors import InputValueError  # noqa: E402
from turing.glue import sequence_classifier  # noqa: E402
from turing.model_options import ModelOptions  # noqa: E402
from turing.modeling import BertConfigError  # noqa: E402
from turing.pretrained import open_trained  # noqa: E402
from turing.tokenization import file_digest, load_tokenizer, vocab_size_padded  # noqa: E402

try:  # only the tests that build stock folders need them (needs_transformers)
    import transformers
    from safetensors.torch import load_file, save_file
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
except ImportError:
    transformers = None

FAMILIES = ("roberta", "xlm-roberta", "camembert")   # the model types
MASKED = {"roberta": "RobertaForMaskedLM", "xlm-roberta": "XLMRobertaForMaskedLM",
          "camembert": "CamembertForMaskedLM"}
BARE = {"roberta": "RobertaModel", "xlm-roberta": "XLMRobertaModel", "camembert": "CamembertModel"}
CONFIGS = {"roberta": "RobertaConfig", "xlm-roberta": "XLMRobertaConfig", "camembert": "CamembertConfig"}
SLOW = ("roberta", "xlm-roberta")   # through the program: a byte-level and a SentencePiece-style tokenizer
PAD = 1                             # <pad>, as in every model of the family
TABLE = 130                         # transformers' max_position_embeddings: 128 positions after pad_token_id 1
HEAD = ("cls.predictions.transform.dense.weight", "cls.predictions.transform.dense.bias",
        "cls.predictions.transform.LayerNorm.weight", "cls.predictions.transform.LayerNorm.bias")
DOCUMENTS = corpus_documents()   # sentences of the words w0..w90
TEXTS = [sentence for document in DOCUMENTS for sentence in document]


@functools.lru_cache(maxsize=None)
def family_tokenizer(family):
    """The family's kind of tokenizer, as its transformers class builds it (one per family and test
    session, so every folder of a family has the same file). RoBERTa: a byte-level BPE of 300 ids
    trained on TEXTS, <s> <pad> </s> <unk> <mask> as ids 0-4. XLM-R and CamemBERT: a Unigram model
    over Metaspace pieces (what transformers converts their sentencepiece models to), each piece's
    score its log frequency in TEXTS, whole words above their characters; XLM-R's <s> <pad> </s>
    <unk> first and <mask> last, CamemBERT's <s>NOTUSED <pad> </s>NOTUSED <unk> <unk>NOTUSED <s> </s>
    first and <mask> last."""
    if family == "roberta":
        bpe = Tokenizer(models.BPE())
        bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        bpe.train_from_iterator(TEXTS, trainers.BpeTrainer(
            vocab_size=300, special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
        model = json.loads(bpe.to_str())["model"]
        return transformers.RobertaTokenizer(vocab=model["vocab"], merges=[tuple(m) for m in model["merges"]])
    words = collections.Counter(w for text in TEXTS for w in text.split())
    chars = collections.Counter(c for w in words.elements() for c in w)
    pieces = [("▁" + w, math.log(n / words.total())) for w, n in sorted(words.items())]
    pieces += [("▁", -20.0)] + [(c, math.log(n / chars.total()) - 20.0) for c, n in sorted(chars.items())]
    if family == "xlm-roberta":
        return transformers.XLMRobertaTokenizer(vocab=[(t, 0.0) for t in ("<s>", "<pad>", "</s>", "<unk>")]
                                                + pieces + [("<mask>", 0.0)])
    first = [("<s>NOTUSED", 0.0), ("<pad>", 0.0), ("</s>NOTUSED", 0.0), ("<unk>", 0.0), ("<unk>NOTUSED", -100.0),
             ("<s>", 0.0), ("</s>", 0.0)]
    return transformers.CamembertTokenizer(vocab=first + pieces + [("<mask>", 0.0)])


def save_tokenizer(family, folder):
    tokenizer = family_tokenizer(family)
    tokenizer.save_pretrained(str(folder))
    if family == "roberta":   # a stock RoBERTa folder's slow-format files too, beside its tokenizer.json
        model = json.loads((folder / "tokenizer.json").read_text())["model"]
        (folder / "vocab.json").write_text(json.dumps(model["vocab"]))
        (folder / "merges.txt").write_text("#version: 0.2\n" + "\n".join(" ".join(m) for m in model["merges"]) + "\n")
    return tokenizer


def stock_folder(family, class_name, folder, dropout=0.0, seed=0):
    """A stock folder of transformers' `class_name` (of `family`) with the family's tokenizer
    (config.json's vocab_size its ids, pad/bos/eos its own), random weights with every bias and
    norm moved off its init; returns the model, eval mode."""
    tokenizer = save_tokenizer(family, folder)
    config = getattr(transformers, CONFIGS[family])(
        vocab_size=len(tokenizer), hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
        max_position_embeddings=TABLE, type_vocab_size=1, layer_norm_eps=1e-5, pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, hidden_dropout_prob=dropout,
        attention_probs_dropout_prob=dropout)
    assert config.pad_token_id == PAD
    torch.manual_seed(seed)
    model = getattr(transformers, class_name)(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "bias" in name or "norm" in name.lower():
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(str(folder), safe_serialization=True)
    return model.eval()


def roberta_batch(**sizes):
    """padded_batch with RoBERTa's padding: <pad> after each row's real tokens (ids 5..98)."""
    batch = padded_batch(**sizes)
    return batch._replace(input_ids=batch.input_ids.masked_fill(batch.input_mask == 0, PAD))


# ---------------------------------------------------------------------------------------------
# Import and export, without training


@needs_transformers
@pytest.mark.parametrize("family", FAMILIES)
def test_a_masked_lm_folder_exports_back_to_its_class_with_its_tensors_and_logits(family, tmp_path):
    from tools.export_hf import hf_model_of

    folder = tmp_path / family
    stock = stock_folder(family, MASKED[family], folder)
    vocab = stock.config.vocab_size
    trained = open_trained(str(folder))
    assert (trained.kind, trained.architecture, trained.config.model_type) == ("export", "roberta", family)
    assert trained.config.vocab_size == vocab_size_padded(vocab) > vocab and trained.vocab_ids == vocab
    assert trained.vocab_file == str(folder / "tokenizer.json") and not trained.nsp_head
    assert trained.config.max_position_embeddings == TABLE - PAD - 1 and trained.config.layer_norm_eps == 1e-5
    ours = trained.build().eval()
    state = ours.state_dict()
    assert tuple(state["bert.embeddings.position_embeddings.weight"].shape) == (TABLE, 64)   # the table, whole
    assert state["bert.embeddings.word_embeddings.weight"][vocab:].abs().sum() == 0
    assert (state["cls.predictions.bias"][vocab:] == PADDED_ROW_BIAS).all()

    hf, name, _ = hf_model_of(state, trained.config, vocab, trained.require_tokenizer().special)
    assert name == MASKED[family]
    theirs = stock.state_dict()   # the round trip gives transformers' tensors back, bit for bit
    assert hf.state_dict().keys() == theirs.keys() and all(torch.equal(hf.state_dict()[k], theirs[k]) for k in theirs)
    hf.save_pretrained(str(tmp_path / "export"), safe_serialization=True)
    exported = transformers.AutoModelForMaskedLM.from_pretrained(str(tmp_path / "export")).eval()
    assert type(exported).__name__ == MASKED[family] and exported.config.model_type == family

    batch = roberta_batch()
    real = batch.input_mask.bool()
    with torch.no_grad():
        expected = stock(input_ids=batch.input_ids, attention_mask=batch.input_mask).logits
        again = exported(input_ids=batch.input_ids, attention_mask=batch.input_mask).logits
        scores, nsp = ours.predict(batch.input_ids, batch.segment_ids, batch.input_mask)
    (diff, ok), (ours_diff, ours_ok) = close(again[real], expected[real]), close(scores[..., :vocab][real],
                                                                                expected[real])
    print(f"\n{MASKED[family]}: max |logit diff| at real positions: ours vs transformers {ours_diff:.3g}, "
          f"export vs stock {diff:.3g} (logits up to {expected[real].abs().max().item():.3g})")
    assert ok and ours_ok and nsp is None, (diff, ours_diff)


@needs_transformers
@pytest.mark.parametrize("family, prefixed", [("roberta", False), ("xlm-roberta", True), ("camembert", False)])
def test_a_bare_encoder_opens_with_a_fresh_head_named_in_one_warning(family, prefixed, tmp_path, caplog):
    """The bare class (its pooler too, as save_pretrained writes it; with `prefixed` its keys under
    `roberta.`, as saved from inside a masked-LM class): the encoder is the folder's (our final hidden
    states are transformers' last_hidden_state), the masked-LM head is created as transformers
    creates it, one warning names the fresh tensors, and the export is the family's masked-LM class."""
    from tools.export_hf import hf_model_of

    folder = tmp_path / family
    bare = stock_folder(family, BARE[family], folder)
    if prefixed:
        tensors = load_file(str(folder / "model.safetensors"))
        save_file({"roberta." + k: v for k, v in tensors.items()}, str(folder / "model.safetensors"))
    trained = open_trained(str(folder))
    with caplog.at_level("WARNING", logger="turing.pretrained"):
        ours = trained.build().eval()
    fresh = [r.getMessage() for r in caplog.records if "start fresh" in r.getMessage()]
    assert len(fresh) == 1 and all(k in fresh[0] for k in HEAD) and str(folder) in fresh[0], fresh
    batch = roberta_batch()
    real = batch.input_mask.bool()
    with torch.no_grad():
        expected = bare(input_ids=batch.input_ids, attention_mask=batch.input_mask).last_hidden_state
        hidden = ours.encode(batch.input_ids, batch.segment_ids, batch.input_mask)
    diff, ok = close(hidden[real], expected[real])
    print(f"\n{BARE[family]}: max |hidden state diff| at real positions {diff:.3g}")
    assert ok, diff
    state, vocab = ours.state_dict(), bare.config.vocab_size
    bias = state["cls.predictions.bias"]   # zero (transformers' fresh head), PADDED_ROW_BIAS on our padding rows
    assert (bias[:vocab] == 0).all() and (bias[vocab:] == PADDED_ROW_BIAS).all()
    assert ours.cls.predictions.decoder.weight is ours.bert.embeddings.word_embeddings.weight   # tied
    hf, name, _ = hf_model_of(state, trained.config, trained.vocab_ids, trained.require_tokenizer().special)
    assert name == MASKED[family] and all(torch.equal(hf.roberta.state_dict()[k], v)
                                          for k, v in bare.state_dict().items() if not k.startswith("pooler."))


@needs_transformers
def test_the_fine_tuning_head_is_transformers_roberta_classification_head(tmp_path):
    folder = tmp_path / "roberta"
    stock = stock_folder("roberta", MASKED["roberta"], folder)
    trained = open_trained(str(folder))
    torch.manual_seed(0)
    ours = sequence_classifier(trained.build(), trained.config, 3).eval()
    head = ours.classifier
    assert all((p == 0).all() for p in (head.dense.bias, head.out_proj.bias))   # transformers' init
    assert all(0.015 < p.std().item() < 0.025 for p in (head.dense.weight, head.out_proj.weight))
    config = copy.deepcopy(stock.config)
    config.num_labels = 3
    theirs = transformers.RobertaForSequenceClassification(config).eval()
    theirs.roberta.load_state_dict(stock.roberta.state_dict())
    theirs.classifier.load_state_dict(head.state_dict())   # its names are transformers'
    batch = roberta_batch()
    with torch.no_grad():
        logits = ours(batch.input_ids, batch.input_mask, batch.segment_ids)
        assert torch.equal(logits, ours(batch.input_ids, batch.input_mask, torch.zeros_like(batch.segment_ids)))
        expected = theirs(input_ids=batch.input_ids, attention_mask=batch.input_mask).logits
    assert close(logits, expected)[1], close(logits, expected)[0]


def test_xlm_r_sized_configs_pad_the_vocab_and_keep_the_position_table():
    """xlm-roberta-base's config.json: 250002 ids (250008 rows), 514 table rows (512 positions)."""
    spec = hf_spec("xlm-roberta", "xlm-roberta-base")
    config = spec.hf.config_from_hf({
        "architectures": ["XLMRobertaForMaskedLM"], "model_type": "xlm-roberta", "vocab_size": 250002,
        "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072,
        "max_position_embeddings": 514, "type_vocab_size": 1, "layer_norm_eps": 1e-05, "pad_token_id": 1,
        "bos_token_id": 0, "eos_token_id": 2, "hidden_act": "gelu"})
    assert spec.name == "roberta" and (config.vocab_size, config.max_position_embeddings) == (250008, 512)
    assert model_config_from_dict({"architecture": "roberta", **config.to_dict()}).to_dict() == config.to_dict()


# ---------------------------------------------------------------------------------------------
# The block's options


def small_roberta(**overrides):
    values = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=48,
                  max_position_embeddings=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return model_config_from_dict({"architecture": "roberta", "vocab_size": 104, **values, **overrides})


def test_unpad_and_checkpoint_activations_give_the_padded_loss_and_grads():
    unpad_and_checkpointing_match(RobertaForPreTraining, small_roberta(), roberta_batch(length=64, rows=(40, 30, 17, 9)))


@pytest.mark.parametrize("flag", ["progressive_layer_drop", "deepspeed_transformer_kernel",
                                  "deepspeed_sparse_attention"])
def test_what_the_post_ln_block_refuses_and_the_nsp_term_are_refused(flag):
    with pytest.raises(ValueError, match=f"--{flag} does not apply to bert_model_config.architecture 'roberta'"):
        RobertaForPreTraining(small_roberta(), SimpleNamespace(**{flag: True}))
    with pytest.raises(ValueError, match="'roberta' has no next-sentence head"):
        ModelOptions(next_sentence_prediction=True).for_block(RobertaForPreTraining)
    assert ARCHITECTURES["roberta"].nsp_head is False


@pytest.mark.parametrize("overrides, expected", [
    ({"type_vocab_size": 2}, "type_vocab_size must be 1, got 2: RoBERTa models have one token type"),
    ({"model_type": "deberta"}, "model_type must be one of roberta, xlm-roberta, camembert, got 'deberta'"),
    ({"pad_token_id": 104}, "pad_token_id must be an id of the vocab (0 to 103), got 104"),
    ({"layer_norm_eps": 0}, "bert_model_config (architecture roberta): layer_norm_eps must be a finite number > 0"),
])
def test_a_bert_model_config_the_block_cannot_build_is_one_error_line(overrides, expected):
    with pytest.raises(BertConfigError) as error:
        small_roberta(**overrides)
    assert expected in str(error.value) and "\n" not in str(error.value), str(error.value)


def test_a_sequence_longer_than_the_positions_is_one_error_line():
    model = RobertaForPreTraining(small_roberta(max_position_embeddings=8)).eval()
    ids = torch.full((1, 9), 5)
    with pytest.raises(InputValueError, match=r"^sequence length 9 exceeds max_position_embeddings 8 \(the position "
                                              r"table's rows after pad_token_id 1\)$"):
        model.predict(ids, torch.zeros_like(ids), torch.ones_like(ids))


# ---------------------------------------------------------------------------------------------
# What we do not compute, and folders that do not fit their config: one error line


def _edit(folder, change):
    config = json.loads((folder / "config.json").read_text())
    config.update(change)
    (folder / "config.json").write_text(json.dumps(config))


def _drop_tensor(folder, key):
    tensors = load_file(str(folder / "model.safetensors"))
    del tensors[key]
    save_file(tensors, str(folder / "model.safetensors"))


@pytest.fixture(scope="module")
def xlmr_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("xlmr_stock")
    stock_folder("xlm-roberta", MASKED["xlm-roberta"], folder)
    return folder


@needs_transformers
@pytest.mark.parametrize("change, expected", [
    ({"model_type": "xlm-roberta-xl"}, "config.json model_type 'xlm-roberta-xl' is not one this project imports: "),
    ({"type_vocab_size": 2}, "Hugging Face config: type_vocab_size 2; the xlm-roberta block imported has one token "
                             "type (RoBERTa's tokenizers give no token type ids)"),
    ({"architectures": ["XLMRobertaForCausalLM"]}, "the xlm-roberta classes imported are XLMRobertaForMaskedLM, "
                                                   "XLMRobertaModel"),
    ({"hidden_act": "gelu_new"}, "hidden_act 'gelu_new' is not one this block computes"),
    ({"intermediate_size": 96}, "shapes differ from bert_model_config and the vocab: "
                                "bert.encoder.layer.0.output.dense.weight (64, 128) (model (64, 96))"),
    ("roberta.encoder.layer.1.output.dense.weight", "Hugging Face state dict: keys do not match (missing: "
                                                    "roberta.encoder.layer.1.output.dense.weight; unexpected: none)"),
], ids=["model_type", "type_vocab_size", "class", "hidden_act", "shape", "missing_tensor"])
def test_what_we_do_not_compute_is_one_error_line(change, expected, xlmr_folder, tmp_path):
    folder = tmp_path / "edited"
    folder.mkdir()
    for name in os.listdir(xlmr_folder):
        (folder / name).write_bytes((xlmr_folder / name).read_bytes())
    if isinstance(change, dict):
        _edit(folder, change)
    else:
        _drop_tensor(folder, change)
    with pytest.raises(InputValueError) as error:
        open_trained(str(folder)).build()
    assert expected in str(error.value) and "\n" not in str(error.value), str(error.value)


@needs_transformers
def test_the_trainer_refuses_a_folder_with_two_token_types_in_one_line(xlmr_folder, data_root, tmp_path, capsys):
    folder = tmp_path / "two_types"
    folder.mkdir()
    for name in os.listdir(xlmr_folder):
        (folder / name).write_bytes((xlmr_folder / name).read_bytes())
    _edit(folder, {"type_vocab_size": 2})
    line = expect_input_error(capsys, train_in_process, data_root, tmp_path / "out", ds_config(tmp_path),
                              "--use_pretrain", cf=stock_job(tmp_path, folder))
    assert "type_vocab_size 2; the xlm-roberta block imported has one token type" in line, line


def test_a_from_scratch_run_whose_tokenizer_pads_with_another_id_is_refused_before_training(data_root, tmp_path,
                                                                                              capsys):
    """A roberta job config with a WordPiece vocab ([PAD] is id 0) and RoBERTa's default
    pad_token_id 1 would train, then be refused at export: it is refused at the start, in one line."""
    job = json.loads(open(TINY_CFG, encoding="utf-8").read())
    job["bert_model_config"] = {**job["bert_model_config"], "architecture": "roberta", "type_vocab_size": 1}
    (tmp_path / "roberta.json").write_text(json.dumps(job))
    line = expect_input_error(capsys, train_in_process, data_root, tmp_path / "out", ds_config(tmp_path),
                              cf=str(tmp_path / "roberta.json"))
    assert "the tokenizer's pad id is 0, bert_model_config's pad_token_id 1" in line and "set to 0" in line, line
    assert not list((tmp_path / "out" / "saved_models" / "tiny_bert").iterdir())   # no checkpoint, no args.json


def test_an_export_whose_tokenizer_pads_with_another_id_is_one_error_line():
    """transformers numbers a RoBERTa's positions from the pad id in its input: the tokenizer's pad
    must be the pad_token_id the model was trained with."""
    config = small_roberta()
    model = RobertaForPreTraining(config)
    with pytest.raises(InputValueError) as error:
        ARCHITECTURES["roberta"].hf.to_hf(model.state_dict(), config, 100, {"pad": 0, "cls": 2, "sep": 3})
    assert str(error.value).startswith("the tokenizer's pad id is 0, bert_model_config's pad_token_id 1: ")
    assert "\n" not in str(error.value)


# ---------------------------------------------------------------------------------------------
# Through the program: the folder's tokenizer, the first step, a resume, the export


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """The slow families' masked-LM folders without dropout (a training step is transformers' forward)."""
    root = tmp_path_factory.mktemp("family")
    return {family: (root / family, stock_folder(family, MASKED[family], root / family)) for family in SLOW}


@pytest.fixture(scope="module")
def prepared(folders, tmp_path_factory):
    """prepare_data's NVIDIA shards of TEXTS' documents, made with each slow family's folder as --tokenizer."""
    root = tmp_path_factory.mktemp("family_prepared")
    corpus = write_corpus(root / "corpus.txt", DOCUMENTS)
    for family in SLOW:
        prepare(corpus, root / f"{family}_nvidia", folders[family][0])
    return root


@needs_transformers
@pytest.mark.parametrize("family", SLOW)
def test_prepared_pairs_are_cls_a_sep_b_sep_of_the_folders_tokenizer(family, folders, prepared):
    folder = folders[family][0]
    tokenizer, out = load_tokenizer(folder), prepared / f"{family}_nvidia"
    special = tokenizer.special
    assert special == {"pad": 1, "unk": 3, "cls": 0, "sep": 2, "mask": 4 if family == "roberta" else
                       tokenizer.vocab_size - 1}
    rows = 0
    for name in sorted(os.listdir(out / "train")):
        for cls, a, sep_a, b, sep_b, _ in nvidia_pairs(out / "train" / name):
            assert (cls, sep_a, sep_b) == (special["cls"], special["sep"], special["sep"])   # <s> A </s> B </s>
            assert all(in_text(tokenizer.decode(ids), [" ".join(d) for d in DOCUMENTS]) for ids in (a, b))
            rows += 1
    assert rows > 48
    record = json.loads((out / "tokenizer_record.json").read_text())
    assert record["sha256"] == file_digest(folder / "tokenizer.json") and record["kind"] == "tokenizer.json"


@pytest.fixture(scope="module", params=SLOW)
def first_step(request, folders, prepared, tmp_path_factory):
    """One step from the family's folder on the shards of its tokenizer: the batch the model saw and its loss."""
    family = request.param
    root = tmp_path_factory.mktemp(f"first_{family}")
    recording, seen = record_first_batch(RobertaForPreTraining)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(RobertaForPreTraining, "forward", recording)
        train_in_process(prepared, root / "out", ds_config(root / "ds"), "--use_pretrain", "--max_steps", 1,
                         "--validation_data_path_prefix", prepared,
                         cf=job_for(root, folders[family][0], f"{family}_nvidia"))
    assert len(seen) == 1
    return {"family": family, "out": root / "out", "batch": seen[0][0], "loss": seen[0][1]}


@needs_transformers
def test_first_step_loss_is_transformers_masked_lm_loss_on_that_batch(first_step, folders):
    family, loss = first_step["family"], first_step["loss"]
    _, ids, mask, _, _, labels = first_step["batch"]
    ids = ids.masked_fill(mask == 0, PAD)   # as transformers' tokenizers pad (the shards pad with 0)
    # a <pad> inside a sequence (an MLM replacement may draw it) is numbered by its index here, skipped there
    assert not (ids[mask.bool()] == PAD).any()
    stock = folders[family][1]
    with torch.no_grad():
        logits = stock(input_ids=ids, attention_mask=mask).logits
    masked = labels != -1
    expected = F.cross_entropy(logits[masked], labels[masked]).item()
    print(f"\n{MASKED[family]}: first-step loss {loss:.7f}, transformers' {expected:.7f}, "
          f"difference {abs(loss - expected):.3g}")
    assert abs(loss - expected) <= 1e-5 * max(1.0, expected)
    assert train_losses(first_step["out"]) == [pytest.approx(loss, abs=1e-6)]


@pytest.fixture(scope="module", params=SLOW)
def family_run(request, data_root, tmp_path_factory):
    """4 steps (one epoch of the tiny NVIDIA shards, which record no tokenizer) from the family's folder
    with dropout 0.1, a checkpoint every 2 steps: tests/test_stock_models.py's stock_run."""
    family = request.param
    root = tmp_path_factory.mktemp(f"run_{family}")
    folder = root / family
    stock_folder(family, MASKED[family], folder, dropout=0.1)
    cf, ds, out = stock_job(root, folder), ds_config(root / "ds"), root / "out"
    state = train_in_process(data_root, out, ds, "--use_pretrain", "--max_steps", 4, "--checkpoint_every_steps", 2,
                             cf=cf)
    assert state.global_step == 4
    return {"kind": family, "folder": folder, "cf": cf, "ds": ds, "out": out,
            "ckpt": out / "saved_models" / "tiny_bert"}


@needs_transformers
def test_sigkill_during_a_checkpoint_then_auto_resume_repeats_the_run(family_run, data_root, tmp_path):
    job_config = json.loads((family_run["ckpt"] / "step2" / "job_config.json").read_text())
    assert job_config["bert_model_config"]["architecture"] == "roberta"
    assert job_config["bert_model_config"]["model_type"] == family_run["kind"]   # from config.json
    assert job_config["bert_token_file"] == str(family_run["folder"] / "tokenizer.json")
    sigkill_then_auto_resume(family_run, data_root, tmp_path)


@needs_transformers
def test_the_trained_checkpoint_exports_to_its_class_and_fine_tunes(family_run, tmp_path):
    from tools import export_hf

    family, export = family_run["kind"], tmp_path / "hf"
    assert export_hf.main(["--checkpoint_dir", str(family_run["ckpt"]), "--output_dir", str(export)]) == 0
    config = json.loads((export / "config.json").read_text())
    stock = json.loads((family_run["folder"] / "config.json").read_text())
    assert config["architectures"] == [MASKED[family]] and config["model_type"] == family and "auto_map" not in config
    assert {k: config[k] for k in ("vocab_size", "max_position_embeddings", "pad_token_id", "type_vocab_size",
                                   "layer_norm_eps", "bos_token_id", "eos_token_id")} == \
        {k: stock[k] for k in ("vocab_size", "max_position_embeddings", "pad_token_id", "type_vocab_size",
                               "layer_norm_eps", "bos_token_id", "eos_token_id")}
    assert type(transformers.AutoModelForMaskedLM.from_pretrained(str(export))).__name__ == MASKED[family]
    theirs, original = (transformers.AutoTokenizer.from_pretrained(str(path))
                        for path in (export, family_run["folder"]))
    assert theirs("w3 w1 w7")["input_ids"] == original("w3 w1 w7")["input_ids"] and theirs.mask_token == "<mask>"
    fine_tune_one_epoch(export, tmp_path)   # one step, its score the dev predictions' accuracy
