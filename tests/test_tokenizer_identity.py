"""One tokenizer, whichever file holds it (turing.tokenization's `Tokenizer.identity`): a vocab.txt
and the tokenizer.json transformers writes from it (BertTokenizerFast.save_pretrained) are the same
tokenizer, and give the same ids on real text (Python's own documentation, with accents and CJK
characters put in); prepare_data makes the same shards from either, and the trainer trains either
on the other's shards. Another vocab order, lower-casing, accent stripping, special token, model
or vocab size is another tokenizer, refused in one line naming what differs; a record of an older
prepare_data, without the identity, is compared by the file's bytes as before. Nothing is
downloaded."""
import json
import os
import shutil
from pydoc_data.topics import topics

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest  # noqa: E402
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers  # noqa: E402

from tests.launch import TINY_CFG, ds_config, expect_input_error, train_in_process, train_losses  # noqa: E402
from tools import prepare_data  # noqa: E402
from tools.prep.vocab import train_vocab  # noqa: E402
from turing.errors import InputValueError  # noqa: E402
from turing.shard_tokenizer import check_shard_tokenizer, record_name  # noqa: E402
from turing.tokenization import BertTokenizer, file_digest, load_tokenizer, tokenizer_difference  # noqa: E402

transformers = pytest.importorskip("transformers")   # the tokenizer.json is the one transformers saves

ACCENTS = str.maketrans("aeiouncAEO", "áéîöüñçÀÉÖ")
CJK = 0x4E00


def real_text():
    """~550 lines of Python's language reference (its topics, as pydoc shows them: curly quotes,
    dashes, ß, code), and 100 more of its lines with every third word accented and CJK characters
    after them."""
    lines = [line.strip() for name in sorted(topics) for line in topics[name].splitlines() if line.strip()]
    mixed = []
    for i, line in enumerate(lines[400:500]):
        words = line.split()
        words[::3] = [w.translate(ACCENTS) for w in words[::3]]
        mixed.append(" ".join(words) + " " + "".join(chr(CJK + (7 * i + k) % 400) for k in range(4)) + "。")
    return lines[:300] + [line for line in lines if any(ord(c) > 127 for c in line)][:150] + mixed


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """The text, and for each lower-casing a WordPiece vocab.txt trained on it (tools/prep/vocab.py, in a
    folder of its own) and the folder transformers saves from it (tokenizer.json and tokenizer_config.json)."""
    root = tmp_path_factory.mktemp("identity")
    text = real_text()
    corpus = root / "corpus.txt"   # documents of 8 lines, as prepare_data reads text
    corpus.write_text("\n\n".join("\n".join(text[i:i + 8]) for i in range(0, len(text), 8)) + "\n")
    found = {"text": text, "corpus": corpus, "root": root}
    for lower in (True, False):
        vocab = root / f"vocab_{lower}" / "vocab.txt"
        vocab.parent.mkdir()
        train_vocab([str(corpus)], 800, lower, str(vocab))
        saved = root / f"saved_{lower}"
        transformers.BertTokenizerFast(str(vocab), do_lower_case=lower).save_pretrained(str(saved))
        if (saved / "vocab.txt").exists():   # transformers 4 writes it too: the folder holds the tokenizer.json only
            (saved / "vocab.txt").unlink()
        assert "tokenizer.json" in os.listdir(saved)
        found[lower] = (vocab, saved)
    return found


def edited(made, tmp_path, change, config=None):
    """A copy of the lower-cased saved folder with its tokenizer.json changed by `change(spec)` and its
    tokenizer_config.json updated with `config`."""
    saved = made[True][1]
    folder = tmp_path / "edited"
    shutil.copytree(saved, folder)
    spec = json.loads((saved / "tokenizer.json").read_text())
    change(spec)
    (folder / "tokenizer.json").write_text(json.dumps(spec))
    settings = json.loads((saved / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**settings, **(config or {})}))
    return load_tokenizer(folder)


# ---------------------------------------------------------------------------------------------
# The identity


