"""tools/plot_run.py: a PNG from the TensorBoard events of a real tiny run (the in-process run
shared with tests/test_export_hf.py), several runs on one figure, and the errors."""
import importlib.util
import os
import sys
import shutil
import struct

import pytest

from tests.test_export_hf import tiny_run  # noqa: F401  (the shared session fixture)
from tools import plot_run

# only drawing needs matplotlib (an optional package): the labels and the smoothing are tested without it
needs_matplotlib = pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None, reason="draws with matplotlib")

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def png_size(path):
    """(width, height) from the IHDR chunk, after checking the signature."""
    with open(path, "rb") as f:
        head = f.read(24)
    assert head[:8] == PNG_SIGNATURE and head[12:16] == b"IHDR"
    return struct.unpack(">II", head[16:24])


@needs_matplotlib
def test_plot_of_a_real_run(tiny_run, tmp_path, capsys):  # noqa: F811
    output = tmp_path / "plots" / "loss.png"
    assert plot_run.main([tiny_run["runs"], "--output", str(output), "--smooth", "0.6"]) == 0
    out = capsys.readouterr().out
    assert "wrote" in out
    assert "tiny_bert: validation MLM accuracy" in out and "at step 6 (" in out   # the run's last point
    width, height = png_size(output)
    assert width >= 600 and height >= 300
    assert output.stat().st_size > 20_000  # drawn panels, not an empty canvas


@needs_matplotlib
def test_panels_follow_the_tags_and_runs_share_a_figure(tiny_run, tmp_path):  # noqa: F811
    # A second run: the same events under another job name.
    other = tmp_path / "runs" / "other_job"
    shutil.copytree(tiny_run["runs"], other)
    drawn = plot_run.plot_runs([tiny_run["runs"], str(other)], str(tmp_path / "two.png"), smooth=0.9)
    # The run trained 6 steps over 2 validated epochs: loss, LR, validation loss and MLM accuracy.
    loss_panel = next(t for t in drawn if t.startswith("Training loss"))
    for title in (loss_panel, "Learning rate", "Validation loss"):
        assert drawn[title] == ["tiny_bert", "other_job"], title
    assert drawn["Validation accuracy"] == ["tiny_bert", "other_job", "tiny_bert NSP", "other_job NSP"]
    # validation points carry the training minutes: accuracy against time compares runs
    assert drawn["Validation MLM accuracy against training time"] == ["tiny_bert", "other_job"]
    assert set(drawn) <= {p[0] for p in plot_run.PANELS}
    png_size(tmp_path / "two.png")
    # one run: every panel against the optimizer step (the loss too), the minutes on the accuracy
    # panel's top axis instead of a panel repeating its series
    alone = plot_run.plot_runs([tiny_run["runs"]], str(tmp_path / "one.png"))
    assert plot_run.MINUTES_PANEL not in alone and all(names == ["tiny_bert"] for t, names in alone.items()
                                                        if t != "Validation accuracy")


@needs_matplotlib
def test_the_output_path_is_the_one_written_and_said(tiny_run, tmp_path, capsys):  # noqa: F811
    (tmp_path / "plots").mkdir()
    for given, written in ((tmp_path / "plots", tmp_path / "plots" / "loss.png"), (tmp_path / "fig", tmp_path / "fig.png")):
        assert plot_run.main([tiny_run["runs"], "--output", str(given)]) == 0
        assert f"wrote {written}:" in capsys.readouterr().out and written.is_file()


def test_runs_with_the_same_name_are_told_apart(tmp_path):
    a, b = tmp_path / "a" / "runs" / "job", tmp_path / "b" / "runs" / "job"
    assert plot_run.run_labels([str(a), str(b)]) == ["a/runs/job", "b/runs/job"]


def test_ema_is_debiased_and_follows_the_data():
    assert plot_run.ema([4.0, 4.0, 4.0], 0.9) == pytest.approx([4.0, 4.0, 4.0])
    smoothed = plot_run.ema([10.0, 0.0, 0.0, 0.0], 0.5)
    assert smoothed[0] == pytest.approx(10.0)
    assert smoothed[1:] == sorted(smoothed[1:], reverse=True) and 0 < smoothed[-1] < 10.0
    assert plot_run.ema([1.0, 2.0], 0.0) == [1.0, 2.0]


def test_missing_events_and_bad_smoothing_are_one_line_errors(tiny_run, tmp_path, capsys):  # noqa: F811
    """(Read before anything is drawn: the same lines without matplotlib.)"""
    empty = tmp_path / "empty_run"
    empty.mkdir()
    assert plot_run.main([tiny_run["runs"], str(empty), "--output", str(tmp_path / "x.png")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and str(empty) in err and "no TensorBoard event files" in err
    assert "\n" not in err
    assert plot_run.main([str(tmp_path / "absent"), "--output", str(tmp_path / "x.png")]) == 2
    assert "run folder not found" in capsys.readouterr().err
    assert plot_run.main([tiny_run["runs"], "--smooth", "1.5", "--output", str(tmp_path / "x.png")]) == 2
    assert "--smooth" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "x.png")


@needs_matplotlib
def test_accuracy_is_drawn_in_percent_as_the_text_says_it(tmp_path, monkeypatch, capsys):
    """A run that logged MLM accuracy 0.25 then 0.5 (fractions): the accuracy panels draw 25 and 50
    on an axis labelled %, and the printed line says 50.0%."""
    import matplotlib.figure
    from tensorboardX import SummaryWriter

    runs = []
    for name in ("a", "b"):
        runs.append(str(tmp_path / name / "runs" / "job"))
        with SummaryWriter(runs[-1]) as writer:
            for step, (accuracy, minutes) in enumerate(((0.25, 1.0), (0.5, 2.0)), start=1):
                writer.add_scalar("Validation/step/MLM_accuracy", accuracy, step)
                writer.add_scalar("Validation/train_minutes", minutes, step)
    figures, savefig = [], matplotlib.figure.Figure.savefig
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig",
                        lambda self, *a, **k: (figures.append(self), savefig(self, *a, **k))[1])
    assert plot_run.main([runs[0], "--output", str(tmp_path / "one.png")]) == 0
    assert "validation MLM accuracy 50.0% at step 2" in capsys.readouterr().out
    plot_run.plot_runs(runs, str(tmp_path / "two.png"))
    drawn = {}
    for figure in figures:
        for ax in figure.axes:
            if ax.get_visible() and ax.get_lines():
                drawn.setdefault(ax.get_title(), []).append((ax.get_ylabel(), list(ax.get_lines()[0].get_ydata())))
    assert drawn["Validation accuracy"] == [("accuracy (%)", [25.0, 50.0])] * 2
    assert drawn[plot_run.MINUTES_PANEL] == [("MLM accuracy (%)", [25.0, 50.0])]


def test_without_matplotlib_the_events_are_read_and_drawing_is_one_line(tiny_run, tmp_path, capsys, monkeypatch):  # noqa: F811
    monkeypatch.setitem(sys.modules, "matplotlib", None)     # as if not installed
    assert plot_run.main([str(tmp_path / "absent"), "--output", str(tmp_path / "x.png")]) == 2
    assert "run folder not found" in capsys.readouterr().err
    assert plot_run.main([tiny_run["runs"], "--output", str(tmp_path / "x.png")]) == 2
    assert "error: drawing needs matplotlib (pip install matplotlib)" in capsys.readouterr().err
