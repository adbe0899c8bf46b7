"""Where metrics go: TensorBoard (the original's, the default), and, where `--report_to` asks for
them, Weights & Biases and MLflow, the integrations Hugging Face's Trainer users know by the same
names (`--report_to tensorboard wandb mlflow`, `all`, `none`). Each sink takes every metric the
run writes as `log(step, {tag: value})` (turing.reporting.Reporter, on rank 0): a string is text,
a list or array of numbers a histogram, anything else a scalar, `step` the value's x (the global
step, the samples seen, or the epoch, as the tag says).

- TensorBoard: tensorboardX event files in OUT/runs/JOB (`tensorboard_writer`, the one place a
  writer is made, also for the tools' own scalars).
- W&B: `wandb.init` in OUT (project $WANDB_PROJECT, default bing_bert; the run named after the
  job; mode from $WANDB_MODE, e.g. `offline` on a machine without an account); the resolved
  arguments as its config. W&B wants one increasing step per run, and the metrics here have
  their own x axes: each tag's x is logged beside it as `_x/TAG` and made its step metric
  (`define_metric`); the leading underscore keeps those out of W&B's default panels.
- MLflow: a run (named after the job) in experiment $MLFLOW_EXPERIMENT_NAME (default bing_bert)
  at $MLFLOW_TRACKING_URI, else a local file store in OUT/mlruns (`mlflow ui --backend-store-uri
  OUT/mlruns`); scalars as metrics at their x, text as artifacts, the arguments as parameters
  (histograms have no MLflow form and are left to the other sinks).

Neither W&B nor MLflow is a requirement: asking for one that is not installed is one error line
before any work (`check_report_to`).
"""
import hashlib
import json
import os
import time

import numpy as np
from tensorboardX import SummaryWriter

from turing.errors import InputError

SINKS = ("tensorboard", "wandb", "mlflow")
PACKAGES = {"wandb": "wandb", "mlflow": "mlflow"}   # sink -> the package it needs (pip install NAME)
MLFLOW_PARAM_CHARS = 6000                            # MLflow's limit on a parameter's value


def check_report_to(names):
    """The sinks of a --report_to list (`all`: every one, `none`: none), each checked to be
    usable; an unknown name or a package that is not installed is one InputError line."""
    names = list(names)
    if names == ["none"]:
        return ()
    if "all" in names:
        names = list(SINKS)
    unknown = [n for n in names if n not in SINKS]
    if unknown:
        raise InputError(f"--report_to {' '.join(unknown)}: not a known sink; expected some of {', '.join(SINKS)}, "
                         f"or all, or none")
    for name in names:
        package = PACKAGES.get(name)
        if package is not None:
            try:
                __import__(package)
            except ImportError:
                raise InputError(f"--report_to {name}: the '{package}' package is not installed (pip install "
                                 f"{package}); it is not one of this project's requirements") from None
    return tuple(dict.fromkeys(names))


def tensorboard_writer(folder):
    """A TensorBoard writer of event files in `folder`, with a unique file suffix (a resumed
    session in the same second must not overwrite the file)."""
    return SummaryWriter(folder, filename_suffix=f".{os.getpid()}.{time.time_ns()}")


def write_metrics(writer, step, values):
    """The one place metrics reach TensorBoard: every {tag: value} at x = `step`. A string is
    written as text, a list or array of numbers as a histogram, anything else as a scalar.
    Without a writer (ranks other than 0) nothing is written."""
    if writer is None:
        return
    for tag, value in values.items():
        if isinstance(value, str):
            writer.add_text(tag, value, step)
        elif isinstance(value, (list, tuple, np.ndarray)):
            writer.add_histogram(tag, np.asarray(value), step)
        else:
            writer.add_scalar(tag, value, step)


class TensorBoardSink:
    def __init__(self, folder):
        self.folder = folder
        self._writer = None     # opened at the first metric, so a run that fails to start writes none

    @property
    def writer(self):
        if self._writer is None:
            self._writer = tensorboard_writer(self.folder)
        return self._writer

    def log(self, step, values):
        write_metrics(self.writer, step, values)

    def flush(self):
        """Closed and reopened at the next metric: tensorboardX's flush leaves queued events in memory."""
        self.close()

    def close(self):
        if self._writer is not None:
            self._writer.close()
            self._writer = None


class WandbSink:
    def __init__(self, cfg):
        import wandb

        # one W&B run per job folder, continued when the job resumes
        run_id = hashlib.sha256(os.path.abspath(cfg.saved_model_path).encode()).hexdigest()[:16]
        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", "bing_bert"), name=cfg.job_name, id=run_id,
                              resume="allow", dir=cfg.output_dir, config=json.loads(json.dumps(cfg.arguments,
                                                                                             default=str)))
        self._wandb = wandb
        self._axes = set()

    def log(self, step, values):
        data = {}
        for tag, value in values.items():
            if isinstance(value, str):
                continue  # text: the run's config holds the arguments
            if isinstance(value, (list, tuple, np.ndarray)):
                value = self._wandb.Histogram(np.asarray(value))
            if tag not in self._axes:
                self.run.define_metric(tag, step_metric=f"_x/{tag}")
                self._axes.add(tag)
            data[tag], data[f"_x/{tag}"] = value, step
        if data:
            self.run.log(data)

    def flush(self):
        pass

    def close(self):
        self.run.finish()


class MlflowSink:
    def __init__(self, cfg):
        import mlflow
        from mlflow.tracking import MlflowClient

        uri = os.environ.get("MLFLOW_TRACKING_URI") or f"file:{os.path.abspath(os.path.join(cfg.output_dir, 'mlruns'))}"
        if uri.startswith("file:"):  # MLflow keeps its local file store, now in maintenance, behind this switch
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.client = MlflowClient(tracking_uri=uri)
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME", "bing_bert")
        experiment = self.client.get_experiment_by_name(name)
        experiment_id = experiment.experiment_id if experiment is not None else self.client.create_experiment(name)
        self.run_id = self.client.create_run(experiment_id, run_name=cfg.job_name).info.run_id
        self._metric = mlflow.entities.Metric
        params = [mlflow.entities.Param(k, json.dumps(v, default=str)[:MLFLOW_PARAM_CHARS])
                  for k, v in sorted(cfg.arguments.items())]
        for i in range(0, len(params), 100):  # MLflow takes at most 100 parameters a call
            self.client.log_batch(self.run_id, params=params[i:i + 100])

    def log(self, step, values):
        now = int(time.time() * 1000)
        metrics = []
        for tag, value in values.items():
            if isinstance(value, str):
                self.client.log_text(self.run_id, value, f"{tag}.txt")
            elif not isinstance(value, (list, tuple, np.ndarray)):
                metrics.append(self._metric(tag, float(value), now, int(step or 0)))
        if metrics:
            self.client.log_batch(self.run_id, metrics=metrics)

    def flush(self):
        pass

    def close(self):
        self.client.set_terminated(self.run_id)


def open_sinks(cfg, names):
    """The sinks `names` (check_report_to's) of a run's config: TensorBoard in its tensorboard_path."""
    kinds = {"tensorboard": lambda: TensorBoardSink(cfg.tensorboard_path), "wandb": lambda: WandbSink(cfg),
             "mlflow": lambda: MlflowSink(cfg)}
    return [kinds[name]() for name in names]