@pytest.mark.parametrize("lower", [True, False], ids=["lower_cased", "cased"])
def test_a_vocab_txt_and_the_tokenizer_json_written_from_it_are_one_tokenizer(made, lower):
    vocab, saved = made[lower]
    ours, theirs = BertTokenizer(vocab, do_lower_case=lower), load_tokenizer(saved)
    assert theirs.kind == "tokenizer.json" and ours.digest != theirs.digest
    assert ours.identity == theirs.identity and tokenizer_difference(ours, theirs) is None
    assert ours.encode_batch(made["text"]) == theirs.encode_batch(made["text"])
    # the text is one where lower-casing, accents and CJK characters decide ids
    tokens = {t for line in made["text"] for t in ours.tokenize(line)}
    assert chr(CJK) in tokens and any("é" in t for t in tokens) == (not lower)   # accents stay only when cased
    other = BertTokenizer(vocab, do_lower_case=not lower)
    assert other.encode_batch(made["text"]) != ours.encode_batch(made["text"])
    # where the Rust BertNormalizer differs from Google's tokenizer (word-final capital sigma, punctuation
    # newer than Unicode 9, an unassigned code point, a literal special token in the text), the same too
    rare = ["ΟΔΟΣ ΣΑΣ", "a\u2e4eb", "x\U000e0fffy", "text [SEP] more [MASK]"]
    assert theirs.wordpiece_lower_case == lower and ours.encode_batch(rare) == theirs.encode_batch(rare)


def test_a_bert_normalizer_strips_accents_as_it_lower_cases(made, tmp_path):
    """transformers writes strip_accents null (follow lowercase, Google's rule): true with lowercase is
    the same tokenizer; false with lowercase is another one, and its ids on the text differ."""
    ours = BertTokenizer(made[True][0], do_lower_case=True)

    def strip(value):
        return lambda spec: spec["normalizer"].update(strip_accents=value)

    assert edited(made, tmp_path / "a", strip(True)).identity == ours.identity
    keeping = edited(made, tmp_path / "b", strip(False))
    assert tokenizer_difference(keeping, ours, "the shards'") == "accent stripping off (the shards' on)"
    assert keeping.encode_batch(made["text"]) != ours.encode_batch(made["text"])


def swap(spec, a=10, b=11):
    vocab = spec["model"]["vocab"]
    first, second = (next(t for t, i in vocab.items() if i == at) for at in (a, b))
    vocab[first], vocab[second] = b, a


def test_another_tokenizer_is_named_by_what_differs(made, tmp_path):
    ours = BertTokenizer(made[True][0], do_lower_case=True)
    tokens, size = ours.tokens_by_id(), ours.vocab_size
    changes = {
        f"id 10 is {tokens[11]!r} (the shards' {tokens[10]!r})": (swap, None),
        "lower-casing off (the shards' on)": (lambda s: s["normalizer"].update(lowercase=False), None),
        "mask token '[SEP]' id 3 (the shards' '[MASK]' id 4)": (lambda s: None, {"mask_token": "[SEP]"}),
        f"vocab size {size + 1} (the shards' {size})": (lambda s: s["model"]["vocab"].update(zzzz=size), None),
        "WordPiece model's max_input_chars_per_word 50 (the shards' 100)":
            (lambda s: s["model"].update(max_input_chars_per_word=50), None),
        "WordPiece model's continuing_subword_prefix '@@' (the shards' '##')":
            (lambda s: s["model"].update(continuing_subword_prefix="@@"), None),
    }
    for i, (words, (change, config)) in enumerate(changes.items()):
        other = edited(made, tmp_path / str(i), change, config)
        assert tokenizer_difference(other, ours, "the shards'") == words
    # of two identities alone (a record's), the vocab by the sha256 of its tokens
    other = edited(made, tmp_path / "swapped", swap)
    assert tokenizer_difference(other.identity, ours.identity, "the shards'") == (
        f"other tokens: the sha256 of its tokens in id order is {other.identity['vocab_sha256'][:12]} (the shards' "
        f"{ours.identity['vocab_sha256'][:12]})")
    # a BPE model of the same text, normalizer and special tokens
    bpe = Tokenizer(models.BPE(unk_token="[UNK]"))
    bpe.normalizer = normalizers.BertNormalizer(lowercase=True)
    bpe.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    bpe.train([str(made["corpus"])], trainers.BpeTrainer(vocab_size=size, show_progress=False,
                                                         special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]))
    transformers.PreTrainedTokenizerFast(tokenizer_object=bpe, pad_token="[PAD]", unk_token="[UNK]", cls_token="[CLS]",
                                         sep_token="[SEP]", mask_token="[MASK]").save_pretrained(str(tmp_path / "bpe"))
    assert tokenizer_difference(load_tokenizer(tmp_path / "bpe"), ours, "the shards'") == \
        "a BPE model (the shards' WordPiece)"


