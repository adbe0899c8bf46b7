"""Minimal pairs in BLiMP's jsonl layout, made from the documents tools/prepare_data.py held out of
its pretraining shards, for tools/eval_mlm.py.

    python -m tools.make_minimal_pairs --heldout OUT --output FILE.jsonl [--input CORPUS] [--seed 0] \
        [--pairs_per_kind 250] [--kinds swap shuffle repeat replace] [--tokenizer TOKENIZER] \
        [--min_words 6] [--max_words 20] [--overwrite]

OUT: a tools/prepare_data.py --output_dir made with --validation_fraction. Its record of the split
(OUT/documents.json and OUT/heldout.jsonl, turing/heldout.py) holds the documents it kept out of
the training shards, as it read them: the pairs are made from their sentences, so the checkpoint
never trained on them (the demo's data holds out 5%). The training documents, for the word
frequencies of `replace` and to leave out a held-out sentence that also occurs in one of them,
are read again from the input the record names (--input when it has moved) and known by their
keys; an input that lacks some of them is refused. Each line of FILE.jsonl is a pair,
`sentence_good` (a sentence of a held-out document, as written) and `sentence_bad` (the same
sentence corrupted), with `UID` = the kind of corruption, `pairID` (its number within the kind),
`linguistics_term` (the kind in words, as BLiMP's field), `lexically_identical` (the same words in
both) and `document` (the document's number in the input, from 0, as prepare_data's split counts):

- swap:    two adjacent inner words swapped;
- shuffle: the inner words put in another random order;
- repeat:  an inner word repeated in place of the word after it ("the cat sat on" -> "the cat cat
           on"), so both sentences keep the same number of words;
- replace: an inner word replaced by another word of (nearly) the same frequency in the training
           documents: a random one of the words within FREQUENCY_NEIGHBOURS (3) places of it in the
           frequency ranking, not already in the sentence, so word frequency alone cannot tell the
           two apart.

Inner words are the letter-only words that are neither first nor last (no capital letter or full
stop moves, as in the probe suite's swaps); replace only touches lower-case words. No corruption
changes a sentence's length: a pseudo-log-likelihood is a sum over tokens, so a longer bad
sentence would lose on length alone (a randomly initialised model would "pass"). swap and shuffle
keep the very tokens; with --tokenizer (a vocab.txt, a tokenizer.json or a model folder), repeat
and replace keep its token count too (the words moved in have as many pieces as those they
replace, inside a sentence: after a space, which a byte-level BPE keeps in the word's first token).

The tool never splits a corpus itself (a split made again drifts from prepare_data's: another
layout beside the text, another --chunk_size_mb): the old --input CORPUS --validation_fraction F
and --dev_fraction forms are refused with a line naming --heldout. Each sentence is used at most
once per kind. The output is a function of OUT's record, the input, the flags and --seed. An
existing FILE is refused unless --overwrite (which says what it replaces).
"""
import argparse
import json
import logging
import os
import random
import sys
from collections import Counter

if not __package__:  # run as `python tools/NAME.py`: import from the repository root, as `python -m` does
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from turing.errors import InputValueError, OneLineParser, tool_exit  # light (argparse only): before --help is answered

from tools.prep.filters import recorded_split
from turing.jsonfile import write_atomic
from turing.tokenization import load_tokenizer

logger = logging.getLogger(__name__)

KINDS = ("swap", "shuffle", "repeat", "replace")
DESCRIPTIONS = {"swap": "adjacent words swapped", "shuffle": "inner words shuffled",
                "repeat": "a word repeated over the next", "replace": "a word replaced, same frequency"}
FREQUENCY_NEIGHBOURS = 3   # replace: candidates are this many words on each side in the frequency ranking


class MinimalPairsError(InputValueError):
    """Bad input to the pair builder; the message names the flag or file."""


