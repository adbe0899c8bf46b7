"""Run deepspeed_train.py from tests: through the real `deepspeed` launcher (the command line and
environment are testkit.launcher's, shared with bench/) or in this process, on the tiny configs."""
import glob
import json
import os
import subprocess
import sys
import time

import pytest

from testkit.launcher import REPO, TINY_CFG, TINY_DS, launch_env, progress, train_cmd  # noqa: F401 (re-exported)


def launch(train_args, num_ranks=1, timeout=600):
    """Run the training script under the launcher; returns the CompletedProcess (text output)."""
    return subprocess.run(train_cmd(train_args, num_ranks), cwd=REPO, env=launch_env(), capture_output=True,
                          text=True, timeout=timeout)


def start(train_args, out_file, num_ranks=1):
    """Start a launcher run in its own process group (as a shell job), output to a file."""
    return subprocess.Popen(train_cmd(train_args, num_ranks), cwd=REPO, env=launch_env(), stdout=open(out_file, "w"),
                            stderr=subprocess.STDOUT, start_new_session=True)


HELD_TRAINER = os.path.join(REPO, "tests", "held_trainer.py")


def start_held(train_args, out_file, tag, at, num_ranks=None):
    """Start the trainer in its own process group, output to a file, held at point `at` ("engine" or
    "marker": tests/held_trainer.py) of its write of checkpoint `tag` until killed (wait_for_line(...,
    "PAUSED")); as `python deepspeed_train.py` (one rank, no launcher) or, given `num_ranks`, under
    the launcher."""
    env = {**launch_env(), "HELD_TAG": tag, "HELD_AT": at}
    args = [str(a) for a in train_args]
    cmd = [sys.executable, HELD_TRAINER, *args] if num_ranks is None else \
        train_cmd(args, num_ranks, script=HELD_TRAINER)
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=open(out_file, "w"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def start_held_before_marker(train_args, out_file, tag):
    """start_held one rank, just before checkpoint `tag`'s completion marker."""
    return start_held(train_args, out_file, tag, "marker")


def start_held_in_engine_write(train_args, out_file, tag):
    """start_held one rank, where the engine has begun writing checkpoint `tag`'s files (its
    model states file there, still empty)."""
    return start_held(train_args, out_file, tag, "engine")


def wait_for_line(proc, out_file, text, timeout=300):
    """Wait until a started run has printed a line holding `text`."""
    wait_for_output(proc, out_file, lambda log: any(text in line for line in log.splitlines()), f"{text!r} not printed",
                    timeout)


def wait_for_step(proc, out_file, step, timeout=300):
    """Wait until a started run has logged optimizer step `step`; returns the last step logged."""
    def reached(log):
        rows = progress(log)
        return rows[-1][0] if rows and rows[-1][0] >= step else None
    return wait_for_output(proc, out_file, reached, f"step {step} not reached", timeout)


def wait_for_output(proc, out_file, found, what, timeout):
    """Poll a started run's log until found(log) is truthy (returned); the run ending first, or
    `timeout` seconds (a hang guard), fails with its log."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        result = found(open(out_file).read())
        if result:
            return result
        assert proc.poll() is None, open(out_file).read()[-3000:]
        time.sleep(0.2)
    raise AssertionError(f"{what} in {timeout} s")


def tiny_argv(data_root, out, *extra, seq=128, cf=TINY_CFG, ds=TINY_DS, nvidia=True):
    """The command line of a tiny run (the one builder every test uses): job config `cf`, DeepSpeed
    config `ds`, data under `data_root`, output to `out`, NVIDIA shards (Bing with nvidia=False),
    then `extra`; all strings."""
    args = ["--cf", cf, "--deepspeed", "--deepspeed_config", ds, "--output_dir", out, "--data_path_prefix", data_root,
            "--max_seq_length", seq, "--max_predictions_per_seq", 20, *(["--use_nvidia_dataset"] if nvidia else []),
            *extra]
    return [str(a) for a in args]


def tiny_args(data_root, out, seq=128, *extra, nvidia=True):
    """tiny_argv for the launcher tests, sequence length positional."""
    return tiny_argv(data_root, out, *extra, seq=seq, nvidia=nvidia)


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

    return deepspeed_train.main(tiny_argv(data_root, out, "--print_steps", 1, "--log_level", "warning", *extra,
                                          cf=cf, ds=ds, nvidia=nvidia))


def train_losses(out, job="tiny_bert"):
    """The per-step training losses a run logged to TensorBoard under OUT/runs/JOB."""
    from turing.tb_events import read_run

    values, _ = read_run(os.path.join(out, "runs", job))
    return [v for _, v in values["Train/Samples/train_loss"]]


def event_files(out, job="tiny_bert"):
    """The TensorBoard event files under OUT/runs/JOB."""
    return set(glob.glob(os.path.join(out, "runs", job, "**", "events.out.tfevents.*"), recursive=True))


def new_event_losses(out, before, job="tiny_bert"):
    """[(samples, loss)] of the training losses in the event files under OUT/runs/JOB that are not
    in `before` (event_files of an earlier moment): what the sessions since then logged."""
    from turing.tb_events import iter_events

    return [(event.step, value.simple_value) for path in sorted(event_files(out, job) - before)
            for event in iter_events(path) for value in event.summary.value if value.tag == "Train/Samples/train_loss"]


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


def tool_error_line(capsys, main, argv):
    """A tool's main(argv) must exit with code 2 having printed exactly one line to stderr, its
    `error: ...` line; returns it."""
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


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
