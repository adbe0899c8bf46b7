"""Plot the TensorBoard scalars of one or more training runs into one PNG.

    python -m tools.plot_run OUT/runs/JOB [OUT2/runs/JOB2 ...] --output loss.png [--smooth 0.9]

Panels (a panel with no data in any run is left out), all against the optimizer step but one:
- training loss, raw (faint) and smoothed (EMA)        `Train/loss` (else `Train/Samples/train_loss`
                                                         against samples, for runs logged before)
- learning rate                                        `Train/lr`
- validation loss                                      `Validation/step/Loss` (else `Validation/Loss`
                                                         against epoch, for runs logged before)
- validation MLM (and NSP) accuracy, in %              `Validation/step/MLM_accuracy`, `.../NSP_accuracy`
                                                         (else the per-epoch tags against epoch); with one
                                                         run, training minutes on its top axis
- validation MLM accuracy (%) against training minutes several runs only (it compares their speed):
                                                         `Validation/step/MLM_accuracy` with `Validation/train_minutes`
- throughput                                           `Train/samples_per_s`
Each run is one colour and one legend name (its folder) in every panel; NSP accuracy lines take
colours of their own (dashed, square markers, "NSP" after the name). Few points get markers and
an integer step or epoch axis with room around them. `--output` names the PNG (".png" is added
where it lacks one; a folder gets loss.png in it); the path written is printed.
Events are read with `turing.tb_events` (no TensorFlow needed); matplotlib draws off-screen (Agg).
"""
import glob
import logging
import math
import os
import sys

if not __package__:  # run as `python tools/NAME.py`: import from the repository root, as `python -m` does
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from turing.errors import InputValueError, OneLineParser, tool_exit
from turing.tb_events import read_run

logger = logging.getLogger(__name__)

MINUTES_PANEL = "Validation MLM accuracy against training time"
# (title, y label, draw raw + EMA, alternatives): a panel draws the first alternative that any
# run has data for; an alternative is (x label, [(y tag, x tag or None = the event step, suffix)]).
PANELS = [
    ("Training loss (faint: raw)", "loss", True, [("optimizer step", [("Train/loss", None, "")]),
                                                  ("samples", [("Train/Samples/train_loss", None, "")])]),
    ("Learning rate", "learning rate", False, [("optimizer step", [("Train/lr", None, "")])]),
    ("Validation loss", "loss", False, [("optimizer step", [("Validation/step/Loss", None, "")]),
                                        ("epoch", [("Validation/Loss", None, "")])]),
    ("Validation accuracy", "accuracy (%)", False,
     [("optimizer step", [("Validation/step/MLM_accuracy", None, " MLM"), ("Validation/step/NSP_accuracy", None, " NSP")]),
      ("epoch", [("Validation/MLM_accuracy", None, " MLM"), ("Validation/NSP_accuracy", None, " NSP")])]),
    (MINUTES_PANEL, "MLM accuracy (%)", False,
     [("training minutes", [("Validation/step/MLM_accuracy", "Validation/train_minutes", "")])]),
    ("Throughput", "samples / s", False, [("optimizer step", [("Train/samples_per_s", None, "")])]),
]
INTEGER_AXES = ("optimizer step", "epoch")
PERCENT_PANELS = ("Validation accuracy", MINUTES_PANEL)  # logged as fractions, drawn x100 (as the text says them)


class PlotError(InputValueError):
    """A run folder that cannot be plotted; the message names it."""


def ema(values, smooth):
    """TensorBoard-style exponential moving average, debiased so it starts at the first value."""
    out, avg = [], 0.0
    for i, value in enumerate(values, start=1):
        avg = smooth * avg + (1.0 - smooth) * value
        out.append(avg / (1.0 - smooth ** i) if smooth > 0 else value)
    return out


def run_labels(run_dirs):
    """Folder names; where two runs share a name, add the parent folders until they differ."""
    parts = [os.path.normpath(os.path.abspath(d)).split(os.sep) for d in run_dirs]
    depth = 1
    while depth < max(len(p) for p in parts):
        labels = ["/".join(p[-depth:]) for p in parts]
        if len(set(labels)) == len(labels):
            return labels
        depth += 1
    return ["/".join(p[-depth:]) for p in parts]


def load_runs(run_dirs):
    """[(label, {tag: [(step, value)]})] with each tag's points sorted by step (a resumed run
    appends files; the last value written for a step wins)."""
    runs = []
    for run_dir, label in zip(run_dirs, run_labels(run_dirs)):
        if not os.path.isdir(run_dir):
            raise PlotError(f"{run_dir}: run folder not found (expected OUT/runs/JOB with TensorBoard event files)")
        if not glob.glob(os.path.join(run_dir, "**", "events.out.tfevents.*"), recursive=True):
            raise PlotError(f"{run_dir}: no TensorBoard event files (events.out.tfevents.*) in this folder")
        scalars, _ = read_run(run_dir)
        runs.append((label, {tag: sorted(dict(points).items()) for tag, points in scalars.items()}))
    return runs


def _points(scalars, ytag, xtag=None):
    """[(x, y)] of a run's tag `ytag`: x is the event step, or the value of `xtag` logged at
    the same step (points without one are left out)."""
    points = scalars.get(ytag, [])
    if xtag is None:
        return points
    xs = dict(scalars.get(xtag, []))
    return [(xs[step], value) for step, value in points if step in xs]


