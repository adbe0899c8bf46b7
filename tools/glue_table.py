"""Print the scores of several tools/finetune_glue.py runs side by side.

    python -m tools.glue_table pretrained=OUT_A "random init"=OUT_B [OUT_C ...]

Each argument is NAME=PATH or PATH; PATH is an output folder of tools/finetune_glue.py or its
results.json. A column without a NAME is named after its folder, with as many parent folders
as it takes to tell it from the other columns (`A/glue` and `B/glue`, not two `glue`). One row
per task plus the average over the tasks every column has (where a column lacks some, the row
says how many it averages and a note names those left out); a cell is the median score x100,
with [min, max] over the seeds when there were several; the last column is the majority-class
baseline. A run stopped before all its tasks finished is named under the table with the tasks it
did not reach.
"""
import os
import sys

if not __package__:  # run as `python tools/NAME.py`: import from the repository root, as `python -m` does
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from turing.errors import OneLineParser, tool_exit
from turing.glue import GlueError, load_run, results_table


def run_folder_parts(path):
    """The folder names of a run's path, outermost first (a results.json path: its folder's)."""
    path = os.path.abspath(path)
    if os.path.basename(path) == "results.json":
        path = os.path.dirname(path)
    return [part for part in path.split(os.sep) if part]


def column_names(specs):
    """[(name, path)] for the NAME=PATH or PATH arguments; a PATH column is named by the shortest
    tail of its folder path that no other column has. Two columns of one name are an error."""
    given = [spec.split("=", 1) if "=" in spec else (None, spec) for spec in specs]
    explicit = [name for name, _ in given if name is not None]
    auto = {i: run_folder_parts(path) for i, (name, path) in enumerate(given) if name is None}
    names = {}
    for i, parts in auto.items():
        for k in range(1, len(parts) + 1):
            tail = parts[-k:]
            if tail not in [other[-k:] for j, other in auto.items() if j != i] and "/".join(tail) not in explicit:
                names[i] = "/".join(tail)
                break
        else:
            names[i] = "/".join(parts)
    columns = [(names.get(i, name), path) for i, (name, path) in enumerate(given)]
    seen = set()
    for name, path in columns:
        if name in seen:
            raise GlueError(f"two columns named '{name}' ({path} is one); give each run its own NAME=PATH")
        seen.add(name)
    return columns


def build_parser():
    parser = OneLineParser(description="Scores of several fine-tuning runs side by side.",
                           epilog="guide: docs/finetuning.md")
    parser.add_argument("runs", nargs="+", metavar="[NAME=]PATH",
                        help="output folder (or results.json) of tools/finetune_glue.py")
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)

    def run():
        runs, notes = {}, []
        for name, path in column_names(args.runs):
            runs[name], unfinished = load_run(path)
            if unfinished:
                notes.append(f"{name}: the run stopped before {', '.join(unfinished)}")
        print(results_table(runs))
        for note in notes:
            print(note)
        return 0
    return tool_exit(run)


if __name__ == "__main__":
    sys.exit(main())
