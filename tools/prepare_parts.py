"""Every part of a --num_parts run of tools/prepare_data.py as a task of datatrove's executor, with
its completion marker, so that the same command again reruns only the parts that did not finish.

    python -m tools.prepare_parts --num_parts 8 --parallel_parts 2 \
        --input dump.xml.bz2 --output_dir OUT --tokenizer vocab.txt --workers 4 --num_shards 4

Every flag but this tool's own (--num_parts, --parallel_parts, --overwrite_markers, --executor and
the --ray_ ones) is tools/prepare_data.py's, given to each part with its `--num_parts N --part K`:
the parts write into one OUT as prepare_data's parts do (shards and records named by part), and
together they are the dataset training reads. Task K runs part K, --parallel_parts at a time, each
with its own --workers:

- --executor local (the default): datatrove's LocalPipelineExecutor on this machine, part K
  in-process (one at a time) or in a process of the executor's pool;
- --executor ray: datatrove's RayPipelineExecutor on the Ray cluster at --ray_address (default:
  RAY_ADDRESS, else the cluster `ray start` started on this machine, else a local one started for
  the run and ended with it, as ray.init() chooses), part K in a process of a Ray actor that
  reserves --workers CPUs and --ray_mem_per_cpu_gb GB per CPU on one node. OUT must be on a
  filesystem every node shares, at the same path, and so must this repository, which the workers
  import (it is put on their PYTHONPATH). A part that fits on no node is refused before any runs.
  A cluster that asks for a token (Ray's default) is reached at an address given with
  RAY_AUTH_MODE=token and its token here (~/.ray/auth_token or RAY_AUTH_TOKEN). An address where
  nothing answers is one error line before ray.init, which would retry it for about 15 minutes.

Completion markers are datatrove's own: OUT/.prepare_parts/completions/000KK once part K's shards
are installed, with each task's log in OUT/.prepare_parts/logs/. A part that failed or was
killed has none and is run again by the same command (it continues from its own journal,
OUT/.prepare_data.work.partKofN); the finished parts are skipped. The command a marker folder
was made by is written beside it (OUT/.prepare_parts/command.json: the flags and the inputs'
fingerprint); another command there is refused with one line (--overwrite_markers drops the
markers and runs every part again). Both executors keep the same markers, so either one finishes a
run the other began. A part's error is named in the exit line with either (Ray's executor only logs
it: the part also writes it to OUT/.prepare_parts/errors/000KK).

datatrove (pip install -r requirements-corpora.txt) is imported only here, ray (pip install ray)
only with --executor ray, which connects to no cluster when every part is done. On a SLURM cluster
the same parts run as an array of prepare_data commands (README, "Many machines"), each task
resuming its own part when requeued.
"""
import argparse
import contextlib
import json
import logging
import math
import os
import shutil
import socket
import sys

if not __package__:  # run as `python tools/NAME.py`: import from the repository root, as `python -m` does
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # = ROOT below

from tools import prepare_data
from tools.prep import CorpusError, PrepareDataError
from tools.prep.journal import run_fingerprint
from tools.prep.layouts import require
from turing.errors import OneLineParser

MARKERS = ".prepare_parts"        # OUT/MARKERS: datatrove's logging folder (completions/, logs/, stats/)
ERRORS = "errors"                 # MARKERS/ERRORS: a part's error line, where Ray's executor ran it
NICENESS = "RAY_worker_niceness"   # Ray's setting of its workers' niceness (default 15)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # the repository the Ray workers import


class PreparePart:
    """datatrove's pipeline step (a callable of (data, rank, world_size)): part `rank` of
    `world_size` of prepare_data with the flags `argv` (picklable, for the executor's processes).
    With `errors` (a folder), the error a part raised is also its line there (000KK, until the part
    runs again): Ray's executor keeps a part's exception to itself and only logs it."""

    def __init__(self, argv, errors=None):
        self.argv = list(argv)
        self.errors = errors

    def __call__(self, data, rank, world_size):
        error = error_path(self.errors, rank) if self.errors else None
        if error and os.path.exists(error):
            os.remove(error)
        try:
            args = prepare_data.build_parser().parse_args(self.argv + ["--num_parts", str(world_size),
                                                                       "--part", str(rank)])
            prepare_data.prepare(args)
        except Exception as e:
            if error:
                os.makedirs(self.errors, exist_ok=True)
                with open(error, "w", encoding="utf-8") as f:
                    f.write(f"{type(e).__name__}: {e}")
            raise
        return data


