"""tools/prepare_data.py's document stages (tools/prep/stages.py): near duplicates (on by default),
decontamination, language and quality filters, --keep_filtered; what each removed in stats.json,
the same shards with every stage off or removing nothing, and a resume after SIGKILL with all on."""
import collections
import json
import os
import pickle
import random
import re
import signal
import subprocess
import sys

import numpy as np
import psutil
import pytest

from testkit import corpora as files
from testkit.launcher import REPO
from tests.launch import tool_error_line, wait_for_line
from tests.test_prepare_corpora import kill_after_chunks
from tools import prepare_data
from tools.prep import neardup, ngrams, quality
from tools.prep.documents import CorpusReader
from tools.prep.journal import WORK_DIR, run_fingerprint
from tools.prep.layouts import ReadOptions, find_sources
from tools.prep.quality import QualityFilter, parse_thresholds
from tools.prep.reader import PROCESS_NAME, STAGE_PROCESS_NAME
from tools.prep.summary import Summary

GERMAN = ("Die Stadt liegt am Ufer des Flusses und wurde im Mittelalter gegründet. Im Jahr 1850 wurde die erste "
          "Brücke gebaut, die beide Teile der Stadt verbindet. Heute leben hier etwa zwanzigtausend Menschen, die "
          "meisten arbeiten in der Landwirtschaft oder in kleinen Betrieben. Die Kirche aus dem vierzehnten "
          "Jahrhundert ist das älteste Gebäude und wird noch immer für Gottesdienste genutzt.")


def english(count, seed):
    return list(files.synthetic_documents(count, seed=seed, paragraphs=(3, 4), sentences=(3, 5), words=(10, 16)))


def make_vocab(path, documents, extra=""):
    words = {w.strip(".?!,").lower() for _, doc in documents for p in doc for w in p.split()} | set(extra.split())
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + sorted(words | {chr(c) for c in range(33, 127)})
    path.write_text("\n".join(tokens) + "\n", encoding="utf-8")
    return path


def argv_of(path, vocab, out, *extra):
    return ["--input", str(path), "--output_dir", str(out), "--format", "bing", "--vocab_file", str(vocab),
            "--max_seq_length", "64", "--max_predictions_per_seq", "10", "--dupe_factor", "1", *map(str, extra)]


def run(path, vocab, out, *extra):
    assert prepare_data.main(argv_of(path, vocab, out, *extra)) == 0
    part = [int(extra[i + 1]) for i, a in enumerate(extra) if a == "--part"]
    return json.loads((out / (f"stats.part{part[0]:03d}.json" if part else "stats.json")).read_text())


def shard_bytes(out):
    return {os.path.relpath(os.path.join(root, n), out): open(os.path.join(root, n), "rb").read()
            for sub in ("train", "validation") for root, _, names in os.walk(out / sub) for n in names}


def removed(out, stage):
    return [json.loads(line) for line in open(out / "kept" / f"{stage}.jsonl", encoding="utf-8")]


def near_copy(doc, rng, changed=0.03):
    """The document with `changed` of its words replaced by another word."""
    title, paragraphs = doc
    out = []
    for p in paragraphs:
        words = p.split()
        for i in rng.sample(range(len(words)), max(1, int(changed * len(words)))):
            words[i] = rng.choice(files.WORDS)
        out.append(" ".join(words))
    return title + " (copy)", out


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """40 documents and 6 near duplicates of some of them: 3% of the words changed, a boilerplate
    paragraph added, the paragraphs reordered (two of each), each after its original."""
    root = tmp_path_factory.mktemp("planted")
    rng = random.Random(0)
    docs = english(40, seed=5)
    boiler = "Read more about the town and the river on the market page of the city school."
    copies = [near_copy(docs[3], rng), near_copy(docs[9], rng),
              (docs[12][0], docs[12][1] + [boiler]), (docs[15][0], [boiler] + docs[15][1]),
              (docs[20][0], docs[20][1][::-1]), (docs[27][0], docs[27][1][1:] + docs[27][1][:1])]
    corpus = docs + copies
    path = files.write_jsonl(str(root / "docs.jsonl"), corpus)
    return root, corpus, path, make_vocab(root / "vocab.txt", corpus, GERMAN.lower())


def test_planted_near_duplicates_are_found_and_written_for_a_look(planted, tmp_path):
    root, corpus, path, vocab = planted
    stats = run(path, vocab, tmp_path / "o", "--keep_filtered", tmp_path / "o" / "kept")
    near = stats["filters"]["near_dedup"]
    assert near["removed"] == {"near_duplicate": 6} and (near["bands"], near["rows"]) == (14, 8)
    assert stats["documents_kept"] == 40
    assert [r["document"] for r in removed(tmp_path / "o", "near_dedup")] == list(range(40, 46))
    assert any("filters: near_dedup 6" in line for line in _lines(stats))
    off = run(path, vocab, tmp_path / "off", "--no_near_dedup")
    assert "filters" not in off and off["documents_kept"] == 46


