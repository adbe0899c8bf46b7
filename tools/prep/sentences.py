"""A document to its sentences, the workers' first step: wikitext reduced to plain text, then
every paragraph (line) split into sentences.

Sentences are split by blingfire (chosen by measurement against pysbd, syntok and spaCy's rule
based sentencizer: bench/README.md, "Corpora in"); `SPLITTERS` holds all four for the bench.
"""
import bisect
import functools
import re

from tools.prep.documents import Wikitext
from tools.prep.layouts import require

_COMMENT = re.compile(r"<!--.*?(-->|\Z)", re.DOTALL)
# Tables open and close at the start of a line; elsewhere "|}" is a template's empty last argument.
_HEAVY = re.compile(r"\{\{|\}\}|^[ \t]*\{\||^[ \t]*\|\}|<ref\b[^>]*?/>|<ref\b[^>]*>|</ref\s*>",
                    re.IGNORECASE | re.MULTILINE)
_CLOSES = {"}}": "{{", "|}": "{|"}
_LINK_DROP = re.compile(r"^\s*:?\s*(file|image|category|media|wikipedia|wp|template|help|portal|"
                        r"draft|module|special|[a-z]{2,3}(-[a-z]+)?)\s*:", re.IGNORECASE)
_INVISIBLE_TAGS = {"ref", "references", "math", "chem", "score", "gallery", "timeline", "graph", "syntaxhighlight",
                   "source", "pre", "code", "templatestyles", "imagemap", "mapframe", "hiero", "nowiki"}
_SPACES = re.compile(r"[ \t\u00a0]+")


def _drop_heavy(text):
    """Remove comments, templates ({{...}}, nested), tables ({|...|}) and <ref>s in one scan.

    They are dropped whole, so finding their extent is all it takes; doing it before the parser
    is what makes wikitext reduction fast (mwparserfromhell spends most of its time in them).
    An opener without its closer drops the rest of the page, as MediaWiki would show it broken.
    """
    text = _COMMENT.sub("", text)
    out, stack, pos = [], [], 0     # stack: the open constructs, outermost first
    for m in _HEAVY.finditer(text):
        tok = m.group(0).strip().lower()
        if tok.startswith("<ref") and tok.endswith("/>"):
            if not stack:
                out.append(text[pos:m.start()])
                pos = m.end()
        elif tok in ("{{", "{|") or tok.startswith("<ref"):
            if not stack:
                out.append(text[pos:m.start()])
            stack.append(tok[:4])
        else:
            want = _CLOSES.get(tok, "<ref")
            if want in stack:         # close it (and anything left open inside it)
                while stack.pop() != want:
                    pass
                if not stack:
                    pos = m.end()
    if not stack:
        out.append(text[pos:])
    return "".join(out)


# mwparserfromhell's tokenizer retries a construct that never closes at every later position: an
# unclosed external link, tag or link is quadratic in the page (70 s for 0.24 MB of "[http://a.b "),
# an external link nested in another's title doubles the work per level (20 of them: 1 s, 1,000:
# beyond 10 minutes), and a long heading line of entities is quadratic too. So the brackets and
# tags that never close are escaped before it parses (as HTML entities: the same text comes out),
# links and tags nest at most _MAX_NESTING deep, an external link inside another's title is
# unwrapped to its title (its "[URL" and "]" removed: the parser never sees one in another), and
# the parser sees at most _PARSE_BLOCK characters at a time, cut where nothing is open. A link
# (or a tag) in an external link's title stays markup: its text is reduced like any other.
_PARSE_BLOCK = 16384
_MAX_NESTING = 8
_ESCAPES = {"[": "&#91;", "<": "&lt;"}
_URL = re.compile(r"[^\s\[\]<>\"]*")     # a bracketed link's URL: up to where mwparserfromhell ends it


@functools.lru_cache(maxsize=1)
def _markup_tokens():
    """What _unclosed scans for: [[, ]], an external link's [ (a URL scheme follows), ], a line
    break, and tags (groups: "/" of a closing tag, the name, what follows it up to ">", the ">")."""
    mw = require("mwparserfromhell", "reading MediaWiki wikitext")
    schemes = "|".join(s + ("://" if slashes else ":") for s, slashes in sorted(mw.definitions.URI_SCHEMES.items()))
    return re.compile(r"\[\[|\]\]|\[(?=%s|//)|\]|\n|<(/?)([A-Za-z][A-Za-z0-9]*)(?=([^<>\n]*)(>?))" % schemes,
                      re.IGNORECASE), frozenset(mw.definitions.SINGLE)


