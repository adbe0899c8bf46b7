"""The tokenizer a model reads, the one way every reader names and opens it: a WordPiece vocab.txt
(token for token the same as Google BERT's original tokenizer) or a Hugging Face tokenizer.json
(byte-level BPE as ModernBERT's and RoBERTa's, or any other model `tokenizers` reads).

Owns the vocab file format (one token per line, id = line index), `Tokenizer` (what the data
tools, the providers, the trainer and the quality tools need of a tokenizer: encode, ids to
tokens, the special ids, the vocab size, the model's rows, a digest, the files a copy of it is
made of) with its two kinds, `BertTokenizer` (vocab.txt) and `JsonTokenizer` (tokenizer.json),
`load_tokenizer` (a vocab.txt, a tokenizer.json or a folder holding one), the fast batch
encoder `build_fast_tokenizer` (a `tokenizers.Tokenizer`), the special-token id lookup and the
model's padded vocab size.

Identity (`Tokenizer.identity`, compared by `tokenizer_difference`): which tokenizer this is, from
what decides its ids, never from its file's bytes, so that a vocab.txt and the tokenizer.json
transformers writes from it (BertTokenizerFast.save_pretrained) are the same tokenizer: the model
(its type and settings: a WordPiece's unk token, continuation prefix and longest word; a BPE's
merges and a Unigram's scores by their sha256), the normalizer and the pre-tokenizer (a vocab.txt's
are Google's BasicTokenizer, named as the `tokenizers` parts transformers writes for it: a
BertNormalizer that cleans the text, splits CJK characters and, with do_lower_case, lower-cases and
strips accents, and a BertPreTokenizer; a tokenizer.json's as its file writes them, a BertNormalizer's
strip_accents null resolved to its lowercase, as BERT's rule and `tokenizers` read it), the added
tokens beyond the special ones, the special tokens with their ids, the vocab size and the sha256 of
the tokens in id order. What only shapes the output around the ids (the post-processor, which the
readers replace with their own [CLS]/[SEP], the decoder, padding, truncation) is left out; so are the
special tokens' being matched in the text, which a tokenizer.json does and Google's tokenizer does
not (a corpus holding "[SEP]" literally). Equal identities mean the same definition: the two
implementations still differ where the module's composition differs from the Rust BertNormalizer
(below). A part longer than IDENTITY_PART_CHARS as JSON (a sentencepiece charsmap) is held by its
type and sha256, so the record the shards carry (turing.shard_tokenizer) stays small.

Special tokens: a vocab.txt's are BERT's five ([PAD], [UNK], [CLS], [SEP], [MASK]: the format has
no other way to name them); a tokenizer.json's come from the tokenizer (special_tokens_map.json or
tokenizer_config.json beside it, as transformers writes them, else its post-processor's cls/sep,
its model's unk_token and its padding's pad_token), whatever they are called ([CLS] or <s>).

The WordPiece encoder is composed from `tokenizers` primitives, not from `BertNormalizer` and
`BertPreTokenizer`: those use the Rust crate's own, older Unicode tables and differ from
Google's Python code (which asks `unicodedata`) on unassigned code points (Google drops them),
punctuation and marks added since Unicode 9, the CJK range 0x2B820-0x2CEAF and the word-final
Greek sigma. Here every character class is built from this interpreter's `unicodedata`, so
the output equals the original tokenizer run under the same Python.

    python -m turing.tokenization --vocab vocab.txt "Some text to tokenize."
"""
import argparse
import collections
import functools
import hashlib
import itertools
import json
import logging
import os
import sys
import unicodedata

import tokenizers
from tokenizers import Regex, decoders, models, normalizers, pre_tokenizers

from turing.errors import InputFileNotFoundError, InputValueError
from turing.model_path import is_model_id, resolve_model_path

logger = logging.getLogger(__name__)

UNK = "[UNK]"
SPECIAL_TOKENS = {"pad": "[PAD]", "unk": "[UNK]", "cls": "[CLS]", "sep": "[SEP]", "mask": "[MASK]"}  # a vocab.txt's
ROLES = tuple(SPECIAL_TOKENS)      # what a model needs a special token for, whatever the tokenizer calls it
VOCAB_TXT, TOKENIZER_JSON = "vocab.txt", "tokenizer.json"
TOKENIZER_FILES = (VOCAB_TXT, TOKENIZER_JSON)   # a folder's tokenizer: the first of these it holds
# beside a tokenizer.json, where transformers writes its special tokens (cls_token, ...), read in this order
SPECIAL_TOKEN_FILES = ("special_tokens_map.json", "tokenizer_config.json")
MAX_INPUT_CHARS_PER_WORD = 100
# a vocab.txt's WordPiece model: its settings, as `tokenizers` names them (build_fast_tokenizer, identity)
WORDPIECE = {"unk_token": UNK, "continuing_subword_prefix": "##", "max_input_chars_per_word": MAX_INPUT_CHARS_PER_WORD}
IDENTITY_PART_CHARS = 2000   # an identity's part longer than this as JSON is held by its type and sha256
IDENTITY_KEYS = ("model", "normalizer", "pre_tokenizer", "added_tokens", "vocab_size", "vocab_sha256", "special_tokens")
# Google's _is_chinese_char ranges (CJK Unified Ideographs and extensions, compatibility forms).
_CJK_RANGES = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F),
               (0x2B740, 0x2B81F), (0x2B820, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F))


