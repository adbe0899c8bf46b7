"""The process group: setting it up once (one rank without the launcher), bounding every
collective by --dist_timeout, and the few collectives the program itself makes.

A rank whose peer died or hangs raises out of a collective instead of waiting for ever;
`is_collective_failure` tells such an error apart from a crash, so that the program ends with
one line naming --auto_resume.
"""
import datetime
import os
import socket
import traceback

import deepspeed
import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as dist_c10d
from deepspeed.accelerator import get_accelerator

from utils import Ranks

SHM_ALLREDUCE_NAME = "/dev/shm/deepspeed_allreduce_buffer_{uid}_{addr}_{port}_{rank}"


def setup_process_group(timeout_seconds):
    """The process group, with every collective bounded by `timeout_seconds`; returns this
    process's Ranks. Started without the launcher (`python deepspeed_train.py`, or main() in a
    test), the process is one rank of one. Does nothing more when the group is up already."""
    if not dist.is_initialized():
        ensure_process_group_env()
        deepspeed.init_distributed(timeout=bound_collectives(timeout_seconds))
        if get_accelerator().device_name() != "cpu":  # collectives before the engine's, on this rank's GPU
            get_accelerator().set_device(int(os.environ.get("LOCAL_RANK", "0")))
        release_shm_allreduce_name()
    return Ranks.current()


def ensure_process_group_env():
    """Let `python deepspeed_train.py ...` (and tests calling main()) run as one rank."""
    if "RANK" in os.environ or "OMPI_COMM_WORLD_RANK" in os.environ:
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))


def bound_collectives(seconds):
    """--dist_timeout as the bound of every collective: of the default group (returned, for
    init_distributed, which also bounds the start-up rendezvous with it) and of the groups
    DeepSpeed creates later (its data-parallel group, ZeRO's), which torch.distributed.new_group
    builds with torch's default timeout, 30 minutes, unless that default is set too."""
    timeout = datetime.timedelta(seconds=seconds)
    dist_c10d.default_pg_timeout = timeout
    dist_c10d.default_pg_nccl_timeout = timeout
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
    name = SHM_ALLREDUCE_NAME.format(uid=os.getuid(), addr=env.get("MASTER_ADDR", ""),
                                     port=env.get("MASTER_PORT", ""), rank=dist.get_rank())
    try:
        os.unlink(name)
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


def is_collective_failure(error):
    """Whether `error` came out of torch.distributed: its errors (a timeout is a DistError) or one
    of gloo's RuntimeErrors (a peer's connection closed) raised inside a collective."""
    if isinstance(error, dist.DistError):
        return True
    frames = traceback.extract_tb(error.__traceback__)
    return any(f"{os.sep}torch{os.sep}distributed{os.sep}" in frame.filename for frame in frames[-3:])
