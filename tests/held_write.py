"""A tool, held for ever at one point of its write of one output file, after printing PAUSED: its
temporary file written whole and not yet renamed into place, the moment a SIGKILL leaves it beside
the output (reached whatever the machine's speed). `python tests/held_write.py FILE MODULE ARGS`
runs `python -m MODULE ARGS` held at the rename of FILE's temporary (turing.jsonfile.temporary_name).
"""
import os
import runpy
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from turing.jsonfile import temporary_name  # noqa: E402

HELD, MODULE = os.path.abspath(sys.argv[1]), sys.argv[2]
replace = os.replace


def held_replace(source, target, *args, **kwargs):
    if os.path.abspath(target) == HELD and os.fspath(source) == temporary_name(os.fspath(target)):
        print("PAUSED", flush=True)
        time.sleep(3600)
    replace(source, target, *args, **kwargs)


os.replace = held_replace
sys.argv = [MODULE, *sys.argv[3:]]
runpy.run_module(MODULE, run_name="__main__", alter_sys=True)
