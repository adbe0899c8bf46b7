"""An offline probe suite in the GLUE layout, made from any plain-text corpus.

    python -m tools.make_probe_tasks --input CORPUS --output_dir DIR [--seed 0] \
        [--train_size 2000] [--dev_size 500] [--dev_fraction 0.2 | --heldout OUT] [--overwrite]

CORPUS: one sentence per line, a blank line between documents (the format of
tools/prepare_data.py; the demo corpus of tools/make_demo_corpus.py is one). DIR gets three
task folders that tools/finetune_glue.py reads like GLUE's (`--task all --data_dir DIR`):

- probe_swap (single sentence, SST-2 layout `sentence<TAB>label`): label 1 = the sentence as
  written, 0 = two of its inner words swapped. Both versions hold the same words, so counting
  words cannot tell them apart; knowing word order can.
- probe_samedoc (pair, RTE layout `index<TAB>sentence1<TAB>sentence2<TAB>label`): `same` = two
  sentences of one document, `different` = of two documents.
- probe_order (pair, RTE layout): two adjacent sentences of a document, `in_order` as written
  or `reversed`. Again the same words either way.

Only sentences of --min_words to --max_words words are used, and a word swap moves inner words
made of letters only (never the first or last word, never one carrying punctuation), so no
capital letter or full stop gives a swap away. Labels are balanced in every file.

Documents are split between train and dev (a seeded --dev_fraction of them go to dev), and a
dev sentence that also occurs in a training document is left out, so no dev sentence is seen
in training. The output is a function of the corpus and --seed. That split is the probe suite's
own: its dev documents may be in a checkpoint's pretraining data. With --heldout OUT (a
tools/prepare_data.py --output_dir) there is no split here: the dev examples come from the
documents prepare_data held out of its pretraining shards (its record, turing/heldout.py), the
training examples from its training documents, read again from its input (--input when that
has moved), so no dev sentence was pretrained on either.

DIR must be empty or new; with --overwrite the three task folders in it are replaced (and named
in a warning), other files are left. Every example is made before anything is written, and the
new folders are written beside the old ones and renamed into place, so a run that fails leaves
DIR as it was, never a mix of two probe sets.
"""
import logging
import os
import random
import shutil
import sys
import tempfile

if not __package__:  # run as `python tools/NAME.py`: import from the repository root, as `python -m` does
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from turing.errors import InputValueError, OneLineParser, tool_exit  # light (argparse only): before --help is answered

from tools.prep.documents import DocumentReader, list_input_files
from tools.prep.filters import recorded_split
from turing.glue import PROBE_LABELS, TASKS
from turing.outputs import clear_unfinished, earlier_output, install_staged

logger = logging.getLogger(__name__)


class ProbeError(InputValueError):
    """Bad input to the probe builder; the message names the flag or file."""


STAGING_PREFIX = ".make_probe_tasks."  # the folder new tasks are written in before they are renamed into place


def build_parser():
    p = OneLineParser(description="Make the offline probe tasks (GLUE layout) from a text corpus.",
                      epilog="guide: docs/finetuning.md")
    p.add_argument("--input", default=None, help="corpus: one sentence per line, blank line between documents "
                                                  "(a file, or a folder of .txt files); with --heldout, the corpus "
                                                  "prepare_data read, where it is now (default: the one OUT records)")
    p.add_argument("--output_dir", required=True, help="folder for probe_swap/, probe_samedoc/, probe_order/")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--train_size", type=int, default=2000, help="training examples per task (at most)")
    p.add_argument("--dev_size", type=int, default=500, help="dev examples per task (at most)")
    p.add_argument("--dev_fraction", type=float, default=0.2, help="share of the documents that go to dev")
    p.add_argument("--heldout", metavar="OUT", default=None,
                   help="a tools/prepare_data.py --output_dir: dev from the documents it held out of its pretraining "
                        "shards, train from its training documents (instead of a --dev_fraction split)")
    p.add_argument("--min_words", type=int, default=6, help="shortest sentence used, in words")
    p.add_argument("--max_words", type=int, default=40, help="longest sentence used, in words")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the probe tasks of an earlier run in --output_dir (else a non-empty folder is "
                        "refused)")
    return p


def split_documents(docs, dev_fraction, rng):
    """(train docs, dev docs): a seeded share of the documents, at least two on each side."""
    if len(docs) < 4:
        raise ProbeError(f"--input has {len(docs)} document(s); the probe tasks need at least 4 "
                         "(a blank line ends a document)")
    order = list(range(len(docs)))
    rng.shuffle(order)
    n_dev = min(len(docs) - 2, max(2, round(dev_fraction * len(docs))))
    dev = sorted(order[:n_dev])
    train = sorted(order[n_dev:])
    return [docs[i] for i in train], [docs[i] for i in dev]


