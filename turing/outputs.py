"""Output folders of the tools: what an earlier run left there is refused unless --overwrite, so
that no tool replaces another run's files without a word; and the digests of their inputs the
tools record beside their results, so that a later run can tell what the results were made from."""
import hashlib
import os


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
