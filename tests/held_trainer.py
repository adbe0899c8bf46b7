"""deepspeed_train.py, held for ever at one point of its write of one checkpoint, after printing
PAUSED: the moment a SIGKILL leaves that checkpoint unfinished, reached whatever the machine's
speed (a kill timed by the log can land a step later, or after the run's end). Run as the
trainer is, `python tests/held_trainer.py ARGS` or under the launcher in its place, with
HELD_TAG (the checkpoint's tag) and HELD_AT in the environment:

- "engine": where the engine has begun the checkpoint's files (its model states file there,
  still empty; rank 0 after the writing marker);
- "marker": rank 0 just before the completion marker (every rank's files written).

Other ranks wait for rank 0 in the checkpoint's next collective.
"""
import os
import runpy
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import turing.checkpointer  # noqa: E402
from turing.checkpoint_files import COMPLETE_MARKER, MODEL_STATES_FILE  # noqa: E402

TAG, AT = os.environ["HELD_TAG"], os.environ["HELD_AT"]
write_atomic = turing.checkpointer.write_atomic
write_engine_checkpoint = turing.checkpointer.write_engine_checkpoint


def pause():
    print("PAUSED", flush=True)
    time.sleep(3600)


def held_before_marker(path, text):
    if AT == "marker" and path.endswith(COMPLETE_MARKER) and os.path.basename(os.path.dirname(path)) == TAG:
        pause()
    write_atomic(path, text)


def held_in_engine_write(engine, path, tag, client_state):
    if AT == "engine" and tag == TAG and int(os.environ.get("RANK", "0")) == 0:
        open(os.path.join(path, tag, MODEL_STATES_FILE), "wb").close()  # as torch's writer opens it
        pause()
    write_engine_checkpoint(engine, path, tag, client_state)


turing.checkpointer.write_atomic = held_before_marker
turing.checkpointer.write_engine_checkpoint = held_in_engine_write
script = os.path.join(REPO, "deepspeed_train.py")
sys.argv = [script, *sys.argv[1:]]
runpy.run_path(script, run_name="__main__")