def error_path(errors, rank):
    """Where part `rank` leaves its error line in the folder `errors` (000KK, as datatrove names its markers)."""
    return os.path.join(errors, f"{rank:05d}")


def recorded_error(errors, ranks):
    """The error line the first of `ranks` left in `errors` (PreparePart's folder), or None."""
    for rank in ranks:
        path = error_path(errors, rank)
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                return f.read()
    return None


def build_parser():
    p = OneLineParser(description="Run every part of a prepare_data --num_parts run as a task of "
                                  "datatrove's local or Ray executor, with completion markers",
                      formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--num_parts", type=int, required=True, help="the parts (tasks); each is --part K of N")
    p.add_argument("--parallel_parts", type=int, default=1,
                   help="parts run at a time, on this machine or the Ray cluster (each with its own --workers "
                        "processes)")
    p.add_argument("--overwrite_markers", action="store_true",
                   help="drop the completion markers of another command in OUT and run every part")
    p.add_argument("--executor", choices=("local", "ray"), default="local",
                   help="local: datatrove's LocalPipelineExecutor on this machine; ray: its RayPipelineExecutor on "
                        "a Ray cluster (pip install ray)")
    p.add_argument("--ray_address", default=None,
                   help="--executor ray: the cluster's HEAD:PORT (default: RAY_ADDRESS, else the cluster `ray "
                        "start` started on this machine, else a local one for the run, as ray.init() finds it)")
    p.add_argument("--ray_mem_per_cpu_gb", type=float, default=2,
                   help="--executor ray: memory a part reserves on its node per --workers CPU (datatrove's "
                        "mem_per_cpu_gb)")
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


def make_executor(own, rest, folder, workers):
    """datatrove's executor of the parts: `workers` is each part's --workers (its CPUs on a Ray node)."""
    if own.executor == "local":
        from datatrove.executor import LocalPipelineExecutor

        return LocalPipelineExecutor(pipeline=[PreparePart(rest)], tasks=own.num_parts,
                                     workers=own.parallel_parts, logging_dir=folder, start_method="fork")
    require("ray", "prepare_parts --executor ray", requirements=None)
    from datatrove.executor import RayPipelineExecutor

    return RayPipelineExecutor(pipeline=[PreparePart(rest, os.path.join(folder, ERRORS))], tasks=own.num_parts,
                               workers=own.parallel_parts, logging_dir=folder, cpus_per_task=workers,
                               mem_per_cpu_gb=own.ray_mem_per_cpu_gb)


@contextlib.contextmanager
def ray_cluster(address):
    """Connected to the Ray cluster at `address` (None: as ray.init() finds one, or a local one
    started here) for the block, with this repository on the workers' PYTHONPATH; a driver the
    caller connected already (ray.is_initialized()) is used as it is and left connected. A local
    cluster started here runs its workers at the usual priority, as the local executor's parts run
    (Ray's own default, niceness 15, lets any other work on the machine starve them)."""
    check_answers(address)
    import ray

    if ray.is_initialized():
        yield ray
        return
    path = os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))
    niceness = os.environ.get(NICENESS)
    os.environ.setdefault(NICENESS, "0")        # read by a raylet this ray.init starts, not by a running one
    try:
        ray.init(address=address, runtime_env={"env_vars": {"PYTHONPATH": path}})
    except (ValueError, RuntimeError) as e:     # a malformed address, another Ray version, too small a /dev/shm
        raise PrepareDataError(f"ray.init(address={address!r}): {e}") from None
    except ConnectionError as e:                # Ray sends its token to an address given only when told to
        hint = "" if os.environ.get("RAY_AUTH_MODE") else (
            "; a cluster that asks for a token (Ray's default) needs RAY_AUTH_MODE=token here and its token "
            "(~/.ray/auth_token or RAY_AUTH_TOKEN)")
        raise PrepareDataError(f"{e}{hint}") from None
    finally:
        if niceness is None:
            del os.environ[NICENESS]
    try:
        yield ray
    finally:
        ray.shutdown()


