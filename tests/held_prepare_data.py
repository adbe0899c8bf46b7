"""tools/prepare_data.py with the stage worker that decides document number HELD_DOCUMENT (in the
environment) held for ever after printing PAUSED: the moment the run's reader and all its stage
workers are alive, reached whatever the machine's speed (a run polled for them can end first on a
fast machine). Run as the tool is: `python tests/held_prepare_data.py ARGS`.
"""
import os
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from tools import prepare_data  # noqa: E402
from tools.prep.stages import DocumentStages  # noqa: E402

HELD = int(os.environ["HELD_DOCUMENT"])
decide = DocumentStages.decide


def held_decide(self, set_name, number, document):
    if number == HELD:
        print("PAUSED", flush=True)
        time.sleep(3600)
    return decide(self, set_name, number, document)


DocumentStages.decide = held_decide        # the forked reader and stage workers inherit it
sys.exit(prepare_data.main(sys.argv[1:]))