def test_the_signature_pass_and_the_summary_count_near_duplicates_alike(planted, tmp_path, caplog):
    """Issue 43: the pass said "near duplicates: 5 of 126 documents" where the summary said
    near_dedup 2 and 3 exact duplicates. The pass marks exact copies too (the exact-duplicate filter
    drops them first): its line says so, and its count is the summary's two added up."""
    import logging

    root, corpus, path, vocab = planted
    with_copy = files.write_jsonl(str(tmp_path / "docs.jsonl"), corpus + [corpus[5]])    # one exact copy
    caplog.set_level(logging.INFO, logger="tools.prep.neardup")
    stats = run(with_copy, vocab, tmp_path / "o")
    (line,) = [r.getMessage() for r in caplog.records if r.name == "tools.prep.neardup"]
    near, exact = stats["filters"]["near_dedup"]["removed"]["near_duplicate"], stats["duplicates"]
    assert (near, exact) == (6, 1)
    assert line.startswith(f"near-duplicate pass: {near + exact} of the input's {len(corpus) + 1} documents are "
                           f"like an earlier one, exact copies included"), line
    assert line.endswith("the summary counts those as exact duplicates, the others as near_dedup"), line
    summary = "\n".join(_lines(stats))
    assert f"{exact} exact duplicates" in summary and f"filters: near_dedup {near}" in summary


def _lines(stats):
    """The closing summary's lines for these stats."""
    return Summary(output_dir="o", fmt="bing", read={k: stats[k] for k in (
        "documents_read", "duplicates", "layouts", "filters")}).lines()


def test_near_duplicates_across_parts_are_those_of_one_run(planted, tmp_path):
    """Every part signs the whole input: a copy whose original went to another part is found."""
    root, corpus, path, vocab = planted
    whole = run(path, vocab, tmp_path / "one")["filters"]["near_dedup"]["removed"]["near_duplicate"]
    parts = [run(path, vocab, tmp_path / "parts", "--num_parts", 2, "--part", k, "--overwrite",
                 "--keep_filtered", tmp_path / "kept") for k in (0, 1)]
    assert sum(p["filters"]["near_dedup"]["removed"]["near_duplicate"] for p in parts) == whole == 6
    assert sum(p["documents_kept"] for p in parts) == 40
    written = [json.loads(line)["document"] for k in (0, 1)
               for line in open(tmp_path / "kept" / f"near_dedup.part{k:03d}.jsonl")]   # each part's own file
    assert sorted(written) == list(range(40, 46))


def test_workers_sign_the_same_near_duplicates_as_the_main_process(planted, tmp_path, monkeypatch):
    """--workers 2 signs batches in the pool (4 documents a batch, blocks of 10: batches in flight
    across blocks); the same documents go, the shards are the same bytes."""
    root, corpus, path, vocab = planted
    monkeypatch.setattr(neardup, "BLOCK", 10)
    monkeypatch.setattr(neardup, "BATCH", 4)
    run(path, vocab, tmp_path / "one", "--keep_filtered", tmp_path / "one" / "kept")
    run(path, vocab, tmp_path / "two", "--workers", 2, "--prefix", "one", "--keep_filtered", tmp_path / "two" / "kept")
    assert removed(tmp_path / "one", "near_dedup") == removed(tmp_path / "two", "near_dedup")
    assert len(removed(tmp_path / "two", "near_dedup")) == 6
    assert shard_bytes(tmp_path / "one") == shard_bytes(tmp_path / "two")


def test_the_signature_pass_resumes_from_its_blocks(planted, tmp_path, monkeypatch):
    root, corpus, path, vocab = planted
    monkeypatch.setattr(neardup, "BLOCK", 8)
    sources = find_sources([path])

    def documents():
        return CorpusReader(sources, ReadOptions())

    fresh = neardup.SignaturePass(str(tmp_path / "fresh"), seed=1).run(documents())
    monkeypatch.setattr(neardup, "BATCH", 3)     # blocks made of batches: the same band hashes
    calls = []

    def stop_after_two_blocks():
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt

    stopped = neardup.SignaturePass(str(tmp_path / "s"), seed=1)
    with pytest.raises(KeyboardInterrupt):
        stopped.run(documents(), stop_after_two_blocks)
    assert sorted(os.listdir(tmp_path / "s")) == ["signatures_0000000.npy", "signatures_0000001.npy"]
    signed, shingles = [], neardup.shingles
    monkeypatch.setattr(neardup, "shingles", lambda text, n: signed.append(1) or shingles(text, n))
    again = neardup.SignaturePass(str(tmp_path / "s"), seed=1).run(documents())
    assert len(signed) == len(corpus) - 16            # the two blocks written are not signed again
    assert again.tolist() == fresh.tolist() == list(range(40, 46))
    for name in os.listdir(tmp_path / "fresh"):
        assert np.array_equal(np.load(tmp_path / "fresh" / name), np.load(tmp_path / "s" / name)), name


def test_decontamination_drops_or_cuts_what_an_evaluation_set_holds(planted, tmp_path):
    root, corpus, path, vocab = planted
    sentence = corpus[7][1][1].split(". ")[0]                # of at least 10 words
    glue = tmp_path / "glue" / "probe_swap"
    glue.mkdir(parents=True)
    (glue / "dev.tsv").write_text(f"sentence\tlabel\n{sentence}\t1\n")
    (glue / "train.tsv").write_text(f"sentence\tlabel\n{corpus[8][1][0]}\t1\n")    # training data: not used
    pairs = tmp_path / "pairs.jsonl"
    long = " ".join(corpus[11][1][2].split()[3:20])                                  # 17 words inside a sentence
    pairs.write_text(json.dumps({"sentence_good": long.upper(), "sentence_bad": "Not in the corpus at all",
                                 "UID": "x", "pairID": "0"}) + "\n")
    out = tmp_path / "o"
    stats = run(path, vocab, out, "--decontaminate", tmp_path / "glue", pairs, "--keep_filtered", out / "kept",
                "--no_near_dedup")
    decontam = stats["filters"]["decontaminate"]
    assert decontam["removed"] == {"ngram_13": 2} and decontam["evaluation"]["files"] == 2
    assert [r["document"] for r in removed(out, "decontaminate")] == [7, 11]
    assert stats["documents_kept"] == len(corpus) - 2
    assert any("filters: decontaminate 2" in line for line in _lines(stats))
    # cut: the document stays, without the paragraph that held the sentence
    cut = run(path, vocab, tmp_path / "cut", "--decontaminate", pairs, "--decontaminate_action", "cut",
              "--keep_filtered", tmp_path / "cut" / "kept", "--no_near_dedup")
    assert cut["documents_kept"] == len(corpus)
    (record,) = removed(tmp_path / "cut", "decontaminate")
    assert record["cut"] and record["text"] == corpus[11][1][2]
    assert any("filters: decontaminate 1 cut" in line for line in _lines(cut))


