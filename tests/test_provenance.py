"""What ties prepare_data's records to its files (turing/heldout.py): its documents.json lists the
shards of each set by name, size and sampled digest, so a shard copied into train/ from another run
(all documents, the validation ones too; or another vocab's) is refused in one line naming it
before the records are trusted, where before it trained past both checks (the held-out count 0 of
15, the log saying the shards were made with this run's tokenizer); and each heldout.jsonl line's
key is its sentences' document key, so a line whose sentences were replaced by training text is
refused by every reader of the record, naming the line. Untouched outputs, every part's, and
shards without a record (NVIDIA's own tool's) train as before; the shards themselves are the same
bytes as without the listing."""
import json
import shutil

import pytest

import deepspeed_train
from testkit import corpora as files
from tests.launch import TINY_CFG, TINY_DS, expect_input_error, train_in_process
from tests.test_prepare_data import make_corpus, make_vocab
from tools import make_minimal_pairs, make_probe_tasks, prepare_data
from tools.prep import shards as prep_shards
from tools.prep.filters import install_split_record
from turing.heldout import check_listed_shards, document_key, find_manifest, shard_digest
from turing.shard_tokenizer import check_shard_tokenizer
from turing.tokenization import load_tokenizer

FORMATS = {"nvidia": True, "bing": False}


class ModelNotBuilt(Exception):
    """Raised where the model would be built: every start-up check passed."""


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One corpus of 60 documents made into shards per format: `split` (a quarter held out, 2 training
    shards) and `all` (every document, as an unsplit run trains); `other`: NVIDIA shards of the same
    corpus made with a 300-id vocab of the same tokens in another order."""
    root = tmp_path_factory.mktemp("provenance")
    corpus, vocab = make_corpus(root / "corpus.txt"), make_vocab(root / "vocab.txt")
    tokens = vocab.read_text().split()
    other = root / "other_vocab" / "vocab.txt"
    other.parent.mkdir()
    other.write_text("\n".join(tokens[:5] + tokens[5:][::-1] + [f"##q{i}" for i in range(300 - len(tokens))]) + "\n")

    def prepare(out, fmt, *extra, tokenizer=vocab):
        assert prepare_data.main(["--input", str(corpus), "--output_dir", str(out), "--format", fmt, "--tokenizer",
                                  str(tokenizer), "--max_seq_length", "128", "--dupe_factor", "2",
                                  *map(str, extra)]) == 0
        return out

    for fmt in FORMATS:
        prepare(root / fmt / "split", fmt, "--num_shards", 2, "--validation_fraction", 0.25)
        prepare(root / fmt / "all", fmt)
    prepare(root / "other", "nvidia", tokenizer=other)
    assert len(load_tokenizer(other).tokens_by_id()) == 300
    return {"root": root, "corpus": corpus, "vocab": vocab, "prepare": prepare}


def copy_of(runs, tmp_path, fmt):
    """A copy of the format's split output in tmp_path/data/<fmt> (the job config's data root
    tmp_path/data, holding the vocab.txt the job config names)."""
    data = tmp_path / "data"
    shutil.copytree(runs["root"] / fmt / "split", data / fmt)
    shutil.copy(runs["vocab"], data / "vocab.txt")
    return data / fmt


def job(tmp_path, fmt):
    with open(TINY_CFG, encoding="utf-8") as f:
        config = json.load(f)
    key = "pretrain_dataset" if FORMATS[fmt] else "wiki_pretrain_dataset"
    config["data"]["mixed_seq_datasets"]["128"] = {key: f"{fmt}/train"}
    path = tmp_path / "job.json"
    path.write_text(json.dumps(config))
    return path


def start_up(tmp_path, fmt, monkeypatch, *extra):
    """The trainer on tmp_path/data/<fmt>/train validating on its validation/, stopped where the
    model would be built."""
    def stop(cfg):
        raise ModelNotBuilt

    monkeypatch.setattr(deepspeed_train, "build_model_and_engine", stop)
    train_in_process(tmp_path / "data", tmp_path / "out", TINY_DS, "--validation_data_path_prefix",
                     tmp_path / "data" / fmt, *extra, cf=job(tmp_path, fmt), nvidia=FORMATS[fmt])


def refusal(capsys, tmp_path, fmt, monkeypatch):
    """The one error line of the trainer's start-up (it must stop with exit code 2 before the model)."""
    return expect_input_error(capsys, start_up, tmp_path, fmt, monkeypatch)


