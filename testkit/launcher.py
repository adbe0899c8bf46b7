"""Running deepspeed_train.py through the real `deepspeed` launcher: the command line, the
environment (no process group of the caller's), and the progress lines a run prints."""
import os
import re
import shutil
import socket
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY_CFG = os.path.join(REPO, "configs", "tiny", "bert_config.json")
TINY_DS = os.path.join(REPO, "configs", "tiny", "ds_config.json")
PROGRESS = re.compile(r"bing_bert_progress: step=(\d+), loss=([0-9.eE+-]+|nan|inf), lr=([0-9.eE+-]+), "
                      r"sample_count=(\d+)")
PROGRESS_MFU = re.compile(r"bing_bert_progress: step=\d+, .*?mfu=([0-9.]+)%")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launcher_cmd(num_ranks=1):
    exe = shutil.which("deepspeed")
    base = [exe] if exe else [sys.executable, "-m", "deepspeed.launcher.runner"]
    return base + ["--num_gpus", str(num_ranks), "--master_port", str(free_port())]


def launch_env():
    """The caller's environment without a process group of its own (the launcher sets it)."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK",
                                                             "MASTER_ADDR", "MASTER_PORT")}
    env["PYTHONUNBUFFERED"] = "1"
    env["OMP_NUM_THREADS"] = "1"  # tiny models; ranks share the machine's cores
    return env


def train_cmd(train_args, num_ranks=1, script=None):
    """The launcher's command line for deepspeed_train.py (or `script` in its place)."""
    script = script or os.path.join(REPO, "deepspeed_train.py")
    return launcher_cmd(num_ranks) + [script] + [str(a) for a in train_args]


def progress(output):
    """[(step, loss, lr, samples)] of the progress lines in a run's output."""
    return [(int(s), float(l), float(r), int(c)) for s, l, r, c in PROGRESS.findall(output)]
