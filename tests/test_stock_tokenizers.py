"""The model's own tokenizer through the data tools and the trainer, for each stock class we import:
BertForMaskedLM and RobertaPreLayerNormForMaskedLM with a WordPiece vocab.txt, ModernBertForMaskedLM
with only a byte-level BPE tokenizer.json (trained here, its special tokens named by the
tokenizer_config.json transformers writes, its config.json's vocab_size padded past its ids).
prepare_data with the folder as --tokenizer gives shards whose token ids decode back to the text
and that record the tokenizer; eval_mlm's pseudo-log-likelihood of a sentence is the one computed
directly with transformers and its own tokenizer; the real entry point trains from the folder on
those shards (both formats), refuses shards made with another tokenizer in one line, and trains
NVIDIA shards that record none as before. Nothing is downloaded."""
import json
import os
import random

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import h5py  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from tests.launch import REPO, TINY_CFG, ds_config, expect_input_error, train_in_process, train_losses  # noqa: E402
from tests.test_modernbert import fine_tune_one_epoch  # noqa: E402
from tests.test_stock_models import needs_transformers, stock_folder, stock_model, stock_weights  # noqa: E402
from tools import eval_mlm, export_hf, make_minimal_pairs, prepare_data  # noqa: E402
from turing.dataset import BingShard  # noqa: E402
from turing.errors import InputValueError  # noqa: E402
from turing.pretrained import open_trained  # noqa: E402
from turing.shard_tokenizer import record_name  # noqa: E402
from turing.tokenization import JsonTokenizer, file_digest, load_tokenizer  # noqa: E402

try:
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
except ImportError:
    transformers = None

KINDS = ("bert_mlm", "roberta", "modernbert")
FILE = {"bert_mlm": "vocab.txt", "roberta": "vocab.txt", "modernbert": "tokenizer.json"}
MODERN_ROWS = 320          # the ModernBERT folder's config.json vocab_size: rows past its tokenizer's ids
SENTENCE = "w3 w1 w1 w7 w2 w15 w4 w4 w9"


def corpus_documents(count=90, seed=0):
    """Documents of sentences of the data vocab's words (w0..w90, Zipf-like), all in every tokenizer."""
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(91)]
    weights = [1 / (i + 1) for i in range(91)]
    return [[" ".join(rng.choices(words, weights, k=rng.randint(4, 14))) for _ in range(rng.randint(3, 8))]
            for _ in range(count)]


def write_corpus(path, documents):
    path.write_text("\n\n".join("\n".join(doc) for doc in documents) + "\n")
    return path