def test_a_decontaminator_sent_to_a_process_of_other_string_hashes_finds_the_same(tmp_path):
    """Its n-gram hashes are Python's string hashes: a spawned stage worker (another PYTHONHASHSEED)
    must hash the evaluation texts again, not test against this process's hashes."""
    from tools.prep.decontam import Decontaminator

    sentence = "the quiet river runs past the old mill and under the stone bridge every spring"
    (tmp_path / "eval.txt").write_text(sentence + "\n", encoding="utf-8")
    (tmp_path / "stage.pkl").write_bytes(pickle.dumps(Decontaminator([str(tmp_path / "eval.txt")])))
    code = ("import pickle, sys\n"
            "stage = pickle.load(open(sys.argv[1], 'rb'))\n"
            "for text in sys.argv[2:]:\n"
            "    print('dropped' if stage('train', 0, text, text)[0] is None else 'kept')\n")
    texts = [f"A page. Then {sentence.upper()}, it said.", "A page about something else entirely, with other words."]
    for seed in ("1", "2"):
        done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "stage.pkl"), *texts], cwd=REPO, check=True,
                              capture_output=True, text=True, env={**os.environ, "PYTHONHASHSEED": seed})
        assert done.stdout.split() == ["dropped", "kept"], seed


def test_a_run_decontaminates_against_another_run_s_held_out_documents(planted, tmp_path):
    """The demo's way: the held-out documents of one run (its heldout.jsonl: every sentence of them)
    are the evaluation set of the next; the copy of held-out document 9 (3% of its words changed) is
    the only training document sharing 13 words in a row with one."""
    root, corpus, path, vocab = planted
    run(path, vocab, tmp_path / "first", "--validation_fraction", 0.1)
    heldout = tmp_path / "first" / "heldout.jsonl"
    assert [json.loads(line)["document"] for line in open(heldout)] == [9, 19, 29, 39]
    out = tmp_path / "o"
    stats = run(path, vocab, out, "--validation_fraction", 0.1, "--no_near_dedup", "--decontaminate", heldout,
                "--keep_filtered", out / "kept")
    assert [(r["document"], r["set"]) for r in removed(out, "decontaminate")] == [(41, "train")]
    assert stats["sets"]["validation"]["documents"] == 4      # the held-out documents themselves stay


def test_an_other_language_document_is_dropped(planted, tmp_path):
    root, corpus, _, vocab = planted
    docs = corpus[:10] + [("Stadt", [GERMAN])] + corpus[10:20]
    path = files.write_jsonl(str(tmp_path / "mixed.jsonl"), docs)
    stats = run(path, vocab, tmp_path / "o", "--languages", "en", "--keep_filtered", tmp_path / "o" / "kept")
    assert stats["filters"]["language"]["removed"] == {"language_de": 1}
    assert [r["document"] for r in removed(tmp_path / "o", "language")] == [10]
    assert run(path, vocab, tmp_path / "de", "--languages", "de")["documents_kept"] == 1


def one_error(argv, capsys):
    return tool_error_line(capsys, prepare_data.main, argv)


def test_a_run_whose_stages_leave_nothing_shows_what_they_removed(planted, tmp_path, capsys):
    """--keep_filtered's files were renamed into place only after the shards, so a run whose stages
    removed every document left them hidden (.language.jsonl.tmp) and the error did not say where."""
    _, _, path, vocab = planted
    kept = tmp_path / "kept"
    line = one_error(argv_of(path, vocab, tmp_path / "o", "--languages", "de", "--keep_filtered", kept), capsys)
    assert line.endswith(f"every document was left out (near_dedup 6, language 40); loosen those settings or add "
                         f"text; what the stages removed is in {kept}: near_dedup.jsonl, language.jsonl"), line
    assert sorted(os.listdir(kept)) == ["language.jsonl", "near_dedup.jsonl"]          # nothing hidden, no .tmp
    assert len(open(kept / "language.jsonl", encoding="utf-8").readlines()) == 40
    assert not (tmp_path / "o" / "train").exists()
    line = one_error(argv_of(path, vocab, tmp_path / "o", "--languages", "de"), capsys)    # no folder: the flag named
    assert line.endswith("loosen those settings or add text; --keep_filtered DIR writes what the stages removed, "
                         "for a look"), line


