"""What the benchmark scripts share: machine facts for their JSON lines and the writing of them.

Light on purpose (standard library; torch only inside `machine_description`), so any bench
script can import it without pulling in another script's heavy imports.
"""
import json
import logging
import os
import platform

logger = logging.getLogger("bench")


def load_average():
    """The 1, 5 and 15-minute load averages, or None where /proc is missing."""
    try:
        with open("/proc/loadavg") as f:
            return [float(x) for x in f.read().split()[:3]]
    except OSError:
        return None


def _cpu_model_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine_description(device_type="cpu"):
    """What the JSON lines record as "machine": the GPU's name, or the CPU's cores and model."""
    import torch  # here, not at the top: the torch-free baselines import this module too

    if device_type == "cuda":
        return f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}"
    return f"{os.cpu_count()}-core CPU, {_cpu_model_name()}, torch {torch.__version__}"


def append_json_lines(path, records):
    """Append one JSON line per record to `path` (made if missing); nothing when path is None."""
    if not path:
        return
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        for rec in records:
            f.write(json.dumps(rec) + "\n")
    logger.info("appended %d JSON lines to %s", len(records), path)
