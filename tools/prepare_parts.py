"""Every part of a --num_parts run of tools/prepare_data.py as a task of datatrove's executor, with
its completion marker, so that the same command again reruns only the parts that did not finish.

    python -m tools.prepare_parts --num_parts 8 --parallel_parts 2 \
        --input dump.xml.bz2 --output_dir OUT --tokenizer vocab.txt --workers 4 --num_shards 4

Every flag but this tool's own (--num_parts, --parallel_parts, --overwrite_markers) is
tools/prepare_data.py's, given to each part with its `--num_parts N --part K`: the parts write
into one OUT as prepare_data's parts do (shards and records named by part), and together they
are the dataset training reads. Task K of datatrove's LocalPipelineExecutor (parts run
--parallel_parts at a time on this machine, each with its own --workers) runs part K in-process
(one at a time) or in a process of the executor's pool.

Completion markers are datatrove's own: OUT/.prepare_parts/completions/000KK once part K's shards
are installed, with each task's log in OUT/.prepare_parts/logs/. A part that failed or was
killed has none and is run again by the same command (it continues from its own journal,
OUT/.prepare_data.work.partKofN); the finished parts are skipped. The command a marker folder
was made by is written beside it (OUT/.prepare_parts/command.json: the flags and the inputs'
fingerprint); another command there is refused with one line (--overwrite_markers drops the
markers and runs every part again).

datatrove (pip install -r requirements-corpora.txt) is imported only here. On a SLURM cluster
the same parts run as an array of prepare_data commands (README, "Many machines"), each task
resuming its own part when requeued.
"""
import argparse
import json
import logging
import os
import shutil
import sys

if not __package__:  # run as `python tools/NAME.py`: import from the repository root, as `python -m` does
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from tools import prepare_data
from tools.prep import CorpusError, PrepareDataError
from tools.prep.journal import run_fingerprint
from tools.prep.layouts import require

MARKERS = ".prepare_parts"        # OUT/MARKERS: datatrove's logging folder (completions/, logs/, stats/)


class PreparePart:
    """datatrove's pipeline step (a callable of (data, rank, world_size)): part `rank` of
    `world_size` of prepare_data with the flags `argv` (picklable, for the executor's processes)."""

    def __init__(self, argv):
        self.argv = list(argv)

    def __call__(self, data, rank, world_size):
        args = prepare_data.build_parser().parse_args(self.argv + ["--num_parts", str(world_size), "--part", str(rank)])
        prepare_data.prepare(args)
        return data


def build_parser():
    p = argparse.ArgumentParser(description="Run every part of a prepare_data --num_parts run as a task of "
                                            "datatrove's local executor, with completion markers",
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--num_parts", type=int, required=True, help="the parts (tasks); each is --part K of N")
    p.add_argument("--parallel_parts", type=int, default=1,
                   help="parts run at a time on this machine (each with its own --workers processes)")
    p.add_argument("--overwrite_markers", action="store_true",
                   help="drop the completion markers of another command in OUT and run every part")
    return p


def command_record(argv):
    """What the markers in OUT belong to: prepare_data's flags as every part resolves them (its
    --part aside) and the inputs' and tokenizer's fingerprint."""
    args = prepare_data.resolved_tokenizer(prepare_data.build_parser().parse_args(argv))
    fingerprint = run_fingerprint(args, prepare_data.input_sources(args))
    fingerprint["flags"].pop("part")
    return fingerprint


def check_markers(folder, record, overwrite):
    """Start the marker folder, or check that its markers are this command's."""
    path = os.path.join(folder, "command.json")
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            previous = json.load(f)
        if previous == record:
            return
        if not overwrite:
            raise PrepareDataError(f"{folder}: its completion markers are of another prepare_parts command (other "
                                   "flags or inputs); run that command again to finish it, or add "
                                   "--overwrite_markers to run every part of this one")
        shutil.rmtree(folder)
    os.makedirs(folder, exist_ok=True)
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(record, f)
    os.replace(path + ".tmp", path)


def main(argv=None):
    own, rest = build_parser().parse_known_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        if any(a in ("--part", "--num_parts") or a.startswith(("--part=", "--num_parts=")) for a in rest):
            raise PrepareDataError("--part: prepare_parts runs every part; give --num_parts N only")
        if own.num_parts < 2 or own.parallel_parts < 1:
            raise PrepareDataError(f"--num_parts {own.num_parts} --parallel_parts {own.parallel_parts}: need N >= 2 "
                                   "and at least 1 part at a time")
        first = prepare_data.build_parser().parse_args(rest + ["--num_parts", str(own.num_parts), "--part", "0"])
        prepare_data.validate_args(first)
        folder = os.path.join(first.output_dir, MARKERS)
        check_markers(folder, command_record(rest + ["--num_parts", str(own.num_parts)]), own.overwrite_markers)
        require("datatrove", "prepare_parts")
        from datatrove.executor import LocalPipelineExecutor

        executor = LocalPipelineExecutor(pipeline=[PreparePart(rest)], tasks=own.num_parts,
                                         workers=own.parallel_parts, logging_dir=folder, start_method="fork")
    except (PrepareDataError, CorpusError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    failure = None
    try:
        executor.run()
    except Exception as e:  # noqa: BLE001 - a part's error, reported with the parts left
        failure = e
    left = executor.get_incomplete_ranks(range(own.num_parts))
    if failure is not None or left:
        why = f" ({type(failure).__name__}: {failure})" if failure is not None else ""
        print(f"error: parts {', '.join(map(str, left))} of {own.num_parts} did not finish{why}; their logs are in "
              f"{folder}/logs; the same command runs only them again", file=sys.stderr)
        return 1
    print(f"{own.num_parts} parts done in {first.output_dir} (completion markers: {folder}/completions)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