def byte_level_folder(folder, texts, size=300, specials=("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"), **names):
    """A byte-level BPE tokenizer.json (ModernBERT's kind, with its [CLS] $A [SEP] template) saved by
    transformers' PreTrainedTokenizerFast beside the model, which names its special tokens in
    tokenizer_config.json (`names`: role -> token, default the five BERT ones)."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=size, special_tokens=list(specials),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(texts, trainer)
    names = names or dict(zip(("pad", "unk", "cls", "sep", "mask"), specials))
    cls, sep = names["cls"], names["sep"]
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{cls} $A {sep}", pair=f"{cls} $A {sep} $B:1 {sep}:1",
        special_tokens=[(cls, tokenizer.token_to_id(cls)), (sep, tokenizer.token_to_id(sep))])
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, **{f"{r}_token": t for r, t in names.items()})
    fast.save_pretrained(str(folder))
    return tokenizer


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    documents = corpus_documents()
    return {"documents": documents, "path": write_corpus(root / "corpus.txt", documents),
            "texts": [" ".join(doc) for doc in documents]}


@pytest.fixture(scope="module")
def folders(data_root, corpus, tmp_path_factory):
    """Each kind's stock folder: the data's vocab.txt for BERT and RoBERTa-PreLN, a BPE tokenizer.json
    only for ModernBERT (pad 0, cls 2, sep 3, as its config.json says)."""
    root = tmp_path_factory.mktemp("stock_tok")
    made = {kind: stock_folder(kind, root / kind, data_root / "vocab.txt") for kind in ("bert_mlm", "roberta")}
    modern = stock_weights("modernbert", root / "modernbert", vocab_size=MODERN_ROWS)
    byte_level_folder(modern, [s for doc in corpus["documents"] for s in doc])
    assert sorted(os.listdir(modern)) == ["config.json", "model.safetensors", "tokenizer.json",
                                          "tokenizer_config.json"]
    made["modernbert"] = modern
    return made


def prepare(corpus_path, out, tokenizer, fmt="nvidia", *extra):
    assert prepare_data.main(["--input", str(corpus_path), "--output_dir", str(out), "--tokenizer", str(tokenizer),
                              "--format", fmt, "--max_seq_length", "128", "--dupe_factor", "2",
                              "--validation_fraction", "0.1", *map(str, extra)]) == 0
    return out


@pytest.fixture(scope="module")
def prepared(folders, corpus, tmp_path_factory):
    """Each kind's corpus as NVIDIA shards made with its folder's tokenizer (the folder as --tokenizer),
    and the ModernBERT one as Bing shards too, under one data root."""
    root = tmp_path_factory.mktemp("prepared")
    for kind in KINDS:
        prepare(corpus["path"], root / f"{kind}_nvidia", folders[kind])
    prepare(corpus["path"], root / "modernbert_bing", folders["modernbert"], "bing")
    return root


# ---------------------------------------------------------------------------------------------
# The tokenizer: its special tokens from the tokenizer, never a fixed list


@needs_transformers
def test_a_roberta_style_tokenizer_json_gives_its_own_special_tokens(corpus, tmp_path):
    folder = tmp_path / "roberta_style"
    specials = ("<s>", "<pad>", "</s>", "<unk>", "<mask>")   # RoBERTa's ids 0..3, <mask> last of the specials
    names = {"pad": "<pad>", "unk": "<unk>", "cls": "<s>", "sep": "</s>", "mask": "<mask>"}
    byte_level_folder(folder, corpus["texts"], specials=specials, **names)
    tokenizer = load_tokenizer(folder)
    assert isinstance(tokenizer, JsonTokenizer) and tokenizer.path == str(folder / "tokenizer.json")
    assert tokenizer.special == {"pad": 1, "unk": 3, "cls": 0, "sep": 2, "mask": 4}
    assert tokenizer.special_tokens == names and tokenizer.digest == file_digest(folder / "tokenizer.json")
    # the ids of a sentence after another one keep the space before it, as in running text
    first, later = tokenizer.encode_batch(["w1 w2"]), tokenizer.encode_batch(["w1 w2"], after_space=True)
    assert tokenizer.decode(first[0]) == "w1 w2" and tokenizer.decode(later[0]) == " w1 w2"
    # without the file naming them, cls and sep still come from the post-processor; the rest is one line
    (folder / "tokenizer_config.json").unlink()
    with pytest.raises(InputValueError) as error:
        load_tokenizer(folder)
    assert str(error.value).startswith(f"{folder / 'tokenizer.json'}: names no pad, unk, mask token; ")
    (folder / "special_tokens_map.json").write_text(json.dumps({"pad_token": "<pad>", "unk_token": "<unk>",
                                                                "mask_token": {"content": "<mask>"}}))
    assert load_tokenizer(folder).special == {"pad": 1, "unk": 3, "cls": 0, "sep": 2, "mask": 4}
    (folder / "special_tokens_map.json").write_text(json.dumps({"pad_token": "<pad>", "unk_token": "<unk>",
                                                                "mask_token": "[MASK]"}))
    with pytest.raises(InputValueError, match=r"its mask token '\[MASK\]' \(special_tokens_map.json\) is not in its "
                                              r"vocab$"):
        load_tokenizer(folder)


@needs_transformers
def test_a_token_the_format_cannot_store_is_one_error_line(folders, corpus, tmp_path, capsys):
    """A Bing shard separates token strings by byte 0x1f: a tokenizer with a token holding it is
    refused for that layout, naming the one that stores it."""
    folder = tmp_path / "with_separator"
    folder.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (folder / name).write_bytes((folders["modernbert"] / name).read_bytes())
    spec = json.loads((folder / "tokenizer.json").read_text())
    spec["model"]["vocab"]["a\x1fb"] = max(spec["model"]["vocab"].values()) + 1
    (folder / "tokenizer.json").write_text(json.dumps(spec))
    argv = ["--input", str(corpus["path"]), "--output_dir", str(tmp_path / "out"), "--tokenizer", str(folder),
            "--format", "bing", "--max_seq_length", "128"]
    assert prepare_data.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"error: --tokenizer {folder / 'tokenizer.json'}: token 'a\\x1fb' holds the separator byte 0x1f; "
                   "use --bing_layout offsets"), err
    assert prepare_data.main(argv + ["--bing_layout", "offsets"]) == 0


# ---------------------------------------------------------------------------------------------
# prepare_data with the folder's tokenizer


def nvidia_pairs(path):
    """(ids of A, ids of B, next-sentence label) of every sequence of an NVIDIA shard, masks undone."""
    with h5py.File(path, "r") as f:
        ids, mask, segments = (np.asarray(f[k]) for k in ("input_ids", "input_mask", "segment_ids"))
        positions, labels, nsp = (np.asarray(f[k]) for k in ("masked_lm_positions", "masked_lm_ids",
                                                            "next_sentence_labels"))
    for row in range(len(ids)):
        seq = ids[row].copy()
        real = positions[row] > 0
        seq[positions[row][real]] = labels[row][real]
        n = int(mask[row].sum())
        a_end = int(np.argmax(segments[row][:n])) - 1     # [CLS] A [SEP] | B [SEP]
        yield seq[0], seq[1:a_end].tolist(), seq[a_end], seq[a_end + 1:n - 1].tolist(), seq[n - 1], int(nsp[row])


def in_text(decoded, texts):
    return any(decoded.strip() in text for text in texts) and decoded.strip()


@needs_transformers
@pytest.mark.parametrize("kind", KINDS)
def test_prepared_shards_decode_back_to_the_text_and_record_the_tokenizer(kind, folders, prepared, corpus):
    out = prepared / f"{kind}_nvidia"
    tokenizer = load_tokenizer(folders[kind])
    texts, special = corpus["texts"], tokenizer.special
    rows = 0
    for name in sorted(os.listdir(out / "train")):
        for cls, a, sep_a, b, sep_b, _ in nvidia_pairs(out / "train" / name):
            assert (cls, sep_a, sep_b) == (special["cls"], special["sep"], special["sep"])
            # each segment is a run of the text (A and B are cut at either end to fit, so A + B need not be)
            parts = [a, b]
            assert all(in_text(tokenizer.decode(ids), texts) for ids in parts), [tokenizer.decode(p) for p in parts]
            rows += 1
    assert rows > 48
    # the shards record the tokenizer that made them, and the output holds a copy that opens to it
    record = json.loads((out / record_name()).read_text())
    assert record["sha256"] == file_digest(folders[kind] / FILE[kind]) and record["name"] == str(folders[kind])
    assert record["kind"] == FILE[kind] and record["special_tokens"]["mask"] == [tokenizer.special_tokens["mask"],
                                                                                 special["mask"]]
    assert json.loads((out / "stats.json").read_text())["tokenizer"] == record
    copy = load_tokenizer(out)
    assert (copy.digest, copy.special) == (tokenizer.digest, special)


@needs_transformers
def test_bing_shards_of_a_byte_level_tokenizer_decode_back_to_the_text(folders, prepared, corpus):
    """The Bing format stores token strings ("Ġw12"): they map back to the tokenizer's ids."""
    tokenizer = load_tokenizer(folders["modernbert"])
    shard = BingShard(str(prepared / "modernbert_bing" / "train" / "shard_000"))
    assert len(shard) > 48 and any("Ġ" in t for t in shard.instance_tokens(0))
    for i in range(len(shard)):
        a, b, _ = shard.instance(i)
        ids = [tokenizer.convert_tokens_to_ids(p) for p in (a, b)]
        assert all(in_text(tokenizer.decode(p), corpus["texts"]) for p in ids)


