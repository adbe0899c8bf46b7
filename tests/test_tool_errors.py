"""Tracebacks turned into one error line: a 0-byte weights file (export and --use_pretrain, our
checkpoints and Hugging Face exports), weights holding a NaN (every reader of weights), a
garbage TensorBoard events file (plot_run), and an export into a folder that holds files
already (refused without --overwrite, never overwritten silently)."""
import json
import logging
import os
import shutil
import signal
import struct
import subprocess
import sys
import time

import pytest
import torch
from tensorboardX.record_writer import masked_crc32c

import deepspeed_train
from tests.launch import REPO, TINY_CFG, ds_config, one_error_line
from tests.test_export_hf import tiny_run  # noqa: F401  (the shared session fixture)
from tools import eval_mlm, export_hf, finetune_glue, plot_run
from turing.checkpoint_files import MODEL_STATES_FILE, resolve_checkpoint_tag_dir


def empty_checkpoint(folder):
    """A checkpoint folder whose model states file has 0 bytes (a disk that filled up)."""
    (folder / "step1").mkdir(parents=True)
    (folder / "step1" / "mp_rank_00_model_states.pt").write_bytes(b"")
    (folder / "latest").write_text("step1")
    return folder


def test_export_of_a_zero_byte_checkpoint_is_one_line(tmp_path, capsys):
    ckpt = empty_checkpoint(tmp_path / "ckpt")
    assert export_hf.main(["--checkpoint_dir", str(ckpt), "--output_dir", str(tmp_path / "hf")]) == 2
    line = one_error_line(capsys.readouterr().err)
    # the trainer's rule for picking a checkpoint, cut-short files included (turing/checkpoint_files.py)
    assert "no checkpoint there can be loaded (step1: mp_rank_00_model_states.pt is empty)" in line
    assert line.endswith("point --checkpoint_dir at another checkpoint")   # not the trainer's --job_name


def hf_folder(folder):
    """A Hugging Face folder's config.json (the weights file is the caller's)."""
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "roberta-prelayernorm"}))
    return folder


def use_pretrain_error(weights, data_root, tmp_path, capsys):
    """The one error line of a tiny training run started --use_pretrain from `weights` (exit code 2)."""
    config = json.load(open(TINY_CFG))
    config["bert_model_file"] = str(weights)
    cf = tmp_path / "job.json"
    cf.write_text(json.dumps(config))
    with pytest.raises(SystemExit) as stop:
        deepspeed_train.main(["--cf", str(cf), "--deepspeed", "--deepspeed_config", str(ds_config(tmp_path)),
                              "--output_dir", str(tmp_path / "out"), "--data_path_prefix", str(data_root),
                              "--max_seq_length", "128", "--max_predictions_per_seq", "20", "--use_nvidia_dataset",
                              "--use_pretrain", "--log_level", "warning"])
    assert stop.value.code == 2
    return one_error_line(capsys.readouterr().err)


@pytest.mark.parametrize("config,said", [
    ({"architectures": ["BertForMaskedLM"], "vocab_size": 30522}, "a Hugging Face folder without model_type; add the "
                                                                   "model's model_type (one of roberta-prelayernorm ("),
    ({"model_type": None}, "a Hugging Face folder without model_type; add"),
    ({"model_type": 7}, "a Hugging Face folder whose model_type is a number, not a name; add"),
    ([1, 2], "an array, not a Hugging Face config (a JSON object with a model_type)"),
], ids=["missing", "null", "number", "array"])
def test_a_folder_whose_config_names_no_model_type_is_said_to_be_one(tmp_path, capsys, config, said):
    """A folder with a config.json but no model_type was read as a checkpoint folder: "no checkpoint
    there (no 'latest' file ...)", about a folder that plainly is a (broken) Hugging Face one."""
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "model.safetensors").write_bytes(b"")
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(json.dumps({"sentence_good": "w1 w2", "sentence_bad": "w2 w1", "UID": "u", "pairID": "0"}) + "\n")
    for tool, argv in ((eval_mlm, ["--model", str(folder), "--pairs", str(pairs), "--output_dir", str(tmp_path / "e")]),
                       (export_hf, ["--checkpoint_dir", str(folder), "--output_dir", str(tmp_path / "x")])):
        assert tool.main(argv) == 2
        assert one_error_line(capsys.readouterr().err).startswith(f"error: {folder / 'config.json'}: {said}")
    (folder / "latest").write_text("step1")      # a checkpoint folder that also holds a config.json: one still
    assert export_hf.main(["--checkpoint_dir", str(folder), "--output_dir", str(tmp_path / "x")]) == 2
    assert f"{folder}: no checkpoint there can be loaded (step1 incomplete)" in one_error_line(capsys.readouterr().err)


