"""Hugging Face export and import: a checkpoint from a real tiny training run is exported with
tools/export_hf.py, loaded offline with transformers' Auto classes and compared with our model
logit by logit; the tokenizer gives our ids; the reverse mapping, the DeepSpeed
transformer-kernel layout and the error messages.

The tiny run (`tiny_run`) is shared with tests/test_plot_run.py through pytest's stash."""
import json
import os
import shutil

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from tests.launch import TINY_CFG, TINY_DS  # noqa: E402
from testkit.synthetic import SPECIALS, make_data_root  # noqa: E402
from tools import export_hf  # noqa: E402
from turing.checkpoint_files import load_checkpoint_state  # noqa: E402
from turing.errors import CheckpointNotFoundError, ConversionError  # noqa: E402
from turing.arch.bert.hf import HF_MISSING_KEYS, hf_to_ours, ours_to_hf  # noqa: E402
from turing.arch.hf_common import PADDED_ROW_BIAS  # noqa: E402
from turing.hf_folder import load_hf_folder  # noqa: E402
from turing.model_path import is_hf_folder  # noqa: E402
from turing.modeling import BertConfig, BertForPreTrainingPreLN  # noqa: E402
from turing.tokenization import BertTokenizer  # noqa: E402

try:  # optional for training; test_plot_run.py imports the shared run from here without it
    import transformers
    from safetensors import torch as safetensors_torch
except ImportError:
    transformers = None
# the export and the loading back need them; the checks of foreign inputs run without them
needs_transformers = pytest.mark.skipif(transformers is None, reason="needs transformers and safetensors")

# The synthetic data uses ids 0..95; three extra words make the vocab 99 long, so the model
# pads it to 104 rows and the export has padding rows to drop. They also give the tokenizer
# test lower-casing and a WordPiece continuation to get right.
EXTRA_WORDS = ["hello", "world", "##s"]
VOCAB_REAL, VOCAB_PADDED = 99, 104
_RUN_KEY = pytest.StashKey[dict]()


def _train_tiny(root, out):
    import deepspeed_train

    make_data_root(str(root), seq_lengths=(128,), n_train=96, shards=2, n_valid=16)
    with open(os.path.join(root, "vocab.txt"), "a") as f:
        f.write("\n".join(EXTRA_WORDS) + "\n")
    # 2 shards x 48 samples at micro batch 16: 2 epochs of 3 steps, validated and saved each epoch.
    deepspeed_train.main(["--cf", TINY_CFG, "--deepspeed", "--deepspeed_config", TINY_DS,
                          "--output_dir", str(out), "--data_path_prefix", str(root),
                          "--max_seq_length", "128", "--max_predictions_per_seq", "20",
                          "--use_nvidia_dataset", "--print_steps", "1",
                          "--validation_data_path_prefix", os.path.join(root, "nvidia", "128")])
    return {"root": str(root), "out": str(out),
            "ckpt": os.path.join(out, "saved_models", "tiny_bert"),
            "runs": os.path.join(out, "runs", "tiny_bert")}


@pytest.fixture(scope="session")
def tiny_run(request, tmp_path_factory):
    """One real in-process training run per session: {root, out, ckpt, runs} paths."""
    stash = request.config.stash
    if _RUN_KEY not in stash:
        stash[_RUN_KEY] = _train_tiny(tmp_path_factory.mktemp("tiny_data"), tmp_path_factory.mktemp("tiny_out"))
    return stash[_RUN_KEY]


@pytest.fixture(scope="module")
def exported(tiny_run, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("hf") / "model")
    assert export_hf.main(["--checkpoint_dir", tiny_run["ckpt"], "--output_dir", out]) == 0
    return out


@pytest.fixture(scope="module")
def ours(tiny_run):
    """Our model with the latest checkpoint's weights, in eval mode."""
    state, job_config, _ = load_checkpoint_state(tiny_run["ckpt"])
    config = BertConfig.from_dict(job_config["bert_model_config"])
    config.vocab_size = VOCAB_PADDED
    model = BertForPreTrainingPreLN(config)
    model.load_state_dict(state, strict=True)
    return model.eval(), state, config