# ---------------------------------------------------------------------------------------------
# The shards a record lists


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_a_shard_of_an_unsplit_run_copied_into_train_is_refused_naming_it(runs, tmp_path, monkeypatch, capsys, fmt):
    """The unsplit run's shard holds every validation document: under a name of its own, and in place
    of a listed shard (its name kept), it is one error line naming it, before any record is trusted."""
    data = copy_of(runs, tmp_path, fmt)
    (shard,) = (runs["root"] / fmt / "all" / "train").iterdir()
    put, remove = (shutil.copytree, shutil.rmtree) if fmt == "bing" else (shutil.copy, lambda p: p.unlink())
    copied = data / "train" / ("shard_002" if fmt == "bing" else shard.name)
    put(shard, copied)
    line = refusal(capsys, tmp_path, fmt, monkeypatch)
    assert line.startswith(f"error: {copied}: not a shard of this prepare_data output: {data / 'documents.json'} "
                           f"lists 2 shards in {data / 'train'} and not this one (copied in from another run?)"), line
    remove(copied)
    listed = min((data / "train").iterdir())
    remove(listed)
    put(shard, listed)
    line = refusal(capsys, tmp_path, fmt, monkeypatch)
    assert line.startswith(f"error: {listed}: not the shard {data / 'documents.json'} lists under this name ("), line
    assert "replaced since prepare_data wrote it" in line


def test_a_shard_of_another_vocab_copied_in_is_refused_before_the_tokenizer_is_trusted(runs, tmp_path, monkeypatch,
                                                                                        capsys):
    data = copy_of(runs, tmp_path, "nvidia")
    (shard,) = (runs["root"] / "other" / "train").iterdir()
    shutil.copy(shard, data / "train" / shard.name)
    line = refusal(capsys, tmp_path, "nvidia", monkeypatch)
    assert line.startswith(f"error: {data / 'train' / shard.name}: not a shard of this prepare_data output"), line
    with pytest.raises(ValueError, match="not a shard of this prepare_data output"):
        check_shard_tokenizer(load_tokenizer(runs["vocab"]), [str(data / "train")])   # eval_mlm's check too


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_an_untouched_output_trains(runs, tmp_path, fmt):
    copy_of(runs, tmp_path, fmt)
    state = train_in_process(tmp_path / "data", tmp_path / "out", TINY_DS, "--max_steps", 1,
                             "--validation_data_path_prefix", tmp_path / "data" / fmt, cf=job(tmp_path, fmt),
                             nvidia=FORMATS[fmt])
    assert state.global_step == 1


def test_every_part_lists_its_own_shards(runs, tmp_path):
    out = tmp_path / "parts"
    for part in (0, 1):
        runs["prepare"](out, "nvidia", "--num_shards", 2, "--validation_fraction", 0.25, "--num_parts", 2,
                        "--part", part)
    manifest = find_manifest(str(out))
    for part, record in enumerate(manifest.parts):
        assert record["path"] == str(out / f"documents.part{part:03d}.json")
        for name in ("train", "validation"):
            listed = record[name]["shards"]
            assert listed and all(f"_part{part:03d}_" in shard for shard in listed), listed
            assert listed == {shard: shard_digest(str(out / name / shard)) for shard in listed}
    for name in ("train", "validation"):
        assert sorted(manifest.shards(name)[0]) == sorted(p.name for p in (out / name).iterdir())
    assert check_listed_shards([str(out / "train"), str(out / "validation")]) == [str(p) for p in manifest.paths] * 2


def test_shards_without_a_record_train_as_before(data_root, runs, tmp_path, monkeypatch):
    """The testkit's shards (as NVIDIA's tool writes them, no record) pass every check; so does an
    output of an older prepare_data (its documents.json lists no shards), with another run's shard in."""
    folders = [str(data_root / "nvidia" / "128" / "train"), str(data_root / "nvidia" / "128" / "validation")]
    assert check_listed_shards(folders) == [] and check_shard_tokenizer(load_tokenizer(runs["vocab"]), folders) == []
    data = copy_of(runs, tmp_path, "nvidia")
    record = json.loads((data / "documents.json").read_text())
    for name in ("train", "validation"):
        del record[name]["shards"]
    (data / "documents.json").write_text(json.dumps(record))
    (shard,) = (runs["root"] / "nvidia" / "all" / "train").iterdir()
    shutil.copy(shard, data / "train" / shard.name)
    with pytest.raises(ModelNotBuilt):
        start_up(tmp_path, "nvidia", monkeypatch)


