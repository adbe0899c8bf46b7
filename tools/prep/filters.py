"""Which documents a run keeps and where each goes: one copy of each (exact duplicates, by
`document_key`), this part's with --num_parts, and the split: the training or the validation set,
by a running count over every document read. The kept documents are grouped into chunks of
about --chunk_size_mb (per set), the workers' units of work; the split is written down beside the
shards (SplitRecord, in turing/heldout.py's files) and read back by every later stage
(recorded_split)."""
import array
import json
import math
import os
from dataclasses import dataclass

import numpy as np

from tools.prep import TRAIN, VALIDATION, PrepareDataError
from tools.prep.documents import CorpusReader, document_size
from tools.prep.layouts import ReadOptions, find_sources
from tools.prep.sentences import SentenceSplitter, document_sentences
from turing import heldout
from turing.heldout import document_key   # the record's key, defined with the record


class DocumentFilter:
    """Which documents a run keeps: one copy of each (exact duplicates: the same document_key)
    and, with --num_parts, those of this part (key mod N, so all copies land in one part)."""

    def __init__(self, num_parts=1, part=0, dedup=True):
        self.num_parts, self.part, self.dedup = num_parts, part, dedup
        self.seen = set()              # 64-bit keys: ~70 bytes of memory per document kept
        self.read = self.duplicates = self.other_parts = 0

    def __call__(self, key):
        """Whether to keep the document of document_key `key`."""
        if self.num_parts > 1 and key % self.num_parts != self.part:
            self.other_parts += 1
            return False
        self.read += 1
        if self.dedup:
            if key in self.seen:
                self.duplicates += 1
                return False
            self.seen.add(key)
        return True


def is_validation_document(index, fraction):
    """Document `index` goes to validation when the running count floor(index*fraction) steps.

    Deterministic and evenly spread; exactly floor(n*fraction) of the first n documents.
    """
    return fraction > 0 and math.floor((index + 1) * fraction) > math.floor(index * fraction)


def iter_chunks(documents, chunk_bytes, validation_fraction, keep=None, record=None, stages=None):
    """Group documents (a CorpusReader) into chunks of about `chunk_bytes` of text, per set.

    Yields (set name, chunk index within the set, documents, input bytes consumed). The
    grouping depends only on the input, so the output does not depend on --workers. `keep`
    (a DocumentFilter) decides which documents are kept; `record(set name, document number,
    key, document)` (a SplitRecord) is told where each kept one goes. `stages` (a DocumentStages:
    near duplicates, decontamination, language, quality; or a StageWorkers, its decisions made in
    processes of their own, the same ones) see each document `keep` kept, and may drop or cut it,
    before it is recorded.
    """
    pending = {TRAIN: [[], 0, 0], VALIDATION: [[], 0, 0]}   # documents, text bytes, chunk index
    consumed = 0
    dealt = _dealt(documents, validation_fraction, keep)
    if stages is not None:
        dealt = stages.staged(dealt)
    for name, number, key, doc, nbytes in dealt:
        consumed += nbytes
        if doc is None:
            continue
        if record is not None:
            record(name, number, key, doc)
        entry = pending[name]
        entry[0].append(doc)
        entry[1] += document_size(doc)
        if entry[1] >= chunk_bytes:
            yield name, entry[2], entry[0], consumed
            consumed = 0
            pending[name] = [[], 0, entry[2] + 1]
    for name, (docs, _, chunk_index) in pending.items():
        if docs:
            yield name, chunk_index, docs, consumed
            consumed = 0


def _dealt(documents, validation_fraction, keep):
    """(set name, document number, key, document, input bytes) of each document read, in order;
    the document None where none is kept (an empty one, a duplicate, another part's)."""
    index = 0
    for doc, nbytes in documents:
        if not doc:
            yield None, None, None, None, nbytes
            continue
        # the split counts every document read, kept or not: a duplicate left out, or another
        # part's document, moves no other document between the sets (and the probe suite's
        # held-out documents, split by the same rule, stay the validation set's)
        name = VALIDATION if is_validation_document(index, validation_fraction) else TRAIN
        index += 1
        key = document_key(doc)
        yield name, index - 1, key, doc if keep is None or keep(key) else None, nbytes


