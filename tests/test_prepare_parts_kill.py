"""tools/prepare_parts.py when a part or the command itself is killed or stopped: a part that dies
ends the command with one line naming it and how it died (never a wait for ever), a stopped or
killed command takes every part's process along (never an orphan that writes on, nor a Manager
left listening), and the same command again finishes the job byte for byte as an uninterrupted run.

The kills land at a deterministic moment: the parts are held where their stage worker decides a
document (tests/held_prepare_parts.py) until killed, whatever the machine's speed."""
import contextlib
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from testkit.launcher import REPO
from tests.test_prepare_filters import argv_of, staged_corpus  # noqa: F401 (a fixture)
from tests.test_prepare_scaling import dataset, needs_ray, ray_cluster  # noqa: F401 (a fixture)
from tools import prepare_parts

HELD = os.path.join(REPO, "tests", "held_prepare_parts.py")
HELD_DOCUMENT = 40          # a few chunks of each part are finished (journalled) by then
WAIT_SECONDS = 120          # for anything a test waits for: a regression fails instead of hanging
EXECUTORS = ["local", pytest.param("ray", marks=needs_ray)]


def command(staged_corpus, out, executor, request):
    """prepare_parts' flags: two parts side by side, every document stage on (a stage worker beside each reader)."""
    _, path, vocab, flags = staged_corpus
    argv = ["--num_parts", "2", "--parallel_parts", "2", *argv_of(path, vocab, out, *flags, "--workers", 1)]
    if executor == "ray":
        cluster = request.getfixturevalue("ray_cluster")
        argv += ["--executor", "ray", "--ray_address", cluster.get_runtime_context().gcs_address]
    return argv


@pytest.fixture(scope="module")
def reference(staged_corpus, tmp_path_factory):
    """What an uninterrupted run of the command writes."""
    out = tmp_path_factory.mktemp("uninterrupted") / "o"
    assert prepare_parts.main(command(staged_corpus, out, "local", None)) == 0
    return dataset(out)


def start_held(argv, parts, tmp_path):
    """The command in a process of its own, parts `parts` held; returns (process, its log, {part: the
    pid of its process}) once every held part has reached its hold."""
    log, held = tmp_path / "log", tmp_path / "held"
    # RAY_AUTH_MODE: Ray sends the cluster's token (~/.ray/auth_token) to an address given so only
    env = {**os.environ, "HELD_PARTS": ",".join(map(str, parts)), "HELD_DOCUMENT": str(HELD_DOCUMENT),
           "HELD_LOG": str(held), "RAY_AUTH_MODE": "token"}
    proc = subprocess.Popen([sys.executable, HELD, *argv], cwd=REPO, env=env, stdout=open(log, "w"),
                            stderr=subprocess.STDOUT)
    deadline = time.time() + WAIT_SECONDS
    while True:
        paused = {int(line.split()[2]): int(line.split()[4])
                  for line in (held.read_text().splitlines() if held.exists() else [])}
        if set(paused) == set(parts):
            return proc, log, paused
        if proc.poll() is not None or time.time() > deadline:
            proc.kill()
            pytest.fail(f"the parts {parts} were not held (exit code {proc.poll()}):\n{log.read_text()[-3000:]}")
        time.sleep(0.1)


def processes_of_the_run(proc, parts):
    """Every process of the run at its hold: the command's and, wherever a part runs (a Ray actor),
    the part's process with all it started and the process that started it."""
    found = {proc.pid: psutil.Process(proc.pid)}
    found.update((p.pid, p) for p in found[proc.pid].children(recursive=True))
    for pid in parts.values():
        part = psutil.Process(pid)
        found.update((p.pid, p) for p in [part, part.parent(), *part.children(recursive=True)])
    return list(found.values())


def manager_sockets(processes):
    """The sockets a multiprocessing Manager listens on (/tmp/pymp-*/listener-*) held by `processes`."""
    held = []
    for process in processes:
        try:
            held += [c.laddr for c in process.net_connections(kind="unix") if "listener-" in (c.laddr or "")]
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            pass
    return held


def alive(processes):
    living = []
    for process in processes:
        try:
            if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                living.append(process)
        except psutil.NoSuchProcess:
            pass
    return living


