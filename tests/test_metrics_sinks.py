"""The one metrics path writes TensorBoard and, where --report_to asks, Weights & Biases (offline
mode) and MLflow (a local file store): the same values at the same x in all three; an unknown
sink or a missing package is one error line (neither package is a requirement of the program:
requirements-dev.txt installs them for these tests)."""
import os

import pytest

from testkit import wandb_offline
from tests.launch import ds_config, expect_input_error, train_in_process
from turing.tb_events import read_run


def test_every_sink_gets_the_same_metrics(data_root, tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    out = tmp_path / "out"
    train_in_process(data_root, out, ds_config(tmp_path), "--max_steps", 3, "--report_to", "all",
                     "--validation_data_path_prefix", data_root / "nvidia" / "128")
    board = read_run(os.path.join(out, "runs", "tiny_bert"))[0]
    client = MlflowClient(tracking_uri=f"file:{out / 'mlruns'}")
    (run,) = client.search_runs([client.get_experiment_by_name("bing_bert").experiment_id])
    assert run.info.run_name == "tiny_bert" and run.data.params["max_steps"] == "3"
    for tag in ("Train/lr", "Train/Samples/train_loss", "Validation/step/Loss"):
        expected = board[tag]
        assert len(expected) == (1 if tag.startswith("Validation") else 3)
        same_series(wandb_offline.series(out, tag), expected)
        same_series([(m.step, m.value) for m in client.get_metric_history(run.info.run_id, tag)], expected)


def same_series(got, expected):
    """The same x, and values equal up to TensorBoard's float32."""
    assert [x for x, _ in got] == [x for x, _ in expected]
    assert [v for _, v in got] == pytest.approx([v for _, v in expected], rel=1e-6)


def test_report_to_none_writes_no_metrics_and_bad_names_are_one_line(data_root, tmp_path, capsys, monkeypatch):
    out = tmp_path / "none"
    train_in_process(data_root, out, ds_config(tmp_path), "--max_steps", 1, "--report_to", "none")
    assert not (out / "runs").exists()
    line = expect_input_error(capsys, train_in_process, data_root, tmp_path / "bad", ds_config(tmp_path),
                              "--report_to", "comet")
    assert "--report_to comet: not a known sink; expected some of tensorboard, wandb, mlflow, or all, or none" in line
    monkeypatch.setitem(__import__("sys").modules, "mlflow", None)   # as if not installed
    line = expect_input_error(capsys, train_in_process, data_root, tmp_path / "bad", ds_config(tmp_path),
                              "--report_to", "tensorboard", "mlflow")
    assert "--report_to mlflow: the 'mlflow' package is not installed (pip install mlflow)" in line