@pytest.mark.parametrize("source", ["file", "checkpoint", "hf_export"])
def test_use_pretrain_from_a_zero_byte_file_is_one_line(data_root, tmp_path, capsys, source):
    if source == "file":
        weights = tmp_path / "bert.pt"
        weights.write_bytes(b"")
        expected = "bert.pt: not a torch state dict (empty file, 0 bytes"
    elif source == "hf_export":  # an export whose model.safetensors was cut to 0 bytes
        weights = hf_folder(tmp_path / "hf")
        (weights / "model.safetensors").write_bytes(b"")
        expected = f"{weights / 'model.safetensors'}: not a complete safetensors file (0 bytes"
    else:
        weights = empty_checkpoint(tmp_path / "ckpt")
        expected = "no checkpoint there can be loaded (step1: mp_rank_00_model_states.pt is empty)"
    assert expected in use_pretrain_error(weights, data_root, tmp_path, capsys)


NAN_TENSOR = "bert.encoder.layer.1.attention.self.query.weight"


def nan_checkpoint(tiny_run, folder):
    """A copy of the tiny run's latest checkpoint with one NaN in NAN_TENSOR (a run that diverged)."""
    tag = resolve_checkpoint_tag_dir(tiny_run["ckpt"])
    shutil.copytree(tag, folder / "job" / os.path.basename(tag))
    (folder / "job" / "latest").write_text(os.path.basename(tag))
    path = folder / "job" / os.path.basename(tag) / MODEL_STATES_FILE
    saved = torch.load(path, weights_only=True)
    saved["module"][NAN_TENSOR][0, 0] = float("nan")
    torch.save(saved, path)
    return folder / "job", saved["module"]


def refused(line):
    """`line`, which must refuse NAN_TENSOR as not finite."""
    assert f"tensor {NAN_TENSOR} is not finite (1 NaN and 0 infinite" in line, line
    return line


def refused_line(capsys):
    return refused(one_error_line(capsys.readouterr().err))


def test_every_tool_refuses_weights_that_are_not_finite(tiny_run, tmp_path, capsys):  # noqa: F811
    """A checkpoint whose weights hold a NaN is not scored, exported or fine-tuned: one line naming
    the tensor, exit code 2, no output written (finetune_glue does not advise a lower --lr)."""
    job, _ = nan_checkpoint(tiny_run, tmp_path)
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(json.dumps({"sentence_good": "w1 w2", "sentence_bad": "w2 w1", "UID": "u", "pairID": "0"}) + "\n")
    assert eval_mlm.main(["--model", str(job), "--pairs", str(pairs), "--output_dir", str(tmp_path / "eval")]) == 2
    refused_line(capsys)
    assert not (tmp_path / "eval" / "results.json").exists()
    assert export_hf.main(["--checkpoint_dir", str(job), "--output_dir", str(tmp_path / "hf")]) == 2
    refused_line(capsys)
    assert not (tmp_path / "hf").exists()
    glue = tmp_path / "SST-2"
    glue.mkdir()
    for split in ("train", "dev"):
        (glue / f"{split}.tsv").write_text("sentence\tlabel\n" + "".join(f"w{i} w{i + 1}\t{i % 2}\n" for i in range(8)))
    assert finetune_glue.main(["--model", str(job), "--task", "sst2", "--data_dir", str(glue), "--output_dir",
                               str(tmp_path / "glue"), "--seeds", "1", "--epochs", "1"]) == 2
    assert "--lr" not in refused_line(capsys)
    assert not (tmp_path / "glue").exists()


