"""tools/prepare_parts.py with each part of HELD_PARTS (in the environment: "1", "0,1") held for
ever where its stage worker decides a document numbered HELD_DOCUMENT or more, after printing
"PAUSED part K pid P" (P: the part's own process, prepare_data's main process) to the file
HELD_LOG: the moment the part's process, its workers, reader and stage worker are all alive,
reached whatever the machine's speed. Run as the tool is: `python tests/held_prepare_parts.py ARGS`.

The hold travels with the pipeline step (HeldPart, a PreparePart defined here, in __main__, which
Ray pickles by value), so it holds a part wherever it runs: a process of this command, or one of
a Ray actor.
"""
import os
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from tools import prepare_parts  # noqa: E402
from tools.prep.stages import DocumentStages  # noqa: E402


class HeldPart(prepare_parts.PreparePart):
    def __init__(self, argv, errors=None):
        super().__init__(argv, errors)
        self.held = {int(k) for k in os.environ["HELD_PARTS"].split(",")}
        self.first = int(os.environ["HELD_DOCUMENT"])
        self.log = os.environ["HELD_LOG"]

    def __call__(self, data, rank, world_size):
        if rank in self.held:   # in the part's process: its reader and stage workers, forked later, inherit it
            part, decide = os.getpid(), DocumentStages.decide

            def held_decide(stages, set_name, number, document):
                if number >= self.first:
                    with open(self.log, "a", encoding="utf-8") as f:
                        f.write(f"PAUSED part {rank} pid {part}\n")
                    time.sleep(3600)
                return decide(stages, set_name, number, document)

            DocumentStages.decide = held_decide
        return super().__call__(data, rank, world_size)


prepare_parts.PreparePart = HeldPart
sys.exit(prepare_parts.main(sys.argv[1:]))