def test_a_stage_that_empties_the_validation_set_is_named(planted, tmp_path, capsys):
    """Every held-out document German and --languages en: the error said only "the validation set has
    no document with tokens ... raise --validation_fraction", not which filter removed them."""
    _, corpus, _, vocab = planted
    docs = corpus[:20]
    for held in (9, 19):          # the held-out documents of --validation_fraction 0.1
        docs[held] = ("Stadt", [GERMAN, f"Die Brücke Nummer {held} wurde im Jahr 18{held} gebaut."])
    path = files.write_jsonl(str(tmp_path / "mixed.jsonl"), docs)
    kept = tmp_path / "kept"
    argv = argv_of(path, vocab, tmp_path / "o", "--languages", "en", "--validation_fraction", "0.1", "--no_near_dedup")
    line = one_error(argv + ["--keep_filtered", str(kept)], capsys)
    assert line.endswith("every held-out document (the validation set) was left out (language 2); loosen those "
                         f"settings or raise --validation_fraction; what the stages removed is in {kept}: "
                         "language.jsonl"), line
    assert [(r["document"], r["set"], r["rule"]) for r in map(json.loads, open(kept / "language.jsonl"))] == \
        [(9, "validation", "language_de"), (19, "validation", "language_de")]
    stats = run(path, vocab, tmp_path / "ok", "--languages", "en", "de", "--no_near_dedup",
                "--validation_fraction", "0.2")       # what is counted for each set, in stats.json too
    assert stats["filters"]["language"]["by_set"] == {} and stats["sets"]["validation"]["documents"] == 4
    stats = run(path, vocab, tmp_path / "en", "--languages", "en", "--no_near_dedup", "--validation_fraction", "0.2")
    assert stats["filters"]["language"]["by_set"] == {"validation": {"language_de": 2}}


def test_quality_rules_count_what_each_removed(planted, tmp_path):
    root, corpus, _, vocab = planted
    good = corpus[:5]
    para = [" ".join(doc[1]) for doc in corpus[30:34]]      # (each its own: no near duplicates)
    bad = [("short", ["The town was built by the river in the first year."]),                    # min_words
           ("lines", ["The river and the town.\n" * 30 + para[0]]),                                # duplicate lines
           ("lorem", [para[1] + " Lorem ipsum dolor sit amet of the town and the river."]),      # C4's lorem ipsum
           ("bullets", ["\n".join("- the " + " ".join(para[2].split()[i:i + 6]) for i in range(0, 120, 6))]),
           ("symbols", [para[3] + " #tag" * 30])]
    path = files.write_jsonl(str(tmp_path / "q.jsonl"), good + bad)
    out = tmp_path / "o"
    stats = run(path, vocab, out, "--quality_filter", "--keep_filtered", out / "kept")
    assert stats["filters"]["quality"]["removed"] == {
        "min_words": 1, "max_duplicate_lines": 1, "c4_lorem_ipsum": 1, "max_bullet_lines": 1,
        "max_symbol_word_ratio": 1}
    assert [(r["document"], r["rule"]) for r in removed(out, "quality")] == [
        (5, "min_words"), (6, "max_duplicate_lines"), (7, "c4_lorem_ipsum"), (8, "max_bullet_lines"),
        (9, "max_symbol_word_ratio")]
    assert stats["documents_kept"] == 5
    relaxed = run(path, vocab, tmp_path / "r", "--quality_filter", "--quality_threshold", "min_words=5",
                  "c4_lorem_ipsum=0")
    assert relaxed["filters"]["quality"]["removed"] == {"max_duplicate_lines": 1, "max_bullet_lines": 1,
                                                        "max_symbol_word_ratio": 1}


def rules_as_written(t, text):
    """The quality rules (tools/prep/quality.py's docstring) word by word, in plain Python: n-grams as
    tuples of words, counted with a Counter (whose most_common takes the first of equal counts)."""
    tokens = text.split()
    content = [w for w in tokens if w.strip(quality.PUNCTUATION)]
    if len(content) < max(t["min_words"], 1):
        return "min_words"
    if len(content) > t["max_words"]:
        return "max_words"
    mean = sum(len(w) for w in content) / len(content)
    if mean < t["min_mean_word_length"]:
        return "min_mean_word_length"
    if mean > t["max_mean_word_length"]:
        return "max_mean_word_length"
    if max(text.count("#"), text.count("...") + text.count("…")) / len(tokens) > t["max_symbol_word_ratio"]:
        return "max_symbol_word_ratio"
    lines = [line for line in text.split("\n") if line.strip()]
    if sum(line.lstrip()[:1] in quality.BULLETS for line in lines) / len(lines) > t["max_bullet_lines"]:
        return "max_bullet_lines"
    if sum(line.rstrip().endswith(("...", "…")) for line in lines) / len(lines) > t["max_ellipsis_lines"]:
        return "max_ellipsis_lines"
    if sum(any(c.isalpha() for c in w) for w in tokens) / len(tokens) < t["min_alpha_words"]:
        return "min_alpha_words"
    if sum(w in ("the", "be", "to", "of", "and", "that", "have", "with") for w in text.lower().split()) \
            < t["min_stop_words"]:
        return "min_stop_words"
    size = max(len(text), 1)
    for kind, items in (("paragraph", [p for p in re.split(r"\n{2,}", text.strip()) if p.strip()]), ("line", lines)):
        repeated = [item for i, item in enumerate(items) if item in items[:i]]
        if len(repeated) / max(len(items), 1) > t[f"max_duplicate_{kind}s"]:
            return f"max_duplicate_{kind}s"
        if sum(map(len, repeated)) / size > t[f"max_duplicate_{kind}_chars"]:
            return f"max_duplicate_{kind}_chars"
    ws = [w.casefold() for w in re.findall(r"\w+", text)]
    for n in range(2, 11):
        grams = list(zip(*(ws[i:] for i in range(n))))
        if n <= 4:
            top, count = collections.Counter(grams).most_common(1)[0] if grams else ((), 0)
            chars = count * (sum(map(len, top)) + n - 1) if count > 1 else 0
            if chars / size > t[f"max_top_{n}gram"]:
                return f"max_top_{n}gram"
        else:
            seen, covered = set(), set()
            for i, gram in enumerate(grams):
                if gram in seen:
                    covered.update(range(i, i + n))
                seen.add(gram)
            if sum(len(ws[i]) for i in covered) / size > t[f"max_duplicate_{n}gram"]:
                return f"max_duplicate_{n}gram"
    if t["c4_lorem_ipsum"] and "lorem ipsum" in text.lower():
        return "c4_lorem_ipsum"
    if t["c4_curly_bracket"] and "{" in text:
        return "c4_curly_bracket"
    return None