# ---------------------------------------------------------------------------------------------
# eval_mlm with the folder's tokenizer


def transformers_pll(kind, folder, sentence):
    """The pseudo-log-likelihood of `sentence` computed with transformers alone: its tokenizer (with its
    special tokens), each token masked in turn, the stock model's log-softmax at that position."""
    if kind == "modernbert":
        tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder))
    else:
        tokenizer = transformers.BertTokenizerFast.from_pretrained(str(folder))   # its vocab.txt and tokenizer_config
    ids = tokenizer(sentence)["input_ids"]
    model = stock_model(folder, kind)
    total = 0.0
    with torch.no_grad():
        for t in range(1, len(ids) - 1):
            masked = torch.tensor([ids[:t] + [tokenizer.mask_token_id] + ids[t + 1:]])
            logits = model(input_ids=masked, attention_mask=torch.ones_like(masked)).logits[0, t]
            total += torch.log_softmax(logits.double(), -1)[ids[t]].item()
    return total, len(ids) - 2


@needs_transformers
@pytest.mark.parametrize("kind", KINDS)
def test_eval_mlm_scores_the_folder_with_its_tokenizer_as_transformers_does(kind, folders, tmp_path):
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(json.dumps({"sentence_good": SENTENCE, "sentence_bad": "w1 w3 w1 w7 w2 w15 w4 w4 w9",
                                 "UID": "swap", "pairID": "0"}) + "\n")
    assert eval_mlm.main(["--model", str(folders[kind]), "--pairs", str(pairs), "--output_dir",
                          str(tmp_path / "out")]) == 0
    ours = json.loads((tmp_path / "out" / "pair_scores.jsonl").read_text().splitlines()[0])["pll_good"]
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert results["vocab_file"] == str(folders[kind] / FILE[kind])
    assert results["vocab_size"] == (MODERN_ROWS if kind == "modernbert" else 99)   # the rows the stock model scores
    theirs, tokens = transformers_pll(kind, folders[kind], SENTENCE)
    print(f"\n{kind}: PLL of {tokens} tokens: eval_mlm {ours:.6f}, transformers {theirs:.6f}, "
          f"difference {abs(ours - theirs):.2g}")
    assert tokens >= 9 and ours == pytest.approx(theirs, rel=1e-5, abs=1e-4)