# ---------------------------------------------------------------------------------------------
# prepare_data and the trainer


def prepare(made, out, tokenizer):
    assert prepare_data.main(["--input", str(made["corpus"]), "--output_dir", str(out), "--tokenizer", str(tokenizer),
                              "--prefix", "p", "--max_seq_length", "128", "--dupe_factor", "2",
                              "--validation_fraction", "0.1"]) == 0
    return out


@pytest.fixture(scope="module")
def shards(made):
    """The corpus prepared with the lower-cased vocab.txt and with the tokenizer.json saved from it."""
    vocab, saved = made[True]
    root = made["root"] / "data"
    return {"root": root, "vocab": prepare(made, root / "from_vocab", vocab),
            "json": prepare(made, root / "from_json", saved)}


def set_files(out):
    return {os.path.relpath(os.path.join(d, f), out): open(os.path.join(d, f), "rb").read()
            for sub in ("train", "validation") for d, _, names in os.walk(out / sub) for f in names}


def test_either_file_makes_the_same_shards_and_records_one_tokenizer(made, shards):
    vocab, saved = made[True]
    made_with_vocab, made_with_json = set_files(shards["vocab"]), set_files(shards["json"])
    assert len(made_with_vocab) == 2 and made_with_vocab == made_with_json
    records = [json.loads((shards[k] / record_name()).read_text()) for k in ("vocab", "json")]
    assert [r["sha256"] for r in records] == [file_digest(vocab), file_digest(saved / "tokenizer.json")]
    assert records[0]["identity"] == records[1]["identity"] == load_tokenizer(vocab).identity


def job(tmp_path, token_file, data, vocab_size):
    """The tiny job config with `token_file` as bert_token_file, on the shards of `data` (a prepare_data output)."""
    with open(TINY_CFG, encoding="utf-8") as f:
        config = json.load(f)
    config["bert_token_file"] = str(token_file)
    config["bert_model_config"]["vocab_size_or_config_json_file"] = vocab_size
    config["data"]["mixed_seq_datasets"]["128"] = {"pretrain_dataset": f"{data.name}/train"}
    config["validation"] = {"path": f"{data.name}/validation"}
    path = tmp_path / f"job_{data.name}.json"
    path.write_text(json.dumps(config))
    return path


@pytest.mark.parametrize("direction", ["json_on_vocab_shards", "vocab_on_json_shards"])
def test_the_trainer_trains_either_file_on_the_others_shards(direction, made, shards, tmp_path):
    vocab, saved = made[True]
    token_file, data = (saved, shards["vocab"]) if direction == "json_on_vocab_shards" else (vocab, shards["json"])
    out = tmp_path / "out"
    state = train_in_process(shards["root"], out, ds_config(tmp_path / "ds"), "--max_steps", 2,
                             "--validation_data_path_prefix", shards["root"],
                             cf=job(tmp_path, token_file, data, load_tokenizer(vocab).vocab_size))
    assert state.global_step == 2 and len(train_losses(out)) == 2


def test_another_vocab_order_is_refused_in_one_line_naming_the_first_differing_id(made, shards, tmp_path, capsys):
    """A tokenizer.json of the same tokens with ids 10 and 11 swapped: the line names id 10's two tokens
    (from the copy beside the shards' record); without that copy, the sha256 of the shards' tokens."""
    vocab, _ = made[True]
    other = edited(made, tmp_path, swap)
    tokens, data = load_tokenizer(vocab).tokens_by_id(), shards["vocab"]
    line = expect_input_error(capsys, train_in_process, shards["root"], tmp_path / "out", ds_config(tmp_path / "ds"),
                              cf=job(tmp_path, other.path, data, other.vocab_size))
    made_with = f"{data / record_name()}: the shards in {data} were made with tokenizer {vocab} (sha256 " \
                f"{file_digest(vocab)[:12]}), not with this run's {other.path} (sha256 {other.digest[:12]}): "
    advice = ("; train with the shards' tokenizer (the job config's bert_token_file, or the model folder's), or make "
              f"the shards again with tools/prepare_data.py --tokenizer {other.path}")
    assert line.startswith(f"error: {made_with}id 10 is {tokens[11]!r} (the shards' {tokens[10]!r}){advice}"), line
    copy = tmp_path / "data" / data.name
    shutil.copytree(data, copy)
    (copy / "vocab.txt").unlink()
    with pytest.raises(InputValueError) as refused:
        check_shard_tokenizer(other, [str(copy / "train")])
    shards_digest = load_tokenizer(vocab).identity["vocab_sha256"]
    assert f"the sha256 of its tokens in id order is {other.identity['vocab_sha256'][:12]} (the shards' " \
           f"{shards_digest[:12]}); " in str(refused.value)