TRICKY = ["İstanbul", "straße", "ﬁne", "Ωμέγα", "ᾳ", "a\u0345b", "東京", "naïve", "Ⅻ", "1990", "a_b", "x2", "--", "—",
          "...", "…", "•", "#", "##tag", "(see", "end.", "“quoted”", "«»", "·", "lorem ipsum", "{x}", "e\u0301"]
SPACES = [" ", " ", " ", "  ", "\t", "\xa0", "\u2028", "\x0b", "\u3000"]


def tricky_document(rng):
    """Lines of common and tricky words (case folds that change length, characters that are not
    letters, Unicode spaces), some lines and word runs repeated, some bulleted or trailing off."""
    lines = []
    for _ in range(rng.randint(1, 12)):
        if lines and rng.random() < 0.2:
            lines.append(rng.choice(lines))
            continue
        tokens = [rng.choice(TRICKY) if rng.random() < 0.2 else rng.choice(files.WORDS + ["the", "of", "and"])
                  for _ in range(rng.randint(0, 30))]
        if tokens and rng.random() < 0.3:
            start = rng.randrange(len(tokens))
            tokens += tokens[start:start + rng.randint(2, 12)] * rng.randint(1, 3)
        line = "".join(w + rng.choice(SPACES) for w in tokens).strip(" ")
        lines.append(rng.choice(["", "", "- ", "• ", "* "]) + line + rng.choice(["", "", "", "...", "…", "."]))
    return rng.choice(["\n", "\n", "\n\n", "\r\n"]).join(lines)


def test_the_quality_rules_decide_as_written_on_tricky_text():
    """quality.py computes the rules in fewer passes (numpy over hashes, the words of a folded text,
    only the tokens that are not all letters one by one); every decision is the plain one's."""
    rng = random.Random(0)
    texts = [tricky_document(rng) for _ in range(1500)]
    settings = [parse_thresholds(None),
                parse_thresholds(["min_words=5", "min_stop_words=0", "min_alpha_words=0.5", "max_mean_word_length=30"]),
                parse_thresholds(["min_words=1", "min_stop_words=0", "min_alpha_words=0", "max_symbol_word_ratio=5",
                                  "max_bullet_lines=1", "max_ellipsis_lines=1", "min_mean_word_length=0",
                                  "max_mean_word_length=99", "max_duplicate_lines=0.5", "max_duplicate_paragraphs=0.5"])]
    decided = collections.Counter()
    for t in settings:
        rules = QualityFilter(t)
        for text in texts:
            expected = rules_as_written(t, text)
            assert rules.failed_rule(text) == expected, (text, t)
            decided[expected] += 1
    assert len(decided) >= 20, decided       # most rules decide some text


def test_only_one_character_folds_into_a_word_character():
    """ngrams.words folds a whole text at once unless it holds a character that is no word
    character but folds to one (which would join or grow words): FOLDS_INTO_A_WORD lists them all."""
    word = re.compile(r"\w")
    found = "".join(c for c in map(chr, range(sys.maxunicode + 1))
                    if not word.match(c) and len(c.casefold()) == 1 and word.match(c.casefold()))
    assert found == ngrams.FOLDS_INTO_A_WORD
    for text in ("a\u0345b İx straße", "ﬁ\u0345 Σ"):
        assert ngrams.words(text) == [w.casefold() for w in re.findall(r"\w+", text)]