def check_answers(address, timeout=10.0):
    """A Ray address given as HOST:PORT (--ray_address, else RAY_ADDRESS; `ray://` too) must take a
    connection: where nothing answers, ray.init retries for about 15 minutes before it says so."""
    given = address if address is not None else os.environ.get("RAY_ADDRESS")
    flag = "--ray_address" if address is not None else "RAY_ADDRESS"
    if not given or given in ("auto", "local"):
        return
    host, sep, port = given.removeprefix("ray://").rpartition(":")
    if not sep or not port.isdigit():
        return                                    # ray.init names what is wrong with it
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as e:
        raise PrepareDataError(f"{flag} {given}: nothing answers there ({e.strerror or e}); start the cluster "
                               "(`ray start --head` on its head node) or give the address `ray start` printed") \
            from None


def check_fits(ray, executor):
    """A part's CPUs and memory on one alive node of the cluster: a part that fits on none would
    wait for a node for ever (Ray's placement group of the part is never ready)."""
    cpus, memory = executor.cpus_per_task, executor.mem_per_cpu_gb * executor.cpus_per_task * 2 ** 30
    nodes = [node["Resources"] for node in ray.nodes() if node["Alive"]]
    if not any(node.get("CPU", 0) >= cpus and node.get("memory", 0) >= memory for node in nodes):
        largest = ", ".join(f"{node.get('CPU', 0):g} CPUs and {node.get('memory', 0) / 2 ** 30:.1f} GB"
                            for node in nodes) or "none alive"
        raise PrepareDataError(f"--workers {cpus} --ray_mem_per_cpu_gb {executor.mem_per_cpu_gb:g}: a part needs "
                               f"{cpus} CPUs and {memory / 2 ** 30:.1f} GB on one node; the Ray cluster's nodes "
                               f"have {largest}")


def main(argv=None):
    own, rest = build_parser().parse_known_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    with contextlib.ExitStack() as connected:
        try:
            if any(a in ("--part", "--num_parts") or a.startswith(("--part=", "--num_parts=")) for a in rest):
                raise PrepareDataError("--part: prepare_parts runs every part; give --num_parts N only")
            if own.num_parts < 2 or own.parallel_parts < 1:
                raise PrepareDataError(f"--num_parts {own.num_parts} --parallel_parts {own.parallel_parts}: need "
                                       "N >= 2 and at least 1 part at a time")
            if not math.isfinite(own.ray_mem_per_cpu_gb) or own.ray_mem_per_cpu_gb <= 0:
                raise PrepareDataError(f"--ray_mem_per_cpu_gb {own.ray_mem_per_cpu_gb}: need a finite number of GB "
                                       "above 0")
            if own.executor != "ray" and own.ray_address is not None:
                raise PrepareDataError("--ray_address: a Ray cluster is used with --executor ray only")
            first = prepare_data.build_parser().parse_args(rest + ["--num_parts", str(own.num_parts), "--part", "0"])
            prepare_data.validate_args(first)
            prepare_data.document_stages(first)   # evaluation sets read, languages known: before any marker moves
            folder = os.path.join(first.output_dir, MARKERS)
            check_markers(folder, command_record(rest + ["--num_parts", str(own.num_parts)]), own.overwrite_markers)
            require("datatrove", "prepare_parts")
            executor = make_executor(own, rest, folder, first.workers)
            if own.executor == "ray" and executor.get_incomplete_ranks(range(own.num_parts)):
                check_fits(connected.enter_context(ray_cluster(own.ray_address)), executor)
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
        error = f"{type(failure).__name__}: {failure}" if failure is not None else \
            recorded_error(os.path.join(folder, ERRORS), left)
        why = f" ({error})" if error else ""
        print(f"error: parts {', '.join(map(str, left))} of {own.num_parts} did not finish{why}; their logs are in "
              f"{folder}/logs; the same command runs only them again", file=sys.stderr)
        return 1
    print(f"{own.num_parts} parts done in {first.output_dir} (completion markers: {folder}/completions)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
