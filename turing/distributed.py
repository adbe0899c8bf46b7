"""The process group: setting it up once (one rank without the launcher), bounding every
collective by --dist_timeout, the few collectives the program itself makes, and closing it before
the process ends.

A rank whose peer died or hangs raises out of a collective instead of waiting for ever;
`is_collective_failure` tells such an error apart from a crash, so that the program ends with
one line naming --auto_resume.
"""
import datetime
import errno
import gc
import logging
import os
import socket
import traceback

import deepspeed
import torch
import torch.distributed as dist
from deepspeed.accelerator import get_accelerator

from turing.errors import InputError
from turing.internals import (deepspeed_shm_buffer_path, forget_deepspeed_groups, set_default_collective_timeout,
                              set_group_timeout, stale_build_locks_released)
from turing.process import Ranks

logger = logging.getLogger(__name__)


def setup_process_group(timeout_seconds):
    """The process group, with every collective bounded by `timeout_seconds` and its start-up
    rendezvous by join_seconds(timeout_seconds); returns this process's Ranks. Started without the
    launcher (`python deepspeed_train.py`, or main() in a test), the process is one rank of one.
    Does nothing more when the group is up already."""
    if not dist.is_initialized():
        ensure_process_group_env()
        check_master_port_free()
        if get_accelerator().device_name() == "cpu":   # said before it happens: minutes without a line
            logger.info("Starting the process group (on a machine's first run DeepSpeed compiles its CPU "
                        "communication op here: about a minute on an idle machine, several on a busy one)")
        try:
            collectives = bound_collectives(timeout_seconds)
            with stale_build_locks_released():  # DeepSpeed loads its communication op here (built on first use)
                deepspeed.init_distributed(timeout=datetime.timedelta(seconds=join_seconds(timeout_seconds)))
        except dist.DistNetworkError as e:
            if is_port_in_use(e):  # taken between the check and the bind
                raise InputError(port_in_use_message()) from None
            raise
        set_group_timeout(collectives)
        if get_accelerator().device_name() != "cpu":  # collectives before the engine's, on this rank's GPU
            get_accelerator().set_device(int(os.environ.get("LOCAL_RANK", "0")))
        release_shm_allreduce_name()
    return Ranks.current()


def close_process_group():
    """Destroy every process group, torch's and the ones DeepSpeed holds, so that their threads end
    while the interpreter is whole. A gloo worker thread releases a finished collective's tensors
    after the caller has its result, and must take the GIL to do so: one still doing it when the
    interpreter tears itself down (a bad config refused right after the engine's broadcast of the
    weights: 3 runs in 108 on a loaded 2-core machine) ended the process with "terminate called
    without an active exception", exit code 134. The program's last call, after what held the
    engine is gone; not collective (the peers of a gloo group need not take part)."""
    if dist.is_initialized():
        dist.destroy_process_group()
    forget_deepspeed_groups()
    gc.collect()   # a half-built engine, in reference cycles, holds its groups too


def ensure_process_group_env():
    """Let `python deepspeed_train.py ...` (and tests calling main()) run as one rank."""
    if "RANK" in os.environ or "OMPI_COMM_WORLD_RANK" in os.environ:
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    os.environ.setdefault("LOCAL_RANK", "0")  # --local_rank given alone set it (run_config.check_local_rank)


def check_master_port_free():
    """On rank 0, before the process group starts: MASTER_PORT must be free, since rank 0 binds
    the group's rendezvous there (another run on the machine holding it, two demos at once, is
    one line naming the launcher's --master_port, not a lost peer minutes later). Under torch
    elastic (torchrun) its agent holds the port itself, and MPI starts its own rendezvous."""
    env = os.environ
    if env.get("RANK") != "0" or "TORCHELASTIC_RUN_ID" in env or "MASTER_PORT" not in env:
        return
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the store binds: only a listener refuses
        try:
            s.bind(("", int(env["MASTER_PORT"])))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise InputError(port_in_use_message()) from None
            raise


def port_in_use_message():
    port = os.environ.get("MASTER_PORT")
    return (f"MASTER_PORT {port} is in use on this machine (another run, or another program, listens there): "
            f"give the deepspeed launcher a free port, e.g. deepspeed --master_port {int(port) + 1} ... "
            f"(scripts/demo.sh picks one itself)")


