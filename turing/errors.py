"""The project's error types for bad user input: configs, flags, paths, data and checkpoint files.

The training script and every tool (`tool_exit`) report an `InputError` as one line (no traceback
unless --debug) and exit code 2; every other exception, whatever its type, is a bug or a crash and
keeps its traceback. Raise these only where the cause is the user's input and the message says
what to change.

`InputValueError` and `InputFileNotFoundError` are also a `ValueError` / `FileNotFoundError`, so
library callers that catch the built-in types keep working.
"""
import argparse
import sys


class InputError(Exception):
    """Bad user input; the message names the file, key or flag and what was expected."""


class InputValueError(InputError, ValueError):
    """A config value, flag combination or data file that cannot be used."""


class InputFileNotFoundError(InputError, FileNotFoundError):
    """A file or folder the user named does not exist."""


class ConversionError(InputValueError):
    """Weights or a config that cannot be mapped or read; the message names the key or file."""


class CheckpointNotFoundError(InputFileNotFoundError):
    """A checkpoint folder, tag or file that does not exist; the message names the path."""


class UnsafeCheckpointError(ConversionError):
    """A checkpoint file that does not load weights-only: unpickling it could run code from it."""


class StopTraining(Exception):
    """Not an input error: the run stops early, its work saved (or, where it cannot be, saying
    why), with an exit code the caller ends with: 3 non-finite losses or weights, 4 a checkpoint
    that could not be written, 128 + N signal N."""

    def __init__(self, message, exit_code):
        super().__init__(message)
        self.exit_code = exit_code


class OneLineParser(argparse.ArgumentParser):
    """argparse that reports a bad flag or flag value in one line, `error: ...`, exit code 2 (the
    full usage is --help's), for the training script and every tool."""

    def error(self, message):
        self.exit(2, f"error: {message} (see --help)\n")


def tool_exit(work, debug=False):
    """A tool's `main`: run `work()` (its job, returning the exit code) and report bad input in one
    line, `error: ...` on stderr, exit code 2: an InputError (the tool's own errors are its
    subclasses) or an OSError (a file or disk the tool was pointed at; its message names the path).
    Any other exception is a bug in the tool and keeps its traceback (Python's exit code 1), so a
    bug is never reported as bad input. `debug` (a tool's --debug): the traceback of bad input too."""
    try:
        return work()
    except (InputError, OSError) as e:
        if debug:
            raise
        print(f"error: {e}", file=sys.stderr)
        return 2