def padded_batch(seed=0, lengths=(128, 70, 23, 5)):
    """Ids of the synthetic words with segments A/B, padded at the end with [PAD] (id 0)."""
    g = torch.Generator().manual_seed(seed)
    L = max(lengths)
    ids = torch.zeros(len(lengths), L, dtype=torch.long)
    mask = torch.zeros_like(ids)
    seg = torch.zeros_like(ids)
    for r, n in enumerate(lengths):
        ids[r, :n] = torch.randint(len(SPECIALS), VOCAB_REAL, (n,), generator=g)
        ids[r, 0], ids[r, n - 1] = 2, 3  # [CLS] ... [SEP]
        ids[r, n // 3] = 4  # a [MASK]
        mask[r, :n] = 1
        seg[r, n // 2:n] = 1
    return ids, mask, seg


@needs_transformers
def test_exported_folder_has_model_tokenizer_and_readme(exported):
    names = set(os.listdir(exported))
    assert {"config.json", "model.safetensors", "vocab.txt", "tokenizer_config.json", "README.md"} <= names
    config = json.load(open(os.path.join(exported, "config.json")))
    assert config["model_type"] == "roberta-prelayernorm"
    assert config["vocab_size"] == VOCAB_REAL  # padding rows dropped
    assert config["max_position_embeddings"] == 512 + 1  # shifted past the [PAD] id 0
    readme = open(os.path.join(exported, "README.md")).read()
    assert "pooler" in readme and "next-sentence" in readme and "padding row" in readme


@needs_transformers
def test_exported_files_are_readable_as_the_umask_says(tiny_run, tmp_path):
    """Other users of a shared cluster read the export: under umask 022 every file is 0644
    (safetensors writes its file 0600 on its own)."""
    old = os.umask(0o022)
    try:
        assert export_hf.main(["--checkpoint_dir", tiny_run["ckpt"], "--output_dir", str(tmp_path / "hf"),
                               "--no_verify"]) == 0
    finally:
        os.umask(old)
    modes = {name: os.stat(tmp_path / "hf" / name).st_mode & 0o777 for name in os.listdir(tmp_path / "hf")}
    assert "model.safetensors" in modes and set(modes.values()) == {0o644}, modes


@needs_transformers
def test_hf_logits_equal_ours_at_real_positions(exported, ours):
    model, _, _ = ours
    hf = transformers.AutoModelForMaskedLM.from_pretrained(exported, local_files_only=True).eval()
    assert type(hf).__name__ == "RobertaPreLayerNormForMaskedLM"
    ids, mask, seg = padded_batch()
    with torch.no_grad():
        expected, _ = model.predict(ids, seg, mask)  # (B, L, 104)
        got = hf(input_ids=ids, attention_mask=mask, token_type_ids=seg).logits  # (B, L, 99)
    assert got.shape == (*ids.shape, VOCAB_REAL)
    real = mask.bool()
    torch.testing.assert_close(got[real], expected[..., :VOCAB_REAL][real], atol=1e-4, rtol=0)
    assert expected[real].std() > 0.1  # real scores, not a degenerate model


@needs_transformers
def test_fill_mask_pipeline_predicts_what_we_predict(exported, ours):
    model, _, _ = ours
    fill = transformers.pipeline("fill-mask", model=exported, tokenizer=exported, device="cpu")
    text = "w1 w1 w2 w2 [MASK] w3 w3"
    best = fill(text, top_k=1)[0]
    tokenizer = BertTokenizer(os.path.join(exported, "vocab.txt"))
    # Our tokenizer, like Google's, knows no special tokens in text: put the [MASK] id in by hand.
    left, right = (tokenizer.convert_tokens_to_ids(tokenizer.tokenize(t)) for t in text.split("[MASK]"))
    ids = torch.tensor([[2] + left + [4] + right + [3]])
    with torch.no_grad():
        scores, _ = model.predict(ids, torch.zeros_like(ids), torch.ones_like(ids))
    position = len(left) + 1
    assert best["token"] == scores[0, position, :VOCAB_REAL].argmax().item()


@needs_transformers
def test_tokenizer_gives_our_ids(exported, tiny_run):
    hf = transformers.AutoTokenizer.from_pretrained(exported, local_files_only=True)
    tokenizer = BertTokenizer(os.path.join(tiny_run["root"], "vocab.txt"))
    cls, sep = tokenizer.vocab["[CLS]"], tokenizer.vocab["[SEP]"]
    texts = ["Hello Worlds, w1 w22!", "W3 w4\tw90   hello", "unknownword w5.", "HELLO\u00e9 world"]
    for text in texts:
        ours = tokenizer.convert_tokens_to_ids(tokenizer.tokenize(text))
        assert hf(text, add_special_tokens=False)["input_ids"] == ours, text
        assert hf(text)["input_ids"] == [cls] + ours + [sep]
    a, b = texts[0], texts[1]
    ids_a = tokenizer.convert_tokens_to_ids(tokenizer.tokenize(a))
    ids_b = tokenizer.convert_tokens_to_ids(tokenizer.tokenize(b))
    pair = hf(a, b)
    assert pair["input_ids"] == [cls] + ids_a + [sep] + ids_b + [sep]
    assert pair["token_type_ids"] == [0] * (len(ids_a) + 2) + [1] * (len(ids_b) + 1)
    assert tokenizer.tokenize(texts[0])[:3] == ["hello", "world", "##s"]  # the case the test relies on
    assert hf.mask_token_id == tokenizer.vocab["[MASK]"] and hf.pad_token_id == tokenizer.vocab["[PAD]"]


@needs_transformers
def test_round_trip_restores_our_weights(exported, ours):
    _, state, config = ours
    hf_state, hf_config = ours_to_hf(state, config, VOCAB_REAL)
    back, back_config = hf_to_ours(hf_state, hf_config)
    # From the saved folder too: save_pretrained drops the tied copies of the decoder.
    assert is_hf_folder(exported) and not is_hf_folder(os.path.dirname(exported))
    from_folder, folder_config = load_hf_folder(exported)
    assert folder_config.to_dict() == config.to_dict()
    assert back_config.to_dict() == config.to_dict()
    assert set(back) == set(state) - set(HF_MISSING_KEYS)
    for result in (back, from_folder):
        assert set(result) == set(back)
        for key, value in result.items():
            if key in ("bert.embeddings.word_embeddings.weight", "cls.predictions.decoder.weight",
                       "cls.predictions.bias"):
                torch.testing.assert_close(value[:VOCAB_REAL], state[key][:VOCAB_REAL], rtol=0, atol=0)
            else:
                torch.testing.assert_close(value, state[key], rtol=0, atol=0, msg=key)
        # Padding rows come back inert: no embedding, no probability mass.
        assert result["bert.embeddings.word_embeddings.weight"][VOCAB_REAL:].abs().sum() == 0
        assert (result["cls.predictions.bias"][VOCAB_REAL:] == PADDED_ROW_BIAS).all()
    model = BertForPreTrainingPreLN(back_config)
    missing, unexpected = model.load_state_dict(from_folder, strict=False)
    assert sorted(missing) == sorted(HF_MISSING_KEYS) and unexpected == []
    assert model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight


@needs_transformers
def test_transformer_kernel_layout_bf16_checkpoint_exports_with_cf(ours, tiny_run, tmp_path):
    """A checkpoint in the DeepSpeed transformer-kernel layout, bf16, keys under 'module.',
    without the saved job config: loaded as fp32 weights with the original's keys and exported with --cf."""
    _, state, config = ours
    kernel = {}
    for key, value in state.items():
        prefix, sep, rest = key.partition("attention.self.")
        if sep:
            if rest.startswith("query."):
                p = rest.split(".")[1]
                qkv = [state[f"{prefix}attention.self.{n}.{p}"] for n in ("query", "key", "value")]
                kernel[f"module.{prefix}attn_qkv{p[0]}"] = torch.cat(qkv).bfloat16()
            continue
        for ours_name, kernel_name in (("attention.output.dense.weight", "attn_ow"),
                                       ("attention.output.dense.bias", "attn_ob"),
                                       ("PreAttentionLayerNorm.weight", "norm_w"),
                                       ("PreAttentionLayerNorm.bias", "norm_b"),
                                       ("PostAttentionLayerNorm.weight", "attn_nw"),
                                       ("PostAttentionLayerNorm.bias", "attn_nb"),
                                       ("intermediate.dense_act.weight", "inter_w"),
                                       ("intermediate.dense_act.bias", "inter_b"),
                                       ("output.dense.weight", "output_w"), ("output.dense.bias", "output_b")):
            if key.startswith("bert.encoder.layer.") and key.endswith("." + ours_name):
                key = key[:-len(ours_name)] + kernel_name
                break
        kernel["module." + key] = value.bfloat16()
    assert any(k.endswith("attn_qkvw") for k in kernel) and not any("PreAttention" in k for k in kernel)
    ckpt = tmp_path / "ckpt"
    (ckpt / "epoch9_step1").mkdir(parents=True)
    torch.save({"module": kernel}, ckpt / "epoch9_step1" / "mp_rank_00_model_states.pt")
    (ckpt / "latest").write_text("epoch9_step1")

    loaded, job_config, args = load_checkpoint_state(str(ckpt))
    assert job_config is None and args is None
    assert set(loaded) == set(state)
    for key, value in loaded.items():
        assert value.dtype == torch.float32
        torch.testing.assert_close(value, state[key].bfloat16().float(), rtol=0, atol=0, msg=key)

    # No args.json: the vocab comes from --cf's bert_token_file (made absolute here).
    cf = json.load(open(TINY_CFG))
    cf["bert_token_file"] = tiny_run["root"]
    (tmp_path / "job.json").write_text(json.dumps(cf))
    out = tmp_path / "hf"
    argv = ["--checkpoint_dir", str(ckpt), "--output_dir", str(out), "--cf", str(tmp_path / "job.json")]
    assert export_hf.main(argv) == 0
    saved = safetensors_torch.load_file(str(out / "model.safetensors"))
    torch.testing.assert_close(saved["roberta_prelayernorm.encoder.layer.1.attention.LayerNorm.weight"],
                               loaded["bert.encoder.layer.1.PreAttentionLayerNorm.weight"])


def _error_line(capsys, argv):
    assert export_hf.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err
    return err


@needs_transformers
def test_bad_paths_give_one_line_errors(tiny_run, tmp_path, capsys):
    out = str(tmp_path / "hf")
    missing = str(tmp_path / "nowhere")
    assert missing in _error_line(capsys, ["--checkpoint_dir", missing, "--output_dir", out])
    err = _error_line(capsys, ["--checkpoint_dir", tiny_run["ckpt"], "--tag", "epoch7_step9", "--output_dir", out])
    assert "epoch7_step9" in err and "epoch1_step3" in err  # names the tag and lists those there
    (tmp_path / "no_latest").mkdir()
    assert "latest" in _error_line(capsys, ["--checkpoint_dir", str(tmp_path / "no_latest"), "--output_dir", out])
    (tmp_path / "no_latest" / "tag").mkdir()
    err = _error_line(capsys, ["--checkpoint_dir", str(tmp_path / "no_latest"), "--tag", "tag", "--output_dir", out])
    assert "mp_rank_00_model_states.pt" in err
    assert not os.path.exists(out)

    # The vocab file the run used is gone, the checkpoint has no copy of it (as those written before
    # the copies) and no --cf: the error lists what was tried.
    moved = tmp_path / "moved"
    shutil.copytree(tiny_run["ckpt"], moved)
    os.remove(moved / "epoch2_step6" / "vocab.txt")
    args_file = moved / "epoch2_step6" / "args.json"
    run_args = json.load(open(args_file))
    run_args["vocab_file"] = str(tmp_path / "gone" / "vocab.txt")
    run_args["data_path_prefix"] = str(tmp_path / "gone")
    args_file.write_text(json.dumps(run_args))
    err = _error_line(capsys, ["--checkpoint_dir", str(moved), "--output_dir", out])
    assert "vocab file not found" in err and str(tmp_path / "gone" / "vocab.txt") in err and "--cf" in err


@needs_transformers
def test_the_vocab_is_the_one_the_checkpoint_was_trained_with(tiny_run, tmp_path, capsys):
    """A vocab file of the same size changed at the path args.json names: the copy beside the
    checkpoint is exported; without the copy, the recorded sha256 refuses the changed file."""
    ckpt = tmp_path / "ckpt"
    shutil.copytree(tiny_run["ckpt"], ckpt)
    folder = ckpt / "epoch2_step6"
    trained = (folder / "vocab.txt").read_text()
    changed = tmp_path / "changed_vocab.txt"
    lines = trained.splitlines()
    lines[-1], lines[-2] = lines[-2], lines[-1]                      # same size, two tokens swapped
    changed.write_text("\n".join(lines) + "\n")
    run_args = json.load(open(folder / "args.json"))
    (folder / "args.json").write_text(json.dumps({**run_args, "vocab_file": str(changed)}))
    assert export_hf.main(["--checkpoint_dir", str(folder), "--output_dir", str(tmp_path / "hf")]) == 0
    assert (tmp_path / "hf" / "vocab.txt").read_text().splitlines() == trained.splitlines()
    os.remove(folder / "vocab.txt")
    capsys.readouterr()
    err = _error_line(capsys, ["--checkpoint_dir", str(folder), "--output_dir", str(tmp_path / "hf2")])
    assert f"vocab file {changed} has changed since the checkpoint was trained with it" in err


def test_zero3_and_foreign_inputs_are_refused(tmp_path):
    folder = tmp_path / "tag"
    folder.mkdir()
    torch.save({"module": {"bert.embeddings.word_embeddings.weight": torch.empty(0)}},
               folder / "mp_rank_00_model_states.pt")
    with pytest.raises(ConversionError, match="ZeRO stage 3"):
        load_checkpoint_state(str(folder))
    with pytest.raises(CheckpointNotFoundError, match="checkpoint folder not found"):
        load_checkpoint_state(str(tmp_path / "none"))
    with pytest.raises(CheckpointNotFoundError, match="no model.safetensors"):
        load_hf_folder(str(tmp_path))
    with pytest.raises(ConversionError, match="model_type"):
        hf_to_ours({}, {"model_type": "bert"})
    config = BertConfig(96, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32)
    state = BertForPreTrainingPreLN(config).state_dict()
    del state["bert.encoder.layer.0.output.dense.bias"]
    with pytest.raises(ConversionError, match="missing: bert.encoder.layer.0.output.dense.bias"):
        ours_to_hf(state, config, 96)