def load_vocab(vocab_file):
    """vocab.txt -> OrderedDict token -> id, the id being the line index.

    A token on several lines keeps the id of its last line (as Google BERT's load_vocab and the
    `tokenizers` WordPiece reader do); see `vocab_size` for the size such a file gives."""
    if not os.path.isfile(vocab_file):
        raise InputFileNotFoundError(f"vocab file {vocab_file!r} not found: expected a vocab.txt "
                                "with one WordPiece token per line")
    vocab = collections.OrderedDict()
    with open(vocab_file, encoding="utf-8") as f:
        for index, line in enumerate(f):
            vocab[line.rstrip()] = index
    return vocab


def _char_class(code_points):
    """A regex character class matching exactly the given sorted code points."""
    runs = (list(g) for _, g in itertools.groupby(enumerate(code_points), lambda t: t[1] - t[0]))
    parts = (f"\\x{{{r[0][1]:x}}}-\\x{{{r[-1][1]:x}}}" for r in runs)
    return "[" + "".join(parts) + "]"


def _fixes(normalizer, reference, chars):
    """Literal Replace rules for the chars where a tokenizers normalizer disagrees with Python."""
    # one call for all chars; a space between them keeps NFD from reordering across chars
    ours = normalizer.normalize_str(" ".join(chars)).split(" ")
    return [normalizers.Replace(c, reference(c)) for c, o in zip(chars, ours) if o != reference(c)]


@functools.lru_cache(maxsize=None)
def _google_rules():
    """Normalizers (without / with lower-casing) and pre-tokenizer equal to Google's
    BasicTokenizer, with character classes read from `unicodedata` (built once, ~1 s)."""
    drop, space, split, marks, kept = [], [], [], [], []
    for cp in range(0x110000):
        if 0xD800 <= cp <= 0xDFFF:
            continue  # lone surrogates cannot be passed to the Rust side at all
        ch, cat = chr(cp), unicodedata.category(chr(cp))
        if cp in (0, 0xFFFD) or (cat[0] == "C" and ch not in "\t\n\r"):
            drop.append(cp)
        elif cat == "Zs" or ch.isspace():  # Zs is mapped to " ", the rest splits in str.split()
            space.append(cp)
        else:
            kept.append(ch)
            if (cat[0] == "P" or 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96
                    or 123 <= cp <= 126 or any(a <= cp <= b for a, b in _CJK_RANGES)):
                split.append(cp)
            if cat == "Mn":
                marks.append(cp)
    # Python lower-cases U+03A3 to final sigma when, skipping case-ignorable chars, a cased char
    # precedes it and none follows. Probe Python for both classes: "xΣ" ends in ς iff x is
    # cased and not case-ignorable; "ΑxΣ" also does when x is case-ignorable.
    cased = {c for c in kept if (c + "Σ").lower().endswith("ς")}
    ignorable = [ord(c) for c in kept if c not in cased and ("Α" + c + "Σ").lower().endswith("ς")]
    cased, ignorable = _char_class(sorted(map(ord, cased))), _char_class(ignorable)
    clean = [normalizers.Replace(Regex(_char_class(drop)), ""),
             normalizers.Replace(Regex(_char_class(space)), " ")]
    lower = clean + [
        normalizers.Replace(Regex(f"(?<={cased}{ignorable}*)\\x{{3a3}}(?!{ignorable}*{cased})"), "ς"),
        *_fixes(normalizers.Lowercase(), str.lower, kept), normalizers.Lowercase(),
        *_fixes(normalizers.NFD(), functools.partial(unicodedata.normalize, "NFD"), kept),
        normalizers.NFD(), normalizers.Replace(Regex(_char_class(marks)), "")]
    pre = [pre_tokenizers.CharDelimiterSplit(" "),
           pre_tokenizers.Split(Regex(_char_class(split)), behavior="isolated")]
    return clean, lower, pre


