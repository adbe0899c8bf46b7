"""Errors of the process group told apart: a peer that died or went silent is one line naming
--auto_resume (exit 5); a plain bug inside a collective keeps its traceback; a rendezvous port
another run holds is named as such, with the launcher flag that fixes it, before any work."""
import os
import socket
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.distributed as dist

from testkit.launcher import REPO, free_port, launch_env, train_cmd
from tests.launch import tiny_args
from turing.distributed import JOIN_SECONDS, is_collective_failure, setup_process_group

PEER = textwrap.dedent("""
    import datetime, os, sys, time
    import torch, torch.distributed as dist
    from turing.distributed import is_collective_failure
    rank, mode = int(sys.argv[1]), sys.argv[2]
    os.environ.update(RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[3])
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=3))
    dist.barrier()
    if rank == 1:
        if mode == "silent":
            time.sleep(30)
        os._exit(0)                      # dies without a word
    time.sleep(1)
    try:
        dist.all_reduce(torch.zeros(2))
    except RuntimeError as e:
        print("lost peer" if is_collective_failure(e) else "bug", flush=True)
    os._exit(0)
""")


@pytest.mark.parametrize("mode", ["dead", "silent"])
def test_a_dead_or_silent_peer_is_a_lost_peer(mode):
    port = str(free_port())
    ranks = [subprocess.Popen([sys.executable, "-c", PEER, str(r), mode, port], cwd=REPO, env=launch_env(),
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True) for r in (1, 0)]
    out = ranks[1].communicate(timeout=120)[0]
    ranks[0].kill()
    ranks[0].wait()
    assert out.strip().splitlines()[-1] == "lost peer"


SLOW_START = textwrap.dedent("""
    import os, sys, time
    import torch, torch.distributed as dist
    from turing.distributed import is_collective_failure, setup_process_group
    rank, port, flag = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    os.environ.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    if rank == 0:
        open(flag, "w").close()
    else:
        while not os.path.exists(flag):
            time.sleep(0.05)
        time.sleep(4)                    # joins twice --dist_timeout after rank 0 began to wait
    setup_process_group(2)
    dist.barrier()
    print("joined", flush=True)
    if rank == 1:
        time.sleep(120)                  # then hangs
    began = time.monotonic()
    try:
        dist.all_reduce(torch.zeros(2))
    except RuntimeError as e:
        print("lost peer" if is_collective_failure(e) else "bug", flush=True)
    print(f"waited {time.monotonic() - began:.1f}", flush=True)
    os._exit(0)
""")


def test_a_slow_start_joins_but_a_hung_collective_ends_within_the_timeout(tmp_path):
    """--dist_timeout 2: a rank that joins 4 s late still joins (the start-up rendezvous waits at
    least 300 s), and a collective it then leaves unanswered ends rank 0 after the collectives'
    bound, not the join's (rank 0 times its own wait)."""
    port, flag = str(free_port()), str(tmp_path / "rank0_waits")
    ranks = [subprocess.Popen([sys.executable, "-c", SLOW_START, str(r), port, flag], cwd=REPO, env=launch_env(),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in (1, 0)]
    try:
        out, err = ranks[1].communicate(timeout=900)
    finally:
        ranks[0].kill()
        ranks[0].wait()
    said = [line for line in out.splitlines() if line in ("joined", "lost peer", "bug")]
    assert said == ["joined", "lost peer"], (out + err)[-3000:]
    waited = float(next(line for line in out.splitlines() if line.startswith("waited ")).split()[1])
    assert waited < JOIN_SECONDS / 2, waited


def test_a_bug_inside_a_collective_is_not_a_lost_peer():
    setup_process_group(60)
    with pytest.raises(RuntimeError, match="invalid root rank") as bug:
        dist.broadcast(torch.zeros(2), src=dist.get_world_size() + 2)
    assert not is_collective_failure(bug.value)
    with pytest.raises(RuntimeError, match="invalid tensor size") as bug:
        dist.all_gather([torch.zeros(3)] * dist.get_world_size(), torch.zeros(2))
    assert not is_collective_failure(bug.value)


def test_a_port_in_use_is_named_before_any_work(data_root, tmp_path):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        cmd = train_cmd(tiny_args(data_root, tmp_path / "out", 128))
        cmd[cmd.index("--master_port") + 1] = str(port)
        run = subprocess.run(cmd, cwd=REPO, env=launch_env(), capture_output=True, text=True, timeout=300)
    log = run.stdout + run.stderr
    assert run.returncode != 0
    assert f"error: MASTER_PORT {port} is in use on this machine" in log and "--master_port" in log
    assert "lost the other ranks" not in log and "Traceback" not in log
    assert not (tmp_path / "out" / "saved_models" / "tiny_bert").exists() or \
        not list((tmp_path / "out" / "saved_models" / "tiny_bert").iterdir())


def test_the_communication_op_compile_is_announced_before_it_runs(data_root, tmp_path):
    """Issue 43: DeepSpeed compiles its CPU communication op when the process group starts (a
    machine's first run: 55 s in the demo, minutes on a busy machine), and the line saying so came
    after it, with "Building the model", so the compile was silent. The line comes first now: in the
    run's own output (stdout and stderr in one stream, unbuffered), before DeepSpeed's "... built
    successfully" (printed on every run, whether it compiled or loaded the op)."""
    import re

    cmd = [sys.executable, os.path.join(REPO, "deepspeed_train.py"),
           *tiny_args(data_root, tmp_path / "out", 128, "--max_steps", 1)]
    run = subprocess.run(cmd, cwd=REPO, env=launch_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:]
    said = re.search(r"compiles (DeepSpeed's|its CPU) communication op", run.stdout)
    built = run.stdout.find("deepspeed_shm_comm_op built successfully")
    assert said and built > 0, run.stdout[-3000:]
    assert said.start() < built, run.stdout[:3000]
