"""The project's error types for bad user input: configs, flags, paths, data and checkpoint files.

The training script reports an `InputError` as one line (no traceback unless --debug) and exit
code 2; every other exception, whatever its type, is a crash and keeps its traceback. Raise
these only where the cause is the user's input and the message says what to change.

`InputValueError` and `InputFileNotFoundError` are also a `ValueError` / `FileNotFoundError`, so
library callers that catch the built-in types keep working.
"""
import argparse


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