def test_a_record_without_the_identity_is_compared_by_the_files_bytes(made, shards, tmp_path):
    """Records of an older prepare_data hold the file's sha256 and the special ids: the same file
    trains, the tokenizer.json written from it is another file."""
    vocab, saved = made[True]
    old = tmp_path / "old"
    shutil.copytree(shards["vocab"], old)
    record = json.loads((old / record_name()).read_text())
    del record["identity"]
    (old / record_name()).write_text(json.dumps(record))
    assert check_shard_tokenizer(load_tokenizer(vocab), [str(old / "train")]) == [str(old / record_name())]
    theirs = load_tokenizer(saved)
    with pytest.raises(InputValueError) as refused:
        check_shard_tokenizer(theirs, [str(old / "train")])
    assert f"not with this run's {saved} (sha256 {theirs.digest[:12]}): its file's sha256 is {theirs.digest[:12]} " \
           f"(the shards' {file_digest(vocab)[:12]}, in a record of an older prepare_data, which names the file's " \
           f"bytes only); " in str(refused.value)


# ---------------------------------------------------------------------------------------------
# A job config's bert_token_file against the model folder it starts from


def test_a_job_configs_vocab_txt_is_the_folders_tokenizer_json(made, tmp_path):
    """check_job_settings (--use_pretrain from a Hugging Face folder holding only the tokenizer.json
    saved from the vocab.txt): bert_token_file the vocab.txt is the folder's tokenizer; the same
    tokens in another order are not, in one line."""
    from tests.test_stock_models import stock_weights
    from turing.pretrained import ModelSourceError, bert_model_config, check_job_settings, open_trained

    vocab, saved = made[True]
    folder = stock_weights("bert_mlm", tmp_path / "model", vocab_size=load_tokenizer(vocab).vocab_size)
    for name in os.listdir(saved):
        shutil.copy(saved / name, folder / name)
    settings = bert_model_config(open_trained(str(folder)).config)
    check_job_settings(str(folder), settings, str(vocab), False, "job.json")
    lines = vocab.read_text().splitlines()
    lines[10], lines[11] = lines[11], lines[10]
    other = tmp_path / "other" / "vocab.txt"
    other.parent.mkdir()
    other.write_text("\n".join(lines) + "\n")
    with pytest.raises(ModelSourceError) as refused:
        check_job_settings(str(folder), settings, str(other), False, "job.json")
    assert str(refused.value) == (f"job.json: bert_token_file {other} is not the tokenizer of "
                                  f"{folder / 'tokenizer.json'}: id 10 is {lines[10]!r} (the folder's {lines[11]!r}); "
                                  f"leave bert_token_file out to take the folder's")


def test_cased_shards_train_with_no_lower_case_and_are_refused_without_it(made, tmp_path, capsys):
    """Shards made cased (--no_lower_case) with a bare vocab.txt (no tokenizer_config.json beside it
    to say it is cased) train with the trainer's --no_lower_case; without it the run would tokenize,
    record and export as lower-cased, and is refused in one line that names the flag."""
    vocab, _ = made[False]
    root = tmp_path / "cased_data"
    assert prepare_data.main(["--input", str(made["corpus"]), "--output_dir", str(root / "cased"), "--tokenizer",
                              str(vocab), "--no_lower_case", "--prefix", "p", "--max_seq_length", "128",
                              "--validation_fraction", "0.1"]) == 0
    cf = job(tmp_path, vocab, root / "cased", load_tokenizer(vocab).vocab_size)
    line = expect_input_error(capsys, train_in_process, root, tmp_path / "refused", ds_config(tmp_path / "ds"), cf=cf)
    assert "lower-casing on (the shards' off)" in line and "and --no_lower_case or --do_lower_case as they were " \
                                                           "made" in line, line
    state = train_in_process(root, tmp_path / "out", ds_config(tmp_path / "ds"), "--no_lower_case", "--max_steps", 1,
                             cf=cf)
    assert state.global_step == 1
    saved = json.loads(next((tmp_path / "out").rglob("args.json")).read_text())
    assert saved["do_lower_case"] is False
