"""turing/heldout.py: the trainer says, in one warning line with the count, when documents of its
validation set are in its training shards, by the records prepare_data wrote beside both (the
README's Bing follow-on validated on 11 documents it trained on); a validation set held out of
the same documents, or shards without a record (NVIDIA's own), say nothing."""
import json
import shutil

import pytest

import deepspeed_train
from tests.launch import TINY_CFG, TINY_DS, train_in_process
from tests.test_prepare_data import make_corpus, make_vocab
from tools import prepare_data
from turing import heldout

WARNING = "are in the training shards of"


class ModelNotBuilt(Exception):
    """Raised where the model would be built: the start-up checks are done."""


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """One corpus prepared three ways: `validation` holds a tenth of the documents out (NVIDIA),
    `same` holds the same ones out (Bing, another chunk size), `all` trains on every document
    (Bing, as the README's follow-on did); and a job config reading NVIDIA shards from nvidia/train
    and Bing ones from bing/train under --data_path_prefix."""
    root = tmp_path_factory.mktemp("heldout")
    corpus, vocab = make_corpus(root / "corpus.txt"), make_vocab(root / "vocab.txt")

    def prepare(out, fmt, *extra):
        assert prepare_data.main(["--input", str(corpus), "--output_dir", str(out), "--format", fmt, "--vocab_file",
                                  str(vocab), "--max_seq_length", "128", *map(str, extra)]) == 0

    prepare(root / "validation", "nvidia", "--validation_fraction", 0.1)
    for name, extra in (("same", ["--validation_fraction", 0.1, "--chunk_size_mb", 0.004]), ("all", [])):
        prepare(root / name / "nvidia", "nvidia", "--num_shards", 2, *extra)
        prepare(root / name / "bing", "bing", "--num_shards", 2, *extra)
        shutil.copy(vocab, root / name / "vocab.txt")
    job = json.loads(open(TINY_CFG).read())
    job["data"]["mixed_seq_datasets"]["128"] = {"pretrain_dataset": "nvidia/train", "wiki_pretrain_dataset": "bing/train"}
    (root / "job.json").write_text(json.dumps(job))
    return root


def start_up_warnings(folders, data, tmp_path, monkeypatch, capsys, nvidia=True, cf=None):
    """The warning lines of the trainer's start-up on DATA, validating on folders/validation's set."""
    def stop(cfg):
        raise ModelNotBuilt

    monkeypatch.setattr(deepspeed_train, "build_model_and_engine", stop)
    with pytest.raises(ModelNotBuilt):
        train_in_process(data, tmp_path / "out", TINY_DS, "--validation_data_path_prefix", folders / "validation",
                         cf=cf or folders / "job.json", nvidia=nvidia)
    return [line for line in capsys.readouterr().err.splitlines() if WARNING in line]


@pytest.mark.parametrize("nvidia", [True, False], ids=["nvidia", "bing"])
def test_validation_documents_in_the_training_shards_are_counted_in_one_warning(folders, tmp_path, monkeypatch,
                                                                               capsys, nvidia):
    (line,) = start_up_warnings(folders, folders / "all", tmp_path, monkeypatch, capsys, nvidia)
    train = folders / "all" / ("nvidia" if nvidia else "bing") / "train"
    assert f"validation set {folders / 'validation' / 'validation'}: 6 of its 6 documents are in the training " \
           f"shards of {train} " in line, line
    assert start_up_warnings(folders, folders / "same", tmp_path, monkeypatch, capsys, nvidia) == []


def test_shards_without_a_record_say_nothing(data_root, folders, tmp_path, monkeypatch, capsys):
    """NVIDIA's own shards (the testkit's here) carry no record: nothing is said either way. (The
    run's tokenizer is the validation set's: shards of another one are refused, a record says so.)"""
    job = json.loads(open(TINY_CFG).read())
    job["bert_token_file"] = str(folders / "vocab.txt")
    (tmp_path / "job.json").write_text(json.dumps(job))
    assert start_up_warnings(folders, data_root, tmp_path, monkeypatch, capsys, cf=tmp_path / "job.json") == []
    assert heldout.trained_validation_documents([str(data_root / "nvidia" / "128" / "train")],
                                                str(folders / "validation" / "validation")) is None
    assert heldout.trained_validation_documents([str(folders / "all" / "nvidia" / "train")],
                                                str(data_root / "nvidia" / "128" / "validation")) is None
