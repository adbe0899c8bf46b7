"""The embedded demo corpus: English text that ships with every Python installation.

Owns `build_demo_corpus(path)` and its command line. The text comes from the language
reference topics in `pydoc_data.topics` and the docstrings of a fixed, sorted list of
standard-library modules (their classes, functions and methods). It is cleaned into the
format BERT's data tools read: one sentence per line, a blank line between documents.
Code examples, grammar rules and underlines are dropped. Nothing is downloaded; the
output is the same on every run of the same Python version (modules that fail to import
on a platform are skipped).

    python -m tools.make_demo_corpus --output data/corpus.txt
"""
import argparse
import importlib
import inspect
import logging
import os
import re
import sys
import warnings

from pydoc_data.topics import topics

if not __package__:  # run as `python tools/make_demo_corpus.py`: import from the repository root, as `python -m` does
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from turing.errors import OneLineParser  # noqa: E402 (argparse only)
from turing.jsonfile import clear_temporaries, temporary_name  # noqa: E402 (json, os, re only)

logger = logging.getLogger(__name__)

# Modules whose import has no side effects (no windows, browsers, terminal or network set-up)
# and is not deprecated. Sorted, so the corpus order never depends on the interpreter.
DEMO_MODULES = (
    "abc", "argparse", "array", "ast", "asyncio", "base64", "bdb", "binascii", "bisect",
    "builtins", "bz2", "calendar", "cmath", "cmd", "code", "codecs", "codeop", "collections",
    "collections.abc", "colorsys", "compileall", "concurrent.futures", "configparser",
    "contextlib", "contextvars", "copy", "copyreg", "csv", "ctypes", "dataclasses", "datetime",
    "decimal", "difflib", "dis", "doctest", "email", "email.message", "email.utils", "enum",
    "filecmp", "fileinput", "fnmatch", "fractions", "ftplib", "functools", "gc", "getopt",
    "gettext", "glob", "graphlib", "gzip", "hashlib", "heapq", "hmac", "html", "html.parser",
    "http", "http.client", "http.cookiejar", "http.cookies", "http.server", "imaplib",
    "importlib", "importlib.metadata", "importlib.resources", "inspect", "io", "ipaddress",
    "itertools", "json", "keyword", "linecache", "locale", "logging", "logging.handlers",
    "lzma", "mailbox", "marshal", "math", "mimetypes", "mmap", "modulefinder",
    "multiprocessing", "netrc", "numbers", "operator", "optparse", "os", "pathlib",
    "pickle", "pickletools", "pkgutil", "platform", "plistlib", "poplib", "posixpath",
    "pprint", "profile", "pstats", "py_compile", "pyclbr", "pydoc", "queue", "quopri",
    "random", "re", "reprlib", "runpy", "sched", "secrets", "selectors", "shelve", "shlex",
    "shutil", "signal", "smtplib", "socket", "socketserver", "sqlite3", "ssl", "stat",
    "statistics", "string", "stringprep", "struct", "subprocess", "symtable", "sys",
    "sysconfig", "tabnanny", "tarfile", "tempfile", "textwrap", "threading", "time", "timeit",
    "token", "tokenize", "tomllib", "trace", "traceback", "tracemalloc", "types", "typing",
    "unicodedata", "unittest", "unittest.mock", "urllib.parse", "urllib.request", "uuid",
    "warnings", "wave", "weakref", "xml.dom.minidom", "xml.etree.ElementTree", "xml.sax",
    "xmlrpc.client", "zipapp", "zipfile", "zlib", "zoneinfo",
)

# A sentence ends at . ! or ? followed by space and a capital, a digit or an opening quote.
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"'(\[‘“])")
_UNDERLINE = re.compile(r"^\s*([*=\-~^#+])\1{2,}\s*$")
_BULLET = re.compile(r"^\s*(?:[*\-•]|\d+\.)\s+")
_WORD = re.compile(r"[A-Za-z]{2,}")


def _indent(line):
    return len(line) - len(line.lstrip())


def _paragraph_sentences(paragraph_lines):
    """Sentences of one prose paragraph: its lines joined, split at sentence ends."""
    text = " ".join(_BULLET.sub("", ln).strip() for ln in paragraph_lines)
    text = re.sub(r"\s+", " ", text).strip()
    out = []
    for sentence in _SENTENCE_END.split(text):
        sentence = sentence.strip()
        # Keep sentences with some words: drops signatures like "f(x) -> y" and stray symbols.
        if len(_WORD.findall(sentence)) >= 3 and len(sentence) <= 1000:
            out.append(sentence)
    return out


def _paragraphs(text):
    """Blocks of non-blank lines; a heading underline also ends a block and is dropped."""
    block = []
    for line in text.expandtabs(4).splitlines() + [""]:
        if not line.strip() or _UNDERLINE.match(line):
            if block:
                yield block
            block = []
        else:
            block.append(line)