class SplitRecord:
    """Which documents went to which set, written beside the shards for every later stage to read
    (turing/heldout.py's files): the held-out documents as read, their sentences split as the
    workers split them, and the training documents' keys. Made in the reader process as documents
    are dealt (so a resumed run, which reads its input again, makes it again whole), written in
    the temporary folder and renamed into place with the shards (install_split_record); the shards
    never depend on it."""

    def __init__(self, tmp, part=None):
        self.tmp = tmp
        self.names = heldout.manifest_names(part)
        self.heldout = open(os.path.join(tmp, self.names[1]), "w", encoding="utf-8")
        self.train_keys = array.array("Q")          # 8 bytes a training document
        self.validation_documents = 0
        self.split = SentenceSplitter()     # the workers' (loaded only for a layout that needs it)

    def __call__(self, name, number, key, document):
        if name == TRAIN:
            self.train_keys.append(key)
            return
        sentences = document_sentences(document, self.split)
        own = document_key(sentences)   # the key the reader checks: the document's, unless reduced (wikitext)
        self.heldout.write(json.dumps({"document": number, "key": key, **({"sentences_key": own} if own != key else {}),
                                       "sentences": sentences}) + "\n")
        self.validation_documents += 1

    def finish(self, args, documents_read):
        """Write documents.json and the training keys (the held-out documents are written already)."""
        self.heldout.close()
        documents, heldout_file, keys_file = self.names
        np.save(os.path.join(self.tmp, keys_file), np.sort(np.frombuffer(self.train_keys, dtype=np.uint64)))
        reading = {k: getattr(args, k) for k in ("input_format", "text_field", "hf_split", "hf_config",
                                                  "skip_bad_records", "chunk_size_mb", "keep_duplicates")}
        inputs = [os.path.abspath(p) if os.path.exists(p) else p for p in args.input]
        record = {
            "split": "the documents read are numbered in input order from 0 (every one: kept, a duplicate or "
                     "another part's); document i is held out when floor((i + 1) * validation_fraction) > "
                     "floor(i * validation_fraction)",
            "validation_fraction": args.validation_fraction, "documents_read": documents_read,
            "num_parts": args.num_parts, "part": args.part if args.num_parts > 1 else None,
            "train": {"documents": len(self.train_keys), "keys": keys_file},
            "validation": {"documents": self.validation_documents, "documents_file": heldout_file},
            # named by the function itself, so the name follows it (no reader compares this string)
            "key": f"{document_key.__module__}.{document_key.__qualname__}: blake2b (8 bytes, little-endian) "
                   "of the text case-folded, whitespace collapsed",
            "reading": {"input": inputs, **reading},
        }
        with open(os.path.join(self.tmp, documents), "w", encoding="utf-8") as f:
            json.dump(record, f, indent=1)

    def close(self):
        self.heldout.close()


def install_split_record(tmp, out, part=None, shards=None):
    """Rename the files of a SplitRecord finished in `tmp` into OUT; a run without parts, which
    replaced every shard, removes every part's record too (a part's own files are replaced by the
    rename). `shards`: {set name: {shard name: turing.heldout.shard_digest}} of this run's (or
    part's) shards, listed in its documents.json first (the trainer refuses any other file there)."""
    names = heldout.manifest_names(part)
    if shards is not None:
        path = os.path.join(tmp, names[0])
        with open(path, encoding="utf-8") as f:
            record = json.load(f)
        for name in (TRAIN, VALIDATION):
            record[name]["shards"] = shards.get(name, {})
        record["shard_digest"] = heldout.SHARD_DIGEST
        with open(path, "w", encoding="utf-8") as f:
            json.dump(record, f, indent=1)
    if part is None:
        for name in heldout.manifest_files(out):
            if name not in names:
                os.remove(os.path.join(out, name))
    for name in names:
        os.replace(os.path.join(tmp, name), os.path.join(out, name))


@dataclass
class RecordedSplit:
    """The documents of a prepare_data output by its record, in input order, each a list of
    sentences (whitespace runs made one space)."""
    train: list
    heldout: list
    numbers: list          # the held-out documents' numbers in the input (from 0, as the split counts)


def recorded_split(out, inputs=None, flag="--heldout"):
    """The split the prepare_data output `out` recorded (SplitRecord): the held-out documents as
    its record holds them, the training ones read again from its input (`inputs`, default the one
    recorded) the same way and known by their keys; the input must still hold every one of them."""
    manifest = heldout.read_manifest(out, flag)
    held = list(manifest.heldout_documents())
    wanted = set(manifest.train_keys().tolist())
    reading = manifest.parts[0]["reading"]
    inputs = inputs or reading["input"]
    options = ReadOptions(text_field=reading["text_field"], hf_split=reading["hf_split"],
                          hf_config=reading["hf_config"], skip_bad_records=reading["skip_bad_records"])
    sources = find_sources(inputs, reading["input_format"], exclude=out, options=options)
    split = SentenceSplitter()
    train = {}
    for doc, _ in CorpusReader(sources, options, max_document_bytes=int(reading["chunk_size_mb"] * 2**20)):
        key = document_key(doc) if doc else None
        if key in wanted and key not in train:
            train[key] = _one_space(document_sentences(doc, split))
    if len(train) < len(wanted):
        raise PrepareDataError(f"{flag} {out}: its input {' '.join(inputs)} holds {len(train)} of the {len(wanted)} "
                               f"training documents {manifest.paths[0]} lists (by key); give the corpus that "
                               "prepare_data read as --input")
    return RecordedSplit(list(train.values()), [_one_space(d["sentences"]) for d in held],
                         [d["document"] for d in held])


def _one_space(sentences):
    return [" ".join(s.split()) for s in sentences]
