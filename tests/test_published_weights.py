"""Weights as they are published: a Hugging Face folder whose weights are pytorch_model.bin (one
file, or shards named by pytorch_model.bin.index.json), a model id in the local Hugging Face cache,
and a sentence-transformers folder each open through turing.pretrained to the very model of the
same weights saved as safetensors. A .bin is read weights-only: a pickle that would run code (here:
create a marker file), a payload in one shard, a truncated file are each one error line, and the
marker never appears. Nothing is downloaded: the cache is a folder of the hub's layout made here
(HF_HUB_CACHE), and an id not in it is one line with the command that fetches it."""
import hashlib
import json
import os
import shutil

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from tests.launch import ds_config, expect_input_error, train_in_process, train_losses  # noqa: E402
from tests.test_stock_models import (close, hf_logits, needs_transformers, padded_batch, stock_folder,  # noqa: E402
                                     stock_job, stock_model,
                                     test_sigkill_during_a_checkpoint_then_auto_resume_repeats_the_run
                                     as sigkill_then_auto_resume)
from turing.errors import CheckpointNotFoundError, ConversionError, InputValueError, UnsafeCheckpointError  # noqa: E402
from turing.hf_folder import hf_folder_config  # noqa: E402
from turing.pretrained import open_trained, read_weights  # noqa: E402

pytestmark = needs_transformers

