"""Run deepspeed_train.py through the real `deepspeed` launcher from tests."""
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY_CFG = os.path.join(REPO, "configs", "tiny", "bert_config.json")
TINY_DS = os.path.join(REPO, "configs", "tiny", "ds_config.json")
PROGRESS = re.compile(r"bing_bert_progress: step=(\d+), loss=([0-9.eE+-]+|nan|inf), lr=([0-9.eE+-]+), "
                      r"sample_count=(\d+)")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launcher_cmd(num_ranks=1):
    exe = shutil.which("deepspeed")
    base = [exe] if exe else [sys.executable, "-m", "deepspeed.launcher.runner"]
    return base + ["--num_gpus", str(num_ranks), "--master_port", str(free_port())]


def launch_env():
    """The test process's environment without a process group of its own (the launcher sets it)."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK",
                                                             "MASTER_ADDR", "MASTER_PORT")}
    env["PYTHONUNBUFFERED"] = "1"
    env["OMP_NUM_THREADS"] = "1"  # tiny models; ranks share the machine's cores
    return env


def train_cmd(train_args, num_ranks=1):
    return launcher_cmd(num_ranks) + [os.path.join(REPO, "deepspeed_train.py")] + [str(a) for a in train_args]


def launch(train_args, num_ranks=1, timeout=600):
    """Run the training script under the launcher; returns the CompletedProcess (text output)."""
    return subprocess.run(train_cmd(train_args, num_ranks), cwd=REPO, env=launch_env(), capture_output=True,
                          text=True, timeout=timeout)


def start(train_args, out_file):
    """Start a launcher run in its own process group (as a shell job), output to a file."""
    return subprocess.Popen(train_cmd(train_args), cwd=REPO, env=launch_env(), stdout=open(out_file, "w"),
                            stderr=subprocess.STDOUT, start_new_session=True)


def wait_for_step(proc, out_file, step, timeout=300):
    """Wait until a started run has logged optimizer step `step`; returns the last step logged."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        rows = progress(open(out_file).read())
        if rows and rows[-1][0] >= step:
            return rows[-1][0]
        assert proc.poll() is None, open(out_file).read()[-3000:]
        time.sleep(0.2)
    raise AssertionError(f"step {step} not reached in {timeout} s")


def tiny_args(data_root, out, seq=128, *extra, nvidia=True):
    args = ["--cf", TINY_CFG, "--deepspeed", "--deepspeed_config", TINY_DS, "--output_dir", str(out),
            "--data_path_prefix", str(data_root), "--max_seq_length", str(seq), "--max_predictions_per_seq", "20"]
    if nvidia:
        args.append("--use_nvidia_dataset")
    return args + [str(x) for x in extra]


def progress(output):
    """[(step, loss, lr, samples)] of the progress lines in a run's output."""
    return [(int(s), float(l), float(r), int(c)) for s, l, r, c in PROGRESS.findall(output)]


def ds_config(tmp_path, **extra):
    """Write a tiny-run DeepSpeed config (AdamW, micro batch 16) with `extra` keys to tmp_path/ds.json."""
    config = {"train_micro_batch_size_per_gpu": 16, "gradient_accumulation_steps": 1, "steps_per_print": 10 ** 6,
              "optimizer": {"type": "AdamW", "params": {"lr": 2e-3, "torch_adam": True, "fused": True}},
              "gradient_clipping": 1.0}
    config.update(extra)
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(config))
    return path


def train_in_process(data_root, out, ds, *extra, cf=TINY_CFG, nvidia=True):
    """deepspeed_train.main in this process, NVIDIA provider (Bing with nvidia=False), tiny config
    unless `cf` is given."""
    import deepspeed_train

    return deepspeed_train.main(["--cf", str(cf), "--deepspeed", "--deepspeed_config", str(ds), "--output_dir", str(out),
                                 "--data_path_prefix", str(data_root), "--max_seq_length", "128",
                                 "--max_predictions_per_seq", "20", *(["--use_nvidia_dataset"] if nvidia else []),
                                 "--print_steps", "1", "--log_level", "warning", *[str(x) for x in extra]])


def train_losses(out, job="tiny_bert"):
    """The per-step training losses a run logged to TensorBoard under OUT/runs/JOB."""
    from turing.tb_events import read_run

    values, _ = read_run(os.path.join(out, "runs", job))
    return [v for _, v in values["Train/Samples/train_loss"]]


def plain_model_from_checkpoint(out, tag="epoch2_step8", job="tiny_bert"):
    """A plain model of the tiny config with the weights of OUT/saved_models/JOB/TAG, loaded with
    strict=True: it raises unless the checkpoint has the original's keys, whatever options trained it."""
    import torch

    from turing.modeling import BertConfig, BertForPreTrainingPreLN

    saved = torch.load(os.path.join(out, "saved_models", job, tag, "mp_rank_00_model_states.pt"),
                       weights_only=False)["module"]
    with open(TINY_CFG, encoding="utf-8") as f:
        bert = json.load(f)["bert_model_config"]
    vocab = saved["bert.embeddings.word_embeddings.weight"].shape[0]
    config = BertConfig.from_dict({**bert, "vocab_size_or_config_json_file": vocab})
    model = BertForPreTrainingPreLN(config)
    model.load_state_dict(saved, strict=True)
    return model


def one_error_line(err):
    """The single `error: ...` line of a run's stderr (and no traceback)."""
    lines = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def expect_input_error(capsys, call, *args, **kwargs):
    """call(*args, **kwargs) must stop with exit code 2 and one error line; returns that line."""
    with pytest.raises(SystemExit) as stop:
        call(*args, **kwargs)
    err = capsys.readouterr().err
    assert stop.value.code == 2, err
    return one_error_line(err)
