"""turing.tokenization gives Google BERT's tokens: checked against an independent pure-Python
re-implementation (tests/bert_reference_tokenizer.py), hand-written cases, and transformers'
pure-Python BertTokenizerLegacy where it is installed."""
import random
import unicodedata

import pytest

from tests.bert_reference_tokenizer import basic_tokenize, reference_tokenize
from turing.tokenization import (BertTokenizer, build_fast_tokenizer, load_vocab, main,
                                 special_token_ids, vocab_size_padded)

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]",
         "want", "##want", "##ed", "wa", "un", "runn", "##ing", ",", ".", "!", "?", "'", "(", ")",
         "hello", "world", "how", "##s", "it", "go", "s", "the", "a", "##a", "##aa",
         "naive", "cafe", "resume", "angstrom", "uber", "über", "café", "Hello", "World", "UN",
         "中", "文", "字", "日", "本", "text", "mixed", "with", "ctrl", "##chars", "here",
         "and", "tabs", "new", "##lines", "upper", "case", "##d", "MiXeD", "οδος", "οδοσ", "σοφος",
         "ΟΔΟΣ", "x", "y", "@", "#", "$", "%", "[", "]", "{", "}", "«", "»", "…", ":", "-", "\u2e4e"]

TEXTS = [
    "UNwant\u00e9d,running",
    "Hello, World! How's it going?",
    "naïve café résumé Ångström über Über",
    "nai\u0308ve cafe\u0301 (decomposed accents)",
    "中文字 mixed with 日本text and \U0002B820 and \uF900",
    "ctrl\x00chars\x07here\ufffd and \u200bzero\u00adwidth \x1fsep",
    "tabs\tand\nnew\r\nlines\u00a0nbsp\u3000ideo\u2028line\u2029para\x0bvt\x85nel",
    "a" * 101, "un" * 50, "un" * 50 + "u", "wa" + "a" * 98, "wa" + "a" * 99,
    "xyzzy unknownword runnx",
    "UPPER Case MiXeD UN",
    "ΟΔΟΣ ΣΟΦΟΣ ΟΔΟΣ. Σ ΑΣ'Σ ΑΣ\u0301",
    "He said: «ok»… (fine) [x] {y} @#$%^&*~`|\\ - \u2e4e a\u2e4eb",
    "run\u0378ning \U000E0080here \U0010FFFF",
    "", "   \t\n ", "İstanbul ǅemal ﬁne ℌ",
]


@pytest.fixture(scope="module")
def vocab_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    path.write_text("".join(t + "\n" for t in VOCAB), encoding="utf-8")
    return path


@pytest.mark.parametrize("lower", [True, False])
def test_matches_reference_on_crafted_texts(vocab_file, lower):
    tok = BertTokenizer(vocab_file, do_lower_case=lower)
    vocab = load_vocab(vocab_file)
    for text in TEXTS:
        assert tok.tokenize(text) == reference_tokenize(text, vocab, lower), repr(text)


@pytest.mark.parametrize("lower", [True, False])
def test_matches_reference_on_random_texts(vocab_file, lower):
    rng = random.Random(1234)
    alphabet = list("aeinsuwrgdUNWAX ,.!?'\"()-") + list("\t\n\r\x00\x07\u00a0\u3000\u200b\ufffd") + \
        list("éüÅÖ\u0301\u0308ΣΑΟσ中文日\u2e4e\u0378«»…")
    tok = BertTokenizer(vocab_file, do_lower_case=lower)
    vocab = load_vocab(vocab_file)
    texts = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40))) for _ in range(400)]
    assert tok.encode_batch(texts) == [tok.convert_tokens_to_ids(reference_tokenize(t, vocab, lower))
                                       for t in texts]


@pytest.mark.parametrize("lower", [True, False])
def test_word_splitting_matches_reference_across_unicode(vocab_file, lower):
    # Every assigned code point outside the big ideograph blocks (and a sample of the rest,
    # unassigned ones included) between cased Greek letters, where case, accents, punctuation,
    # whitespace and control handling all show up in the words produced.
    fast = build_fast_tokenizer(vocab_file, do_lower_case=lower)
    cps = [cp for cp in range(0x30000) if not 0xD800 <= cp <= 0xDFFF
           and (cp % 61 == 0 or (unicodedata.category(chr(cp)) != "Cn"
                                 and unicodedata.name(chr(cp), "").split("-")[0] not in
                                 ("CJK UNIFIED IDEOGRAPH", "HANGUL SYLLABLE")))]
    mismatched = []
    for cp in cps:
        text = f"Α{chr(cp)}Σ x{chr(cp)}"
        words = [w for w, _ in fast.pre_tokenizer.pre_tokenize_str(fast.normalizer.normalize_str(text))]
        if words != basic_tokenize(text, lower):
            mismatched.append(hex(cp))
    assert not mismatched


def test_hand_written_cases(vocab_file):
    tok = BertTokenizer(vocab_file)
    assert tok.tokenize("UNwant\u00e9d,running") == ["un", "##want", "##ed", ",", "runn", "##ing"]
    assert tok.tokenize("Ångström, Über!") == ["angstrom", ",", "uber", "!"]
    assert tok.tokenize("中文x") == ["中", "文", "x"]
    assert tok.tokenize("ctrl\x00chars\u200b here") == ["ctrl", "##chars", "here"]
    assert tok.tokenize("run\u0378ning") == ["runn", "##ing"]  # unassigned code point dropped
    assert tok.tokenize("ΟΔΟΣ ΟΔΟΣx") == ["οδος", "[UNK]"]  # word-final sigma, as Python lower()
    assert tok.tokenize("wa" + "a" * 98) == ["wa"] + ["##aa"] * 49  # 100 chars: still split
    assert tok.tokenize("wa" + "a" * 99) == ["[UNK]"]  # 101 chars: too long
    assert tok.tokenize("xyzzy runnx") == ["[UNK]", "[UNK]"]
    assert tok.tokenize("") == []
    cased = BertTokenizer(vocab_file, do_lower_case=False)
    assert cased.tokenize("UNwant\u00e9d,running") == ["[UNK]", ",", "runn", "##ing"]  # one bad piece: whole word
    assert cased.tokenize("Hello World café über") == ["Hello", "World", "café", "über"]
    assert cased.tokenize("ΟΔΟΣ") == ["ΟΔΟΣ"]