def test_gopher_repetition_rules_on_their_own():
    para = " ".join(w for _, doc in english(3, seed=2) for p in doc for w in p.split())
    rules = QualityFilter(parse_thresholds(None))
    assert rules.failed_rule(para) is None
    # its most frequent 3-gram holds 25% of the characters (Gopher's limit: 18%), its 2-gram 18% (20%)
    assert rules.failed_rule(para + (" the old castle" * int(0.025 * len(para)))) == "max_top_3gram"
    assert rules.failed_rule("\n\n".join([para[:400]] * 3 + [para])) == "max_duplicate_paragraphs"
    words = para.split()
    # a quarter of the words again, in one run: the words of 5-grams seen before hold ~17% of the
    # characters (a fifth of the text, less its spaces and punctuation; limit 15%)
    assert rules.failed_rule(" ".join(words + words[:len(words) // 4])) == "max_duplicate_5gram"
    # a 10-word run repeated through the text (each copy after other words): only the 10-gram rule,
    # with the 5- to 9-gram ones off, sees it, every rule below it having found nothing twice
    block, step = words[:10], len(words) // 12
    repeated = [w for i in range(12) for w in block + words[i * step:(i + 1) * step]]
    relaxed = QualityFilter(parse_thresholds([f"max_duplicate_{n}gram=1" for n in range(5, 10)] +
                                             [f"max_top_{n}gram=1" for n in (2, 3, 4)]))
    assert relaxed.failed_rule(" ".join(repeated)) == "max_duplicate_10gram"
    assert relaxed.failed_rule(" ".join(words)) is None


LONG_WORDS = ("extraordinarily", "magnificent", "archaeological", "establishment", "international",
              "correspondence", "representative", "neighbourhood")


def tied_document(i, short_first):
    """A page whose most frequent 2-grams are two, equally frequent: a short one holding ~8% of its
    characters, a long one ~30% (Gopher's limit: 20%), each after words seen once; the one it holds
    first decides max_top_2gram (as datatrove's Counter picks), the other never."""
    rng = random.Random(i)
    short, long = f"of {rng.choice(['it', 'us', 'me'])}", " ".join(rng.sample(LONG_WORDS, 2))
    pairs = [short, long] if short_first else [long, short]
    filler = iter(f"{w}{k}" for k, w in enumerate(rng.choices(files.WORDS, k=40)))
    body = " ".join(f"{pairs[k % 2]} {next(filler)} {next(filler)}" for k in range(16))
    return f"Tie {i} {short_first}", [body + " " + " ".join(filler) + " and the end."]


def test_of_equally_frequent_n_grams_the_first_in_the_text_decides():
    rules = QualityFilter(parse_thresholds(None))
    for i in range(8):
        assert rules.failed_rule(tied_document(i, short_first=True)[1][0]) is None
        assert rules.failed_rule(tied_document(i, short_first=False)[1][0]) == "max_top_2gram"


def test_the_same_command_in_another_process_writes_the_same_files(tmp_path):
    """Python draws its string hashes anew in every process (PYTHONHASHSEED): no decision may
    depend on them (a resumed run decides again what the killed one decided)."""
    docs = english(30, seed=21) + [tied_document(i, i % 3 != 0) for i in range(12)] + [("Stadt", [GERMAN])]
    random.Random(3).shuffle(docs)
    path = files.write_jsonl(str(tmp_path / "docs.jsonl"), docs)
    vocab = make_vocab(tmp_path / "vocab.txt", docs)
    outputs = []
    for seed in ("1", "2"):
        out = tmp_path / f"o{seed}"
        # (the tied pages have ~75 words: the later --quality_threshold is the one read)
        argv = argv_of(path, vocab, out, *every_text_stage(tmp_path, docs), "--quality_threshold", "min_words=50",
                       "--keep_filtered", out / "kept")
        subprocess.run([sys.executable, "-m", "tools.prepare_data", *map(str, argv)], cwd=REPO, check=True,
                       capture_output=True, env={**os.environ, "PYTHONHASHSEED": seed})
        stats = json.loads((out / "stats.json").read_text())
        outputs.append((shard_bytes(out), stats["filters"],
                        {p.name: p.read_bytes() for p in sorted((out / "kept").iterdir())}))
    assert outputs[0] == outputs[1]
    assert outputs[0][1]["quality"]["removed"]["max_top_2gram"] == 4
    assert all(outputs[0][1][stage]["removed"] for stage in ("decontaminate", "language")), outputs[0][1]


def test_a_wikipedia_page_is_judged_by_its_text_not_its_markup(planted, tmp_path):
    """The stages see a page as the shards will hold it: its templates ("{{...}}", which C4's rule
    against "{" would drop it for) and tables removed, as the workers remove them."""
    root, corpus, _, vocab = planted
    path = files.write_mediawiki(str(tmp_path / "testwiki-pages-articles.xml"), corpus[:12])
    assert open(path).read().count("{{") >= 12
    out = tmp_path / "o"
    stats = run(path, vocab, out, "--quality_filter", "--quality_threshold", "min_words=0", "min_stop_words=0",
                "--keep_filtered", out / "kept")
    assert stats["filters"]["quality"]["removed"] == {} and stats["documents_kept"] == 12, stats["filters"]


def test_every_stage_on_removing_nothing_gives_the_same_shards(planted, tmp_path):
    root, corpus, _, vocab = planted
    path = files.write_jsonl(str(tmp_path / "clean.jsonl"), corpus[:40])
    unrelated = tmp_path / "eval.txt"
    unrelated.write_text("a sentence that occurs nowhere in the corpus, not even in part of it at all\n")
    off = tmp_path / "off"
    run(path, vocab, off, "--no_near_dedup", "--validation_fraction", 0.1)
    on = tmp_path / "on"
    stats = run(path, vocab, on, "--validation_fraction", 0.1, "--decontaminate", unrelated, "--languages", "en",
                "--quality_filter", "--quality_threshold", "min_words=0", "min_stop_words=0", "--prefix", "off")
    assert all(sum(f["removed"].values()) == 0 for f in stats["filters"].values()), stats["filters"]
    assert shard_bytes(on) == shard_bytes(off) and shard_bytes(off)


@pytest.mark.parametrize("flags, expected", [
    (["--quality_threshold", "min_words=5"], "--quality_threshold without --quality_filter"),
    (["--quality_filter", "--quality_threshold", "min_word=5"], "--quality_threshold min_word=5: expected NAME=VALUE"),
    (["--quality_filter", "--quality_threshold", "max_bullet_lines=1.5"], "max_bullet_lines must be a share in [0, 1]"),
    (["--quality_filter", "--quality_threshold", "min_words=-1"], "min_words must be a whole number >= 0"),
    (["--languages", "en", "xx"], "--languages xx: not a language the model knows"),
    (["--decontaminate", "MISSING"], "missing.tsv: no such file or folder"),
    (["--decontaminate", "LATIN1"], "latin1.txt: not UTF-8 text (byte 3"),
    (["--decontaminate", "BADJSON"], "bad.jsonl: line 2 is not JSON"),
    (["--decontaminate", "EMPTYDIR"], "a folder without evaluation files"),
    (["--decontaminate", "BADJSON", "--decontaminate_min_words", "20"], "--decontaminate_min_words 20: must be"),
    (["--near_dedup_rows", "0"], "--near_dedup_rows 0: must be at least 1"),
    (["--keep_filtered", "IN_TRAIN"], "inside --output_dir's train/ or validation/"),
    (["--quality_filter", "--quality_threshold", "max_bullet_lines=inf"], "max_bullet_lines must be a share in [0, 1]"),
    (["--quality_filter", "--quality_threshold", "max_mean_word_length=inf"], "must be a finite number >= 0"),
    (["--quality_filter", "--quality_threshold", "min_words=1e400"], "min_words must be a whole number >= 0"),
    (["--quality_filter", "--quality_threshold", "min_words=20", "min_words=30"], "min_words is given twice"),
    (["--quality_filter", "--quality_threshold", "min_words=200", "max_words=100"],
     "min_words 200 is above max_words 100: every document would be dropped"),
    (["--no_near_dedup", "--near_dedup_bands", "20"], "--near_dedup_bands 20 with --no_near_dedup: near duplicates"),
    (["--near_dedup_bands", "1000", "--near_dedup_rows", "100"], "at most 4096 MinHash values a document"),
    (["--keep_filtered", "A_FILE"], "a file; expected a folder (made if missing)"),
    (["--no_near_dedup", "--keep_filtered", "KEPT"], "with every document stage off"),
    (["--languages", "de"], "every document was left out (near_dedup 6, language 40); loosen those settings"),
    (["--chunk_size_mb", "nan"], "--chunk_size_mb nan: must be a positive finite number"),
    (["--chunk_size_mb", "inf"], "--chunk_size_mb inf: must be a positive finite number"),
    (["--vocab_sample_mb", "nan"], "--vocab_sample_mb nan: must be a positive finite number"),
])
def test_bad_settings_and_evaluation_sets_are_one_error_line(planted, tmp_path, capsys, flags, expected):
    root, _, path, vocab = planted
    (tmp_path / "latin1.txt").write_bytes("caf\xe9 au lait\n".encode("latin-1"))
    (tmp_path / "bad.jsonl").write_text('{"sentence_good": "a b"}\nnot json\n')
    (tmp_path / "empty").mkdir()
    (tmp_path / "a_file").write_text("")
    names = {"MISSING": tmp_path / "missing.tsv", "LATIN1": tmp_path / "latin1.txt", "BADJSON": tmp_path / "bad.jsonl",
             "EMPTYDIR": tmp_path / "empty", "IN_TRAIN": tmp_path / "o" / "train" / "removed",
             "A_FILE": tmp_path / "a_file", "KEPT": tmp_path / "kept"}
    flags = [str(names.get(f, f)) for f in flags]
    line = one_error(argv_of(path, vocab, tmp_path / "o", *flags), capsys)
    assert expected in line, line
    assert not (tmp_path / "o" / "train").exists()


def test_a_resume_with_other_filter_settings_is_refused(planted, tmp_path, capsys):
    root, _, path, vocab = planted
    killed = tmp_path / "k"
    (killed / WORK_DIR / "chunks").mkdir(parents=True)
    argv = argv_of(path, vocab, killed)
    fingerprint = run_fingerprint(prepare_data.resolved_tokenizer(prepare_data.build_parser().parse_args(argv)),
                                  find_sources([path]))
    (killed / WORK_DIR / "run.json").write_text(json.dumps(fingerprint))
    np.savez(killed / WORK_DIR / "chunks" / "train_0000000.npz", x=np.zeros(1))
    for extra, said in ((["--quality_filter"], "--quality_filter False then, True now"),
                        (["--no_near_dedup"], "--near_dedup True then, False now")):
        assert prepare_data.main(argv + extra) == 2
        assert said in capsys.readouterr().err


def test_resume_after_sigkill_with_every_stage_on_is_the_same(tmp_path):
    docs = english(160, seed=11)
    rng = random.Random(1)
    docs += [near_copy(docs[i], rng) for i in range(0, 160, 10)] + [("Stadt", [GERMAN])] * 1
    rng.shuffle(docs)
    path = files.write_jsonl(str(tmp_path / "big.jsonl"), docs)
    vocab = make_vocab(tmp_path / "vocab.txt", docs, GERMAN.lower())
    evaluation = tmp_path / "eval.txt"
    evaluation.write_text("\n".join(" ".join(doc[1][0].split()[:14]) for doc in docs[5:60:11]) + "\n")
    flags = ["--format", "nvidia", "--chunk_size_mb", "0.004", "--num_shards", 2, "--decontaminate", evaluation,
             "--languages", "en", "--quality_filter", "--quality_threshold", "min_words=100"]
    out = tmp_path / "o"
    argv = argv_of(path, vocab, out, *flags, "--keep_filtered", out / "kept")
    kill_after_chunks(argv, out, 4)
    assert (out / WORK_DIR / "near_dedup" / "removed.npy").exists()
    assert prepare_data.main(argv) == 0
    fresh = tmp_path / "fresh"
    stats = run(path, vocab, fresh, *flags, "--prefix", "o", "--keep_filtered", fresh / "kept")
    assert shard_bytes(out) == shard_bytes(fresh)
    for stage in ("near_dedup", "decontaminate", "language", "quality"):
        assert removed(out, stage) == removed(fresh, stage)
        assert sum(stats["filters"][stage]["removed"].values()) > 0, stage
    assert json.loads((out / "stats.json").read_text())["filters"] == stats["filters"]
    assert not (out / WORK_DIR).exists()


# --- stage workers: the decisions of the stages that read the text, beside the reader

READER_NAME, STAGE_NAME = PROCESS_NAME.decode(), STAGE_PROCESS_NAME.decode()


def every_text_stage(tmp_path, docs):
    evaluation = tmp_path / "eval.txt"
    evaluation.write_text("\n".join(" ".join(doc[1][0].split()[:14]) for doc in docs[5:60:11]) + "\n")
    return ["--chunk_size_mb", "0.004", "--validation_fraction", 0.1, "--decontaminate", evaluation,
            "--decontaminate_action", "cut", "--languages", "en", "--quality_filter", "--quality_threshold",
            "min_words=100"]


@pytest.fixture(scope="module")
def staged_corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("staged")
    docs = english(120, seed=13)
    rng = random.Random(2)
    docs += [near_copy(docs[i], rng) for i in range(0, 120, 15)] + [("Stadt", [GERMAN])] * 2
    rng.shuffle(docs)
    return root, files.write_jsonl(str(root / "docs.jsonl"), docs), make_vocab(root / "vocab.txt", docs, GERMAN.lower()), \
        every_text_stage(root, docs)


def test_stage_workers_decide_what_the_reader_decides(staged_corpus, tmp_path):
    """Every output file the same, byte for byte, whoever made the decisions: the shards, the record
    of the split, stats.json's counts and --keep_filtered's files (every rule of every stage removed
    or cut something here)."""
    _, path, vocab, flags = staged_corpus
    outs = {}
    for processes in (0, 1, 3):
        out = outs[processes] = tmp_path / f"w{processes}"
        stats = run(path, vocab, out, *flags, "--stage_workers", processes, "--workers", 2, "--prefix", "o",
                    "--keep_filtered", out / "kept")
        assert all(sum(stats["filters"][s]["removed"].values()) > 0 for s in ("decontaminate", "language", "quality"))
    for processes in (1, 3):
        assert shard_bytes(outs[processes]) == shard_bytes(outs[0]) and shard_bytes(outs[0])
        for name in ("documents.json", "heldout.jsonl", "train_document_keys.npy"):
            assert (outs[processes] / name).read_bytes() == (outs[0] / name).read_bytes(), name
        for stage in ("near_dedup", "decontaminate", "language", "quality"):
            assert (outs[processes] / "kept" / f"{stage}.jsonl").read_bytes() == \
                (outs[0] / "kept" / f"{stage}.jsonl").read_bytes(), stage
        counts = [json.loads((outs[p] / "stats.json").read_text())["filters"] for p in (processes, 0)]
        assert counts[0] == counts[1]


def test_a_stage_worker_that_dies_is_one_error_line_and_the_run_continues_after(staged_corpus, tmp_path, capsys,
                                                                                  monkeypatch):
    """A stage worker killed (the out-of-memory killer) while it decides: one error line, no wait for
    ever (a process pool would wait on the lost task); the same command then finishes the run."""
    from tools.prep.stages import DocumentStages

    _, path, vocab, flags = staged_corpus
    out = tmp_path / "o"
    argv = argv_of(path, vocab, out, *flags, "--stage_workers", 2)
    real = DocumentStages.decide
    monkeypatch.setattr(DocumentStages, "decide", lambda self, name, number, document:
                        os.kill(os.getpid(), signal.SIGKILL) if number >= 60
                        else real(self, name, number, document))      # the forked stage workers inherit it
    assert prepare_data.main(argv) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error")]
    assert len(lines) == 1 and re.search(r"the stage worker process \d+ ended \(killed by SIGKILL\) while deciding",
                                         lines[0]), lines
    monkeypatch.setattr(DocumentStages, "decide", real)
    assert prepare_data.main(argv) == 0
    fresh = tmp_path / "fresh"
    run(path, vocab, fresh, *flags, "--stage_workers", 0, "--prefix", "o")
    assert shard_bytes(out) == shard_bytes(fresh)


def test_a_sigkilled_run_takes_its_stage_workers_along(staged_corpus, tmp_path):
    """SIGKILL of the main process while a stage worker decides (held there: tests/held_prepare_data.py):
    the reader ends with it and the stage workers with the reader; none is left."""
    _, path, vocab, flags = staged_corpus
    log = tmp_path / "log"
    argv = argv_of(path, vocab, tmp_path / "o", *flags, "--stage_workers", 2)
    proc = subprocess.Popen([sys.executable, os.path.join(REPO, "tests", "held_prepare_data.py"), *argv], cwd=REPO,
                            env={**os.environ, "HELD_DOCUMENT": "10"}, stdout=open(log, "w"),
                            stderr=subprocess.STDOUT)
    wait_for_line(proc, log, "PAUSED")
    tree = psutil.Process(proc.pid).children(recursive=True)
    (reader,) = [p for p in tree if p.name() == READER_NAME]
    assert [p.name() for p in reader.children()] == [STAGE_NAME] * 2
    proc.kill()
    proc.wait()
    gone, alive = psutil.wait_procs(tree, timeout=60)
    for process in alive:
        process.kill()
    assert alive == [], "processes outlived the SIGKILLed main process"
