"""Started in every Python process the tests start (tests/conftest.py puts this folder first on
PYTHONPATH): two costs of a process's start and end that say nothing about the program.

The tests install mlflow for the `--report_to mlflow` tests; a user's install
(requirements.txt) has none. Where it is installed, `import deepspeed` imports it whole (its
autotuner, which this program never runs, tries `import mlflow`): about 1.6 s in every process
that imports DeepSpeed (the deepspeed command, launch.py, each rank, each tool), a third of a
tiny launcher run. Here that one `import mlflow` fails as where mlflow is missing; every other
import of it (the mlflow sink) loads it as usual. A sitecustomize this file hides (one later on
sys.path) still runs.

At exit, the objects still alive are frozen (gc.freeze) before the interpreter tears itself
down: the collection it runs then walks every object torch and DeepSpeed made, about 0.7 s a
process (0.85 -> 0.18 s after `import deepspeed`). Everything is still released; only cycles
are left to the operating system, so a file the program leaves to the collector to close
shows up here as lost output, never the reverse.
"""
import atexit
import gc
import importlib.abc
import os
import sys

HIDDEN_FROM = "deepspeed.autotuning.autotuner"


class NoMlflowForDeepSpeed(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "mlflow":
            frame = sys._getframe(1)
            while frame is not None:
                if frame.f_globals.get("__name__") == HIDDEN_FROM:
                    raise ModuleNotFoundError(f"No module named 'mlflow' (hidden from {HIDDEN_FROM} in the tests)",
                                              name=name)
                frame = frame.f_back
        return None


def _run_the_hidden_one():
    here = os.path.dirname(os.path.abspath(__file__))
    for folder in sys.path:
        path = os.path.join(folder or ".", "sitecustomize.py")
        if os.path.abspath(folder or ".") != here and os.path.isfile(path):
            with open(path, encoding="utf-8") as f:
                exec(compile(f.read(), path, "exec"), {"__name__": "sitecustomize", "__file__": path})
            return


sys.meta_path.insert(0, NoMlflowForDeepSpeed())
atexit.register(gc.freeze)     # registered first, so it runs last of the exit handlers
_run_the_hidden_one()
