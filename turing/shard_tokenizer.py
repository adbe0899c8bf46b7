"""Which tokenizer made a set of shards: the record tools/prepare_data.py writes beside them, defined
and read here, and the trainer's check (check_run_inputs) that its tokenizer is that one.

A shard holds token ids (NVIDIA hdf5) or token strings (Bing), which mean something only with the
tokenizer that made them; a run with another one trains on noise without any error. prepare_data
writes down which tokenizer it used (turing.tokenization's `Tokenizer.record()`: its identity, and
for people its name, kind, file's sha256, vocab size and special tokens), at the output folder's
top level like its record of the split (turing/heldout.py), never inside train/ or validation/
(training reads those whole), so the shard files themselves are what they were:

    OUT/tokenizer_record.json            (with --num_parts, one per part: tokenizer_record.part003.json)

The trainer reads the records beside every training folder and the validation folder (their
parent, a prepare_data --output_dir) and refuses in one line a run whose tokenizer (its
bert_token_file, or its model folder's) is not the one recorded: another identity (what decides
the ids, whichever file holds it: shards made with a vocab.txt train with the tokenizer.json
transformers writes from it, and the other way round), the line naming what differs
(turing.tokenization.tokenizer_difference). A record of an older prepare_data, without the
identity, is compared by the file's sha256 and the special token ids. Shards without a record
(NVIDIA's own, or made before the record was written) train as before.

A record beside a folder speaks for the files prepare_data wrote there, not for whatever is copied
in later (another run's shard, one of another vocab): the split's record (OUT/documents.json, per
part) lists every shard of each set with its size and a sampled digest, and `check_shard_tokenizer`
first refuses, in one line naming it, a file in the set folders that it does not list
(turing.heldout.check_listed_shards, whose docstring says what is hashed); only then is this
record trusted for the shards there.
"""
import json
import logging
import os
import re

from turing.errors import InputValueError
from turing.heldout import check_listed_shards, output_folder
from turing.tokenization import IDENTITY_KEYS, TOKENIZER_FILES, load_tokenizer, tokenizer_difference

logger = logging.getLogger(__name__)

RECORD = re.compile(r"^tokenizer_record(\.part\d+)?\.json$")


class ShardTokenizerError(InputValueError):
    """Shards made with another tokenizer than the run's, or an unreadable record."""


def record_name(part=None):
    """The record's file name in a prepare_data output (of part `part` with --num_parts)."""
    return "tokenizer_record.json" if part is None else f"tokenizer_record.part{part:03d}.json"


def record_text(tokenizer):
    """The record of `tokenizer` (a turing.tokenization.Tokenizer), as the file holds it."""
    return json.dumps(tokenizer.record(), indent=1) + "\n"


def find_records(folder):
    """[(path, record)] of the records in `folder` (a prepare_data --output_dir; every part's), [] without one."""
    if not os.path.isdir(folder):
        return []
    found = []
    for name in sorted(n for n in os.listdir(folder) if RECORD.match(n)):
        path = os.path.join(folder, name)
        try:
            with open(path, encoding="utf-8") as f:
                record = json.load(f)
        except ValueError as e:
            raise ShardTokenizerError(f"{path}: not valid JSON ({e}); it is prepare_data's record of the tokenizer "
                                      f"the shards beside it were made with") from None
        if not isinstance(record, dict) or not isinstance(record.get("sha256"), str):
            raise ShardTokenizerError(f"{path}: no sha256 (expected prepare_data's record of the tokenizer the shards "
                                      f"beside it were made with)")
        if "identity" in record and not (isinstance(record["identity"], dict)
                                         and set(record["identity"]) == set(IDENTITY_KEYS)):
            raise ShardTokenizerError(f"{path}: its identity is not a tokenizer identity this program reads (keys "
                                      f"{', '.join(IDENTITY_KEYS)}); make the shards again with tools/prepare_data.py")
        found.append((path, record))
    return found


def _special_ids(record):
    return {role: entry[1] for role, entry in (record.get("special_tokens") or {}).items()
            if isinstance(entry, list) and len(entry) == 2}


def recorded_copy(folder, record):
    """The copy of the tokenizer prepare_data wrote beside its record in `folder` (the record's
    kind: vocab.txt, lower-casing as recorded, or tokenizer.json), where it is still the recorded
    one (its identity the record's); else None."""
    path = os.path.join(folder, record.get("kind") or "")
    if record.get("kind") not in TOKENIZER_FILES or not os.path.isfile(path):
        return None
    try:
        copy = load_tokenizer(path, record.get("do_lower_case"))
        return copy if copy.identity == record["identity"] else None
    except (OSError, ValueError):   # replaced since by something that does not open: nothing to tell from
        return None


def differs(record, tokenizer, folder=None):
    """How `tokenizer` differs from the one a record names, in a few words; None where it is that one.
    Their identities compared; where they differ, told from the copy beside the record in `folder`
    where it is the recorded tokenizer (the first differing id, with both tokens), else from the
    record. A record without the identity (an older prepare_data's): the file's sha256, then the
    special token ids."""
    recorded = record.get("identity")
    if recorded is None:
        if record["sha256"] != tokenizer.digest:
            return (f"its file's sha256 is {tokenizer.digest[:12]} (the shards' {record['sha256'][:12]}, in a record "
                    f"of an older prepare_data, which names the file's bytes only)")
        theirs, ours = _special_ids(record), tokenizer.special
        other = [f"{role} {ours[role]} (the shards' {theirs[role]})" for role in ours if role in theirs
                 and theirs[role] != ours[role]]
        return "the same file, other special token ids: " + ", ".join(other) if other else None
    if recorded == tokenizer.identity:
        return None
    copy = recorded_copy(folder, record) if folder else None
    return tokenizer_difference(tokenizer, copy or recorded, "the shards'")


def check_shard_tokenizer(tokenizer, set_folders):
    """Refuse, in one line, shards in `set_folders` (training folders, the validation folder) that
    their prepare_data output's record of the split does not list, or whose output records another
    tokenizer than `tokenizer`; returns the tokenizer records read (none: shards of another tool,
    nothing to check)."""
    check_listed_shards(set_folders)
    checked = []
    for folder in dict.fromkeys(output_folder(f) for f in set_folders):
        for path, record in find_records(folder):
            why = differs(record, tokenizer, folder)
            if why:
                raise ShardTokenizerError(
                    f"{path}: the shards in {folder} were made with tokenizer {record.get('name')} (sha256 "
                    f"{record['sha256'][:12]}), not with this run's {tokenizer.describe()}: {why}; train with the "
                    f"shards' tokenizer (the job config's bert_token_file, or the model folder's"
                    f"{', and --no_lower_case or --do_lower_case as they were made' if 'lower-casing' in why else ''}"
                    f"), or make the shards again with tools/prepare_data.py --tokenizer {tokenizer.name}")
            if record["sha256"] != tokenizer.digest:
                logger.info("%s: the shards' tokenizer %s is this run's %s in another file", path, record.get("name"),
                            tokenizer.name)
            checked.append(path)
    if checked:
        logger.info("the shards were made with this run's tokenizer %s (%s)", tokenizer.describe(), ", ".join(checked))
    return checked
