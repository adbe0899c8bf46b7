"""Which documents a prepare_data output trained on and which it held out: the record
tools/prepare_data.py writes beside its shards, defined and read here, and the trainer's check that
a validation set's documents are not in its training shards.

The split has one owner: prepare_data decides which documents go to the validation set and writes
that down; every later stage reads it back (tools/make_minimal_pairs.py and make_probe_tasks.py
take their held-out sentences from it, the trainer checks its validation set with it) instead of
splitting the corpus again. The record sits at the output folder's top level, never inside
train/ or validation/ (training reads those whole: the Bing provider takes every entry of train/
for a shard folder):

    OUT/documents.json            the split: its rule, the fraction, the counts, how the input was
                                  read, the names of the two files below, and each set's shards
    OUT/heldout.jsonl             one line per held-out document, in input order, as prepare_data
                                  read it: {"document": its number in the input (from 0, as the
                                  split counts), "key": its key, "sentences": [...]}
    OUT/train_document_keys.npy   the keys of the training documents, uint64, sorted

With --num_parts each part writes its own three files, named by its part (documents.part003.json,
heldout.part003.jsonl, train_document_keys.part003.npy); a folder's record is all of them together.
A document's key is `document_key` below (prepare_data's, tools/prep/filters.py imports it): a 64-bit
blake2b hash of its text, case-folded and with whitespace collapsed (so equal for the exact
duplicates prepare_data keeps once).

What is checked, where the record is read:
- heldout.jsonl (`Manifest.heldout_documents`, the one reader: make_minimal_pairs, make_probe_tasks,
  the trainer's count): each line's key is the document key of its sentences (a document whose
  sentences are not its text as read, wikitext reduced from its markup, also holds
  "sentences_key", theirs). A line whose sentences were changed since is refused in one line
  naming it; nothing downstream takes other text for held-out text.
- The shards: documents.json lists the files it made in each set, {"train": {..., "shards":
  {name: {"bytes": size, "digest": shard_digest}}}, "validation": {...}} (a part's record its
  part's shards), so the record is tied to the files and not to the folder alone. Every entry of a
  train/ or validation/ folder whose output has such a record must be listed by it with the same
  size and digest (`check_listed_shards`, run by turing.shard_tokenizer's check before it trusts
  the tokenizer record: the trainer and eval_mlm), else one line names the file: a shard copied in
  from another run would train past both records' checks. A record of an older prepare_data lists
  no shards, and shards without a record (NVIDIA's own tool's) have nothing to be listed in: both
  train as before.
- `shard_digest` must cost little on a shard of gigabytes, at every start: blake2b over each
  file's name and size and SAMPLE_BLOCKS blocks of SAMPLE_BYTES at evenly spaced offsets (the
  first and the last included; a file of up to 64 KiB whole), 64 KiB read a file. It tells one
  run's shard from another's (their sizes and hdf5 headers differ, and every sample), not a file
  edited in place between the samples.
"""
import hashlib
import json
import logging
import os
import re
from dataclasses import dataclass

import numpy as np

from turing.errors import InputValueError

logger = logging.getLogger(__name__)

MANIFEST = re.compile(r"^documents(\.part\d+)?\.json$")
MANIFEST_KEYS = ("split", "validation_fraction", "documents_read", "train", "validation", "reading")
SETS = ("train", "validation")        # tools.prep's TRAIN and VALIDATION: the set folders and the record's sections
SAMPLE_BLOCKS, SAMPLE_BYTES = 16, 4096
SHARD_DIGEST = (f"blake2b (16 bytes) of each file's name, size and {SAMPLE_BLOCKS} blocks of {SAMPLE_BYTES} bytes at "
                f"evenly spaced offsets (the whole file up to {SAMPLE_BLOCKS * SAMPLE_BYTES} bytes); a shard folder's "
                f"files in name order (turing.heldout.shard_digest)")


class HeldOutError(InputValueError):
    """A missing or unreadable record, or an entry of it not what prepare_data wrote (a changed
    held-out line, a shard it does not list); the message names the file and what was expected."""


def document_key(document):
    """A 64-bit hash of the document's text, case-folded and with its whitespace collapsed: equal for
    exact duplicates (markup and all, for wikitext), used to drop them and to deal parts, and the
    record's key of a document (a list of sentences is its sentences joined by spaces)."""
    text = " ".join(document) if isinstance(document, list) else document
    normalised = " ".join(text.casefold().split())
    return int.from_bytes(hashlib.blake2b(normalised.encode("utf-8"), digest_size=8).digest(), "little")


