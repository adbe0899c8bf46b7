"""Every private torch, DeepSpeed and numpy internal the program relies on, in one place, each with
why no public API serves (tests/test_internals.py fails loudly when one of them changes):

- `set_default_collective_timeout`: torch.distributed bounds the groups created after the default
  one (DeepSpeed's data-parallel and ZeRO groups, made by `new_group` without a timeout) by the
  module-level default of distributed_c10d; no public call sets it, and without it those groups'
  collectives wait 30 minutes, whatever --dist_timeout says.
- `set_group_timeout`: the default group's collectives bounded by another time than its start-up
  rendezvous (init_process_group takes one timeout for both; torch's own `_set_pg_timeout` changes
  the collectives' afterwards, for gloo and NCCL).
- `deepspeed_shm_buffer_path`: DeepSpeed's CPU all-reduce (shm.cpp) gives each rank a 67 MB buffer
  in /dev/shm and never unlinks it; its name is built in C++ and exposed nowhere.
- `numpy_reconstruct`: the function a pickled numpy array names (older checkpoints' RNG states
  hold numpy arrays); a weights-only load must allow that exact global.
- `tensor_version`: a tensor's in-place modification counter, which keys a cache of a mask
  derived from a tensor (sparse attention), so that an in-place change of it is seen.
- `release_stale_build_locks`: torch's JIT build of an extension (DeepSpeed compiles its CPU
  communication op on a machine's first run, and its other ops where asked) holds a `lock` file in
  the op's build folder while it compiles and removes it after; a build killed meanwhile leaves
  it, and every later run waits on it for ever (torch's FileBaton has no owner to check).
- `forget_deepspeed_groups`: DeepSpeed keeps the process groups it made (its world group, the
  data-parallel and expert groups) in module globals of deepspeed.utils.groups, which no public
  call releases; while they are held, torch's destroy_process_group leaves their threads running.
"""
import contextlib
import datetime
import glob
import logging
import os
import threading
import time

import numpy as np
import psutil
import torch.distributed.distributed_c10d as dist_c10d
from torch.utils.cpp_extension import get_default_build_root

logger = logging.getLogger(__name__)
STALE_LOCK_SECONDS = 120  # a live build takes its lock and starts its compiler within moments
STALE_LOCK_POLL_SECONDS = 10  # how often a process waiting on a build looks for a stale lock again

# deepspeed/ops/csrc/cpu/comm/shm.cpp: "%s_%d_%s_%s" of SHM_BUFFER_NAME, uid, MASTER_ADDR,
# MASTER_PORT, then "%s_%d" with the rank
SHM_BUFFER_PATH = "/dev/shm/deepspeed_allreduce_buffer_{uid}_{addr}_{port}_{rank}"


def set_default_collective_timeout(timeout: datetime.timedelta):
    """Make `timeout` the default of every process group created from now on (all backends)."""
    for name in ("default_pg_timeout", "default_pg_nccl_timeout"):
        if not hasattr(dist_c10d, name):
            raise RuntimeError(f"torch.distributed.distributed_c10d.{name} is gone in torch; --dist_timeout cannot "
                               f"bound DeepSpeed's groups (turing/internals.py)")
        setattr(dist_c10d, name, timeout)


def set_group_timeout(timeout: datetime.timedelta, group=None):
    """Bound the collectives of `group` (default: the default group) by `timeout` from now on."""
    if not hasattr(dist_c10d, "_set_pg_timeout"):
        raise RuntimeError("torch.distributed.distributed_c10d._set_pg_timeout is gone in torch; --dist_timeout "
                           "cannot bound the collectives apart from the start-up rendezvous (turing/internals.py)")
    dist_c10d._set_pg_timeout(timeout, group)


def forget_deepspeed_groups():
    """Drop DeepSpeed's references to the process groups it made (deepspeed.utils.groups' module
    globals: a group, or a dict of them), so that once torch has destroyed them they are freed."""
    from deepspeed.utils import groups
    for name, value in list(vars(groups).items()):
        if isinstance(value, dist_c10d.ProcessGroup):
            setattr(groups, name, None)
        elif isinstance(value, dict) and any(isinstance(v, dist_c10d.ProcessGroup) for v in value.values()):
            value.clear()


def deepspeed_shm_buffer_path(rank):
    """The /dev/shm file of this rank's DeepSpeed CPU all-reduce buffer (from the environment the
    launcher set)."""
    env = os.environ
    return SHM_BUFFER_PATH.format(uid=os.getuid(), addr=env.get("MASTER_ADDR", ""), port=env.get("MASTER_PORT", ""),
                                  rank=rank)


def numpy_reconstruct():
    multiarray = getattr(np, "_core", None) or np.core  # numpy 2 / numpy 1
    return multiarray.multiarray._reconstruct


def tensor_version(tensor):
    return tensor._version


def release_stale_build_locks(now=None):
    """Remove the `lock` of every extension build folder (under $TORCH_EXTENSIONS_DIR and torch's
    default build root) that no process works in (no process has its current folder there: the
    compiler ninja runs in it) and in which nothing, the lock included, was written for
    STALE_LOCK_SECONDS: a build killed before it finished (a build that just finished has just
    written its library, and keeps its lock). The build starts again at the next load (ninja keeps
    what was compiled). Returns the folders released."""
    now = time.time() if now is None else now
    roots = {os.environ.get("TORCH_EXTENSIONS_DIR") or get_default_build_root()}
    locks = sorted({p for root in roots for pattern in ("*/lock", "*/*/lock")
                    for p in glob.glob(os.path.join(root, pattern))})
    if not locks:
        return []
    busy = set()
    for process in psutil.process_iter(["cwd"]):
        cwd = process.info.get("cwd")
        if cwd:
            busy.add(os.path.realpath(cwd))
    released = []
    for lock in locks:
        folder = os.path.realpath(os.path.dirname(lock))
        try:
            age = now - max(os.stat(entry.path).st_mtime for entry in os.scandir(folder))
        except (FileNotFoundError, ValueError):
            continue
        if age < STALE_LOCK_SECONDS or any(cwd == folder or cwd.startswith(folder + os.sep) for cwd in busy):
            continue
        try:
            os.remove(lock)
        except FileNotFoundError:
            continue
        logger.warning("%s: the lock of an extension build that was stopped before it finished (%.0f s old, no process "
                       "building there); removed, so the op is built again instead of waited for", lock, age)
        released.append(folder)
    return released


@contextlib.contextmanager
def stale_build_locks_released():
    """Run the block (a load of a JIT-built op: building it, or waiting on the process that builds
    it) while releasing stale build locks every STALE_LOCK_POLL_SECONDS (release_stale_build_locks):
    torch waits on another process's lock with no time limit, so a wait on a build killed moments
    before this one started ends once that lock is stale, instead of never."""
    release_stale_build_locks()
    done = threading.Event()

    def watch():
        while not done.wait(STALE_LOCK_POLL_SECONDS):
            release_stale_build_locks()

    watcher = threading.Thread(target=watch, name="stale-build-locks", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
        watcher.join()
