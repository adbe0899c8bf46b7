"""Every part of a --num_parts run of tools/prepare_data.py as a task of datatrove's executor, with
its completion marker, so that the same command again reruns only the parts that did not finish.

    python -m tools.prepare_parts --num_parts 8 --parallel_parts 2 \
        --input dump.xml.bz2 --output_dir OUT --tokenizer vocab.txt --workers 4 --num_shards 4

Every flag but this tool's own (--num_parts, --parallel_parts, --overwrite_markers, --executor and
the --ray_ ones) is tools/prepare_data.py's, given to each part with its `--num_parts N --part K`:
the parts write into one OUT as prepare_data's parts do (shards and records named by part), and
together they are the dataset training reads. Task K runs part K, --parallel_parts at a time, each
with its own --workers:

- --executor local (the default): datatrove's LocalPipelineExecutor's tasks on this machine, part K
  in a process of its own;
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
run the other began. Every part runs, whichever failed; the exit line then names each part that did
not finish and how (its error, or "part 1 (pid N) was killed by SIGKILL"), which the part, or the
process that watched it, also writes to OUT/.prepare_parts/errors/000KK (Ray's executor only logs a
task's error).

Processes. A part runs in a process of its own (named prepare_partK in ps), started by the process
that waits for it, and ends with that process however it ends (tools/prep/workers.py's
end_with_parent, as prepare_data's workers end with it: the kernel's parent-death signal, and a
thread that sees the parent change), taking its workers, reader and stage workers along. Of
datatrove's executors only the task is used (`_run_for_rank`: the part, its log, stats and
completion marker); the pieces that start the tasks are replaced, because they can neither see a
part's process die nor end the parts with the command:
- local: LocalPipelineExecutor.run runs the tasks in a multiprocess.Pool, which waits for ever for a
  task whose process was killed, whose processes outlive a killed command, and beside which a
  multiprocess Manager process stays listening on a socket in /tmp; `run_local` forks the parts and
  waits on their process sentinels. SIGTERM/SIGINT stop the parts (prepare_data's own stop: its
  finished chunks are kept) and end the command with 128 + the signal; SIGKILL of the command ends
  the parts by the parent-death signal.
- ray: datatrove's RankWorker actor runs its task in a multiprocess.Pool too (the same wait for
  ever); PartWorker takes its place for the run (RayParts), forking the part in the actor. The
  command's SIGTERM/SIGINT leave datatrove's loop by an exception (KeyboardInterrupt, as Ctrl-C
  does): its `finally` cancels the tasks, whose PartWorker stops its part as SIGTERM stops
  prepare_data, then kills the actors (a part still running ends with its actor); a command killed
  outright leaves that to Ray, which ends the actors of a driver that is gone.

datatrove (pip install -r requirements-corpora.txt) is imported only here, ray (pip install ray)
only with --executor ray, which connects to no cluster when every part is done. On a SLURM cluster
the same parts run as an array of prepare_data commands (README, "Many machines"), each task
resuming its own part when requeued.
"""
import argparse
import collections
import contextlib
import ctypes
import json
import logging
import math
import multiprocessing.connection
import os
import shutil
import signal
import socket
import sys

if not __package__:  # run as `python tools/NAME.py`: import from the repository root, as `python -m` does
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # = ROOT below

from tools import prepare_data
from tools.prep import CorpusError, PrepareDataError
from tools.prep.journal import run_fingerprint
from tools.prep.layouts import require
from tools.prep.reader import PR_SET_NAME
from tools.prep.workers import end_with_parent, worker_context
from turing.errors import OneLineParser
from turing.signals import STOP_SIGNALS, StopRequested, StopSignals

logger = logging.getLogger(__name__)

MARKERS = ".prepare_parts"        # OUT/MARKERS: datatrove's logging folder (completions/, logs/, stats/)
ERRORS = "errors"                 # MARKERS/ERRORS: the line saying why a part did not finish (000KK)
NICENESS = "RAY_worker_niceness"   # Ray's setting of its workers' niceness (default 15)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # the repository the Ray workers import
PROCESS_NAME = "prepare_part"     # part K's process in ps and top: prepare_partK (Linux: 15 bytes at most)
POLL_SECONDS = 0.2                # how often the command checks for a stop while it waits for the parts
STOP_SECONDS = 60                 # how long a stopped part may take to end cleanly before it is killed