def test_the_shards_are_the_bytes_written_without_the_listing(runs, tmp_path, monkeypatch):
    """The listing only reads the finished shards: a run whose record lists none (the code as it was
    without it) writes the same shard files, heldout.jsonl, keys and tokenizer record, and a
    documents.json that differs by the listing alone."""
    listed = runs["prepare"](tmp_path / "listed", "bing", "--num_shards", 2, "--validation_fraction", 0.25)
    monkeypatch.setattr(prep_shards.ShardSet, "listing", lambda self: {})
    monkeypatch.setattr(prepare_data, "install_split_record",
                        lambda tmp, out, part, shards: install_split_record(tmp, out, part))
    plain = runs["prepare"](tmp_path / "plain", "bing", "--num_shards", 2, "--validation_fraction", 0.25)
    written = {str(p.relative_to(listed)) for p in listed.rglob("*") if p.is_file()}
    assert {str(p.relative_to(plain)) for p in plain.rglob("*") if p.is_file()} == written
    assert len([name for name in written if name.startswith("train/")]) == 8
    for name in written - {"documents.json", "stats.json"}:
        assert (listed / name).read_bytes() == (plain / name).read_bytes(), name
    theirs, ours = (json.loads((folder / "documents.json").read_text()) for folder in (plain, listed))
    for name in ("train", "validation"):
        assert sorted(ours[name].pop("shards")) == sorted(p.name for p in (listed / name).iterdir())
    assert ours.pop("shard_digest") and ours == theirs


# ---------------------------------------------------------------------------------------------
# The held-out documents as recorded


def edited(runs, tmp_path, line=3):
    """A copy of the NVIDIA split output whose heldout.jsonl line `line` holds training sentences
    (the first training document's, its key kept)."""
    data = copy_of(runs, tmp_path, "nvidia")
    held = (data / "heldout.jsonl").read_text().splitlines()
    docs = [d.split("\n") for d in runs["corpus"].read_text().strip().split("\n\n")]
    record = json.loads(held[line - 1])
    record["sentences"] = docs[0]
    held[line - 1] = json.dumps(record)
    (data / "heldout.jsonl").write_text("\n".join(held) + "\n")
    return data


def test_an_edited_heldout_file_is_refused_by_every_reader_naming_the_line(runs, tmp_path, monkeypatch, capsys):
    data = edited(runs, tmp_path)
    says = f"error: {data / 'heldout.jsonl'}: line 3: its sentences are not held-out document "
    assert make_minimal_pairs.main(["--heldout", str(data), "--output", str(tmp_path / "pairs.jsonl")]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(says) and "changed since prepare_data wrote them" in line, line
    assert make_probe_tasks.main(["--heldout", str(data), "--output_dir", str(tmp_path / "probe")]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(says), line
    assert refusal(capsys, tmp_path, "nvidia", monkeypatch).startswith(says)   # the trainer's count reads it too


def test_an_untouched_heldout_file_is_accepted_wikitext_too(runs, tmp_path):
    """Every line's key is its sentences' document key; a MediaWiki dump's documents are keyed by their
    markup, so their lines also hold their sentences' key, which is checked instead."""
    data = copy_of(runs, tmp_path, "nvidia")
    assert make_minimal_pairs.main(["--heldout", str(data), "--output", str(tmp_path / "pairs.jsonl"),
                                    "--pairs_per_kind", "5"]) == 0
    for line in (data / "heldout.jsonl").read_text().splitlines():
        record = json.loads(line)
        assert "sentences_key" not in record and document_key(record["sentences"]) == record["key"]
    docs = list(files.synthetic_documents(12, seed=3))
    dump = files.write_mediawiki(str(tmp_path / "testwiki-pages-articles.xml"), docs)
    vocab = tmp_path / "wiki_vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + sorted(
        {w.strip(".?!").lower() for _, doc in docs for p in doc for w in p.split()} | set(".?!"))) + "\n")
    wiki = tmp_path / "wiki"
    assert prepare_data.main(["--input", dump, "--output_dir", str(wiki), "--tokenizer", str(vocab),
                              "--validation_fraction", "0.25", "--max_seq_length", "64", "--dupe_factor", "1"]) == 0
    manifest = find_manifest(str(wiki))
    held = list(manifest.heldout_documents())
    assert len(held) == 3 and all(d["sentences_key"] == document_key(d["sentences"]) != d["key"] for d in held)