def build_parser():
    p = OneLineParser(description="Make minimal pairs (BLiMP's jsonl layout) from the documents "
                                  "tools/prepare_data.py held out of its pretraining shards.",
                      epilog="guide: docs/evaluation.md")
    p.add_argument("--heldout", metavar="OUT", default=None,
                   help="a tools/prepare_data.py --output_dir: the pairs come from the documents it held out "
                        "(its documents.json and heldout.jsonl)")
    p.add_argument("--input", nargs="+", default=None,
                   help="the corpus prepare_data read, where it is now (default: the input OUT's record names); "
                        "its training documents give the word frequencies")
    p.add_argument("--output", required=True, help="the .jsonl file to write")
    p.add_argument("--seed", type=int, default=0, help="seed of the corruptions")
    p.add_argument("--pairs_per_kind", type=int, default=250, help="pairs of each kind (at most)")
    p.add_argument("--kinds", nargs="+", default=list(KINDS), choices=KINDS, help="kinds of corruption")
    p.add_argument("--tokenizer", "--vocab_file", dest="vocab_file", default=None,
                   help="the model's tokenizer (vocab.txt, tokenizer.json or a folder holding one): repeat and "
                        "replace then keep the sentence's token count (--vocab_file: the older name)")
    p.add_argument("--min_words", type=int, default=6, help="shortest sentence used, in words")
    p.add_argument("--max_words", type=int, default=20, help="longest sentence used, in words")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --output")
    # the forms that split the corpus here, refused in one line (see SPLIT_AGAIN)
    p.add_argument("--validation_fraction", default=None, help=argparse.SUPPRESS)
    p.add_argument("--dev_fraction", default=None, help=argparse.SUPPRESS)
    return p


SPLIT_AGAIN = {
    "validation_fraction": "make_minimal_pairs no longer splits the corpus again (that split drifted from "
                           "prepare_data's with another layout beside the text or another --chunk_size_mb, and "
                           "its held-out sentences were training sentences)",
    "dev_fraction": "the probe suite's dev documents are not held out of the pretraining shards",
}


# ---------------------------------------------------------------------------------------------
# Corruptions: each takes the words of a sentence and a random.Random, returns the corrupted words
# or None when the sentence has nothing to corrupt that way.


def inner(words):
    """Positions of the letter-only words that are neither first nor last."""
    return [i for i in range(1, len(words) - 1) if words[i].isalpha()]


def swap(words, rng, _context):
    spots = [i for i in inner(words) if i + 1 < len(words) - 1 and words[i + 1].isalpha()
             and words[i].lower() != words[i + 1].lower()]
    if not spots:
        return None
    i = rng.choice(spots)
    out = list(words)
    out[i], out[i + 1] = out[i + 1], out[i]
    return out


def shuffle(words, rng, _context):
    spots = inner(words)
    if len({words[i].lower() for i in spots}) < 3:
        return None
    moved = [words[i] for i in spots]
    for _ in range(10):
        rng.shuffle(moved)
        if [w.lower() for w in moved] != [words[i].lower() for i in spots]:
            out = list(words)
            for i, w in zip(spots, moved):
                out[i] = w
            return out
    return None


def repeat(words, rng, context):
    spots = [i for i in inner(words) if i + 1 < len(words) - 1 and words[i + 1].isalpha()
             and words[i].lower() != words[i + 1].lower() and context.same_pieces(words[i], words[i + 1])]
    if not spots:
        return None
    i = rng.choice(spots)
    out = list(words)
    out[i + 1] = words[i]
    return out


def replace(words, rng, context):
    present = {w.lower() for w in words}
    spots = [i for i in inner(words) if words[i].islower() and words[i] in context.rank]
    rng.shuffle(spots)
    for i in spots:
        candidates = [w for w in context.neighbours(words[i]) if w not in present
                      and context.same_pieces(w, words[i])]
        if candidates:
            out = list(words)
            out[i] = rng.choice(candidates)
            return out
    return None


CORRUPTIONS = {"swap": swap, "shuffle": shuffle, "repeat": repeat, "replace": replace}


class Context:
    """What the corruptions need beyond the sentence: word frequencies of the training documents
    (lower-case letter-only words) and, given a tokenizer, token counts."""

    def __init__(self, train_docs, tokenizer=None, seed=0):
        counts = Counter(w for doc in train_docs for s in doc for w in s.split() if w.isalpha() and w.islower())
        self.counts = counts
        # Words of one count in a seeded random order: alphabetical neighbours would be inflections
        # of the same word ("return", "returned"), which often still make a sentence.
        words = sorted(counts)
        random.Random(f"{seed}/frequency").shuffle(words)
        self.ranked = sorted(words, key=counts.__getitem__)  # stable: the random order within a count
        self.rank = {w: r for r, w in enumerate(self.ranked)}
        self.tokenizer = tokenizer
        self._pieces = {}

    def neighbours(self, word):
        r = self.rank[word]
        return [w for w in self.ranked[max(0, r - FREQUENCY_NEIGHBOURS):r + FREQUENCY_NEIGHBOURS + 1] if w != word]

    def pieces(self, word):
        if word not in self._pieces:
            self._pieces[word] = len(self.tokenizer.encode_batch([word], after_space=True)[0])  # an inner word
        return self._pieces[word]

    def same_pieces(self, a, b):
        return self.tokenizer is None or self.pieces(a) == self.pieces(b)


# ---------------------------------------------------------------------------------------------