class PreparePart:
    """datatrove's pipeline step (a callable of (data, rank, world_size)): part `rank` of
    `world_size` of prepare_data with the flags `argv` (picklable, for the executor's processes),
    in the part's own process (`start_part`). SIGTERM/SIGINT stop it as they stop prepare_data
    (its finished chunks kept) and end the process with 128 + the signal, without a traceback in
    datatrove's log. With `errors` (a folder), the error a part raised is also its line there
    (000KK, until the part runs again): Ray's executor keeps a part's exception to itself."""

    def __init__(self, argv, errors=None):
        self.argv = list(argv)
        self.errors = errors

    def __call__(self, data, rank, world_size):
        if self.errors:
            forget_error(self.errors, rank)
        signals = StopSignals(action=f"stopping part {rank}; its finished chunks are kept")
        signals.install()
        try:
            args = prepare_data.build_parser().parse_args(self.argv + ["--num_parts", str(world_size),
                                                                       "--part", str(rank)])
            prepare_data.prepare(args, signals)
        except StopRequested as e:
            raise SystemExit(128 + e.signum) from None   # not an Exception: datatrove logs no traceback
        except Exception as e:
            if self.errors:
                record_error(self.errors, rank, f"part {rank}: {type(e).__name__}: {e}")
            raise
        finally:
            signals.uninstall()
        return data


def error_path(errors, rank):
    """Where part `rank` leaves its error line in the folder `errors` (000KK, as datatrove names its markers)."""
    return os.path.join(errors, f"{rank:05d}")


def record_error(errors, rank, line):
    os.makedirs(errors, exist_ok=True)
    with open(error_path(errors, rank) + ".tmp", "w", encoding="utf-8") as f:
        f.write(line)
    os.replace(error_path(errors, rank) + ".tmp", error_path(errors, rank))


def forget_error(errors, rank):
    with contextlib.suppress(FileNotFoundError):
        os.remove(error_path(errors, rank))


def recorded_errors(errors, ranks):
    """The lines `ranks` left in `errors` (record_error), joined; "" where none did."""
    lines = []
    for rank in ranks:
        path = error_path(errors, rank)
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                lines.append(f.read())
    return "; ".join(lines)


def how_part_ended(rank, pid, exitcode):
    """A part's process that did not end well, in the words of the exit line."""
    if exitcode < 0:
        name = signal.Signals(-exitcode).name
        hint = " (SIGKILL is what the out-of-memory killer sends)" if -exitcode == signal.SIGKILL else ""
        return f"part {rank} (pid {pid}) was killed by {name}{hint}"
    if exitcode - 128 in set(STOP_SIGNALS):
        return f"part {rank} (pid {pid}) was stopped by {signal.Signals(exitcode - 128).name}"
    return f"part {rank} (pid {pid}) ended with exit code {exitcode}"


def part_failure(errors, rank, process):
    """Why part `rank` did not finish, its process `process` ended: the error line the part
    recorded in `errors`, else how the process ended (recorded there now)."""
    line = recorded_errors(errors, [rank]) if process.exitcode == 1 else ""
    if not line:
        line = how_part_ended(rank, process.pid, process.exitcode)
        record_error(errors, rank, line)
    return line


# ---------------------------------------------------------------------------------------------
# The parts' processes: each started by the process that waits for it, and ending with it

def start_part(ctx, executor, rank, local_rank, node_rank=-1):
    """Part `rank` run by datatrove's task (`executor._run_for_rank`: the part, its log, stats and
    completion marker) in a process of its own (`ctx`: forked where the platform can), which ends
    with this one however this one ends; returns the started process."""
    process = ctx.Process(target=_part_main, args=(executor, rank, local_rank, node_rank, os.getpid()),
                          name=f"{PROCESS_NAME}{rank}", daemon=False)   # not daemonic: it starts processes
    process.start()
    return process


