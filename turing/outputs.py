"""Output folders of the tools: what an earlier run left there is refused unless --overwrite, so
that no tool replaces another run's files without a word; and the digests of their inputs the
tools record beside their results, so that a later run can tell what the results were made from."""
import hashlib
import json
import os
import shutil

INSTALLING = "INSTALLING.json"   # in a staging folder: the names being moved into the output folder


def earlier_output(output_dir, overwrite, error_type, advice):
    """The names in `output_dir` (none when it does not exist yet); `error_type` naming the folder
    and what is in it when it holds any and not `overwrite` (`advice` says what to do), or when
    it is a file."""
    if os.path.exists(output_dir) and not os.path.isdir(output_dir):
        raise error_type(f"--output_dir {output_dir} exists and is not a folder")
    present = sorted(os.listdir(output_dir)) if os.path.isdir(output_dir) else []
    if present and not overwrite:
        raise error_type(f"--output_dir {output_dir} is not empty ({', '.join(present[:4])}"
                         f"{', ...' if len(present) > 4 else ''}); {advice}")
    return present


def content_sha256(path):
    """The sha256 of a file's bytes; of a folder, of its files' names (relative, sorted) and bytes:
    what tools/quality_table.py compares to know that two results scored the same inputs, and
    tools/finetune_glue.py to know that a finished task was fine-tuned on the same data."""
    folder = os.path.isdir(path)
    files = sorted(os.path.join(root, name) for root, _, names in os.walk(path) for name in names) if folder else [path]
    digest = hashlib.sha256()
    for file in files:
        if folder:
            digest.update(os.path.relpath(file, path).encode() + b"\0")
        with open(file, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def clear_unfinished(output_dir, prefix):
    """Undo what a killed run of a tool left in `output_dir`: its staging folders (names starting
    with `prefix`) and, where one was being installed (it holds INSTALLING), every name it was
    moving in, new or earlier, so that no mix of two runs' files stays to be read as one whole.
    Returns the names removed from `output_dir` beside the staging folders."""
    removed = []
    for name in sorted(os.listdir(output_dir)) if os.path.isdir(output_dir) else ():
        if not name.startswith(prefix):
            continue
        staging = os.path.join(output_dir, name)
        try:
            with open(os.path.join(staging, INSTALLING), encoding="utf-8") as f:
                installing = json.load(f)
        except (OSError, ValueError):
            installing = []              # killed before its install began: the folder is all
        for item in installing:
            path = os.path.join(output_dir, os.path.basename(item))
            if os.path.lexists(path):
                _remove(path)
                removed.append(os.path.basename(item))
        shutil.rmtree(staging, ignore_errors=True)
    return removed


def install_staged(staging, output_dir, names, last=()):
    """Move `names` from the folder `staging` into `output_dir` (an earlier one of a name is
    replaced). INSTALLING, written first, lets the next run's clear_unfinished undo a kill in the
    middle; `last` (a model's weights) is moved in last and its earlier copy removed first, so that
    until the install ends the folder holds no weights that another run's files could be read with."""
    tmp = os.path.join(staging, INSTALLING + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(sorted(names), f)
    os.replace(tmp, os.path.join(staging, INSTALLING))
    for name in last:
        _remove(os.path.join(output_dir, name))
    for name in sorted(names, key=lambda n: n in last):
        final = os.path.join(output_dir, name)
        if os.path.isdir(final) and not os.path.islink(final):
            shutil.rmtree(final)       # a folder is not replaced by os.replace
        os.replace(os.path.join(staging, name), final)
    os.remove(os.path.join(staging, INSTALLING))


def _remove(path):
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        os.remove(path)