MODEL_ID, COMMIT = "org/name", "4f1c2b0d9e8a7f6c5b4a3f2e1d0c9b8a7f6e5d4c"
FOLDER_FILES = ("config.json", "vocab.txt", "tokenizer_config.json")   # a stock folder's, beside its weights
ST_MODULES = [{"idx": 0, "name": "0", "path": "0_Transformer", "type": "sentence_transformers.models.Transformer"},
              {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]


class Payload:
    """What a crafted pytorch_model.bin can hold: an object whose unpickling runs code (here it
    creates `marker`; it could as well run a shell)."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return exec, (f"open({self.marker!r}, 'w').close()",)


def copy_folder_files(source, folder):
    folder.mkdir(parents=True)
    for name in FOLDER_FILES:
        shutil.copy(source / name, folder / name)
    return folder


def bin_folder(source, folder, shards=1, payload=None, payload_shard=0):
    """`source`'s model (transformers' state dict, tied copies included, as transformers 4 saved
    .bin) as pytorch_model.bin, or as `shards` pytorch_model-0000K-of-0000N.bin and their index;
    `payload` (a Payload) goes into shard `payload_shard` beside its tensors."""
    copy_folder_files(source, folder)
    state = stock_model(source, "bert_mlm").state_dict()
    names = list(state)
    parts = [names[i::shards] for i in range(shards)]
    files = ["pytorch_model.bin"] if shards == 1 else [f"pytorch_model-{i + 1:05d}-of-{shards:05d}.bin"
                                                       for i in range(shards)]
    for i, (part, name) in enumerate(zip(parts, files)):
        content = {key: state[key] for key in part}
        if payload is not None and i == payload_shard:
            content["cls.predictions.payload"] = payload
        torch.save(content, folder / name)
    if shards > 1:
        weight_map = {key: name for part, name in zip(parts, files) for key in part}
        (folder / "pytorch_model.bin.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return folder


def sentence_transformers_folder(source, folder, module_path):
    """A sentence-transformers layout of `source`'s model: modules.json, its Transformer module in
    `module_path` ("" the folder itself), a pooling module and its own config beside it."""
    if module_path:
        copy_folder_files(source, folder / module_path)
        shutil.copy(source / "model.safetensors", folder / module_path / "model.safetensors")
    else:
        shutil.copytree(source, folder)
    modules = [dict(ST_MODULES[0], path=module_path), ST_MODULES[1]]
    (folder / "modules.json").write_text(json.dumps(modules))
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": 64,
                                                                  "pooling_mode_mean_tokens": True}))
    (folder / "config_sentence_transformers.json").write_text(json.dumps({"similarity_fn_name": "cosine"}))
    return folder


def cache_model(cache, model_id, folder):
    """`folder` as the hub caches a model: blobs named by their hash, snapshots/COMMIT/ of links to
    them, refs/main naming COMMIT."""
    repo = cache / f"models--{model_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / COMMIT
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        blob = repo / "blobs" / hashlib.sha256(path.read_bytes()).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, blob)
        link = snapshot / path.relative_to(folder)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    return snapshot


@pytest.fixture(scope="module")
def published(data_root, tmp_path_factory):
    """The stock BertForMaskedLM folder (safetensors), its MLM scores and transformers' own on a
    padded batch, and its .bin and sentence-transformers layouts."""
    root = tmp_path_factory.mktemp("published")
    source = stock_folder("bert_mlm", root / "safetensors", data_root / "vocab.txt")
    batch = padded_batch()
    torch.manual_seed(0)
    with torch.no_grad():
        ours = open_trained(str(source)).build().eval().predict(batch.input_ids, batch.segment_ids, batch.input_mask)
        theirs, _ = hf_logits(stock_model(source, "bert_mlm"), "bert_mlm", batch.input_ids, batch.input_mask,
                              batch.segment_ids)
    real = batch.input_mask.bool()
    assert close(ours[0][..., :theirs.shape[-1]][real], theirs[real])[1]
    both = copy_folder_files(source, root / "both")   # safetensors wins; its .bin would run code
    shutil.copy(source / "model.safetensors", both / "model.safetensors")
    torch.save({"x": Payload(root / "both_marker")}, both / "pytorch_model.bin")
    return {"source": source, "batch": batch, "scores": ours[0], "marker": root / "both_marker",
            "bin": bin_folder(source, root / "bin"), "sharded": bin_folder(source, root / "sharded", shards=3),
            "both": both, "st_sub": sentence_transformers_folder(source, root / "st_sub", "0_Transformer"),
            "st_root": sentence_transformers_folder(source, root / "st_root", "")}


def scores_of(path, batch):
    """(TrainedModel, MLM scores on `batch`) of the model at `path` (anything open_trained takes)."""
    trained = open_trained(path)
    torch.manual_seed(1)   # another init than the fixture's: every weight must come from the files
    with torch.no_grad():
        return trained, trained.build().eval().predict(batch.input_ids, batch.segment_ids, batch.input_mask)[0]


@pytest.mark.parametrize("layout", ["bin", "sharded", "both", "st_sub", "st_root"])
def test_published_layouts_open_to_the_safetensors_models_scores(layout, published):
    trained, scores = scores_of(str(published[layout]), published["batch"])
    assert trained.kind == "export" and trained.architecture == "bert_postln" and not trained.nsp_head
    assert torch.equal(scores, published["scores"])   # the same weights, fp32: the same scores, bit for bit
    if layout.startswith("st_"):   # read through its Transformer module's folder
        module = published[layout] / ("0_Transformer" if layout == "st_sub" else "")
        assert trained.weights == os.path.abspath(module) and trained.vocab_file == str(module / "vocab.txt")
    names = hf_folder_config(trained.weights)[2]
    assert "cls.predictions.bias" in names and not published["marker"].exists()


def bad_bin_folder(published, case, tmp_path):
    """A .bin folder that must be refused, the file its line names and the marker a run would create."""
    marker = tmp_path / "marker"
    if case == "payload":
        folder = bin_folder(published["source"], tmp_path / case, payload=Payload(marker))
        return folder, folder / "pytorch_model.bin", marker
    if case == "payload_in_a_shard":
        folder = bin_folder(published["source"], tmp_path / case, shards=3, payload=Payload(marker), payload_shard=1)
        return folder, folder / "pytorch_model-00002-of-00003.bin", marker
    folder = copy_folder_files(published["source"], tmp_path / case)
    whole = (published["bin"] / "pytorch_model.bin").read_bytes()
    (folder / "pytorch_model.bin").write_bytes(whole[:len(whole) // 2])
    return folder, folder / "pytorch_model.bin", marker


@pytest.mark.parametrize("case", ["payload", "payload_in_a_shard", "truncated"])
def test_a_bin_that_is_not_plain_weights_is_one_error_line_and_runs_nothing(case, published, tmp_path):
    folder, named, marker = bad_bin_folder(published, case, tmp_path)
    if case == "payload":   # the payload is live: the full unpickler runs it
        probe = tmp_path / "probe.bin"
        torch.save(Payload(tmp_path / "probe_marker"), probe)
        torch.load(probe, weights_only=False)
        assert (tmp_path / "probe_marker").exists()
    expected = UnsafeCheckpointError if case.startswith("payload") else ConversionError
    for reader in (open_trained, read_weights):
        with pytest.raises(expected) as error:
            reader(str(folder))
        line = str(error.value)
        assert line.startswith(f"{named}: ") and "\n" not in line, line
        assert ("builtins.exec" in line) if case.startswith("payload") else ("not a readable torch" in line), line
    assert not marker.exists()


def test_a_bin_of_weights_that_are_not_finite_is_refused(published, tmp_path):
    folder = copy_folder_files(published["source"], tmp_path / "diverged")
    state = torch.load(published["bin"] / "pytorch_model.bin", weights_only=True)
    state["bert.encoder.layer.1.output.dense.weight"][0, 0] = float("nan")
    torch.save(state, folder / "pytorch_model.bin")
    with pytest.raises(ConversionError) as error:
        open_trained(str(folder)).build()
    assert str(error.value).startswith(f"{folder / 'pytorch_model.bin'}: tensor bert.encoder.layer.1.output.dense."
                                       "weight is not finite (1 NaN"), str(error.value)


@pytest.fixture
def hub(published, tmp_path, monkeypatch):
    """A Hugging Face cache (HF_HUB_CACHE) holding org/name (the stock folder, sharded .bin) and
    org/st (a sentence-transformers layout); the working directory is an empty folder."""
    cache = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    return {"cache": cache, "work": work, "snapshot": cache_model(cache, MODEL_ID, published["sharded"]),
            "st": cache_model(cache, "org/st", published["st_sub"])}


def test_a_model_id_in_the_cache_opens_offline_and_a_local_path_wins(published, hub):
    trained, scores = scores_of(MODEL_ID, published["batch"])
    assert trained.path == MODEL_ID and trained.weights == str(hub["snapshot"])
    assert torch.equal(scores, published["scores"])
    trained, scores = scores_of("org/st", published["batch"])
    assert trained.weights == str(hub["st"] / "0_Transformer") and torch.equal(scores, published["scores"])
    shutil.copytree(published["bin"], hub["work"] / "org" / "name")   # a local folder of that name wins
    assert open_trained(MODEL_ID).weights == str(hub["work"] / "org" / "name")


def test_a_model_id_not_in_the_cache_is_one_line_with_the_command_that_fetches_it(hub, tmp_path, capsys):
    from tools import eval_mlm

    with pytest.raises(CheckpointNotFoundError) as error:
        open_trained("org/missing")
    line = str(error.value)
    assert line.startswith("org/missing: no such file or folder, and no model org/missing in the Hugging Face "
                           f"cache {hub['cache']} (no models--org--missing there); fetch it with `hf download "
                           "org/missing`") and "\n" not in line, line
    text = tmp_path / "text.txt"
    text.write_text("w1 w2 w3\n")
    assert eval_mlm.main(["--model", "org/missing", "--text", str(text), "--output_dir", str(tmp_path / "eval")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"error: --model {line}" and not (tmp_path / "eval").exists()


def test_eval_mlm_scores_a_model_id(hub, tmp_path):
    from tools import eval_mlm

    text = tmp_path / "text.txt"
    text.write_text("w1 w2 w3 w4 w5\nw10 w11 w12\n")
    assert eval_mlm.main(["--model", MODEL_ID, "--text", str(text), "--output_dir", str(tmp_path / "eval")]) == 0
    results = json.loads((tmp_path / "eval" / "results.json").read_text())
    assert results["vocab_file"] == str(hub["snapshot"] / "vocab.txt") and results["text"]["tokens"] == 8


def test_the_trainer_starts_from_a_model_id(published, hub, data_root, tmp_path, capsys):
    """--use_pretrain with bert_model_file "org/name" trains from the cached model as from its
    folder: the same losses, which are not those of its sizes and vocab with fresh weights (the
    same job config without --use_pretrain); an id not cached is one line before anything is
    written."""
    runs = {"id": (MODEL_ID, ["--use_pretrain"]), "folder": (published["sharded"], ["--use_pretrain"]),
            "fresh": (MODEL_ID, [])}
    losses = {}
    for name, (model, pretrain) in runs.items():
        out = tmp_path / name
        train_in_process(data_root, out, ds_config(tmp_path / f"ds_{name}"), *pretrain, "--max_steps", 2,
                         cf=stock_job(tmp_path, model))
        losses[name] = train_losses(out)
    assert len(losses["id"]) == 2 and losses["id"] == losses["folder"] and losses["fresh"][0] != losses["id"][0]
    cf = stock_job(tmp_path, "org/missing")
    line = expect_input_error(capsys, train_in_process, data_root, tmp_path / "never", ds_config(tmp_path / "ds"),
                              "--use_pretrain", cf=cf)
    assert line.startswith(f"error: {cf}: bert_model_file org/missing: no such file or folder") and \
        "hf download org/missing" in line, line
    assert not (tmp_path / "never").exists()


def test_a_modules_json_without_a_transformer_module_is_one_error_line(published, tmp_path):
    folder = shutil.copytree(published["st_sub"], tmp_path / "st")
    (folder / "modules.json").write_text(json.dumps([ST_MODULES[1]]))
    with pytest.raises(ConversionError) as error:
        open_trained(str(folder))
    line = str(error.value)
    assert line.startswith(f"{folder / 'modules.json'}: no module of type sentence_transformers.models.Transformer")
    assert "\n" not in line


def test_every_tokenizer_flag_takes_a_model_id_and_a_sentence_transformers_folder(published, hub, tmp_path):
    """--tokenizer (prepare_data's, make_minimal_pairs', eval_mlm's) and bert_token_file name a
    tokenizer as --model names a model: a model id in the cache, a sentence-transformers folder
    (its Transformer module's tokenizer), resolved by the one rule (turing.model_path), without
    torch (prepare_data's workers are forked before torch is loaded)."""
    from tools import prepare_data
    from turing.tokenization import load_tokenizer

    folder = load_tokenizer(published["sharded"])
    for name in (MODEL_ID, "org/st", str(published["st_sub"])):
        assert load_tokenizer(name).identity == folder.identity, name
    corpus = tmp_path / "corpus.txt"
    tokens = [t for t in folder.tokens_by_id() if t.startswith("w")]
    corpus.write_text("\n\n".join("\n".join(" ".join(tokens[(d + s + k) % len(tokens)] for k in range(6))
                                            for s in range(4)) for d in range(40)) + "\n")
    made = {}
    for name, tokenizer in (("id", MODEL_ID), ("folder", str(published["sharded"]))):
        out = tmp_path / f"shards_{name}"
        assert prepare_data.main(["--input", str(corpus), "--output_dir", str(out), "--tokenizer", tokenizer,
                                  "--prefix", "p", "--max_seq_length", "32", "--no_near_dedup"]) == 0
        made[name] = {p.relative_to(out): p.read_bytes() for p in sorted((out / "train").rglob("*")) if p.is_file()}
    assert made["id"] and made["id"] == made["folder"]


def test_a_config_that_disagrees_with_the_weights_is_refused_from_the_headers_before_any_allocation(
        published, tmp_path, monkeypatch):
    """config.json asking for 2,000,000,000 positions (the tensors say 160): one line naming the
    tensor and both shapes, from the safetensors headers and a model built on the meta device,
    before a weight is allocated (an allocation of the model's size would be 512 GB); a folder whose
    hidden size disagrees likewise."""
    folder = copy_folder_files(published["source"], tmp_path / "huge")
    shutil.copy(published["source"] / "model.safetensors", folder / "model.safetensors")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 2_000_000_000}))
    allocated = []
    real_empty = torch.empty

    def counting_empty(*shape, **kwargs):   # every tensor the check allocates off the meta device
        tensor = real_empty(*shape, **kwargs)
        if not tensor.is_meta and tensor.numel() > 10 ** 6:
            allocated.append(tuple(tensor.shape))
        return tensor
    monkeypatch.setattr(torch, "empty", counting_empty)
    with pytest.raises(InputValueError) as error:
        open_trained(str(folder))
    line = str(error.value)
    assert line == (f"{folder}: shapes differ from bert_model_config and the vocab: "
                    "bert.embeddings.position_embeddings.weight (160, 64) (model (2000000000, 64))"), line
    assert allocated == []