@needs_transformers
def test_make_minimal_pairs_keeps_the_byte_level_token_count(folders, tmp_path):
    """repeat and replace move in words of the same token count inside a sentence (after a space)."""
    from testkit.corpora import synthetic_documents, write_text

    corpus = tmp_path / "english.txt"
    write_text(corpus, synthetic_documents(60), lambda paragraph: paragraph.replace("! ", "!\n").replace(
        "? ", "?\n").replace(". ", ".\n").split("\n"))
    prepare(corpus, tmp_path / "out", folders["modernbert"], "nvidia", "--validation_fraction", "0.3")
    made = make_minimal_pairs.make_minimal_pairs(str(tmp_path / "out"), str(tmp_path / "pairs.jsonl"),
                                                 kinds=("repeat", "replace"), vocab_file=str(folders["modernbert"]),
                                                 pairs_per_kind=40)
    assert made == {"repeat": 40, "replace": 40}
    tokenizer = load_tokenizer(folders["modernbert"])
    for line in (tmp_path / "pairs.jsonl").read_text().splitlines():
        pair = json.loads(line)
        good, bad = tokenizer.encode_batch([pair["sentence_good"], pair["sentence_bad"]])
        assert len(good) == len(bad), pair


# ---------------------------------------------------------------------------------------------
# Training through the real entry point


