"""Print the scores of several tools/finetune_glue.py runs side by side.

    python -m tools.glue_table pretrained=OUT_A "random init"=OUT_B [OUT_C ...]

Each argument is NAME=PATH or PATH (the column is then named after the folder); PATH is an
output folder of tools/finetune_glue.py or its results.json. One row per task plus the
average; a cell is the median score x100, with [min, max] over the seeds when there were
several; the last column is the majority-class baseline.
"""
import argparse
import os
import sys

from turing.glue import GlueError, load_results, results_table


def main(argv=None):
    parser = argparse.ArgumentParser(description="Scores of several fine-tuning runs side by side.")
    parser.add_argument("runs", nargs="+", metavar="[NAME=]PATH",
                        help="output folder (or results.json) of tools/finetune_glue.py")
    args = parser.parse_args(argv)
    runs = {}
    try:
        for spec in args.runs:
            name, path = spec.split("=", 1) if "=" in spec else (os.path.basename(os.path.normpath(spec)), spec)
            runs[name] = load_results(path)
    except (GlueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(results_table(runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