def _part_main(executor, rank, local_rank, node_rank, parent):
    end_with_parent(parent)
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(PR_SET_NAME, f"{PROCESS_NAME}{rank}".encode())
    try:
        executor._run_for_rank(rank, local_rank, node_rank=node_rank)
    except Exception:  # noqa: BLE001 - datatrove logged it, PreparePart recorded its line
        sys.exit(1)


def stop_parts(processes, signum=signal.SIGTERM, timeout=STOP_SECONDS):
    """Stop the part processes still running, as `signum` stops prepare_data (its finished chunks
    kept), and wait for them; one still running after `timeout` seconds is killed."""
    alive = [p for p in processes if p.is_alive()]
    for process in alive:
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signum)
    waiting = {p.sentinel: p for p in alive}
    while waiting:
        ended = multiprocessing.connection.wait(list(waiting), timeout=timeout)
        if not ended:
            for process in waiting.values():
                process.kill()
            timeout = None
        for sentinel in ended:
            waiting.pop(sentinel)
    for process in processes:
        process.join()


def run_local(executor, ranks, parallel, signals, errors):
    """Parts `ranks` on this machine, `parallel` at a time, each in a process of its own
    (start_part), until all ran: how a part did not finish is logged and written to `errors`
    (part_failure), where main() reads it; raises StopRequested once `signals` has a stop, after
    stopping the parts running (stop_parts)."""
    ctx, _ = worker_context(())
    waiting, running, failed = collections.deque(ranks), {}, {}
    free = list(range(parallel))      # datatrove's local ranks: local rank 0 logs to the console too
    if ranks:
        executor.save_executor_as_json()
    try:
        while waiting or running:
            signals.check()
            while waiting and free:
                rank, local_rank = waiting.popleft(), free.pop(0)
                process = start_part(ctx, executor, rank, local_rank)
                running[process.sentinel] = rank, local_rank, process
            for sentinel in multiprocessing.connection.wait(list(running), timeout=POLL_SECONDS):
                rank, local_rank, process = running.pop(sentinel)
                process.join()
                free = sorted(free + [local_rank])
                if process.exitcode == 0 and executor.is_rank_completed(rank):
                    logger.info("part %d of %d done", rank, executor.world_size)
                    continue
                failed[rank] = part_failure(errors, rank, process)
                logger.error("%s", failed[rank])
    finally:
        stop_parts([process for _, _, process in running.values()], signals.received or signal.SIGTERM)
    if ranks and not failed:
        merge_stats(executor)


def merge_stats(executor):
    """The logging folder's stats.json, every task's stats added up, as datatrove's executors leave it."""
    from datatrove.utils.stats import PipelineStats

    total = PipelineStats()
    for rank in range(executor.world_size):
        if executor.logging_dir.isfile(f"stats/{rank:05d}.json"):
            with executor.logging_dir.open(f"stats/{rank:05d}.json", "r") as f:
                total += PipelineStats.from_json(json.load(f))
    with executor.logging_dir.open("stats.json", "wt") as f:
        total.save_to_disk(f)


class PartWorker:
    """The Ray actor of a task in place of datatrove's RankWorker (whose multiprocess.Pool waits for
    ever for a part whose process was killed): each of its ranks in a process of its own
    (start_part) that ends with the actor; a part that does not finish raises, named (and written to
    MARKERS/ERRORS: datatrove's executor only logs a task's error). A task cancelled by datatrove's
    clean-up (the command stopped) stops its part, as SIGTERM stops prepare_data."""

    def get_node_ip(self):
        import ray

        return ray.util.get_node_ip_address()

    def run_for_rank(self, executor, ranks, node_ips, node_idx):
        import ray

        os.environ["RAY_NODELIST"] = ",".join(node_ips)
        os.environ["RAY_NODEID"] = str(node_idx)
        node_rank = -1 if executor.nodes_per_task == 1 else node_idx
        errors = os.path.join(executor.logging_dir.path, ERRORS)
        # ray.cancel of a running actor task sets this flag (an older Ray has none: the actor is killed, its part too)
        canceled = getattr(ray.get_runtime_context(), "is_canceled", lambda: False)
        ctx, _ = worker_context(())
        failed = []
        for local_rank, rank in enumerate(ranks, start=0 if executor.log_first else 1):
            process = start_part(ctx, executor, rank, local_rank, node_rank)
            try:
                while not multiprocessing.connection.wait([process.sentinel], timeout=POLL_SECONDS):
                    if canceled():     # datatrove's clean-up: the command was stopped
                        break
            finally:
                stop_parts([process])
            if process.exitcode != 0:
                failed.append(part_failure(errors, rank, process))
        if failed:
            raise PrepareDataError("; ".join(failed))