def test_export_whose_scores_are_not_finite_is_refused(tiny_run, tmp_path, capsys):  # noqa: F811
    """Finite weights whose MLM head overflows: the check of the exported model against ours refuses
    it (a NaN difference passed the check before), and nothing is written."""
    job, _ = nan_checkpoint(tiny_run, tmp_path)
    path = next(job.glob(f"*/{MODEL_STATES_FILE}"))
    saved = torch.load(path, weights_only=True)
    saved["module"][NAN_TENSOR][0, 0] = 0.0
    saved["module"]["cls.predictions.transform.dense_act.weight"].fill_(1e38)
    torch.save(saved, path)
    assert export_hf.main(["--checkpoint_dir", str(job), "--output_dir", str(tmp_path / "hf")]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "our model's MLM scores on a test batch are not finite (NaN or Infinity); not exported" in line
    assert not (tmp_path / "hf").exists()


@pytest.mark.parametrize("source", ["file", "checkpoint", "hf_export"])
def test_use_pretrain_refuses_weights_that_are_not_finite(tiny_run, data_root, tmp_path, capsys, source):  # noqa: F811
    job, state = nan_checkpoint(tiny_run, tmp_path)
    if source == "file":
        weights = tmp_path / "bert.pt"
        torch.save(state, weights)
    elif source == "hf_export":  # read before it is mapped: an export's own tensor names
        from safetensors.torch import save_file

        weights = hf_folder(tmp_path / "hf")
        save_file({NAN_TENSOR: state[NAN_TENSOR].contiguous()}, weights / "model.safetensors")
    else:
        weights = job
    refused(use_pretrain_error(weights, data_root, tmp_path, capsys))


def damaged_record():
    """A record whose header (length and its checksum) is right but whose data is no Event."""
    data = b"\xff" * 20
    header = struct.pack("<Q", len(data))
    return header + struct.pack("<I", masked_crc32c(header)) + data + struct.pack("<I", masked_crc32c(data))


@pytest.mark.parametrize("garbage", [b"hello, this is no event file\n" * 40, bytes(range(256)) * 20, damaged_record()],
                         ids=["text", "binary", "damaged_record"])
def test_plot_of_a_garbage_events_file_is_one_line(tmp_path, capsys, garbage):
    run = tmp_path / "runs" / "job"
    run.mkdir(parents=True)
    events = run / "events.out.tfevents.123.host"
    events.write_bytes(garbage)
    assert plot_run.main([str(run), "--output", str(tmp_path / "x.png")]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert f"{events}: not a TensorBoard event file" in line
    assert not (tmp_path / "x.png").exists()


def test_export_into_a_folder_with_files_needs_overwrite(tiny_run, tmp_path, capsys, caplog):  # noqa: F811
    out = tmp_path / "hf"
    out.mkdir()
    (out / "README.md").write_text("my notes")
    (out / "config.json").write_text('{"model_type": "mine"}')
    (out / "data.csv").write_text("1,2\n")
    argv = ["--checkpoint_dir", tiny_run["ckpt"], "--output_dir", str(out)]
    assert export_hf.main(argv) == 2
    line = one_error_line(capsys.readouterr().err)
    assert f"--output_dir {out} is not empty (README.md, config.json, data.csv)" in line and "--overwrite" in line
    assert (out / "README.md").read_text() == "my notes" and sorted(os.listdir(out)) == [
        "README.md", "config.json", "data.csv"]
    with caplog.at_level(logging.WARNING):
        assert export_hf.main(argv + ["--overwrite"]) == 0
    assert "RobertaPreLayerNorm" in (out / "README.md").read_text()
    assert json.loads((out / "config.json").read_text())["model_type"] == "roberta-prelayernorm"
    assert (out / "data.csv").read_text() == "1,2\n"
    assert any("left in place, not written by this export: data.csv" in r.getMessage() for r in caplog.records)
    assert not [name for name in os.listdir(out) if name.startswith(".export_hf")]


# a tool run in a child whose os.replace is slowed, so a SIGKILL lands between two of its renames
SLOW_RENAMES = ("import os, runpy, sys, time\n"
                "real = os.replace\n"
                "def slow(a, b):\n"
                "    real(a, b)\n"
                "    time.sleep(1.0)\n"
                "os.replace = slow\n"
                "sys.argv = sys.argv[1:]\n"
                "runpy.run_module(sys.argv[0], run_name='__main__', alter_sys=True)\n")


def test_an_export_killed_while_moving_its_files_in_leaves_no_mix_and_the_same_command_ends_it(tiny_run, tmp_path):
    """--overwrite over an earlier export, SIGKILLed between two renames: the folder holds no weights
    to be read with the new config (the earlier export's go first, the new ones last), and the same
    command clears what the kill left (the staging folder, the half-moved files) and exports."""
    out, fresh = tmp_path / "hf", tmp_path / "fresh"
    argv = ["--checkpoint_dir", tiny_run["ckpt"], "--output_dir", str(out)]
    assert export_hf.main(argv) == 0
    assert export_hf.main(["--checkpoint_dir", tiny_run["ckpt"], "--output_dir", str(fresh)]) == 0
    (out / "config.json").write_text('{"model_type": "earlier"}')     # an earlier export, told apart
    child = subprocess.Popen([sys.executable, "-c", SLOW_RENAMES, "tools.export_hf", *argv, "--overwrite"], cwd=REPO,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while json.loads((out / "config.json").read_text() or "{}").get("model_type") == "earlier":
        assert time.time() < deadline and child.poll() is None
        time.sleep(0.02)
    child.send_signal(signal.SIGKILL)                                 # the new config is in, more to come
    child.wait()
    assert not (out / "model.safetensors").exists()
    assert [name for name in os.listdir(out) if name.startswith(".export_hf.")]
    assert export_hf.main(argv + ["--overwrite"]) == 0
    assert sorted(os.listdir(out)) == sorted(os.listdir(fresh))
    for name in os.listdir(fresh):
        if name != "README.md":                                       # (names the output folder)
            assert (out / name).read_bytes() == (fresh / name).read_bytes(), name


TOOLS = sorted(name[:-3] for name in os.listdir(os.path.join(REPO, "tools"))
               if name.endswith(".py") and name != "__init__.py"
               and '__name__ == "__main__"' in open(os.path.join(REPO, "tools", name)).read())


@pytest.mark.parametrize("tool", TOOLS)
def test_every_tool_runs_typed_as_a_file_from_anywhere(tool, tmp_path):
    """`python tools/NAME.py` (how most users first type it) works as `python -m tools.NAME` does,
    from any folder, not a ModuleNotFoundError traceback."""
    done = subprocess.run([sys.executable, os.path.join(REPO, "tools", f"{tool}.py"), "--help"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "usage:" in done.stdout, done.stderr[-2000:]


@pytest.mark.parametrize("tool", [t for t in TOOLS if t != "make_demo_corpus"])
def test_every_tool_answers_a_bad_flag_in_one_line(tool, tmp_path):
    """One `error: ...` line and exit code 2, not argparse's usage block before it."""
    done = subprocess.run([sys.executable, os.path.join(REPO, "tools", f"{tool}.py"), "--no_such_flag"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    err = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(err) == 1 and err[0].startswith("error: ") and err[0].endswith("(see --help)"), \
        done.stderr[-2000:]


@pytest.mark.parametrize("tool", ["eval_mlm", "export_hf", "finetune_glue"])
def test_help_is_answered_before_the_slow_imports(tool):
    """`python -m tools.NAME --help` prints the usage without importing torch, DeepSpeed or
    transformers (it took seconds, and began with DeepSpeed's "Setting accelerator" warning)."""
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", f"tools.{tool}", "--help"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.startswith("usage:"), done.stderr[-2000:]
    imported = {line.rsplit("|", 1)[1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}
    assert "argparse" in imported and not imported & {"torch", "deepspeed", "transformers"}
    assert "Setting accelerator" not in done.stdout + done.stderr


@pytest.mark.parametrize("tool, work, argv", [
    ("export_hf", "export", ["--checkpoint_dir", "c", "--output_dir", "o"]),
    ("eval_mlm", "evaluate", ["--model", "m", "--output_dir", "o"]),
    ("finetune_glue", "finetune", ["--model", "m", "--data_dir", "d", "--task", "all", "--output_dir", "o"]),
    ("plot_run", "plot_runs", ["run"]),
    ("make_minimal_pairs", "make_minimal_pairs", ["--heldout", "h", "--output", "o.jsonl"]),
    ("make_probe_tasks", "make_probe_tasks", ["--input", "i", "--output_dir", "o"]),
    ("quality_table", "load", ["--pretrained", "p", "--random_init", "r"]),
    ("glue_table", "load_run", ["run"]),
])
def test_a_bug_in_a_tool_keeps_its_traceback(tool, work, argv, monkeypatch, capsys):
    """Every tool's main reports bad input (an InputError, an OSError) in one line, and nothing
    else: a bug (here a ValueError planted where the tool does its work) propagates with its
    traceback instead of printing as a user error with exit code 2."""
    import importlib

    module = importlib.import_module(f"tools.{tool}")

    def planted(*args, **kwargs):
        raise ValueError("a planted bug")
    monkeypatch.setattr(module, work, planted)
    with pytest.raises(ValueError, match="a planted bug"):
        module.main(argv)
    assert "error:" not in capsys.readouterr().err