def make_pairs(held_docs, doc_numbers, context, kinds, pairs_per_kind, seed, min_words, max_words, seen=()):
    """[record] of every kind: BLiMP fields plus `lexically_identical` and `document`."""
    first_document = {}  # sentence -> the first held-out document holding it (a sentence is used once)
    for doc, number in zip(held_docs, doc_numbers):
        for s in doc:
            if min_words <= len(s.split()) <= max_words and s not in seen:
                first_document.setdefault(s, number)
    sentences = list(first_document.items())
    records = []
    for kind in kinds:
        rng = random.Random(f"{seed}/{kind}")  # one generator per kind (str seeds hash deterministically)
        order = list(sentences)
        rng.shuffle(order)
        made = 0
        for sentence, number in order:
            if made == pairs_per_kind:
                break
            words = sentence.split()
            bad = CORRUPTIONS[kind](words, rng, context)
            if bad is None or bad == words:
                continue
            records.append({"sentence_good": sentence, "sentence_bad": " ".join(bad), "UID": kind,
                            "pairID": str(made), "linguistics_term": DESCRIPTIONS[kind],
                            "lexically_identical": kind in ("swap", "shuffle"), "document": number})
            made += 1
        if made < pairs_per_kind:
            logger.warning("%s: %d pairs (asked for %d); the held-out documents have no more", kind, made,
                           pairs_per_kind)
    return records


def write_jsonl(path, records, overwrite):
    if os.path.exists(path):
        if not overwrite:
            raise MinimalPairsError(f"--output {path} exists; pass --overwrite to replace it, or give another file")
        with open(path, "rb") as f:
            logger.warning("--overwrite: replacing %s (%d lines)", path, sum(1 for _ in f))
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    write_atomic(path, "".join(json.dumps(r) + "\n" for r in records))   # what a killed run left goes too


def make_minimal_pairs(heldout, output, seed=0, pairs_per_kind=250, kinds=KINDS, vocab_file=None, min_words=6,
                       max_words=20, overwrite=False, inputs=None):
    """Write the pairs from the held-out documents of the prepare_data output `heldout`; returns
    {kind: count}."""
    if pairs_per_kind < 1:
        raise MinimalPairsError(f"--pairs_per_kind {pairs_per_kind}: must be at least 1")
    if min_words < 4 or max_words < min_words:
        raise MinimalPairsError(f"--min_words {min_words} / --max_words {max_words}: need 4 <= min_words <= max_words")
    if os.path.exists(output) and not overwrite:  # before any work
        raise MinimalPairsError(f"--output {output} exists; pass --overwrite to replace it, or give another file")
    split = recorded_split(heldout, inputs)
    train_docs, held_docs, numbers = split.train, split.heldout, split.numbers
    if not held_docs:
        raise MinimalPairsError(f"--heldout {heldout}: prepare_data held no document out (it ran without "
                                "--validation_fraction, or with one too small for the corpus)")
    tokenizer = load_tokenizer(vocab_file) if vocab_file else None
    seen = {s for doc in train_docs for s in doc}
    records = make_pairs(held_docs, numbers, Context(train_docs, tokenizer, seed), kinds, pairs_per_kind, seed,
                         min_words, max_words, seen)
    if not records:
        raise MinimalPairsError(f"--heldout {heldout}: no pair could be made from the held-out documents; use a "
                                "bigger corpus, a larger --validation_fraction or other --min_words/--max_words")
    write_jsonl(output, records, overwrite)
    return dict(Counter(r["UID"] for r in records))


def refused_form(args):
    """The one-line error of a command line that asks for a split made here, or lacks --heldout."""
    for flag, why in SPLIT_AGAIN.items():
        if getattr(args, flag) is not None:
            return (f"--{flag}: {why}; give --heldout OUT, the tools/prepare_data.py --output_dir whose held-out "
                    "documents to use (it records them)")
    if args.heldout is None:
        return ("--heldout OUT is needed: the tools/prepare_data.py --output_dir (made with --validation_fraction) "
                "whose held-out documents the pairs are made from")
    return None


def main(argv=None):
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    refused = refused_form(args)
    if refused:
        print(f"error: {refused}", file=sys.stderr)
        return 2

    def run():
        counts = make_minimal_pairs(args.heldout, args.output, args.seed, args.pairs_per_kind, args.kinds,
                                    args.vocab_file, args.min_words, args.max_words, args.overwrite, args.input)
        print(f"{args.output}: " + ", ".join(f"{n} {kind}" for kind, n in counts.items()) + " pairs")
        return 0
    return tool_exit(run)


if __name__ == "__main__":
    sys.exit(main())
