"""WordPiece tokenization, token for token the same as Google BERT's original tokenizer.

Owns the vocab file format (one token per line, id = line index), `BertTokenizer`, the fast
batch encoder `build_fast_tokenizer` (a `tokenizers.Tokenizer`), the special-token id lookup
and the model's padded vocab size.

The fast encoder is composed from `tokenizers` primitives, not from `BertNormalizer` and
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
import logging
import os
import sys
import unicodedata

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

from turing.errors import InputFileNotFoundError, InputValueError

logger = logging.getLogger(__name__)

UNK = "[UNK]"
SPECIAL_TOKENS = {"pad": "[PAD]", "unk": "[UNK]", "cls": "[CLS]", "sep": "[SEP]", "mask": "[MASK]"}
MAX_INPUT_CHARS_PER_WORD = 100
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
    tokenizer = Tokenizer(models.WordPiece(dict(vocab), unk_token=UNK, continuing_subword_prefix="##",
                                           max_input_chars_per_word=MAX_INPUT_CHARS_PER_WORD))
    tokenizer.normalizer = normalizers.Sequence(lower if do_lower_case else clean)
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(pre)
    tokenizer.decoder = decoders.WordPiece(prefix="##")
    return tokenizer


class BertTokenizer:
    """Text -> WordPiece tokens -> ids, with the vocab of one vocab.txt."""

    def __init__(self, vocab_file, do_lower_case=True):
        self.vocab = load_vocab(vocab_file)
        self.ids_to_tokens = collections.OrderedDict((i, t) for t, i in self.vocab.items())
        self.do_lower_case = do_lower_case
        if UNK not in self.vocab:
            raise InputValueError(f"vocab file {vocab_file!r} has no {UNK} token")
        self._unk_id = self.vocab[UNK]
        self._fast = build_fast_tokenizer(self.vocab, do_lower_case)

    @classmethod
    def from_pretrained(cls, path_or_folder, do_lower_case=True):
        """Load from a vocab.txt path or a folder holding vocab.txt (nothing is downloaded)."""
        path = os.fspath(path_or_folder)
        if os.path.isdir(path):
            path = os.path.join(path, "vocab.txt")
        if not os.path.isfile(path):
            raise InputFileNotFoundError(f"tokenizer vocab {path!r} not found: expected a vocab.txt file "
                                    "or a folder holding vocab.txt (model names are not downloaded)")
        return cls(path, do_lower_case=do_lower_case)

    def __len__(self):
        return len(self.vocab)

    def tokenize(self, text):
        return self._fast.encode(text, add_special_tokens=False).tokens

    def encode_batch(self, texts):
        """Token ids of many texts at once, encoded in parallel by `tokenizers`."""
        return [e.ids for e in self._fast.encode_batch(list(texts), add_special_tokens=False)]

    def convert_tokens_to_ids(self, tokens):
        return [self.vocab.get(t, self._unk_id) for t in tokens]

    def convert_ids_to_tokens(self, ids):
        return [self.ids_to_tokens[int(i)] for i in ids]


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
    parser = argparse.ArgumentParser(description="Show the WordPiece tokens and ids of some text.")
    parser.add_argument("--vocab", required=True, help="vocab.txt or a folder holding it")
    parser.add_argument("--no_lower_case", dest="do_lower_case", action="store_false",
                        help="keep case and accents (cased vocab)")
    parser.add_argument("text", nargs="+", help="text to tokenize (the words are joined by spaces)")
    args = parser.parse_args(argv)
    try:
        tokenizer = BertTokenizer.from_pretrained(args.vocab, do_lower_case=args.do_lower_case)
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    tokens = tokenizer.tokenize(" ".join(args.text))
    print("tokens:", " ".join(tokens))
    print("ids:   ", " ".join(map(str, tokenizer.convert_tokens_to_ids(tokens))))
    return 0


if __name__ == "__main__":
    sys.exit(main())


def vocab_digest(path):
    """The sha256 of a vocab file's bytes: which vocab a checkpoint was trained with (args.json)."""
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()