JOIN_SECONDS = 300.0


def join_seconds(timeout_seconds):
    """How long the ranks may take to join the process group at start-up: --dist_timeout, but at
    least JOIN_SECONDS. Ranks start at different times (the launcher reaches the nodes one after
    another over ssh, a busy node imports torch and DeepSpeed slowly, the first run on a machine
    compiles DeepSpeed's communication op), and a short --dist_timeout, set to end a job soon after
    a rank hangs, must not fail a start that is merely slow."""
    return max(float(timeout_seconds), JOIN_SECONDS)


def bound_collectives(seconds):
    """--dist_timeout as the bound of every collective: of the default group (returned; set on it
    once it is up, since its rendezvous has the longer join_seconds) and of the groups DeepSpeed
    creates later (its data-parallel group, ZeRO's), which torch.distributed.new_group builds with
    torch's default timeout, 30 minutes, unless that default is set too."""
    timeout = datetime.timedelta(seconds=seconds)
    set_default_collective_timeout(timeout)
    return timeout


def release_shm_allreduce_name():
    """Remove the name of this rank's shared-memory all-reduce buffer once every rank holds it.

    On the CPU accelerator, when all ranks are on one machine (LOCAL_SIZE == WORLD_SIZE, as the
    launcher sets), DeepSpeed gives each rank a 67 MB buffer in /dev/shm, which every peer maps
    during init_distributed, and never unlinks it: each run leaves 67 MB per rank of RAM behind,
    a killed run too, until /dev/shm fills the machine's memory. After a barrier every rank has
    mapped every peer's buffer, so the names can go; the mappings stay valid until the
    processes end, and nothing is left behind whatever way the run ends."""
    env = os.environ
    if get_accelerator().device_name() != "cpu" or env.get("LOCAL_SIZE") != env.get("WORLD_SIZE"):
        return
    dist.barrier()
    try:
        os.unlink(deepspeed_shm_buffer_path(dist.get_rank()))
    except FileNotFoundError:
        pass  # released by an earlier call, or DeepSpeed did not create one


def multi_rank():
    return dist.is_initialized() and dist.get_world_size() > 1


def all_ranks(obj):
    """[obj of rank 0, obj of rank 1, ...] on every rank."""
    if not multi_rank():
        return [obj]
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def barrier():
    if dist.is_initialized():
        dist.barrier()


def all_reduce(tensor, op=dist.ReduceOp.SUM):
    """`tensor` reduced over the ranks, in place (a no-op on one rank); returns it."""
    if multi_rank():
        dist.all_reduce(tensor, op=op)
    return tensor


def agreed_min(count, device):
    """The smallest `count` over the ranks (an int)."""
    return int(all_reduce(torch.tensor([count], dtype=torch.long, device=device), dist.ReduceOp.MIN).item())


# What the backends say when a peer is gone or silent (gloo: "Connection closed by peer",
# "Timed out waiting 3000ms for recv"; the TCP store: "Connection reset by peer", "Broken pipe";
# NCCL's watchdog: "communicator was aborted", "collective operation timeout"), lower-cased.
LOST_PEER_MESSAGES = ("connection closed by peer", "connection reset by peer", "broken pipe", "timed out",
                      "timeout", "connection refused", "no route to host", "communicator was aborted",
                      "failed to recv", "socket closed")


def is_collective_failure(error):
    """Whether `error` means a lost peer: the TCP store's network errors, or an error raised inside
    torch.distributed whose message says a connection closed or a collective timed out. Any other
    error of a collective (a wrong root rank, mismatched tensor sizes: a bug) is not one, and keeps
    its traceback."""
    if isinstance(error, (dist.DistNetworkError, dist.DistStoreError)) and not is_port_in_use(error):
        return True
    frames = traceback.extract_tb(error.__traceback__)
    inside = isinstance(error, dist.DistError) or any(
        f"{os.sep}torch{os.sep}distributed{os.sep}" in frame.filename for frame in frames[-3:])
    message = str(error).lower()
    return inside and any(marker in message for marker in LOST_PEER_MESSAGES)


def is_port_in_use(error):
    return "eaddrinuse" in str(error).lower() or "address already in use" in str(error).lower()