def _balanced(positives, negatives, size, rng):
    """Up to `size` examples, half of each label, in random order."""
    half = min(size // 2, len(positives), len(negatives))
    examples = rng.sample(positives, half) + rng.sample(negatives, half)
    rng.shuffle(examples)
    return examples


def _swappable(words):
    """Positions of inner words that are letters only (no punctuation, not first or last)."""
    return [i for i in range(1, len(words) - 1) if words[i].isalpha()]


# Each generator takes the documents of one split, a document being its runs of usable
# sentences (consecutive in the corpus), and a seeded random.Random.


def swap_examples(docs, size, rng):
    """[(sentence, label)]: label "1" = as written, "0" = two inner words swapped."""
    sentences = [s for doc in docs for run in doc for s in run]
    candidates = [s for s in sentences if len({s.split()[i].lower() for i in _swappable(s.split())}) >= 2]
    rng.shuffle(candidates)
    half = min(size // 2, len(candidates) // 2)
    originals, to_swap = candidates[:half], candidates[half:2 * half]
    swapped = []
    for sentence in to_swap:
        words = sentence.split()
        positions = _swappable(words)
        while True:
            i, j = rng.sample(positions, 2)
            if words[i].lower() != words[j].lower():
                break
        words[i], words[j] = words[j], words[i]
        swapped.append(" ".join(words))
    examples = [(s, "1") for s in originals] + [(s, "0") for s in swapped]
    rng.shuffle(examples)
    return examples


def samedoc_examples(docs, size, rng):
    """[(sentence1, sentence2, label)]: `same` document or `different` documents."""
    different_label, same_label = PROBE_LABELS["probe_samedoc"]
    usable = [sentences for doc in docs if len(sentences := [s for run in doc for s in run]) >= 2]
    if len(usable) < 2:
        return []
    n = size // 2 + 1
    positives, negatives = [], []
    for _ in range(n):
        doc = rng.choice(usable)
        a, b = rng.sample(doc, 2)
        positives.append((a, b, same_label))
        first, second = rng.sample(range(len(usable)), 2)
        negatives.append((rng.choice(usable[first]), rng.choice(usable[second]), different_label))
    return _balanced(positives, negatives, size, rng)


def order_examples(docs, size, rng):
    """[(sentence1, sentence2, label)]: adjacent sentences `in_order` or `reversed`; each
    adjacent pair is used once."""
    reversed_label, in_order_label = PROBE_LABELS["probe_order"]
    pairs = [(run[i], run[i + 1]) for doc in docs for run in doc for i in range(len(run) - 1) if run[i] != run[i + 1]]
    rng.shuffle(pairs)
    half = min(size // 2, len(pairs) // 2)
    examples = ([(a, b, in_order_label) for a, b in pairs[:half]]
                + [(b, a, reversed_label) for a, b in pairs[half:2 * half]])
    rng.shuffle(examples)
    return examples


PROBES = {"probe_swap": swap_examples, "probe_samedoc": samedoc_examples, "probe_order": order_examples}


def write_task(folder, name, split, examples):
    task = TASKS[name]
    path = os.path.join(folder, f"{split}.tsv")
    with open(path, "w", encoding="utf-8") as f:
        if len(task.text_columns) == 1:
            f.write("sentence\tlabel\n")
            f.writelines(f"{s}\t{label}\n" for s, label in examples)
        else:
            f.write("index\tsentence1\tsentence2\tlabel\n")
            f.writelines(f"{i}\t{a}\t{b}\t{label}\n" for i, (a, b, label) in enumerate(examples))
    return path


def check_output_dir(output_dir, overwrite):
    """What --output_dir holds already; refused unless it is empty, or --overwrite. What a killed
    run left (its staging folder, the task folders of an install it did not finish: never a part of
    a suite read as the whole) is cleared first."""
    cleared = clear_unfinished(output_dir, STAGING_PREFIX)
    if cleared:
        logger.warning("%s: removed %s, left by a run that was stopped while moving them in", output_dir,
                       ", ".join(cleared))
    return earlier_output(output_dir, overwrite, ProbeError, "choose a new folder, or pass --overwrite to replace the probe tasks in it")


def _examples_in(folder):
    """'N train, M dev' of an earlier task folder (its lines less the header)."""
    counts = []
    for split in ("train", "dev"):
        path = os.path.join(folder, f"{split}.tsv")
        if os.path.isfile(path):
            with open(path, "rb") as f:
                counts.append(f"{max(0, sum(1 for _ in f) - 1)} {split}")
    return ", ".join(counts) or "no train.tsv or dev.tsv"


def install_tasks(output_dir, tasks):
    """Write {name: {split: examples}} as task folders under output_dir: into a staging folder
    beside them first, then moved into place (install_staged; an earlier folder of the name is
    replaced). What a killed run left there is check_output_dir's to clear, before the work."""
    os.makedirs(output_dir, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=output_dir)
    try:
        folders = [TASKS[name].folder for name in tasks]
        for name, splits in tasks.items():
            os.makedirs(os.path.join(staging, TASKS[name].folder))
            for split, examples in splits.items():
                write_task(os.path.join(staging, TASKS[name].folder), name, split, examples)
        replaced = [f"{name} ({_examples_in(os.path.join(output_dir, folder))})"
                    for name, folder in zip(tasks, folders) if os.path.lexists(os.path.join(output_dir, folder))]
        install_staged(staging, output_dir, folders)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return replaced


def make_probe_tasks(input_path, output_dir, seed=0, train_size=2000, dev_size=500, dev_fraction=0.2,
                     min_words=6, max_words=40, overwrite=False, heldout=None):
    """Write the three probe tasks; returns {task: {"train": n, "dev": n}}. `heldout`: a prepare_data
    output whose recorded split gives the dev and training documents."""
    if not 0 < dev_fraction < 1:
        raise ProbeError(f"--dev_fraction {dev_fraction}: must be between 0 and 1")
    if min(train_size, dev_size) < 2:
        raise ProbeError("--train_size and --dev_size must be at least 2")
    if min_words < 3 or max_words < min_words:
        raise ProbeError(f"--min_words {min_words} / --max_words {max_words}: need 3 <= min_words <= max_words")
    if input_path is None and heldout is None:
        raise ProbeError("give --input CORPUS, or --heldout OUT (a tools/prepare_data.py --output_dir)")
    present = check_output_dir(output_dir, overwrite)
    # Whitespace runs (tabs too) become one space: no tab or line break inside a TSV field.
    if heldout is not None:
        recorded = recorded_split(heldout, [input_path] if input_path else None)
        train_docs, dev_docs = recorded.train, recorded.heldout
        if len(dev_docs) < 2:
            raise ProbeError(f"--heldout {heldout}: prepare_data held out {len(dev_docs)} document(s); the probe "
                             "tasks need at least 2 (a larger --validation_fraction)")
    else:
        docs = [[" ".join(s.split()) for s in doc] for doc, _ in DocumentReader(list_input_files([input_path]))]
        train_docs, dev_docs = split_documents([doc for doc in docs if doc], dev_fraction, random.Random(seed))
    seen = {s for doc in train_docs for s in doc}

    def usable(doc, leave_out=()):
        """The document's runs of consecutive sentences of the allowed length (not in leave_out)."""
        runs, run = [], []
        for s in doc:
            if min_words <= len(s.split()) <= max_words and s not in leave_out:
                run.append(s)
            elif run:
                runs.append(run)
                run = []
        return runs + [run] if run else runs

    source = f"--heldout {heldout}" if heldout is not None else f"--input {input_path}"
    splits = {"train": ([usable(d) for d in train_docs], train_size),
              "dev": ([usable(d, seen) for d in dev_docs], dev_size)}
    tasks = {}
    for name, make in PROBES.items():
        tasks[name] = {}
        for split, (split_docs, size) in splits.items():
            # One generator per task and split (str seeds hash deterministically).
            examples = make(split_docs, size, random.Random(f"{seed}/{name}/{split}"))
            if not examples:
                raise ProbeError(f"{source}: too little text for {name} ({split}); use a bigger corpus "
                                 f"or lower --min_words")
            tasks[name][split] = examples
            if len(examples) < size - 1:
                logger.warning("%s %s: %d examples (asked for %d); the corpus has no more", name, split,
                               len(examples), size)
    replaced = install_tasks(output_dir, tasks)
    if replaced:
        logger.warning("--overwrite: replaced the earlier %s in %s", "; ".join(replaced), output_dir)
    kept = [name for name in present if name not in {TASKS[t].folder for t in tasks}]
    if kept:
        logger.warning("%s: left in place, not written by make_probe_tasks: %s", output_dir, ", ".join(kept))
    return {name: {split: len(examples) for split, examples in splits_.items()} for name, splits_ in tasks.items()}


def main(argv=None):
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s", force=True)

    def run():
        counts = make_probe_tasks(args.input, args.output_dir, args.seed, args.train_size, args.dev_size,
                                  args.dev_fraction, args.min_words, args.max_words, args.overwrite, args.heldout)
        for name, n in counts.items():
            print(f"{os.path.join(args.output_dir, name)}: {n['train']} train, {n['dev']} dev examples")
        return 0
    return tool_exit(run)


if __name__ == "__main__":
    sys.exit(main())