def plot_runs(run_dirs, output, smooth=0.9):
    """Draw the figure into `output` (PNG); returns {panel title: [line labels drawn]}."""
    if not 0.0 <= smooth < 1.0:
        raise PlotError(f"--smooth must be in [0, 1), got {smooth}")
    runs = load_runs(run_dirs)  # a missing or empty run folder is one line, with or without matplotlib
    try:
        import matplotlib  # optional: only for drawing (the events are read without it)
    except ImportError:
        raise PlotError("drawing needs matplotlib (pip install matplotlib); the runs' events were read") from None

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    panels = []
    for title, ylabel, smoothed, alternatives in PANELS:
        if title == MINUTES_PANEL and len(runs) == 1:
            continue  # one run: the accuracy panel's top axis says the minutes
        chosen = next(((xlabel, series) for xlabel, series in alternatives
                       if any(_points(scalars, y, x) for _, scalars in runs for y, x, _ in series)), None)
        if chosen:
            panels.append((title, ylabel, smoothed) + chosen)
    if not panels:
        raise PlotError(f"{', '.join(run_dirs)}: no scalars to plot (tags read: "
                        f"{', '.join(sorted({t for _, s in runs for t in s})) or 'none'})")
    cols = 2 if len(panels) > 1 else 1
    rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6.5 * cols, 4.0 * rows), squeeze=False)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    drawn = {}
    for ax, (title, ylabel, smoothed, xlabel, series) in zip(axes.flat, panels):
        drawn[title] = []
        xs = []
        for k, (ytag, xtag, suffix) in enumerate(series):
            for r, (label, scalars) in enumerate(runs):
                points = _points(scalars, ytag, xtag)
                if not points:
                    continue
                # the first series takes the run's colour, a second one (NSP) colours of its own
                colour = colours[(k * len(runs) + r) % len(colours)]
                steps, values = zip(*points)
                if title in PERCENT_PANELS:
                    values = [100 * v for v in values]
                xs += steps
                name = label + (suffix if k else "")   # the first series carries the run's name alone
                if smoothed:
                    ax.plot(steps, values, color=colour, alpha=0.25, linewidth=0.8)
                    ax.plot(steps, ema(values, smooth), color=colour, label=name)
                else:
                    marker = ("o", "s")[k % 2] if len(steps) < 30 else None
                    ax.plot(steps, values, color=colour, linestyle=("-", "--")[k % 2], marker=marker, label=name)
                drawn[title].append(name)
        ax.set_title(title.replace("(faint: raw)", f"(EMA {smooth:g}; faint: raw)") if smoothed else title)
        ax.set_xlabel(xlabel)
        if title == "Validation accuracy" and len(runs) == 1 and xlabel == "optimizer step":
            _minutes_on_top(ax, runs[0][1])
        if xlabel in INTEGER_AXES:
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps and epochs are whole
            if max(xs) - min(xs) < 2:  # one or two points: whole numbers around them, not 0.95-1.05
                ax.set_xlim(min(xs) - 1, max(xs) + 1)
        elif xlabel == "training minutes":
            ax.set_xlim(left=0)
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
    fig.savefig(output, dpi=100)
    plt.close(fig)
    return drawn


def _minutes_on_top(ax, scalars):
    """A top axis in training minutes over a step axis (from the run's Validation/train_minutes)."""
    known = sorted(dict(scalars.get("Validation/train_minutes", [])).items())
    if len(known) < 2:
        return
    import numpy as np

    steps, minutes = map(np.asarray, zip(*([(0, 0.0)] + known)))
    top = ax.secondary_xaxis("top", functions=(lambda x: np.interp(x, steps, minutes),
                                               lambda m: np.interp(m, minutes, steps)))
    top.set_xlabel("training minutes")


def output_path(output):
    """Where --output writes: a folder gets loss.png in it; a name without .png gets the suffix."""
    if os.path.isdir(output):
        return os.path.join(output, "loss.png")
    return output if output.lower().endswith(".png") else output + ".png"


def last_validation(run_dirs):
    """One line per run with its last validation point: MLM accuracy, step, training minutes."""
    lines = []
    for label, scalars in load_runs(run_dirs):
        points = _points(scalars, "Validation/step/MLM_accuracy")
        if points:
            step, accuracy = points[-1]
            minutes = dict(scalars.get("Validation/train_minutes", [])).get(step)
            lines.append(f"{label}: validation MLM accuracy {100 * accuracy:.1f}% at step {step}"
                         + ("" if minutes is None else f" ({minutes:.1f} min of training)"))
    return lines


def build_parser():
    parser = OneLineParser(description="Plot training loss, learning rate, validation and throughput "
                                       "of one or more runs (TensorBoard folders OUT/runs/JOB) into a PNG.",
                           epilog="guide: docs/metrics.md")
    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="TensorBoard folder of a run")
    parser.add_argument("--output", "-o", default="loss.png", help="PNG file to write (default: loss.png)")
    parser.add_argument("--smooth", type=float, default=0.9,
                        help="EMA weight for the smoothed training loss, in [0, 1) (default: 0.9)")
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    output = output_path(args.output)

    def run():
        drawn = plot_runs(args.run_dirs, output, args.smooth)
        print("\n".join(last_validation(args.run_dirs) + [f"wrote {output}: {', '.join(drawn)}"]))
        return 0
    return tool_exit(run)


if __name__ == "__main__":
    sys.exit(main())