def _unclosed(text):
    """(the edits to make, sorted: (start, end, replacement), the brackets and tag openers to escape
    and the external links inside another's title to unwrap; the line breaks where no bracket or tag
    is open). One scan, whatever the page."""
    tokens, single = _markup_tokens()
    escape, quiet, stack = [], [], []        # stack: (kind, position): "[[", "[" (external) or a tag name
    unwrap = []                              # (start, end) of an inner external link's "[URL" and "]"
    for m in tokens.finditer(text):
        token, at = m.group(0), m.start()
        if token == "\n":                    # an external link ends with its line
            _escape_above(stack, next((i for i, (kind, _) in enumerate(stack) if kind == "["), len(stack)), escape)
            if not stack:
                quiet.append(at)
        elif token[0] == "]":
            link = max((i for i, (kind, _) in enumerate(stack) if kind == "[["), default=None)
            if token == "]]" and link is not None and sum(kind == "[" for kind, _ in stack[link:]) < 2:
                _close(stack, "[[", escape)
            else:                             # each "]" closes an external link (two: one in another's title)
                for closer in range(at, m.end()):
                    _close(stack, "[", escape, text, closer, unwrap)
        elif token[0] == "[":
            _open(stack, token, at, escape)
        else:
            closing, name, attributes, end = m.groups()
            name = name.lower()
            if name in single or (end and attributes.endswith("/")):
                continue
            if closing:
                _close(stack, name, escape)
            elif end:
                _open(stack, name, at, escape)
            else:                             # no ">" on its line: no tag
                escape.append(at)
    _escape_above(stack, 0, escape)
    edits = [(at, at + 1, _ESCAPES[text[at]]) for at in escape] + [(start, end, "") for start, end in unwrap]
    return sorted(edits), quiet


def _open(stack, kind, at, escape):
    if len(stack) >= _MAX_NESTING:
        escape.extend(_brackets(kind, at))
    else:
        stack.append((kind, at))


def _close(stack, kind, escape, text=None, closer=None, unwrap=None):
    """Close the innermost open `kind`, escaping what is open inside it; a closer of nothing is text.
    An external link closed inside another's title is unwrapped (`unwrap`: its "[URL" and `closer`)."""
    for depth in range(len(stack) - 1, -1, -1):
        if stack[depth][0] == kind:
            _escape_above(stack, depth + 1, escape)
            _, at = stack.pop()
            if kind == "[" and any(other == "[" for other, _ in stack):
                unwrap += [(at, _URL.match(text, at + 1).end()), (closer, closer + 1)]
            return


def _escape_above(stack, depth, escape):
    for kind, at in stack[depth:]:
        escape.extend(_brackets(kind, at))
    del stack[depth:]


def _brackets(kind, at):
    return (at, at + 1) if kind == "[[" else (at,)


def _parse_blocks(text):
    """`text` in pieces of at most _PARSE_BLOCK characters, cut at line breaks where nothing is open
    (else at a line break, else a space), with _unclosed's edits made (brackets and tags escaped,
    external links in another's title unwrapped)."""
    edits, quiet = _unclosed(text)
    starts = [start for start, _, _ in edits]
    start = 0
    while start < len(text):
        stop = _block_end(text, start, quiet)
        lo, hi = bisect.bisect_left(starts, start), bisect.bisect_left(starts, stop)
        out, pos = [], start
        for at, end, replacement in edits[lo:hi]:
            out += [text[pos:at], replacement]
            pos = min(end, stop)          # (a URL is never cut: blocks end at a line break or a space)
        out.append(text[pos:stop])
        yield "".join(out)
        start = stop


def _block_end(text, start, quiet):
    limit = start + _PARSE_BLOCK
    if len(text) <= limit:
        return len(text)
    i = bisect.bisect_right(quiet, limit - 1) - 1
    if i >= 0 and quiet[i] >= start:
        return quiet[i] + 1
    for mark in ("\n", " "):
        at = text.rfind(mark, start, limit)
        if at > start:
            return at + 1
    return limit


