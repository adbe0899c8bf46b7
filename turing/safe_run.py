"""Run a Python module's command line with every torch.load weights-only.

    python -m turing.safe_run deepspeed.checkpoint.ds_to_universal --input_folder ... --output_folder ...

DeepSpeed's command-line converters read checkpoints with the full unpickler, which runs any
code a crafted file holds. Here they run under turing.checkpoint_files.weights_only_loads: torch.load
is weights-only whatever they ask, with the classes DeepSpeed's own checkpoints hold allowed
(worker processes they fork inherit both).
"""
import runpy
import sys

from turing.checkpoint_files import weights_only_loads


def main(argv):
    if not argv:
        raise SystemExit("usage: python -m turing.safe_run MODULE [ARGS ...]")
    module, sys.argv = argv[0], list(argv)
    with weights_only_loads():
        runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