def test_an_index_naming_a_file_outside_its_folder_is_refused(published, tmp_path):
    """A model.safetensors.index.json (or pytorch_model.bin.index.json) whose weight_map names
    ../outside.safetensors is refused in one line; nothing outside the folder is read. (A file of the
    folder that is a link, as in the Hugging Face cache, is read: the cache test.)"""
    outside = tmp_path / "outside.safetensors"
    shutil.copy(published["source"] / "model.safetensors", outside)
    folder = copy_folder_files(published["source"], tmp_path / "m" / "model")
    from safetensors import safe_open
    with safe_open(str(outside), "pt") as f:
        names = list(f.keys())
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {name: "../../outside.safetensors" for name in names}}))
    with pytest.raises(ConversionError) as error:
        open_trained(str(folder))
    assert str(error.value) == (f"{folder / 'model.safetensors.index.json'}: names '../../outside.safetensors', a "
                                f"file outside {folder}; the shards of an index are files of its folder")


@pytest.fixture(scope="module", params=["sharded_bin", "sentence_transformers", "model_id"])
def layout_run(request, data_root, tmp_path_factory):
    """4 steps, a checkpoint every 2, from the stock BertForMaskedLM with dropout 0.1 in one
    published layout: shards of pytorch_model.bin with their index, a sentence-transformers folder,
    or a model id in the Hugging Face cache (HF_HUB_CACHE given in "env"); test_stock_models.py's
    stock_run, for its kill test."""
    layout, root = request.param, tmp_path_factory.mktemp(f"run_{request.param}")
    source = stock_folder("bert_mlm", root / "safetensors", data_root / "vocab.txt", dropout=0.1)
    env = {}
    if layout == "sentence_transformers":
        model = sentence_transformers_folder(source, root / "st", "0_Transformer")
    else:
        model = bin_folder(source, root / "sharded", shards=3)
    if layout == "model_id":
        cache_model(root / "hub", MODEL_ID, model)
        model, env = MODEL_ID, {"HF_HUB_CACHE": str(root / "hub")}
    with pytest.MonkeyPatch.context() as patch:
        for key, value in env.items():
            patch.setenv(key, value)
        cf, ds, out = stock_job(root, model), ds_config(root / "ds"), root / "out"
        state = train_in_process(data_root, out, ds, "--use_pretrain", "--max_steps", 4, "--checkpoint_every_steps",
                                 2, cf=cf)
    assert state.global_step == 4
    return {"folder": model, "cf": cf, "ds": ds, "out": out, "ckpt": out / "saved_models" / "tiny_bert", "env": env}


def test_each_published_layout_kill_resumes_bit_for_bit(layout_run, data_root, tmp_path, monkeypatch):
    """SIGKILLed inside its last checkpoint and run again, a run started from each layout repeats
    the uninterrupted losses and final weights bit for bit (the model is opened again at the
    restart, from the same layout)."""
    for key, value in layout_run["env"].items():
        monkeypatch.setenv(key, value)
    sigkill_then_auto_resume(layout_run, data_root, tmp_path)