def build_fast_tokenizer(vocab_file_or_vocab_dict, do_lower_case=True):
    """A `tokenizers.Tokenizer` giving Google BERT's WordPiece tokens; adds no special tokens."""
    vocab = vocab_file_or_vocab_dict
    source = "vocab dict"
    if isinstance(vocab, (str, os.PathLike)):
        source, vocab = f"vocab file {os.fspath(vocab)!r}", load_vocab(vocab)
    if UNK not in vocab:
        raise InputValueError(f"{source} has no {UNK} token: WordPiece needs it for unknown words")
    clean, lower, pre = _google_rules()
    tokenizer = tokenizers.Tokenizer(models.WordPiece(dict(vocab), **WORDPIECE))
    tokenizer.normalizer = normalizers.Sequence(lower if do_lower_case else clean)
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(pre)
    tokenizer.decoder = decoders.WordPiece(prefix="##")
    return tokenizer


class TokenizerError(InputValueError):
    """A tokenizer that cannot be used as asked; the message names the file and what to do instead."""


def file_digest(path):
    """The sha256 of a file's bytes: which tokenizer a checkpoint (args.json) or a set of shards was made with."""
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


vocab_digest = file_digest   # the name the checkpoints' readers know it by


def _json_sha256(value):
    return hashlib.sha256(json.dumps(value, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


def _compact(value):
    """An identity's part as it is, or by its type and sha256 where its JSON is longer than IDENTITY_PART_CHARS."""
    if len(json.dumps(value, sort_keys=True, ensure_ascii=False)) <= IDENTITY_PART_CHARS:
        return value
    kind = value.get("type") if isinstance(value, dict) else None
    return {**({"type": kind} if kind else {}), "sha256": _json_sha256(value)}


def _bert_text(do_lower_case):
    """(normalizer, pre-tokenizer) of Google's BasicTokenizer, as `tokenizers` names the parts that do
    its work: strip_accents is do_lower_case, as in Google's tokenizer."""
    return ({"type": "BertNormalizer", "clean_text": True, "handle_chinese_chars": True,
             "strip_accents": do_lower_case, "lowercase": do_lower_case}, {"type": "BertPreTokenizer"})


def _resolved(spec):
    """A tokenizer.json normalizer with every BertNormalizer's strip_accents as it acts: null (what
    transformers writes) strips accents exactly where it lower-cases."""
    if isinstance(spec, list):
        return [_resolved(s) for s in spec]
    if not isinstance(spec, dict):
        return spec
    spec = {k: _resolved(v) for k, v in spec.items()}
    if spec.get("type") == "BertNormalizer" and spec.get("strip_accents") is None:
        spec["strip_accents"] = spec.get("lowercase")
    return spec


def _model_settings(model):
    """A tokenizer.json model's settings that decide ids: all but its vocab (token -> id, which the
    identity's vocab holds), its merges (BPE: "a b" in older files, ["a", "b"] since) and its
    scores (Unigram's [token, score] vocab) by their sha256."""
    found = {k: v for k, v in model.items() if k not in ("vocab", "merges")}
    if "merges" in model:
        found["merges_sha256"] = _json_sha256([m.split(" ", 1) if isinstance(m, str) else m for m in model["merges"]])
    if isinstance(model.get("vocab"), list):
        found["scores_sha256"] = _json_sha256([entry[1:] for entry in model["vocab"]])
    return found


class Tokenizer:
    """One tokenizer file and what every reader needs of it. `path`: the file; `name`: as the user
    named it (a file or a folder); `vocab` token -> id; `ids_to_tokens`; `special_tokens` role ->
    token and `special` role -> id (ROLES: pad, unk, cls, sep, mask); `vocab_size` the ids it
    spans; `digest` its file's sha256; `identity` what decides its ids, whichever file holds it
    (the module docstring); `do_lower_case` (a vocab.txt's; None for a tokenizer.json, whose
    normalizer says). Subclasses: BertTokenizer (vocab.txt), JsonTokenizer (tokenizer.json)."""

    kind = None           # VOCAB_TXT or TOKENIZER_JSON: the file a copy of it is named
    unit = "token"        # what its pieces are called in messages
    do_lower_case = None

    def __init__(self, path, vocab, name=None):
        self.path = os.fspath(path)
        self.name = os.fspath(name) if name is not None else self.path
        self.vocab = vocab
        self.ids_to_tokens = collections.OrderedDict((i, t) for t, i in vocab.items())

    # -- encoding
    @property
    def backend(self):
        """The `tokenizers.Tokenizer` that encodes (no special tokens added)."""
        raise NotImplementedError

    def __len__(self):
        return len(self.vocab)

    def tokenize(self, text):
        return self.backend.encode(text, add_special_tokens=False).tokens

    def encode(self, text):
        """The ids of `text`, no special tokens."""
        return self.backend.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts, after_space=False):
        """Token ids of many texts at once, encoded in parallel by `tokenizers`. `after_space`: each
        text as it stands after a space in running text (a byte-level BPE keeps the space in its
        next token: "Ġword"; a WordPiece drops it)."""
        texts = [" " + t for t in texts] if after_space and self.space_in_tokens else list(texts)
        return [e.ids for e in self.backend.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids):
        return self.backend.decode([int(i) for i in ids], skip_special_tokens=False)

    def convert_tokens_to_ids(self, tokens):
        unk = self.vocab.get(self.special_tokens["unk"])
        return [self.vocab.get(t, unk) for t in tokens]

    def convert_ids_to_tokens(self, ids):
        return [self.ids_to_tokens[int(i)] for i in ids]

    # -- what the model and the data formats need of it
    space_in_tokens = False   # whether a space before a word is part of its first token

    @functools.cached_property
    def special(self):
        """{"pad", "unk", "cls", "sep", "mask"} -> id."""
        return {role: self.vocab[token] for role, token in self.special_tokens.items()}

    @property
    def vocab_size(self):
        """The ids the tokenizer spans: its highest id + 1."""
        return vocab_size(self.vocab)

    def model_vocab(self, config_vocab_size=None):
        """The ids the model's embedding rows stand for (rows past them are padding): the
        tokenizer's, or `config_vocab_size` (the model config's) where larger (JsonTokenizer)."""
        return self.vocab_size

    def rows(self, config_vocab_size=None):
        """The model's embedding rows: model_vocab rounded up to a multiple of 8; the one rule the
        trainer, the tools and the export read."""
        return vocab_size_padded(self.model_vocab(config_vocab_size))

    @functools.cached_property
    def digest(self):
        return file_digest(self.path)

    def tokens_by_id(self):
        """Token string of every id 0..vocab_size-1 ("" for an id no token has)."""
        return [self.ids_to_tokens.get(i, "") for i in range(self.vocab_size)]

    def files(self):
        """{file name: bytes} of a copy of this tokenizer that opens to the same tokenizer (its file,
        and what names its special tokens)."""
        with open(self.path, "rb") as f:
            return {self.kind: f.read()}

    def definition(self):
        """(model, normalizer, pre-tokenizer, added tokens beyond the special ones) as `tokenizers`
        names them: what decides its ids besides its vocab and special tokens."""
        raise NotImplementedError

    @functools.cached_property
    def identity(self):
        """Which tokenizer this is, from what decides its ids (the module docstring): a dict of JSON
        values, equal for a vocab.txt and the tokenizer.json written from it; tokenizer_difference
        says how two differ."""
        model, normalizer, pre_tokenizer, added = self.definition()
        tokens = [self.ids_to_tokens.get(i) for i in range(self.vocab_size)]
        return {"model": _compact(model), "normalizer": _compact(normalizer), "pre_tokenizer": _compact(pre_tokenizer),
                "added_tokens": _compact(added), "vocab_size": self.vocab_size, "vocab_sha256": _json_sha256(tokens),
                "special_tokens": {role: [token, self.special[role]] for role, token in self.special_tokens.items()}}

    def record(self):
        """Which tokenizer this is, as the shards record it: its identity, and for people its name,
        kind and file's sha256."""
        return {"name": self.name, "kind": self.kind, "sha256": self.digest,
                "vocab_size": self.vocab_size,
                "special_tokens": {role: [token, self.special[role]] for role, token in self.special_tokens.items()},
                "identity": self.identity}

    def describe(self):
        return f"{self.name} (sha256 {self.digest[:12]})"


class BertTokenizer(Tokenizer):
    """Text -> WordPiece tokens -> ids, with the vocab of one vocab.txt."""

    kind = VOCAB_TXT
    unit = "WordPiece token"

    def __init__(self, vocab_file, do_lower_case=True, name=None):
        super().__init__(vocab_file, load_vocab(vocab_file), name)
        self.do_lower_case = do_lower_case
        if UNK not in self.vocab:
            raise InputValueError(f"vocab file {os.fspath(vocab_file)!r} has no {UNK} token")
        self._unk_id = self.vocab[UNK]
        self._fast = None
        self.special_tokens = dict(SPECIAL_TOKENS)

    @classmethod
    def from_pretrained(cls, path_or_folder, do_lower_case=True):
        """Load from a vocab.txt path or a folder holding vocab.txt (nothing is downloaded)."""
        path = os.fspath(path_or_folder)
        if os.path.isdir(path):
            path = os.path.join(path, VOCAB_TXT)
        if not os.path.isfile(path):
            raise InputFileNotFoundError(f"tokenizer vocab {path!r} not found: expected a vocab.txt file "
                                    "or a folder holding vocab.txt (model names are not downloaded)")
        return cls(path, do_lower_case=do_lower_case)

    @property
    def backend(self):
        if self._fast is None:   # built on first use: ~1 s for the character classes, once a process
            self._fast = build_fast_tokenizer(self.vocab, self.do_lower_case)
        return self._fast

    @functools.cached_property
    def special(self):
        try:
            return special_token_ids(self.vocab)
        except InputValueError as e:
            raise TokenizerError(f"vocab file {self.path}: {e}") from None

    def convert_tokens_to_ids(self, tokens):
        return [self.vocab.get(t, self._unk_id) for t in tokens]

    def rows(self, config_vocab_size=None):
        """The vocab file's lines (repeated lines included) rounded up to 8, whatever the model
        config says: the original's rule (vocab_rows)."""
        return vocab_rows(self.vocab, self.path)

    def tokens_by_id(self):
        """The file's lines: a repeated line's earlier id keeps its string (load_vocab's dict keeps the last)."""
        with open(self.path, encoding="utf-8") as f:
            return [line.rstrip() for line in f]

    def definition(self):
        return ({"type": "WordPiece", **WORDPIECE}, *_bert_text(self.do_lower_case), [])

    def record(self):
        return {**super().record(), "do_lower_case": self.do_lower_case}


class JsonTokenizer(Tokenizer):
    """A Hugging Face tokenizer.json (read by `tokenizers`), its special tokens named beside it or
    in it (see the module docstring)."""

    kind = TOKENIZER_JSON

    def __init__(self, path, name=None):
        path = os.fspath(path)
        try:
            with open(path, encoding="utf-8") as f:
                spec = json.load(f)
            fast = tokenizers.Tokenizer.from_file(path)
        except Exception as e:  # noqa: BLE001 - the Rust reader raises a bare Exception
            raise TokenizerError(f"{path}: not a tokenizer.json that Hugging Face tokenizers reads "
                                 f"({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None
        fast.no_padding()      # a tokenizer.json may say to pad or cut every text: the readers do that
        fast.no_truncation()
        super().__init__(path, dict(sorted(fast.get_vocab(with_added_tokens=True).items(), key=lambda kv: kv[1])),
                         name)
        self._fast = fast
        self.special_tokens = _special_tokens(path, spec, self.vocab)
        model = (spec.get("model") or {}).get("type")
        pre = json.dumps(spec.get("pre_tokenizer"))
        # byte-level BPE keeps a word's leading space in its first token ("Ġword"), as do Metaspace ones
        self.space_in_tokens = model != "WordPiece" and ("ByteLevel" in pre or "Metaspace" in pre)
        # as the file writes them (not as this `tokenizers` would write them again: the same file is
        # the same tokenizer whatever version reads it), the special tokens' entries in their own part
        specials = set(self.special_tokens.values())
        self._definition = (_model_settings(spec.get("model") or {}), _resolved(spec.get("normalizer")),
                            spec.get("pre_tokenizer"),
                            sorted((t for t in spec.get("added_tokens") or [] if t.get("content") not in specials),
                                   key=lambda t: t["id"]))

    @functools.cached_property
    def backend(self):
        """The file's own `tokenizers` encoder; for a tokenizer.json that is BERT's WordPiece (its
        identity a vocab.txt's, as transformers writes one from a vocab.txt), the Google-exact encoder
        of a vocab.txt (`build_fast_tokenizer`), so that the same identity gives the same ids: the
        Rust BertNormalizer differs from Google's on rare characters (the module docstring) and
        would match a literal "[SEP]" in the text as the special token."""
        lower = self.wordpiece_lower_case
        return self._fast if lower is None else build_fast_tokenizer(self.vocab, lower)

    @functools.cached_property
    def wordpiece_lower_case(self):
        """do_lower_case of the vocab.txt tokenizer this tokenizer.json is the same as (model,
        normalizer, pre-tokenizer and added tokens), or None where it is another kind."""
        mine = [self.identity[key] for key in ("model", "normalizer", "pre_tokenizer", "added_tokens")]
        for lower in (True, False):
            model, normalizer, pre_tokenizer = {"type": "WordPiece", **WORDPIECE}, *_bert_text(lower)
            if mine == [_compact(model), _compact(normalizer), _compact(pre_tokenizer), _compact([])]:
                return lower
        return None

    def definition(self):
        return self._definition

    def model_vocab(self, config_vocab_size=None):
        """The tokenizer's ids, or the model config's vocab_size where larger: an embedding padded
        past the tokenizer's ids (a ModernBERT or RoBERTa config.json's vocab_size) keeps its rows."""
        return max(self.vocab_size, config_vocab_size if isinstance(config_vocab_size, int) else 0)

    def files(self):
        roles = {f"{role}_token": token for role, token in self.special_tokens.items()}
        return {**super().files(), SPECIAL_TOKEN_FILES[0]: (json.dumps(roles, indent=2) + "\n").encode()}


def tokenizer_difference(ours, theirs, whose="the other's"):
    """How tokenizer `ours` differs from `theirs`, in a few words (`whose` names theirs: "the shards'"),
    None where they are the same tokenizer (equal identities). Each is a Tokenizer or an identity (a
    record's). The first of: the model's type, then its settings; the normalizer (the lower-casing,
    ...); the pre-tokenizer; the vocab size and the first id whose token differs, with both tokens
    (where both are Tokenizers; of two identities, the sha256 of their tokens); a special token's id;
    the added tokens."""
    a, b = (t.identity if isinstance(t, Tokenizer) else t for t in (ours, theirs))
    if a == b:
        return None
    if a["model"].get("type") != b["model"].get("type"):
        return f"a {a['model'].get('type')} model ({whose} {b['model'].get('type')})"
    for part in ("model", "normalizer", "pre_tokenizer"):
        if a[part] != b[part]:
            return _part_difference(part, a[part], b[part], whose)
    words = []
    if a["vocab_size"] != b["vocab_size"]:
        words.append(f"vocab size {a['vocab_size']} ({whose} {b['vocab_size']})")
    if isinstance(ours, Tokenizer) and isinstance(theirs, Tokenizer):
        first = next((i for i in range(min(a["vocab_size"], b["vocab_size"]))
                      if ours.ids_to_tokens.get(i) != theirs.ids_to_tokens.get(i)), None)
        if first is not None:
            words.append(f"id {first} is {_token(ours.ids_to_tokens.get(first))} "
                         f"({whose} {_token(theirs.ids_to_tokens.get(first))})")
    elif not words and a["vocab_sha256"] != b["vocab_sha256"]:
        words.append(f"other tokens: the sha256 of its tokens in id order is {a['vocab_sha256'][:12]} "
                     f"({whose} {b['vocab_sha256'][:12]})")
    if words:
        return ", ".join(words)
    for role in ROLES:
        (token, at), (their_token, their_at) = (x["special_tokens"].get(role, [None, None]) for x in (a, b))
        if (token, at) != (their_token, their_at):
            theirs_words = f"id {their_at}" if token == their_token else f"{their_token!r} id {their_at}"
            return f"{role} token {token!r} id {at} ({whose} {theirs_words})"
    return f"added tokens {_value(a['added_tokens'])} ({whose} {_value(b['added_tokens'])})"


# a BertNormalizer's settings, as a difference names them
_BERT_SETTINGS = {"lowercase": "lower-casing", "strip_accents": "accent stripping",
                  "handle_chinese_chars": "CJK character splitting", "clean_text": "text cleaning"}


def _part_difference(part, ours, theirs, whose):
    """How a model, normalizer or pre-tokenizer spec differs from another of the same part, in a few words."""
    name = part.replace("_", "-")
    if not (isinstance(ours, dict) and isinstance(theirs, dict) and ours.get("type") == theirs.get("type")):
        return f"{name} {_kind(ours)} ({whose} {_kind(theirs)})"
    key = next(k for k in sorted(set(ours) | set(theirs)) if ours.get(k) != theirs.get(k))
    if ours.get("type") == "BertNormalizer" and key in _BERT_SETTINGS:
        return f"{_BERT_SETTINGS[key]} {_on(ours.get(key))} ({whose} {_on(theirs.get(key))})"
    return (f"{ours.get('type')} {name}'s {key} {_value(ours.get(key), key)} "
            f"({whose} {_value(theirs.get(key), key)})")


def _kind(spec):
    """A spec's type, a Sequence's with the types in it ("Sequence of NFD, Lowercase"); "none" for none."""
    if not isinstance(spec, dict):
        return "none"
    inner = spec.get("normalizers") or spec.get("pretokenizers")
    if spec.get("type") == "Sequence" and isinstance(inner, list):
        return "Sequence of " + ", ".join(map(_kind, inner))
    return str(spec.get("type"))


def _on(value):
    return {True: "on", False: "off"}.get(value, repr(value))


def _token(token):
    return "no token" if token is None else repr(token)


def _value(value, key=""):
    """A setting's value in a message: a digest (`key` *sha256) by its first 12 digits, anything by 60 characters."""
    if key.endswith("sha256") and isinstance(value, str):
        return value[:12]
    text = repr(value) if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 60 else text[:57] + "..."


def _content(value):
    """A special token as transformers writes it: a string, or {"content": ...} (an AddedToken)."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) and value else None


def _processor_tokens(processor):
    """{"cls", "sep"} -> token of a tokenizer.json post-processor (TemplateProcessing's single
    template: the special token before the sequence and the one after; Roberta/BertProcessing's
    cls and sep; the first of a Sequence's processors that names them)."""
    kind = (processor or {}).get("type")
    if kind == "Sequence":
        for inner in processor.get("processors") or []:
            found = _processor_tokens(inner)
            if found:
                return found
        return {}
    if kind in ("RobertaProcessing", "BertProcessing"):
        return {role: processor[role][0] for role in ("cls", "sep") if isinstance(processor.get(role), list)}
    if kind == "TemplateProcessing":
        pieces = processor.get("single") or []
        at = next((i for i, p in enumerate(pieces) if "Sequence" in p), None)
        if at is None:
            return {}
        found = {}
        if at > 0 and "SpecialToken" in pieces[at - 1]:
            found["cls"] = pieces[at - 1]["SpecialToken"]["id"]
        if at + 1 < len(pieces) and "SpecialToken" in pieces[at + 1]:
            found["sep"] = pieces[at + 1]["SpecialToken"]["id"]
        specials = processor.get("special_tokens") or {}
        # a template piece names an entry of special_tokens, whose first token is the one in the text
        return {role: ((specials.get(name) or {}).get("tokens") or [name])[0] for role, name in found.items()}
    return {}


def _special_tokens(path, spec, vocab):
    """role -> token of a tokenizer.json: from the files beside it (SPECIAL_TOKEN_FILES: cls_token,
    sep_token, mask_token, pad_token, unk_token), else its post-processor (cls, sep), its model's
    unk_token, its padding's pad_token. A role no source names, or a token not in the vocab, is
    one error line."""
    found, where = {}, {}
    folder = os.path.dirname(os.path.abspath(path))
    for name in SPECIAL_TOKEN_FILES:
        beside = os.path.join(folder, name)
        if not os.path.isfile(beside):
            continue
        try:
            with open(beside, encoding="utf-8") as f:
                values = json.load(f)
        except ValueError as e:
            raise TokenizerError(f"{beside}: not valid JSON ({e})") from None
        for role in ROLES:
            token = _content((values if isinstance(values, dict) else {}).get(f"{role}_token"))
            if token and role not in found:
                found[role], where[role] = token, name
    inside = dict(_processor_tokens(spec.get("post_processor")))
    inside["unk"] = _content((spec.get("model") or {}).get("unk_token"))
    inside["pad"] = _content((spec.get("padding") or {}).get("pad_token"))
    for role, token in inside.items():
        if token and role not in found:
            found[role], where[role] = token, "its " + {"cls": "post-processor", "sep": "post-processor",
                                                        "unk": "model's unk_token", "pad": "padding"}[role]
    missing = [role for role in ROLES if role not in found]
    if missing:
        raise TokenizerError(
            f"{path}: names no {', '.join(missing)} token; a tokenizer.json's special tokens are read from "
            f"{' or '.join(SPECIAL_TOKEN_FILES)} beside it ({', '.join(f'{r}_token' for r in missing)}, as "
            f"transformers' save_pretrained writes them), else its post-processor (cls, sep), its model's unk_token "
            f"and its padding's pad_token")
    unknown = [role for role in ROLES if found[role] not in vocab]
    if unknown:
        role = unknown[0]
        raise TokenizerError(f"{path}: its {role} token {found[role]!r} ({where[role]}) is not in its vocab")
    return {role: found[role] for role in ROLES}


def tokenizer_file(path):
    """The tokenizer file `path` names: a vocab.txt or a tokenizer.json (any *.json file) as given,
    or the first of TOKENIZER_FILES a folder holds (a model folder, a prepare_data output, a
    checkpoint; a sentence-transformers folder's Transformer module's; a model id's folder in the
    local Hugging Face cache: turing.model_path, the rule the model's readers follow); anything
    else is one error line."""
    path = os.fspath(path)
    if os.path.isdir(path) or (not os.path.exists(path) and is_model_id(path)
                               and not path.endswith((".txt", ".json"))):
        path = resolve_model_path(path)
    if os.path.isdir(path):
        for name in TOKENIZER_FILES:
            if os.path.isfile(os.path.join(path, name)):
                return os.path.join(path, name)
        slow = [n for n in ("vocab.json", "merges.txt", "sentencepiece.bpe.model", "spiece.model")
                if os.path.isfile(os.path.join(path, n))]
        hint = (f"; its {' and '.join(slow)} are a tokenizer of transformers' slow format: save it as tokenizer.json "
                f"(transformers: AutoTokenizer.from_pretrained(FOLDER).save_pretrained(FOLDER) writes one)"
                if slow else "")
        raise InputFileNotFoundError(f"{path}: holds no {VOCAB_TXT} or {TOKENIZER_JSON}{hint}")
    if not os.path.isfile(path):
        raise InputFileNotFoundError(f"{path}: not found; expected a {VOCAB_TXT}, a {TOKENIZER_JSON} or a folder "
                                     f"holding one")
    return path


def folder_lower_case(vocab_file):
    """do_lower_case of the tokenizer_config.json beside a vocab.txt (a model folder's), else True."""
    beside = os.path.join(os.path.dirname(os.path.abspath(vocab_file)), SPECIAL_TOKEN_FILES[1])
    try:
        with open(beside, encoding="utf-8") as f:
            value = json.load(f).get("do_lower_case", True)
    except (OSError, ValueError, AttributeError):
        return True
    return value if isinstance(value, bool) else True


def is_tokenizer_json(path):
    return os.fspath(path).endswith(".json")


def load_tokenizer(path, do_lower_case=None):
    """The tokenizer `path` names (tokenizer_file): a JsonTokenizer for a *.json file, else a
    BertTokenizer of a vocab.txt, lower-casing as `do_lower_case` says (None: as the
    tokenizer_config.json beside it says, else on). The name it gives is `path` as given."""
    file = tokenizer_file(path)
    if is_tokenizer_json(file):
        return JsonTokenizer(file, name=path)
    lower = folder_lower_case(file) if do_lower_case is None else do_lower_case
    return BertTokenizer(file, lower, name=path)


def vocab_of(source):
    """(token -> id, special ids, ids spanned) of a Tokenizer, or of a WordPiece vocab dict (load_vocab's)."""
    if isinstance(source, Tokenizer):
        return source.vocab, source.special, source.vocab_size
    return source, special_token_ids(source), vocab_size(source)


def vocab_size(vocab):
    """The number of ids a vocab spans: its highest id + 1, i.e. the vocab file's line count.

    The one definition of a vocab's size (model rows, data checks, the data tool). It differs
    from len(vocab) when a line repeats: the earlier line's id is then never produced by the
    tokenizer, but it is a valid id (another tool may have written it) and keeps its row."""
    return max(vocab.values()) + 1 if vocab else 0


def vocab_size_padded(vocab_size, multiple=8):
    """Vocab size rounded up to a multiple of `multiple` (the model's embedding rows)."""
    if vocab_size < 1 or multiple < 1:
        raise ValueError(f"vocab_size and multiple must be positive, got {vocab_size}, {multiple}")
    return -(-vocab_size // multiple) * multiple


def vocab_rows(vocab, vocab_file="vocab file"):
    """The model's embedding rows for `vocab` (load_vocab's): its size (vocab_size) rounded up to a
    multiple of 8; the one rule the trainer, the tools and the export read. An empty vocab is an
    error naming `vocab_file`."""
    if not vocab:
        raise InputValueError(f"vocab file {vocab_file}: empty, expected one WordPiece token per line")
    return vocab_size_padded(vocab_size(vocab))


def special_token_ids(vocab):
    """{"pad", "unk", "cls", "sep", "mask"} -> id of [PAD], [UNK], [CLS], [SEP], [MASK]."""
    missing = [tok for tok in SPECIAL_TOKENS.values() if tok not in vocab]
    if missing:
        raise InputValueError(f"vocab lacks special token(s) {', '.join(missing)}: a BERT vocab.txt "
                         "must list [PAD], [UNK], [CLS], [SEP] and [MASK]")
    return {key: vocab[tok] for key, tok in SPECIAL_TOKENS.items()}


def main(argv=None):
    parser = argparse.ArgumentParser(description="Show the tokens and ids of some text.")
    parser.add_argument("--vocab", "--tokenizer", dest="vocab", required=True,
                        help="a vocab.txt, a tokenizer.json or a folder holding one")
    parser.add_argument("--no_lower_case", dest="do_lower_case", action="store_false", default=None,
                        help="vocab.txt: keep case and accents (cased vocab; default: as its folder's "
                             "tokenizer_config.json says, else lower-cased)")
    parser.add_argument("text", nargs="+", help="text to tokenize (the words are joined by spaces)")
    args = parser.parse_args(argv)
    try:
        tokenizer = load_tokenizer(args.vocab, do_lower_case=args.do_lower_case)
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    text = " ".join(args.text)
    print("tokens:", " ".join(tokenizer.tokenize(text)))
    print("ids:   ", " ".join(map(str, tokenizer.encode(text))))
    return 0


if __name__ == "__main__":
    sys.exit(main())

