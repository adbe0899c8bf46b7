"""Reading the project's JSON files (job, DeepSpeed, Hugging Face configs) with errors that
name the file and, for a syntax error, the line and column."""
import json
import os


def read_json(path, what, error=ValueError, missing_error=None):
    """The parsed JSON file at `path`. A missing file raises `missing_error` (default `error`)
    with "{path}: {what} not found"; bad JSON raises `error` with the line and column."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise (missing_error or error)(f"{path}: {what} not found")
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except json.JSONDecodeError as e:
        raise error(f"{path}: not valid JSON ({e.msg} at line {e.lineno}, column {e.colno})") from None
