"""This process: its place in the job (`Ranks`, `get_rank_and_world`: with or without an
initialised process group) and its global random generators (`set_seeds`)."""
import dataclasses
import os
import random

import numpy as np
import torch
import torch.distributed as dist


def set_seeds(seed):
    """Seed python's, numpy's and torch's global generators (numpy takes the seed modulo 2**32)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def get_rank_and_world():
    """(global rank, world size); (0, 1) when no process group is initialised."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


@dataclasses.dataclass(frozen=True)
class Ranks:
    """This process's place in the job, decided once the process group is up (`current()`):
    global rank, world size, rank on its node. Rank 0 is the main process: it logs at the
    chosen level, writes TensorBoard, the run files and `latest`; rank 0 of each node fsyncs
    checkpoint files."""
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def is_main(self):
        return self.rank == 0

    @property
    def is_node_main(self):
        return self.local_rank == 0

    @classmethod
    def current(cls):
        rank, world = get_rank_and_world()
        return cls(rank, world, int(os.environ.get("LOCAL_RANK", "0")))

    @classmethod
    def launched(cls):
        """This process's place as its launcher's environment says it, before the process group is up
        (RANK, WORLD_SIZE and LOCAL_RANK; MPI's OMPI_COMM_WORLD_*; one rank of one without a launcher),
        for what the program says while the group starts."""
        env = os.environ
        rank = env.get("RANK", env.get("OMPI_COMM_WORLD_RANK", "0"))
        world = env.get("WORLD_SIZE", env.get("OMPI_COMM_WORLD_SIZE", "1"))
        local = env.get("LOCAL_RANK", env.get("OMPI_COMM_WORLD_LOCAL_RANK", "0"))
        return cls(int(rank), int(world), int(local))