def shard_digest(path):
    """{"bytes": size, "digest": hex} of a shard (an hdf5 file, or a Bing shard folder: its files in
    name order): SHARD_DIGEST, reading SAMPLE_BLOCKS x SAMPLE_BYTES of each file whatever its size."""
    if os.path.isdir(path):
        files = sorted(os.path.relpath(os.path.join(d, n), path) for d, _, names in os.walk(path) for n in names)
    else:
        files = [""]
    h, total = hashlib.blake2b(digest_size=16), 0
    for name in files:
        with open(os.path.join(path, name) if name else path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            h.update(name.encode("utf-8") + b"\0" + size.to_bytes(8, "little"))
            if size <= SAMPLE_BLOCKS * SAMPLE_BYTES:
                h.update(f.read())
            else:
                for k in range(SAMPLE_BLOCKS):
                    f.seek(k * (size - SAMPLE_BYTES) // (SAMPLE_BLOCKS - 1))
                    h.update(f.read(SAMPLE_BYTES))
        total += size
    return {"bytes": total, "digest": h.hexdigest()}


def manifest_names(part=None):
    """(documents.json, heldout.jsonl, train_document_keys.npy) of a run, or of part `part`."""
    tag = "" if part is None else f".part{part:03d}"
    return f"documents{tag}.json", f"heldout{tag}.jsonl", f"train_document_keys{tag}.npy"


def manifest_files(folder):
    """Every file of the records in `folder` (all parts), by name; [] without one."""
    if not os.path.isdir(folder):
        return []
    found = []
    for name in sorted(os.listdir(folder)):
        match = MANIFEST.match(name)
        if match:
            found += manifest_names(int(match.group(1)[5:]) if match.group(1) else None)
    return [name for name in found if os.path.exists(os.path.join(folder, name))]


@dataclass
class Manifest:
    """The record of a prepare_data output folder: one documents.json per part (parsed, each with
    the paths of its two files)."""
    folder: str
    parts: list

    def heldout_documents(self):
        """The held-out documents of every part: dicts with "document", "key", "sentences" (and
        "sentences_key" where their key is not the document's); a line whose sentences are not the
        document of its key is refused."""
        for part in self.parts:
            path = part["heldout_path"]
            with open(path, encoding="utf-8") as f:
                for number, line in enumerate(f, start=1):
                    try:
                        record = json.loads(line)
                        ok = (isinstance(record.get("key"), int) and isinstance(record.get("document"), int)
                              and isinstance(record.get("sentences"), list)
                              and all(isinstance(s, str) for s in record["sentences"])
                              and isinstance(record.get("sentences_key", 0), int))
                    except (ValueError, AttributeError):
                        ok = False
                    if not ok:
                        raise HeldOutError(f"{path}: line {number} is not a held-out document (expected a JSON "
                                           f"object with an integer document and key and a list of sentences)")
                    expected, found = record.get("sentences_key", record["key"]), document_key(record["sentences"])
                    if found != expected:
                        raise HeldOutError(
                            f"{path}: line {number}: its sentences are not held-out document {record['document']}'s "
                            f"(their key is {found}, the line's {expected}): changed since prepare_data wrote them "
                            f"(or the record is an older prepare_data's of wikitext, keyed by its markup); make the "
                            f"shards and the record again with tools/prepare_data.py")
                    yield record

    def heldout_keys(self):
        return np.array([d["key"] for d in self.heldout_documents()], dtype=np.uint64)

    def train_keys(self):
        """The training documents' keys of every part, sorted (uint64)."""
        keys = [_read_keys(part["keys_path"]) for part in self.parts]
        return np.unique(np.concatenate(keys)) if keys else np.zeros(0, dtype=np.uint64)

    @property
    def paths(self):
        return [part["path"] for part in self.parts]

    def shards(self, set_name):
        """({shard name: {"bytes", "digest"}} the parts list in set `set_name`, the paths of the
        records listing them); None where no part lists its shards (an older prepare_data's)."""
        listing, paths = {}, []
        for part in self.parts:
            if "shards" in part["train"]:
                listing.update(part[set_name].get("shards", {}) if set_name in SETS else {})
                paths.append(part["path"])
        return (listing, paths) if paths else None


def _read_keys(path):
    try:
        keys = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as e:
        raise HeldOutError(f"{path}: not a .npy file of document keys ({e})") from None
    if keys.dtype != np.uint64 or keys.ndim != 1:
        raise HeldOutError(f"{path}: expected a 1-D uint64 array of document keys, found {keys.dtype} of shape "
                           f"{keys.shape}")
    return keys


def find_manifest(folder):
    """The record in `folder` (a prepare_data --output_dir), or None where there is none."""
    names = [n for n in (os.listdir(folder) if os.path.isdir(folder) else []) if MANIFEST.match(n)]
    if not names:
        return None
    parts = []
    for name in sorted(names):
        path = os.path.join(folder, name)
        try:
            with open(path, encoding="utf-8") as f:
                part = json.load(f)
        except ValueError as e:
            raise HeldOutError(f"{path}: not valid JSON ({e})") from None
        missing = [k for k in MANIFEST_KEYS if not isinstance(part, dict) or k not in part]
        if missing:
            raise HeldOutError(f"{path}: missing key '{missing[0]}' (expected prepare_data's record of its "
                               f"documents: {', '.join(MANIFEST_KEYS)})")
        for name in SETS:
            shards = part[name].get("shards", {}) if isinstance(part[name], dict) else None
            if not (isinstance(shards, dict) and all(isinstance(v, dict) and isinstance(v.get("bytes"), int)
                                                     and isinstance(v.get("digest"), str) for v in shards.values())):
                raise HeldOutError(f"{path}: {name}.shards is not a listing of shards (expected {{name: {{\"bytes\": "
                                   f"size, \"digest\": hex}}}}, as prepare_data writes)")
        for key, field in (("heldout_path", ("validation", "documents_file")), ("keys_path", ("train", "keys"))):
            part[key] = os.path.join(folder, part[field[0]][field[1]])
            if not os.path.isfile(part[key]):
                raise HeldOutError(f"{path}: names {part[key]}, which does not exist")
        part["path"] = path
        parts.append(part)
    return Manifest(folder, parts)


def read_manifest(folder, flag="--heldout"):
    """The record of the prepare_data output `folder`; one error line where it has none."""
    if not os.path.isdir(folder):
        raise HeldOutError(f"{flag} {folder}: no such folder (expected a tools/prepare_data.py --output_dir)")
    manifest = find_manifest(folder)
    if manifest is None:
        raise HeldOutError(f"{flag} {folder}: holds no documents.json, prepare_data's record of the documents it "
                           f"held out (shards made by another tool, or before it wrote one): make them again with "
                           f"tools/prepare_data.py")
    return manifest


def output_folder(set_folder):
    """The prepare_data output holding a train/ or validation/ folder: its parent."""
    return os.path.dirname(os.path.normpath(os.path.abspath(set_folder)))


def check_listed_shards(set_folders):
    """Refuse, in one line naming it, an entry of a set folder (train/, validation/) that the
    record beside it does not list among that set's shards, or lists with another size or digest;
    returns the records read. Folders without a record, or with an older one listing no shards,
    are not checked."""
    checked = []
    for folder in dict.fromkeys(os.path.normpath(os.path.abspath(f)) for f in set_folders):
        manifest = find_manifest(output_folder(folder))
        listed = manifest.shards(os.path.basename(folder)) if manifest is not None else None
        if listed is None or not os.path.isdir(folder):
            continue
        listing, paths = listed
        records = ", ".join(paths)
        for name in sorted(os.listdir(folder)):
            path = os.path.join(folder, name)
            recorded = listing.get(name)
            if recorded is None:
                raise HeldOutError(
                    f"{path}: not a shard of this prepare_data output: {records} list{'s' if len(paths) == 1 else ''} "
                    f"{len(listing)} shard{'' if len(listing) == 1 else 's'} in {folder} and not this one (copied in "
                    f"from another run?), so its documents and tokenizer are not the ones recorded; move it out of "
                    f"{folder}, or make the shards again with tools/prepare_data.py")
            try:
                found = shard_digest(path)
            except OSError as e:
                raise HeldOutError(f"{path}: cannot be read ({e.strerror}); {records} list"
                                   f"{'s' if len(paths) == 1 else ''} it among the shards in {folder}") from None
            if found != recorded:
                raise HeldOutError(
                    f"{path}: not the shard {records} list{'s' if len(paths) == 1 else ''} under this name "
                    f"({found['bytes']} bytes, digest {found['digest'][:12]}; recorded: {recorded['bytes']} bytes, "
                    f"{recorded['digest'][:12]}): replaced since prepare_data wrote it; make the shards again with "
                    f"tools/prepare_data.py")
        checked += paths
    return checked


def trained_validation_documents(training_folders, validation_folder):
    """(validation documents found among the training documents, validation documents, records
    read) by the records beside the folders; None where the validation set or every training
    folder has none (shards made by another tool: nothing to say)."""
    validation = find_manifest(output_folder(validation_folder))
    training = [m for m in (find_manifest(output_folder(f)) for f in training_folders) if m is not None]
    if validation is None or not training:
        return None
    held = validation.heldout_keys()
    trained = np.unique(np.concatenate([m.train_keys() for m in training]))
    found = int(np.isin(held, trained).sum())
    return found, len(held), validation.paths + [p for m in training for p in m.paths]


def warn_if_validation_trained(training_folders, validation_folder, say=True):
    """One warning line when documents of the validation set are in the training shards (where
    `say`: every rank of a run reads and checks the records, one says what they find)."""
    result = trained_validation_documents(training_folders, validation_folder)
    if result is None or not result[0] or not say:
        return
    found, total, paths = result
    logger.warning("validation set %s: %d of its %d documents are in the training shards of %s (by the document "
                   "keys of %s): its loss and accuracy measure partly trained-on text; make both with "
                   "tools/prepare_data.py from the same corpus and the same --validation_fraction",
                   validation_folder, found, total, ", ".join(training_folders), ", ".join(paths))
