"""Beyond one node, on one machine: two "nodes" on the loopback interface, each started with
scripts/launch_node.sh (the real `deepspeed` launcher, --no_ssh, its --node_rank, a hostfile naming
two hosts that resolve here), one rank each, gloo. The run equals the same job on 2 ranks of one
node; a rank that hangs ends the job within --dist_timeout with one line, and --auto_resume on both
nodes continues it exactly."""
import json
import os
import re
import signal
import subprocess
import time

import pytest

from tests.launch import launch, tiny_args
from testkit.launcher import REPO, TINY_CFG, free_port, launch_env, progress

TIMEOUT = 10  # --dist_timeout of the hang test, seconds
STEPS = 12    # three epochs of the tiny NVIDIA data on two ranks


@pytest.fixture(scope="module")
def long_cf(tmp_path_factory):
    """The tiny job config with epochs enough that a run is still going when the test stops a rank."""
    cf = json.load(open(TINY_CFG))
    cf["mixed_seq_training"]["128"]["num_epochs"] = 40
    path = tmp_path_factory.mktemp("cf") / "long.json"
    path.write_text(json.dumps(cf))
    return path


def start_nodes(hostfile, train_args, logs, folders=(REPO, REPO)):
    """Both nodes' launchers (each in its own session, like a process on another machine), node i
    started in folders[i]."""
    port = str(free_port())
    script = os.path.join(REPO, "scripts", "launch_node.sh")
    return [subprocess.Popen(["bash", script, str(hostfile), str(node), "127.0.0.1", port,
                              os.path.join(REPO, "deepspeed_train.py"), *map(str, train_args)], cwd=folder,
                             env={**launch_env(), "DIST_TIMEOUT": str(TIMEOUT)}, stdout=open(log, "w"),
                             stderr=subprocess.STDOUT, start_new_session=True)
            for node, (log, folder) in enumerate(zip(logs, folders))]


def two_hosts(tmp_path):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("localhost slots=1\n127.0.0.1 slots=1\n")  # two names, both this machine
    return hostfile


def rank_of_node(launcher):
    """The pid of the training process a node's launcher started (launcher -> launch.py -> rank)."""
    out = subprocess.run(["pgrep", "-f", "-P", ",".join(_children(launcher.pid)), "deepspeed_train.py"],
                         capture_output=True, text=True).stdout.split()
    return int(out[0]) if out else None


def _children(pid):
    return subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split() or ["0"]


def test_two_nodes_equal_two_ranks_and_a_hung_rank_ends_the_job(data_root, long_cf, tmp_path):
    args = ["--print_steps", 1, "--validation_data_path_prefix", data_root / "nvidia" / "128"]
    reference = launch(tiny_args(data_root, tmp_path / "one_node", 128, "--cf", long_cf, "--max_steps", STEPS,
                                 *args), num_ranks=2)
    assert reference.returncode == 0, reference.stderr[-3000:]
    ref = {s: loss for s, loss, _, _ in progress(reference.stdout + reference.stderr)}
    assert sorted(ref) == list(range(1, STEPS + 1))

    hostfile = two_hosts(tmp_path)
    out = tmp_path / "two_nodes"
    train = tiny_args(data_root, out, 128, "--cf", long_cf, "--checkpoint_every_steps", 2, *args)
    logs = [tmp_path / "node0.log", tmp_path / "node1.log"]
    nodes = start_nodes(hostfile, train, logs)
    try:
        deadline = time.time() + 300
        while not any(s >= 3 for s, *_ in progress(logs[0].read_text())):
            assert time.time() < deadline and nodes[0].poll() is None, logs[0].read_text()[-3000:]
            time.sleep(0.1)
        victim = rank_of_node(nodes[1])
        os.kill(victim, signal.SIGSTOP)      # node 1's rank hangs: alive, silent
        stopped = time.time()
        code = nodes[0].wait(timeout=TIMEOUT + 60)
        waited = time.time() - stopped
    finally:
        for node in nodes:
            try:
                os.killpg(node.pid, signal.SIGKILL)   # node 1 still holds the stopped rank
            except ProcessLookupError:
                pass
            node.wait()
    log = logs[0].read_text()
    assert code != 0 and waited < TIMEOUT + 30, (waited, log[-3000:])
    assert re.search(r"error: rank 0: lost the other ranks .*--dist_timeout 10 s\. Re-run with --auto_resume", log)
    first = {s: loss for s, loss, _, _ in progress(log)}
    assert all(abs(first[s] - ref[s]) < 1e-5 for s in first), (first, ref)

    checkpoint = int(open(out / "saved_models" / "tiny_bert" / "latest").read().split("step")[-1])
    assert checkpoint >= 2
    nodes = start_nodes(hostfile, [*train, "--auto_resume", "--max_steps", STEPS - checkpoint], logs)
    assert [node.wait(timeout=300) for node in nodes] == [0, 0], logs[0].read_text()[-3000:]
    log = logs[0].read_text()
    resumed = {s: loss for s, loss, _, _ in progress(log)}
    assert sorted(resumed) == list(range(checkpoint + 1, STEPS + 1))
    assert all(abs(resumed[s] - ref[s]) < 1e-5 for s in resumed), (resumed, ref)
    assert "Validation at step 12" in log and os.path.isdir(out / "saved_models" / "tiny_bert" / "epoch3_step12")


def test_a_node_local_output_folder_stops_the_job_before_training(data_root, tmp_path):
    """--output_dir out, relative: each node's launcher starts in its own folder, as on nodes whose
    working folder is local scratch. Every rank stops with one line naming the rank that cannot
    see rank 0's files; nothing is trained and no checkpoint is begun."""
    folders = [tmp_path / "node0_scratch", tmp_path / "node1_scratch"]
    for folder in folders:
        folder.mkdir()
    logs = [tmp_path / "node0.log", tmp_path / "node1.log"]
    nodes = start_nodes(two_hosts(tmp_path), tiny_args(data_root, "out", 128, "--max_steps", 2), logs, folders)
    codes = [node.wait(timeout=300) for node in nodes]
    log = logs[0].read_text()
    assert codes[0] != 0 and codes[1] != 0, log[-3000:]
    assert re.search(r"error: --output_dir out: rank 1 on \S+ cannot see the files rank 0 writes to "
                     r"out/saved_models/tiny_bert; checkpoints need a folder every node sees", log), log[-3000:]
    assert not progress(log) and not progress(logs[1].read_text())
    assert os.listdir(folders[0] / "out" / "saved_models" / "tiny_bert") == []
