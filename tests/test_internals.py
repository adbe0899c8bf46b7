"""The private torch, DeepSpeed and numpy internals of turing/internals.py, each checked against
the installed libraries, so that an upgrade that changes one fails here, loudly, not in a run."""
import datetime
import os
import pickle
import re

import deepspeed
import numpy as np
import torch
import torch.distributed.distributed_c10d as dist_c10d

from turing import internals


def test_the_default_collective_timeout_is_what_new_groups_get():
    before = (dist_c10d.default_pg_timeout, dist_c10d.default_pg_nccl_timeout)
    try:
        internals.set_default_collective_timeout(datetime.timedelta(seconds=17))
        # what torch.distributed.new_group uses when its caller (DeepSpeed) gives no timeout
        for backend in ("gloo", "nccl"):
            assert dist_c10d._get_default_timeout(dist_c10d.Backend(backend)) == datetime.timedelta(seconds=17)
    finally:
        dist_c10d.default_pg_timeout, dist_c10d.default_pg_nccl_timeout = before


GROUP_TIMEOUT = """
import datetime, os, torch, torch.distributed as dist
from testkit.launcher import free_port
from turing import internals
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="1")
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=300))
gloo = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
before = gloo.options._timeout
internals.set_group_timeout(datetime.timedelta(seconds=7))
print(before.total_seconds(), gloo.options._timeout.total_seconds())
"""


def test_the_default_groups_collectives_get_their_own_timeout():
    """What the start-up rendezvous was given (300 s) is replaced for the collectives (7 s)."""
    import subprocess
    import sys
    run = subprocess.run([sys.executable, "-c", GROUP_TIMEOUT], capture_output=True, text=True, timeout=600,
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split()[-2:] == ["300.0", "7.0"]


DEEPSPEED_GROUPS = """
import gc, os, deepspeed, torch.distributed as dist
from deepspeed.utils import groups
from testkit.launcher import free_port
from turing import internals
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
def gloo_threads():
    return sum(open(f"/proc/self/task/{t}/comm").read().startswith("pt_gloo") for t in os.listdir("/proc/self/task"))
deepspeed.init_distributed("gloo")
groups._get_data_parallel_group()          # DeepSpeed's clone of the world group, as its engine makes it
dist.destroy_process_group()
gc.collect()
held = gloo_threads()
internals.forget_deepspeed_groups()
gc.collect()
print(held, gloo_threads())
"""


def test_the_groups_deepspeed_holds_are_freed_once_forgotten():
    """torch's destroy_process_group leaves the group DeepSpeed keeps in its module globals running
    (its threads alive); forgotten there, it is freed and its threads end."""
    import subprocess
    import sys
    run = subprocess.run([sys.executable, "-c", DEEPSPEED_GROUPS], capture_output=True, text=True, timeout=600,
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert run.returncode == 0, run.stderr[-2000:]
    held, left = map(int, run.stdout.split()[-2:])
    assert held > 0 and left == 0, run.stdout


def test_the_shm_buffer_name_is_deepspeeds():
    source = open(os.path.join(os.path.dirname(deepspeed.__file__), "ops", "csrc", "cpu", "comm", "shm.cpp")).read()
    assert '#define SHM_BUFFER_NAME "deepspeed_allreduce_buffer"' in source
    assert re.search(r'"%s_%d_%s_%s",\s*SHM_BUFFER_NAME,\s*getuid\(\),\s*addr_string,\s*port_string', source)
    assert re.search(r'"%s_%d", shm_name_prefix, rank', source)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")
    assert internals.deepspeed_shm_buffer_path(3) == (f"/dev/shm/deepspeed_allreduce_buffer_{os.getuid()}_"
                                                      f"{os.environ['MASTER_ADDR']}_{os.environ['MASTER_PORT']}_3")


def test_a_pickled_numpy_array_names_the_reconstruct_function():
    reconstruct = internals.numpy_reconstruct()
    assert reconstruct.__name__ == "_reconstruct"
    assert f"{reconstruct.__module__}\n_reconstruct".encode() in pickle.dumps(np.zeros(2), protocol=2) or \
        reconstruct.__module__.encode() in pickle.dumps(np.zeros(2))


def test_a_tensor_version_counts_in_place_changes():
    t = torch.zeros(3)
    before = internals.tensor_version(t)
    t.add_(1)
    assert internals.tensor_version(t) == before + 1


def test_the_lock_of_a_killed_extension_build_is_released(tmp_path, monkeypatch, caplog):
    """A JIT build killed while compiling leaves its `lock`, on which torch's next load waits for
    ever: one older than a build's start and with no process in its folder is removed; a fresh one,
    or one a process is building in, is kept. The file layout is torch's own (the FileBaton)."""
    import inspect
    import subprocess
    import sys
    import time

    from torch.utils import cpp_extension

    assert "FileBaton(os.path.join(build_directory, 'lock'))" in inspect.getsource(cpp_extension)
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    stale, fresh, building = (tmp_path / name for name in ("stale_op", "fresh_op", "building_op"))
    for folder in (stale, fresh, building):
        folder.mkdir()
        (folder / "lock").write_text("")
    old = time.time() - 3600
    os.utime(stale / "lock", (old, old))
    os.utime(building / "lock", (old, old))
    compiler = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], cwd=building)
    try:
        time.sleep(0.5)
        with caplog.at_level("WARNING"):
            released = internals.release_stale_build_locks()
    finally:
        compiler.kill()
        compiler.wait()
    assert released == [os.path.realpath(stale)]
    assert not (stale / "lock").exists() and (fresh / "lock").exists() and (building / "lock").exists()
    assert "stopped before it finished" in caplog.text

    finished = tmp_path / "finished_op"  # a build that has just written its library: its lock is not stale
    finished.mkdir()
    (finished / "lock").write_text("")
    os.utime(finished / "lock", (old, old))
    (finished / "op.so").write_text("")
    assert os.path.realpath(finished) not in internals.release_stale_build_locks() and (finished / "lock").exists()


def test_a_wait_on_a_build_killed_moments_before_ends(tmp_path, monkeypatch):
    """The lock of a build killed moments before a run starts is not stale yet when the run looks;
    torch then waits on it without a time limit (its FileBaton). While the op loads, the lock is
    looked at again until it is stale, so the wait ends (the CPU communication op's first build,
    killed, hung the next run's process group start-up for ever)."""
    import threading

    from torch.utils.file_baton import FileBaton

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setattr(internals, "STALE_LOCK_SECONDS", 1)
    monkeypatch.setattr(internals, "STALE_LOCK_POLL_SECONDS", 0.2)
    (tmp_path / "killed_op").mkdir()
    lock = tmp_path / "killed_op" / "lock"
    lock.write_text("")  # just now, by a build that was then killed
    waiting = threading.Thread(target=FileBaton(str(lock), wait_seconds=0.05).wait, daemon=True)
    with internals.stale_build_locks_released():
        waiting.start()
        waiting.join(timeout=30)
    assert not waiting.is_alive() and not lock.exists()