def wikitext_to_text(wikitext):
    """Plain text of an article's wikitext: templates, tables, references, comments, files,
    categories, interlanguage links and headings removed, link text kept; paragraphs on lines."""
    mw = require("mwparserfromhell", "reading MediaWiki wikitext")
    pieces = []
    for block in _parse_blocks(_drop_heavy(wikitext)):
        text = _reduce(mw.parse(block, skip_style_tags=True), mw.nodes)
        if text:                          # a block cut inside a line goes on on the same line
            pieces += [text, "\n" if block.endswith("\n") else " "]
    return "".join(pieces[:-1])


def _reduce(code, nodes):
    """The text of parsed wikitext, as wikitext_to_text returns it."""
    parts = []
    for node in code.nodes:
        if isinstance(node, nodes.Text):
            parts.append(node.value)
        elif isinstance(node, nodes.Wikilink):
            if _LINK_DROP.match(str(node.title)):
                continue
            parts.append(str(node.text.strip_code() if node.text else node.title.strip_code()))
        elif isinstance(node, nodes.ExternalLink):
            if node.title:
                parts.append(node.title.strip_code())
        elif isinstance(node, nodes.Tag):
            tag = str(node.tag).lower()
            if tag in _INVISIBLE_TAGS or tag == "table":
                continue
            if tag in ("br", "hr"):
                parts.append("\n")
            elif tag == "li" or tag == "dt" or tag == "dd":
                parts.append("\n")
            elif node.contents:
                parts.append(_strip(node.contents))
        elif isinstance(node, nodes.Heading):
            parts.append("\n\n")
        elif isinstance(node, nodes.HTMLEntity):
            parts.append(node.normalize())
        elif isinstance(node, (nodes.Template, nodes.Comment, nodes.Argument)):
            continue
        else:
            parts.append(node.__strip__(normalize=True, collapse=True) or "")
    lines = []
    for line in "".join(parts).split("\n"):
        line = _SPACES.sub(" ", line.replace("'''", "").replace("''", "")).strip()
        if line and not line.startswith(("|", "!", "{", "}")):
            lines.append(line)
    return "\n".join(lines)


def _strip(wikicode):
    """The text of markup inside a tag (bold, italics, spans): link text kept, the rest removed."""
    return wikitext_to_text(str(wikicode)).replace("\n", " ")


def _blingfire():
    bf = require("blingfire", "splitting documents into sentences")
    return lambda text: bf.text_to_sentences(text).split("\n")


def _pysbd():
    pysbd = require("pysbd", "the pysbd sentence splitter")
    seg = pysbd.Segmenter(language="en", clean=False)
    return lambda text: [s.strip() for s in seg.segment(text)]


def _syntok():
    segmenter = require("syntok.segmenter", "the syntok sentence splitter")
    return lambda text: ["".join(t.spacing + t.value for t in sentence).strip()
                         for paragraph in segmenter.process(text) for sentence in paragraph]


def _spacy():
    spacy = require("spacy", "spaCy's sentencizer")
    nlp = spacy.blank("en")
    nlp.add_pipe("sentencizer")
    return lambda text: [s.text.strip() for s in nlp(text).sents]


SPLITTERS = {"blingfire": _blingfire, "pysbd": _pysbd, "syntok": _syntok, "spacy": _spacy}
SPLITTER = "blingfire"


class SentenceSplitter:
    """Paragraphs (lines) into sentences; the splitter is loaded on first use (in the worker)."""

    def __init__(self, name=SPLITTER):
        self.name = name
        self._split = None

    def __call__(self, paragraph):
        if self._split is None:
            self._split = SPLITTERS[self.name]()
        return [s for s in (x.strip() for x in self._split(paragraph)) if s]


def document_sentences(document, splitter):
    """The sentences of a document (a list of sentences is returned as it is)."""
    if isinstance(document, list):
        return document
    text = wikitext_to_text(document) if isinstance(document, Wikitext) else document
    sentences = []
    for paragraph in text.split("\n"):
        if paragraph.strip():
            sentences.extend(splitter(paragraph))
    return sentences