def job_for(root, folder, data, **training):
    """The tiny job config naming only the model folder (its config.json and tokenizer are the run's),
    the shards of `data` under --data_path_prefix and its validation set."""
    job = json.load(open(TINY_CFG))
    del job["bert_model_config"], job["bert_token_file"]
    job["bert_model_file"] = str(folder)
    job["data"]["mixed_seq_datasets"]["128"] = {"pretrain_dataset": f"{data}/train",
                                                "wiki_pretrain_dataset": f"{data}/train"}
    job["validation"] = {"path": f"{data}/validation"}
    job["mixed_seq_training"]["128"].update(training)
    path = root / f"job_{os.path.basename(folder)}_{data}.json"
    path.write_text(json.dumps(job))
    return path


def train_from(folder, data, prepared, tmp_path, *extra, nvidia=True):
    out = tmp_path / "out"
    state = train_in_process(prepared, out, ds_config(tmp_path / "ds"), "--use_pretrain", "--max_steps", 2,
                             "--validation_data_path_prefix", prepared, *extra,
                             cf=job_for(tmp_path, folder, data), nvidia=nvidia)
    assert state.global_step == 2 and len(train_losses(out)) == 2
    return out / "saved_models" / "tiny_bert"


@needs_transformers
@pytest.mark.parametrize("kind", KINDS)
def test_trains_from_the_folder_on_shards_of_its_tokenizer(kind, folders, prepared, tmp_path):
    ckpt = train_from(folders[kind], f"{kind}_nvidia", prepared, tmp_path, "--checkpoint_every_steps", 2)
    tag = ckpt / (ckpt / "latest").read_text().strip()
    job_config = json.loads((tag / "job_config.json").read_text())
    assert job_config["bert_token_file"] == str(folders[kind] / FILE[kind])
    copies = {"vocab.txt"} if FILE[kind] == "vocab.txt" else {"tokenizer.json", "special_tokens_map.json"}
    assert copies <= set(os.listdir(tag))
    trained = open_trained(str(ckpt))   # the checkpoint opens with its copy of the tokenizer, the same rows
    assert trained.require_tokenizer().digest == file_digest(folders[kind] / FILE[kind])
    assert trained.config.vocab_size == open_trained(str(folders[kind])).config.vocab_size
    if kind == "modernbert":  # the export keeps the tokenizer.json, AutoTokenizer reads it, finetune_glue tunes it
        export = tmp_path / "hf"
        assert export_hf.main(["--checkpoint_dir", str(ckpt), "--output_dir", str(export)]) == 0
        assert (export / "tokenizer.json").read_bytes() == (folders[kind] / "tokenizer.json").read_bytes()
        config = json.loads((export / "config.json").read_text())
        assert config["vocab_size"] == MODERN_ROWS and config["architectures"] == ["ModernBertForMaskedLM"]
        theirs = transformers.AutoTokenizer.from_pretrained(str(export))
        assert theirs(SENTENCE)["input_ids"] == transformers.AutoTokenizer.from_pretrained(
            str(folders[kind]))(SENTENCE)["input_ids"]
        assert theirs.mask_token == "[MASK]"
        fine_tune_one_epoch(export, tmp_path)


@needs_transformers
def test_trains_a_byte_level_tokenizer_on_bing_shards(folders, prepared, tmp_path):
    train_from(folders["modernbert"], "modernbert_bing", prepared, tmp_path, nvidia=False)