def ray_executor_class():
    """datatrove's RayPipelineExecutor whose tasks run in PartWorker actors (datatrove's loop makes
    its actors of the module's RankWorker: PartWorker is put there for the run, and put back)."""
    from datatrove.executor import ray as datatrove_ray

    class RayParts(datatrove_ray.RayPipelineExecutor):
        def run(self):
            saved, datatrove_ray.RankWorker = datatrove_ray.RankWorker, PartWorker
            try:
                return super().run()
            finally:
                datatrove_ray.RankWorker = saved

    return RayParts


@contextlib.contextmanager
def stops_interrupt():
    """SIGTERM and SIGINT interrupt the block as Ctrl-C does (KeyboardInterrupt in the main thread,
    the one exception Ray's waits let through), turned into StopRequested as the block is left; a
    second one ends the process at once. datatrove's Ray executor waits in a loop of its own, which
    only an exception leaves (its `finally` ends the actors, PartWorker stopping their parts)."""
    received = []

    def stop(signum, frame):
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_DFL)
        received.append(signum)
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, stop) for sig in STOP_SIGNALS}
    try:
        yield
    except KeyboardInterrupt:
        if not received:
            raise
        raise StopRequested(received[0]) from None
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def build_parser():
    p = OneLineParser(description="Run every part of a prepare_data --num_parts run as a task of "
                                  "datatrove's local or Ray executor, with completion markers",
                      formatter_class=argparse.ArgumentDefaultsHelpFormatter, epilog="guide: docs/data.md")
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
    """datatrove's executor of the parts: `workers` is each part's --workers (its CPUs on a Ray node).
    The local one's tasks are run by run_local, not by its own run()."""
    step = PreparePart(rest, os.path.join(folder, ERRORS))
    if own.executor == "local":
        from datatrove.executor import LocalPipelineExecutor

        return LocalPipelineExecutor(pipeline=[step], tasks=own.num_parts, workers=own.parallel_parts,
                                     logging_dir=folder)
    require("ray", "prepare_parts --executor ray", requirements=None)
    return ray_executor_class()(pipeline=[step], tasks=own.num_parts, workers=own.parallel_parts, logging_dir=folder,
                                cpus_per_task=workers, mem_per_cpu_gb=own.ray_mem_per_cpu_gb)


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
        errors = os.path.join(folder, ERRORS)
        failure = stopped = None
        try:
            if own.executor == "local":
                ranks = executor.get_incomplete_ranks(range(own.num_parts))
                if len(ranks) < own.num_parts:
                    logger.info("%d of %d parts are done already (their completion markers are in %s/completions)",
                                own.num_parts - len(ranks), own.num_parts, folder)
                signals = StopSignals(action="stopping the parts; their finished chunks are kept")
                signals.install()
                try:
                    run_local(executor, ranks, own.parallel_parts, signals, errors)
                finally:
                    signals.uninstall()
            else:
                with stops_interrupt():
                    executor.run()
        except StopRequested as e:
            stopped = e
        except Exception as e:  # noqa: BLE001 - a part's error, reported with the parts left
            failure = e
    left = executor.get_incomplete_ranks(range(own.num_parts))
    which = f"parts {', '.join(map(str, left))} of {own.num_parts} did not finish"
    if stopped is not None and left:     # (a stop as the last part finished stops nothing)
        print(f"error: {stopped}; {which} (their finished chunks are kept); the same command runs only them again",
              file=sys.stderr)
        return 128 + stopped.signum
    if failure is not None or left:
        error = f"{type(failure).__name__}: {failure}" if failure is not None else recorded_errors(errors, left)
        why = f": {error}" if error else ""
        print(f"error: {which}{why}; their logs are in {folder}/logs; the same command runs only them again",
              file=sys.stderr)
        return 1
    print(f"{own.num_parts} parts done in {first.output_dir} (completion markers: {folder}/completions)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