def test_ids_both_ways_and_batch(vocab_file):
    tok = BertTokenizer(vocab_file)
    assert len(tok) == len(set(VOCAB))
    tokens = tok.tokenize("Hello, world! xyzzy")
    ids = tok.convert_tokens_to_ids(tokens)
    assert ids == [VOCAB.index("hello"), VOCAB.index(","), VOCAB.index("world"), VOCAB.index("!"),
                   VOCAB.index("[UNK]")]
    assert tok.convert_ids_to_tokens(ids) == tokens
    assert tok.convert_tokens_to_ids(["not-in-vocab"]) == [VOCAB.index("[UNK]")]
    assert tok.ids_to_tokens[VOCAB.index("runn")] == "runn"
    texts = ["Hello, world!", "UNwant\u00e9d,running", ""]
    assert tok.encode_batch(texts) == [tok.convert_tokens_to_ids(tok.tokenize(t)) for t in texts]


def test_load_vocab_ids_are_line_numbers(tmp_path):
    path = tmp_path / "v.txt"
    path.write_text("[UNK]\nb  \r\nc\n\nd", encoding="utf-8")
    assert list(load_vocab(path).items()) == [("[UNK]", 0), ("b", 1), ("c", 2), ("", 3), ("d", 4)]


def test_from_pretrained_file_and_folder(vocab_file, tmp_path):
    by_file = BertTokenizer.from_pretrained(str(vocab_file))
    by_folder = BertTokenizer.from_pretrained(vocab_file.parent, do_lower_case=False)
    assert by_file.vocab == by_folder.vocab and by_folder.do_lower_case is False
    assert by_folder.tokenize("Hello") == ["Hello"] and by_file.tokenize("Hello") == ["hello"]
    with pytest.raises(FileNotFoundError, match="empty.*vocab.txt"):
        BertTokenizer.from_pretrained(tmp_path / "empty")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="empty.*vocab.txt"):
        BertTokenizer.from_pretrained(tmp_path / "empty")


def test_missing_vocab_file_error(tmp_path):
    missing = tmp_path / "nope.txt"
    with pytest.raises(FileNotFoundError, match=r"nope\.txt.*one WordPiece token per line"):
        load_vocab(missing)
    with pytest.raises(FileNotFoundError, match=r"nope\.txt"):
        BertTokenizer(missing)


def test_vocab_without_unk_is_rejected(tmp_path):
    path = tmp_path / "v.txt"
    path.write_text("a\nb\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"v\.txt.*\[UNK\]"):
        build_fast_tokenizer(path)


def test_special_token_ids(vocab_file):
    assert special_token_ids(load_vocab(vocab_file)) == {"pad": 0, "unk": 1, "cls": 2, "sep": 3, "mask": 4}
    shuffled = {"[MASK]": 7, "[SEP]": 9, "[CLS]": 1, "[UNK]": 5, "[PAD]": 3}
    assert special_token_ids(shuffled) == {"pad": 3, "unk": 5, "cls": 1, "sep": 9, "mask": 7}
    with pytest.raises(ValueError, match=r"lacks special token\(s\) \[CLS\], \[MASK\]:"):
        special_token_ids({"[PAD]": 0, "[UNK]": 1, "[SEP]": 2})


def test_vocab_size_padded():
    assert [vocab_size_padded(n) for n in (1, 8, 9, 30522, 30528)] == [8, 8, 16, 30528, 30528]
    assert vocab_size_padded(30522, multiple=128) == 30592
    with pytest.raises(ValueError):
        vocab_size_padded(0)


def test_cli_prints_tokens_and_ids(vocab_file, capsys):
    assert main(["--vocab", str(vocab_file), "UNwant\u00e9d,running"]) == 0
    out = capsys.readouterr().out
    assert "un ##want ##ed , runn ##ing" in out and "9 6 7 12 10 11" in out
    assert main(["--vocab", str(vocab_file.parent / "missing.txt"), "x"]) == 2
    assert "missing.txt" in capsys.readouterr().err


def transformers_pure_python_tokenizer():
    """transformers' pure-Python BERT tokenizer (a requirement, so never skipped): BertTokenizer
    up to 4.x, BertTokenizerLegacy from 5.0 on, where BertTokenizer became the Rust one."""
    try:
        from transformers.models.bert.tokenization_bert_legacy import BertTokenizerLegacy
        return BertTokenizerLegacy
    except ImportError:
        from transformers import BertTokenizer
        return BertTokenizer


@pytest.mark.parametrize("lower", [True, False])
def test_matches_transformers_pure_python_tokenizer(vocab_file, lower):
    theirs = transformers_pure_python_tokenizer()(str(vocab_file), do_lower_case=lower)
    ours = BertTokenizer(vocab_file, do_lower_case=lower)
    # transformers NFC-normalises first, so decomposed accents are left out of this comparison
    texts = [t for t in TEXTS if unicodedata.normalize("NFC", t) == t]
    for text in texts:
        assert ours.tokenize(text) == theirs.tokenize(text), repr(text)