@needs_transformers
def test_shards_of_another_tokenizer_are_refused_in_one_line(folders, prepared, tmp_path, capsys):
    """BERT's folder on shards made with ModernBERT's tokenizer: its ids mean other tokens."""
    data = prepared / "modernbert_nvidia"
    line = expect_input_error(capsys, train_in_process, prepared, tmp_path / "out", ds_config(tmp_path),
                              "--use_pretrain", cf=job_for(tmp_path, folders["bert_mlm"], "modernbert_nvidia"))
    digest = file_digest(folders["modernbert"] / "tokenizer.json")
    ours = folders["bert_mlm"] / "vocab.txt"
    assert line.startswith(f"error: {data / record_name()}: the shards in {data} were made with tokenizer "
                    f"{folders['modernbert']} (sha256 {digest[:12]}), not with this run's {ours} (sha256 "
                    f"{file_digest(ours)[:12]}): a WordPiece model (the shards' BPE); train with the shards' tokenizer "
                    f"(the job config's bert_token_file, or the model folder's), or make the shards again with "
                    f"tools/prepare_data.py --tokenizer {ours}"), line
    assert not (tmp_path / "out" / "saved_models").exists() or not os.listdir(tmp_path / "out" / "saved_models"
                                                                              / "tiny_bert")


@needs_transformers
def test_nvidia_shards_without_a_record_train_as_before(folders, prepared, tmp_path):
    """NVIDIA's own shards record no tokenizer: nothing is checked, the run trains."""
    import shutil

    data = tmp_path / "data" / "unrecorded"
    shutil.copytree(prepared / "bert_mlm_nvidia", data)
    (data / record_name()).unlink()
    train_from(folders["bert_mlm"], "unrecorded", tmp_path / "data", tmp_path)


# ---------------------------------------------------------------------------------------------
# The continued-pretraining recipe's configs


CONTINUED = os.path.join(REPO, "configs", "continued")


def test_the_continued_recipe_is_linear_warmup_over_6_percent_then_linear_decay_to_0():
    """configs/continued/bert_base.json under --lr_schedule WSD: the published recipes' shape (a
    linear warmup over 6% of the steps from the model's state, then a linear decay to 0)."""
    from turing.job_config import TrainingSection
    from turing.lr_schedule import lr_factor

    training = TrainingSection.from_dict(json.load(open(os.path.join(CONTINUED, "bert_base.json")))
                                         ["mixed_seq_training"]["128"], "bert_postln")
    steps = training.total_training_steps
    assert (training.learning_rate, training.warmup_proportion, steps) == (1e-4, 0.06, 12500)
    factors = [lr_factor("WSD", s, training) for s in (0, 375, 750, 750 + 5875, steps, steps + 1)]
    assert factors == pytest.approx([0.0, 0.5, 1.0, 0.5, 0.0, 0.0])


@needs_transformers
def test_the_continued_configs_train_from_a_stock_folder(folders, prepared, tmp_path):
    """configs/continued/ as given (its DeepSpeed config: batch 256, bf16), the job config's model
    and data pointed at the test's: one optimizer step of 8 accumulated micro batches."""
    job = json.load(open(os.path.join(CONTINUED, "bert_base.json")))
    job["bert_model_file"] = str(folders["bert_mlm"])
    job["data"]["mixed_seq_datasets"]["128"]["pretrain_dataset"] = "bert_mlm_nvidia/train"
    job["validation"]["path"] = "bert_mlm_nvidia/validation"
    cf = tmp_path / "continued.json"
    cf.write_text(json.dumps(job))
    state = train_in_process(prepared, tmp_path / "out", os.path.join(CONTINUED, "ds_config.json"), "--use_pretrain",
                             "--lr_schedule", "WSD", "--max_steps", 1, "--validation_data_path_prefix", prepared,
                             cf=cf)
    assert state.global_step == 1 and state.global_data_samples == 256
    assert len(train_losses(tmp_path / "out", "bert_base_continued")) == 1