def text_to_sentences(text):
    """Clean one document's raw text (reST-like topic or docstring) into a list of sentences.

    reST convention: a block indented deeper than the prose before it (and not a list item)
    is a literal block, i.e. code or grammar; drop it. So are interactive sessions.
    """
    sentences = []
    prose_indent = 0  # where text of the current prose level starts
    for block in _paragraphs(text):
        first = block[0]
        indent = _indent(first)
        bullet = _BULLET.match(first)
        # Interactive examples and grammar rules are never prose.
        for i, line in enumerate(block):
            if line.lstrip().startswith((">>>", "...")) or "::=" in line:
                block = block[:i]
                break
        if not block or (indent > prose_indent and not bullet):
            continue
        # A list item's own text starts after its marker; its continuation blocks align there.
        prose_indent = bullet.end() if bullet else indent
        sentences.extend(_paragraph_sentences(block))
    return sentences


def _defined_by(obj, module_name):
    """Whether `obj` belongs to the module: defined there, in a submodule, or in the private
    implementation module behind it (`_io` behind `io`, `posix` behind `os`)."""
    home = getattr(obj, "__module__", None)
    if not isinstance(home, str):
        return False
    return (home == module_name or home.startswith(module_name + ".")
            or home.startswith("_") or home in ("posix", "nt"))


def _own_docstrings(module):
    """Docstrings of the module and of the public classes/functions/methods it defines.

    Yields (qualified name, docstring) in sorted name order; objects imported from other
    public modules are skipped (the caller also drops repeated docstrings).
    """
    if module.__doc__:
        yield module.__name__, module.__doc__
    for name in sorted(vars(module)):
        if name.startswith("_"):
            continue
        obj = vars(module)[name]
        if not (inspect.isclass(obj) or inspect.isroutine(obj)):
            continue
        if not _defined_by(obj, module.__name__) or not isinstance(obj.__doc__, str):
            continue
        yield f"{module.__name__}.{name}", obj.__doc__
        if inspect.isclass(obj):
            members = vars(obj)
            for attr in sorted(members):
                member = members[attr]
                if attr.startswith("_") or not inspect.isroutine(member):
                    continue
                doc = getattr(member, "__doc__", None)
                if isinstance(doc, str):
                    yield f"{module.__name__}.{name}.{attr}", doc


def iter_demo_documents(modules=DEMO_MODULES):
    """Yield each demo document as a list of sentences (documents with at least 2)."""
    seen = set()
    for key in sorted(topics):
        sentences = text_to_sentences(topics[key])
        if len(sentences) >= 2:
            yield sentences
    for module_name in sorted(modules):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                module = importlib.import_module(module_name)
        except Exception as exc:  # a platform without the module (e.g. no _ssl): skip it
            logger.info("skipping %s: %s", module_name, exc)
            continue
        # One document per module: its own docstring then those of what it defines.
        sentences = []
        with warnings.catch_warnings():
            # Touching deprecated aliases (typing.io) warns; the text is still wanted.
            warnings.simplefilter("ignore")
            docs = list(_own_docstrings(module))
        for _, doc in docs:
            doc = inspect.cleandoc(doc)
            if doc in seen:
                continue
            seen.add(doc)
            sentences.extend(text_to_sentences(doc))
        if len(sentences) >= 2:
            yield sentences


def build_demo_corpus(path, max_bytes=None):
    """Write the demo corpus to `path`; returns (documents, sentences, bytes written).

    `max_bytes` stops after the last whole document that fits (None: everything).
    The file is written under a temporary name and renamed, so a reader never sees half.
    """
    path = os.fspath(path)
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    tmp = temporary_name(path)
    documents = sentences = size = 0
    try:
        with open(tmp, "w", encoding="utf-8", newline="\n") as f:
            for doc in iter_demo_documents():
                block = "\n".join(doc) + "\n\n"
                block_size = len(block.encode("utf-8"))
                if max_bytes is not None and size + block_size > max_bytes:
                    break
                f.write(block)
                documents += 1
                sentences += len(doc)
                size += block_size
        os.replace(tmp, path)
        clear_temporaries(path)   # what a killed run of this command left
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return documents, sentences, size


def build_parser():
    parser = OneLineParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter,
                           epilog="guide: docs/demo.md")
    parser.add_argument("--output", required=True, help="corpus file to write (one sentence per line)")
    parser.add_argument("--max_bytes", type=int, default=None,
                        help="stop after the last whole document within this size (default: all)")
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if args.max_bytes is not None and args.max_bytes <= 0:
        print(f"error: --max_bytes must be positive, got {args.max_bytes}", file=sys.stderr)
        return 2
    try:
        documents, sentences, size = build_demo_corpus(args.output, args.max_bytes)
    except OSError as exc:
        print(f"error: cannot write {args.output}: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {args.output}: {documents} documents, {sentences} sentences, "
          f"{size / 1e6:.2f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
