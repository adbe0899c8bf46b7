"""The project's JSON files: reading them (job, DeepSpeed, Hugging Face configs, results) with errors
that name the file and, for a syntax error, the line and column; writing a file whole or not at all
(write_atomic, which every writer of results and markers uses); and writing results as strict JSON,
which holds no NaN or Infinity (Python's json writes them as bare `NaN`, which strict parsers and
other languages reject)."""
import json
import math
import os
import re


def read_json(path, what, error=ValueError, missing_error=None):
    """The parsed JSON file at `path`. A missing file raises `missing_error` (default `error`)
    with "{path}: {what} not found"; bad JSON raises `error` with the line and column, and a NaN or
    Infinity anywhere in it (or a number too large for a float) `error` naming the key."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise (missing_error or error)(f"{path}: {what} not found")
    try:
        with open(path, encoding="utf-8") as f:
            document = json.load(f)
    except json.JSONDecodeError as e:
        raise error(f"{path}: not valid JSON ({e.msg} at line {e.lineno}, column {e.colno})") from None
    found = _non_finite(document)     # Python's json takes NaN, Infinity and 1e400 (inf): strict JSON has none
    if found:
        raise error(f"{path}: {found[0]} is {found[1]}, not a finite number (JSON has no NaN or Infinity)")
    return document


_KINDS = {bool: "a boolean", int: "a number", float: "a number", str: "a string", list: "an array",
          dict: "an object", bytes: "binary data"}


def json_kind(value):
    """The kind of a value read from JSON (or Arrow), in JSON's words: null, a number, an array, ..."""
    return "null" if value is None else _KINDS.get(type(value), type(value).__name__)


def _non_finite(value, where=""):
    """(where, value) of the first NaN or Infinity in a JSON-able value, or None."""
    if isinstance(value, float) and not math.isfinite(value):
        return where or "the document", value
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, (list, tuple)) else ()
    for key, item in items:
        found = _non_finite(item, f"{where}[{key}]" if isinstance(key, int) else f"{where}.{key}" if where else key)
        if found:
            return found
    return None


def json_text(document, path, error=ValueError, indent=2):
    """`document` as strict JSON text for the file `path` (a final newline with `indent`). A NaN or
    Infinity in it raises `error` naming the file and the key, so that no file holds one."""
    found = _non_finite(document)
    if found:
        raise error(f"{path}: not written: {found[0]} is {found[1]}, not a finite number (the scores are not "
                    "usable)")
    return json.dumps(document, indent=indent, allow_nan=False) + ("\n" if indent is not None else "")


def write_json(path, document, error=ValueError):
    """`document` in `path` as strict JSON (`json_text`), whole or not at all (write_atomic);
    nothing is written when it is refused."""
    write_atomic(path, json_text(document, path, error))


def _fsync(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path, text):
    """`text` (str, written as UTF-8, or bytes) in `path`, whole or not at all, on disk: a
    temporary file, fsync'ed, renamed (checkpoint markers, results, every tool's output file).
    What a killed writer of `path` left beside it goes once `path` is written (clear_temporaries)."""
    tmp = temporary_name(path)
    try:
        with open(tmp, "wb") as f:
            text = text.encode("utf-8") if isinstance(text, str) else text
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:              # an error, or a stop (SIGTERM, Ctrl-C) raised here: no litter
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    _fsync(os.path.dirname(path) or ".")
    clear_temporaries(path)


def temporary_name(path):
    """The name `path` is written under before its rename: `{path}.tmp{PID}` (clear_temporaries)."""
    return f"{path}.tmp{os.getpid()}"


def clear_temporaries(path):
    """Remove the temporary files of `path` (temporary_name's) that a process no longer running
    left: the litter of a writer killed (SIGKILL) before its rename, which the same command, run
    again, clears once it has written `path`. A running process's (another writer's) stays."""
    folder, name = os.path.split(os.path.abspath(path))
    pattern = re.compile(re.escape(name) + r"\.tmp(\d+)$")
    for entry in os.listdir(folder):
        match = pattern.match(entry)
        if match and not _running(int(match.group(1))):
            try:
                os.remove(os.path.join(folder, entry))
            except FileNotFoundError:
                pass


def _running(pid):
    """Whether process `pid` runs on this machine (it or a process of another user)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