def naming(out):
    """Processes whose command line names the folder `out` (a part run by hand, an orphan of this run)."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        if str(out) in " ".join(process.info["cmdline"] or ()):
            found.append(process)
    return found


def assert_none_left(processes, out, proc):
    """Every process of the run ends (a few seconds: Ray ends the actors of a driver that is gone),
    none names `out`; any left is killed here, and the test fails."""
    deadline = time.time() + 30
    while alive(processes) and time.time() < deadline:
        time.sleep(0.1)
    left = {p.pid: p for p in alive(processes) + [p for p in naming(out) if p.pid != os.getpid()]}
    described = [describe(p) for p in left.values()]
    for process in left.values():
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    proc.kill()
    proc.wait()
    assert not described, f"left running: {described}"


def describe(process):
    try:
        return f"{process.pid} {process.name()} (parent {process.ppid()})"
    except psutil.Error:
        return f"{process.pid} (ended meanwhile)"


def error_lines(log):
    return [line for line in log.read_text().splitlines() if line.startswith("error")]


@pytest.mark.parametrize("executor", EXECUTORS)
def test_a_killed_part_is_one_line_naming_it_and_the_same_command_finishes(executor, staged_corpus, reference,
                                                                           tmp_path, request):
    """Part 1's process SIGKILLed (the out-of-memory killer) at its hold: the command ends with one
    error line naming the part and the signal, exit code 1, none of the part's processes left
    (datatrove's pools waited for it for ever: the log stopped at "1/2 tasks completed"); the same
    command again runs part 1 only, from its journal, and the folder is the uninterrupted run's."""
    out = tmp_path / "o"
    argv = command(staged_corpus, out, executor, request)
    proc, log, parts = start_held(argv, [1], tmp_path)
    processes = processes_of_the_run(proc, parts)
    try:
        assert manager_sockets(processes) == []
        os.kill(parts[1], signal.SIGKILL)
        assert proc.wait(timeout=WAIT_SECONDS) == 1, log.read_text()[-3000:]
    finally:
        assert_none_left(processes, out, proc)
    assert error_lines(log) == [(
        f"error: parts 1 of 2 did not finish: part 1 (pid {parts[1]}) was killed by SIGKILL (SIGKILL is what the "
        f"out-of-memory killer sends); their logs are in {out}/{prepare_parts.MARKERS}/logs; the same command runs "
        "only them again")]
    assert os.listdir(out / prepare_parts.MARKERS / "completions") == ["00000"]
    assert prepare_parts.main(argv) == 0
    assert dataset(out) == reference


@pytest.mark.parametrize("executor, sig", [("local", signal.SIGTERM), ("local", signal.SIGKILL),
                                           pytest.param("ray", signal.SIGTERM, marks=needs_ray)],
                         ids=["local-SIGTERM", "local-SIGKILL", "ray-SIGTERM"])
def test_a_stopped_or_killed_command_takes_its_parts_along(executor, sig, staged_corpus, reference, tmp_path,
                                                           request):
    """The command SIGTERMed or SIGKILLed while both parts run (held): every part's process, with its
    workers, reader and stage worker, ends with it (they went on as orphans, wrote their shards and
    markers, and a Manager stayed listening; a Ray driver died of SIGABRT without a line); SIGTERM
    stops the parts as it stops prepare_data and is one error line; the same command again finishes
    the job. (Ray itself ends the processes of the actors of a SIGKILLed driver, and so the parts in
    them, before this change too: that case is no test here.)"""
    out = tmp_path / "o"
    argv = command(staged_corpus, out, executor, request)
    proc, log, parts = start_held(argv, [0, 1], tmp_path)
    processes = processes_of_the_run(proc, parts)
    try:
        assert manager_sockets(processes) == []
        proc.send_signal(sig)
        assert proc.wait(timeout=WAIT_SECONDS) == (128 + sig if sig == signal.SIGTERM else -sig), \
            log.read_text()[-3000:]
    finally:
        assert_none_left(processes, out, proc)
    if sig == signal.SIGTERM:
        assert error_lines(log) == [("error: stopped by SIGTERM; parts 0, 1 of 2 did not finish (their finished "
                                     "chunks are kept); the same command runs only them again")]
    assert not os.path.exists(out / prepare_parts.MARKERS / "completions")
    assert prepare_parts.main(argv) == 0
    assert dataset(out) == reference
