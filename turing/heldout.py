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
                                  read, and the names of the two files below
    OUT/heldout.jsonl             one line per held-out document, in input order, as prepare_data
                                  read it: {"document": its number in the input (from 0, as the
                                  split counts), "key": its key, "sentences": [...]}
    OUT/train_document_keys.npy   the keys of the training documents, uint64, sorted

With --num_parts each part writes its own three files, named by its part (documents.part003.json,
heldout.part003.jsonl, train_document_keys.part003.npy); a folder's record is all of them together.
A document's key is tools/prep/filters.py's document_key: a 64-bit blake2b hash of its text,
case-folded and with whitespace collapsed (so equal for the exact duplicates prepare_data keeps once).
"""
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


class HeldOutError(InputValueError):
    """A missing or unreadable record; the message names the folder or file and what was expected."""


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
        """The held-out documents of every part: dicts with "document", "key", "sentences"."""
        for part in self.parts:
            path = part["heldout_path"]
            with open(path, encoding="utf-8") as f:
                for number, line in enumerate(f, start=1):
                    try:
                        record = json.loads(line)
                        ok = (isinstance(record.get("key"), int) and isinstance(record.get("document"), int)
                              and isinstance(record.get("sentences"), list))
                    except (ValueError, AttributeError):
                        ok = False
                    if not ok:
                        raise HeldOutError(f"{path}: line {number} is not a held-out document (expected a JSON "
                                           f"object with an integer document and key and a list of sentences)")
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


def warn_if_validation_trained(training_folders, validation_folder):
    """One warning line when documents of the validation set are in the training shards."""
    result = trained_validation_documents(training_folders, validation_folder)
    if result is None or not result[0]:
        return
    found, total, paths = result
    logger.warning("validation set %s: %d of its %d documents are in the training shards of %s (by the document "
                   "keys of %s): its loss and accuracy measure partly trained-on text; make both with "
                   "tools/prepare_data.py from the same corpus and the same --validation_fraction",
                   validation_folder, found, total, ", ".join(training_folders), ", ".join(paths))
