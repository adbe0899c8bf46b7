"""tools/eval_mlm.py: pseudo-log-likelihoods, minimal-pair accuracy, MLM scores beside the unigram
baseline, and its input errors.

The model is made here, not trained: configs/tiny's sizes (2 layers, 64 wide, 128 positions) with
weights drawn at a larger scale than training's init, so the MLM's predictions are far from
uniform. It is saved as a checkpoint folder of ours (job folder, `latest`, a tag with the
completion marker, job_config.json and args.json beside the weights), which is what
--model reads; the vocab is testkit's plus three entries, so the model has padding rows.
"""
import json
import math
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from tests.launch import TINY_CFG, one_error_line, tool_error_line  # noqa: E402
from testkit.synthetic import make_data_root  # noqa: E402
from tools import eval_mlm  # noqa: E402
from turing.checkpoint_files import COMPLETE_MARKER, MODEL_STATES_FILE  # noqa: E402
from turing.modeling import BertConfig, BertForPreTrainingPreLN  # noqa: E402
from turing.tb_events import read_run  # noqa: E402
from turing.tokenization import vocab_size_padded  # noqa: E402

EXTRA_WORDS = ["hello", "world", "##s"]   # 96 + 3 = 99 entries: 104 rows, 5 of them padding
VOCAB_REAL = 99


def _sentence(rng, n):
    return " ".join(f"w{w}" for w in rng.integers(0, 91, size=n))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """{root, job, tag, vocab}: testkit's data (its validation shards are scored below) and a
    checkpoint folder of a tiny model with its vocab."""
    root = tmp_path_factory.mktemp("eval_mlm")
    make_data_root(str(root), seq_lengths=(128,), n_train=16, shards=1, n_valid=16)
    vocab = os.path.join(root, "vocab.txt")
    with open(vocab, "a") as f:
        f.write("\n".join(EXTRA_WORDS) + "\n")
    job = json.load(open(TINY_CFG))
    job["bert_model_config"]["max_position_embeddings"] = 128
    job["bert_token_file"] = vocab
    config = BertConfig.from_dict({**job["bert_model_config"], "initializer_range": 0.3})
    config.vocab_size = vocab_size_padded(VOCAB_REAL)
    torch.manual_seed(0)
    model = BertForPreTrainingPreLN(config)
    tag = root / "out" / "tiny_bert" / "epoch1_step10"
    os.makedirs(tag)
    torch.save({"module": model.state_dict()}, tag / MODEL_STATES_FILE)
    (tag / "job_config.json").write_text(json.dumps(job))
    (tag / "args.json").write_text(json.dumps({"vocab_file": vocab, "do_lower_case": True}))
    (tag / COMPLETE_MARKER).write_text("{}")
    (tag.parent / "latest").write_text(tag.name)
    return {"root": root, "job": str(tag.parent), "tag": str(tag), "vocab": vocab}


@pytest.fixture(scope="module")
def scorer(tiny):
    return eval_mlm.load_scorer(tiny["job"])


def write_pairs(path, pairs):
    with open(path, "w") as f:
        f.writelines(json.dumps(p) + "\n" for p in pairs)
    return str(path)


def some_pairs(n=12, seed=0):
    """Pairs of two UIDs: a sentence and its reverse, a sentence and a longer one."""
    rng = np.random.default_rng(seed)
    pairs = []
    for i in range(n):
        s = _sentence(rng, int(rng.integers(3, 9)))
        bad = " ".join(reversed(s.split())) if i % 2 else s + " hello worlds"
        pairs.append({"sentence_good": s, "sentence_bad": bad, "UID": "reverse" if i % 2 else "longer",
                      "pairID": str(i // 2), "field": "ignored"})
    return pairs


def direct_token_scores(model, ids, special, vocab_real):
    """[(log P(token | the rest), whether it is the argmax)] of one sentence, unbatched: each token
    masked in turn, one forward each, through the model's predict (all positions scored)."""
    out = []
    for t in range(len(ids)):
        seq = [special["cls"]] + list(ids) + [special["sep"]]
        seq[t + 1] = special["mask"]
        x = torch.tensor([seq])
        with torch.no_grad():
            scores, _ = model.predict(x, torch.zeros_like(x), torch.ones_like(x))
        row = scores[0, t + 1, :vocab_real]
        out.append((torch.log_softmax(row.double(), -1)[ids[t]].item(), int(row.argmax()) == ids[t]))
    return out


def direct_pll(model, ids, special, vocab_real):
    """PLL of one sentence, unbatched: each token masked in turn, one forward each."""
    return sum(lp for lp, _ in direct_token_scores(model, ids, special, vocab_real))


def test_pll_equals_the_direct_computation(scorer):
    rng = np.random.default_rng(1)
    sentences = [_sentence(rng, n) for n in (1, 5, 3, 12, 7)] + ["hello worlds w3"]
    ids = scorer.tokenizer.encode_batch(sentences)
    assert [len(i) for i in ids][-1] == 4  # "worlds" is two pieces
    # a small token budget: batches of a few rows that split sentences and mix lengths
    batched = eval_mlm.pseudo_log_likelihoods(scorer, ids, batch_tokens=40)
    one_batch = eval_mlm.pseudo_log_likelihoods(scorer, ids)
    direct = [direct_pll(scorer.model, s, scorer.special, VOCAB_REAL) for s in ids]
    assert len(batched) == len(direct) == len(sentences)
    np.testing.assert_allclose(batched, direct, rtol=0, atol=1e-4)
    np.testing.assert_allclose(one_batch, direct, rtol=0, atol=1e-4)
    assert min(direct) < -1.0  # real numbers, not zeros


def test_pair_accuracy_by_uid_sums_up_and_per_pair_rows(tiny, scorer, tmp_path, capsys):
    pairs = some_pairs()
    path = write_pairs(tmp_path / "pairs.jsonl", pairs)
    out, runs = tmp_path / "out", tmp_path / "runs"
    assert eval_mlm.main(["--model", tiny["job"], "--pairs", path, "--output_dir", str(out),
                          "--tensorboard_dir", str(runs)]) == 0
    printed = capsys.readouterr().out
    assert "minimal pairs" in printed and "reverse" in printed
    results = json.load(open(out / "results.json"))
    mp = results["minimal_pairs"]
    assert results["step"] == 10 and results["vocab_size"] == VOCAB_REAL
    assert set(mp["by_uid"]) == {"reverse", "longer"}
    assert sum(e["pairs"] for e in mp["by_uid"].values()) == mp["pairs"] == len(pairs)
    assert sum(e["correct"] for e in mp["by_uid"].values()) == mp["correct"]
    rows = [json.loads(line) for line in open(out / "pair_scores.jsonl")]
    assert len(rows) == len(pairs)
    assert [(r["UID"], r["pairID"]) for r in rows] == [(p["UID"], p["pairID"]) for p in pairs]
    # each row holds its own pair's two PLLs, good as good and bad as bad, as computed one by one
    direct = [[direct_pll(scorer.model, ids, scorer.special, VOCAB_REAL)
               for ids in scorer.tokenizer.encode_batch([p["sentence_good"], p["sentence_bad"]])] for p in pairs]
    np.testing.assert_allclose([[r["pll_good"], r["pll_bad"]] for r in rows], direct, rtol=0, atol=1e-4)
    assert all(r["correct"] == (r["pll_good"] > r["pll_bad"]) for r in rows)
    assert sum(r["correct"] for r in rows) == mp["correct"]
    for uid, entry in mp["by_uid"].items():
        assert entry["correct"] == sum(r["correct"] for r in rows if r["UID"] == uid), uid
    for entry in [mp, *mp["by_uid"].values()]:
        lo, hi = entry["ci95"]
        assert entry["accuracy"] == entry["correct"] / entry["pairs"]
        assert lo <= entry["accuracy"] <= hi
    scalars, _ = read_run(str(runs))
    assert scalars["Quality/minimal_pairs/accuracy"] == [(10, pytest.approx(mp["accuracy"]))]
    assert "Quality/minimal_pairs/reverse" in scalars


def test_appended_words_lower_the_pll_where_predictions_ignore_the_context(tiny, scorer):
    """PLL(s + extra) = sum over s's tokens of log P(w_t | the rest, extra included) + the extra
    tokens' terms. The extra terms are each < 0, but the context they add can raise the other
    terms by more: "a longer bad sentence scores lower" is no theorem for a model that reads its
    context. It is one for a model whose prediction at a position ignores the other tokens (here the
    fixture's model with every attention output projection zeroed): s's terms stay as they were, so
    PLL(s + extra) = PLL(s) + the extra terms < PLL(s), and every "longer" pair is correct."""
    blind = eval_mlm.load_scorer(tiny["job"])
    with torch.no_grad():
        for layer in blind.model.bert.encoder.layer:
            layer.attention.output.dense.weight.zero_()
            layer.attention.output.dense.bias.zero_()
    pairs = [eval_mlm.Pair("f", i, p["UID"], p["pairID"], p["sentence_good"], p["sentence_bad"])
             for i, p in enumerate(some_pairs()) if p["UID"] == "longer"]
    assert len(pairs) == 6

    def terms(model):
        """Per pair: log P of each good token, of the same tokens in the bad sentence, of its 3 extra
        tokens."""
        encoded = eval_mlm.encode_pairs(model, pairs)
        log_probs, _ = eval_mlm.token_scores(model, [s for pair in encoded for s in pair])
        for good, bad in encoded:
            assert bad[:len(good)] == good and len(bad) == len(good) + 3   # + hello, world, ##s
        return [(log_probs[2 * k], log_probs[2 * k + 1][:len(good)], log_probs[2 * k + 1][len(good):])
                for k, (good, _) in enumerate(encoded)]

    summary, rows = eval_mlm.score_pairs(blind, pairs)
    for row, (good_terms, shared_terms, extra) in zip(rows, terms(blind), strict=True):
        np.testing.assert_allclose(shared_terms, good_terms, rtol=0, atol=1e-5)
        assert (extra < 0).all() and row["pll_bad"] == pytest.approx(row["pll_good"] + extra.sum(), abs=1e-4)
    assert summary["accuracy"] == 1.0
    # the model that reads its context: the same tokens score otherwise once the words are appended
    assert not any(np.allclose(shared, good, rtol=0, atol=1e-5) for good, shared, _ in terms(scorer))


def test_wilson_interval():
    lo, hi = eval_mlm.wilson_interval(81, 100)
    assert (round(lo, 4), round(hi, 4)) == (0.7222, 0.8749)  # the textbook example's values
    assert eval_mlm.wilson_interval(0, 10)[0] == pytest.approx(0.0)
    assert eval_mlm.wilson_interval(10, 10)[1] == pytest.approx(1.0)


def _error_line(capsys, argv):
    return tool_error_line(capsys, eval_mlm.main, argv)


def test_bad_pair_files_are_one_error_line(tiny, tmp_path, capsys):
    good = some_pairs(2)
    base = ["--model", tiny["job"], "--output_dir", str(tmp_path / "out"), "--pairs"]
    missing = write_pairs(tmp_path / "missing.jsonl", [good[0], {k: v for k, v in good[1].items() if k != "UID"}])
    assert _error_line(capsys, base + [missing]) == (f"error: {missing}:2: no UID field (BLiMP layout: "
                                                     "sentence_good, sentence_bad, UID, pairID)")
    bad_json = tmp_path / "bad.jsonl"
    bad_json.write_text(json.dumps(good[0]) + "\n\n{not json\n")
    assert _error_line(capsys, base + [str(bad_json)]).startswith(f"error: {bad_json}:3: not valid JSON")
    not_object = tmp_path / "list.jsonl"
    not_object.write_text("[1, 2]\n")
    assert f"{not_object}:1: expected a JSON object" in _error_line(capsys, base + [str(not_object)])
    latin1 = tmp_path / "latin1.jsonl"
    latin1.write_bytes(json.dumps(good[0]).encode() + b"\n" + b'{"sentence_good": "caf\xe9"}\n')
    assert f"{latin1}:2: not UTF-8" in _error_line(capsys, base + [str(latin1)])
    nowhere = str(tmp_path / "nowhere.jsonl")
    assert _error_line(capsys, base + [nowhere]) == f"error: {nowhere}: file not found"
    # a sentence longer than the 128 positions is refused by name, not cut
    long = write_pairs(tmp_path / "long.jsonl", [good[0], {**good[1], "sentence_bad": " ".join(["w1"] * 127)}])
    line = _error_line(capsys, base + [long])
    assert f"{long}:2: pairID 0: sentence_bad has 127 WordPiece tokens; the model takes at most 126" in line
    assert not os.path.exists(tmp_path / "out" / "results.json")


@pytest.mark.parametrize("bad,expected", [
    ('{"sentence_good": "The river \\ud800 town", "sentence_bad": "x y", "UID": "u", "pairID": "1"}',
     "2: sentence_good holds a lone surrogate \\ud800 at character 11"),
    ("[" * 100_000, "2: not JSON this reader takes (arrays or objects nested too deeply)")],
    ids=["surrogate", "nesting"])
def test_a_pair_line_that_holds_no_text_is_one_error_line(tiny, tmp_path, capsys, bad, expected):
    """What json.loads reads into no text: a lone surrogate half (a TypeError traceback in the tokenizer)
    and 100,000 nested [ (a RecursionError)."""
    path = tmp_path / "pairs.jsonl"
    path.write_text(json.dumps(some_pairs(1)[0]) + "\n" + bad + "\n")
    line = _error_line(capsys, ["--model", tiny["job"], "--output_dir", str(tmp_path / "out"), "--pairs", str(path)])
    assert line.startswith(f"error: {path}:{expected}"), line
    assert not os.path.exists(tmp_path / "out" / "results.json")


def test_a_byte_order_mark_before_the_pairs_is_read(tmp_path):
    path = tmp_path / "pairs.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + "".join(json.dumps(p) + "\n" for p in some_pairs(2)).encode())
    assert [p.good for p in eval_mlm.read_pairs(str(path))] == [p["sentence_good"] for p in some_pairs(2)]


def direct_validation_scores(model, path, vocab_real):
    """(masked tokens, MLM accuracy, mean cross-entropy, unigram accuracy) at the masked positions
    an NVIDIA hdf5 file holds, read with h5py and scored through the model's predict."""
    import h5py

    with h5py.File(path) as f:
        ids, mask, segments, positions, labels = (torch.from_numpy(f[key][:].astype(np.int64)) for key in
                                                  ("input_ids", "input_mask", "segment_ids", "masked_lm_positions",
                                                   "masked_lm_ids"))
    with torch.no_grad():
        scores, _ = model.predict(ids, segments, mask)                      # (N, L, V)
    rows, slots = (positions > 0).nonzero(as_tuple=True)                    # position 0 ([CLS]) pads the list
    picked, target = scores[rows, positions[rows, slots], :vocab_real], labels[rows, slots]
    loss = torch.nn.functional.cross_entropy(picked.double(), target).item()
    return len(target), (picked.argmax(-1) == target).double().mean().item(), loss, \
        np.bincount(target.numpy()).max() / len(target)


def test_text_and_validation_set_beside_the_unigram_baseline(tiny, scorer, tmp_path):
    rng = np.random.default_rng(2)
    special = scorer.special
    x = torch.tensor([[special["cls"], special["mask"], special["sep"]]])
    with torch.no_grad():
        guess = int(scorer.model.predict(x, torch.zeros_like(x), torch.ones_like(x))[0][0, 1, :VOCAB_REAL].argmax())
    word = scorer.tokenizer.ids_to_tokens[guess]   # the model's guess for a lone [MASK]: a line it gets right
    assert scorer.tokenizer.encode_batch([word]) == [[guess]], word
    lines = [_sentence(rng, n) for n in (6, 9, 4)] + ["", " ".join(["w7"] * 130), word]  # "w7 ..." is chunked
    text = tmp_path / "heldout.txt"
    text.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"
    validation = os.path.join(tiny["root"], "nvidia", "128", "validation")
    assert eval_mlm.main(["--model", tiny["tag"], "--text", str(text), "--output_dir", str(out),
                          "--validation_set", validation]) == 0
    results = json.load(open(out / "results.json"))
    t = results["text"]
    assert (t["lines"], t["chunked_lines"], t["tokens"]) == (5, 1, 6 + 9 + 4 + 130 + 1)
    ids = [i for line in lines if line for i in scorer.tokenizer.encode_batch([line])[0]]
    top = max(set(ids), key=ids.count)
    assert t["unigram"]["accuracy"] == ids.count(top) / len(ids) and t["unigram"]["most_frequent_token"] == "w7"
    p = np.bincount(ids) / len(ids)
    p = p[p > 0]
    assert t["unigram"]["perplexity"] == pytest.approx(math.exp(-(p * np.log(p)).sum()))
    # every token masked in turn, one forward each: the long line in windows of 126 (128 positions)
    windows = [w for line in lines if line for encoded in scorer.tokenizer.encode_batch([line])
               for w in (encoded[:126], encoded[126:]) if w]
    direct = [s for w in windows for s in direct_token_scores(scorer.model, w, special, VOCAB_REAL)]
    assert len(direct) == t["tokens"] and sum(hit for _, hit in direct) >= 1    # the guessed line at least
    assert t["accuracy"] == sum(hit for _, hit in direct) / len(direct)
    assert t["pseudo_log_likelihood"] == pytest.approx(sum(lp for lp, _ in direct), abs=1e-3)
    assert t["pseudo_perplexity"] == pytest.approx(math.exp(-t["pseudo_log_likelihood"] / t["tokens"]))
    v = results["validation_set"]
    (hdf5,) = [os.path.join(validation, f) for f in os.listdir(validation)]
    masked, accuracy, loss, unigram = direct_validation_scores(scorer.model, hdf5, VOCAB_REAL)
    assert v["sequences"] == 16 and v["masked_tokens"] == masked > 16
    assert accuracy > 0 and v["accuracy"] == pytest.approx(accuracy, abs=1e-12)
    assert v["loss"] == pytest.approx(loss, abs=1e-4) and v["perplexity"] == pytest.approx(math.exp(v["loss"]))
    assert v["unigram"]["accuracy"] == pytest.approx(unigram, abs=1e-12)


def test_hf_export_scores_as_the_checkpoint_and_as_stock_transformers(tiny, tmp_path):
    transformers = pytest.importorskip("transformers")
    from tools import export_hf

    export = str(tmp_path / "hf")
    assert export_hf.main(["--checkpoint_dir", tiny["job"], "--output_dir", export]) == 0
    pairs = write_pairs(tmp_path / "pairs.jsonl", some_pairs(6, seed=3))
    results = {}
    for name, model in (("ours", tiny["job"]), ("hf", export)):
        assert eval_mlm.main(["--model", model, "--pairs", pairs, "--output_dir", str(tmp_path / name)]) == 0
        results[name] = [json.loads(line) for line in open(tmp_path / name / "pair_scores.jsonl")]
    ours = [s for r in results["ours"] for s in (r["pll_good"], r["pll_bad"])]
    np.testing.assert_allclose([s for r in results["hf"] for s in (r["pll_good"], r["pll_bad"])], ours,
                               rtol=0, atol=1e-4)
    # the same PLL through transformers' own classes, one masked copy per token
    tokenizer = transformers.AutoTokenizer.from_pretrained(export)
    model = transformers.AutoModelForMaskedLM.from_pretrained(export).eval()
    stock = []
    for p in some_pairs(6, seed=3):
        for sentence in (p["sentence_good"], p["sentence_bad"]):
            ids = tokenizer(sentence, return_tensors="pt")["input_ids"]
            n = ids.shape[1] - 2
            batch = ids.repeat(n, 1)
            batch[torch.arange(n), torch.arange(n) + 1] = tokenizer.mask_token_id
            with torch.no_grad():
                logits = model(input_ids=batch).logits
            log_probs = torch.log_softmax(logits[torch.arange(n), torch.arange(n) + 1].double(), -1)
            stock.append(log_probs[torch.arange(n), ids[0, 1:-1]].sum().item())
    np.testing.assert_allclose(stock, ours, rtol=0, atol=1e-4)


def test_quality_table_of_a_checkpoint_and_its_random_init_twin(tiny, tmp_path, capsys):
    from tools import quality_table

    pairs = write_pairs(tmp_path / "pairs.jsonl", some_pairs())
    validation = os.path.join(tiny["root"], "nvidia", "128", "validation")
    for name, extra in (("pretrained", []), ("random", ["--random_init", "--seed", "1"])):
        assert eval_mlm.main(["--model", tiny["job"], "--pairs", pairs, "--validation_set", validation,
                              "--output_dir", str(tmp_path / name), *extra]) == 0
    random_results = json.load(open(tmp_path / "random" / "results.json"))
    assert random_results["random_init"] and random_results["seed"] == 1
    capsys.readouterr()
    assert quality_table.main(["--pretrained", str(tmp_path / "pretrained"), "--random_init",
                               str(tmp_path / "random"), "--output", str(tmp_path / "quality.json")]) == 0
    printed = capsys.readouterr().out
    doc = json.load(open(tmp_path / "quality.json"))
    scored = {"pretrained": json.load(open(tmp_path / "pretrained" / "results.json")), "random_init": random_results}
    keys = ("accuracy", "ci95", "pairs", "correct")
    for name, results in scored.items():   # each column holds its own run's scores
        entry, mp = doc["minimal_pairs"][name], results["minimal_pairs"]
        assert set(entry["by_kind"]) == {"longer", "reverse"} and entry["pairs"] == 12
        assert {k: entry[k] for k in keys} == {k: mp[k] for k in keys}
        assert entry["by_kind"] == {uid: {k: e[k] for k in keys} for uid, e in mp["by_uid"].items()}
        v = results["validation_set"]
        assert doc["validation_mlm"][name] == {"accuracy": v["accuracy"], "perplexity": v["perplexity"]}
    assert doc["validation_mlm"]["pretrained"] != doc["validation_mlm"]["random_init"]   # two models, not one twice
    assert doc["minimal_pairs"]["pretrained_above_random_init"] == (
        doc["minimal_pairs"]["pretrained"]["ci95"][0] > doc["minimal_pairs"]["random_init"]["ci95"][1])
    assert doc["validation_mlm"]["unigram_baseline"] == scored["pretrained"]["validation_set"]["unigram"]
    assert doc["validation_mlm"]["tokens"] == scored["pretrained"]["validation_set"]["masked_tokens"]
    assert "unigram baseline" in printed and "random init" in printed and "reverse" in printed
    assert quality_table.main(["--pretrained", str(tmp_path / "nowhere"), "--random_init", str(tmp_path)]) == 2
    assert "nowhere: tools/eval_mlm.py results not found" in capsys.readouterr().err


def test_quality_table_refuses_results_that_do_not_compare(tiny, tmp_path, capsys):
    """Two results that are not a checkpoint and its random-init twin on the same inputs: one line
    each, exit 2, no table: swapped flags, two models, another pairs file (same path, other content),
    a validation score on one side only, and a file that holds no results object."""
    import shutil

    from tools import quality_table

    pairs = write_pairs(tmp_path / "pairs.jsonl", some_pairs())
    validation = os.path.join(tiny["root"], "nvidia", "128", "validation")
    other_model = tmp_path / "copy" / "tiny_bert"
    shutil.copytree(tiny["job"], other_model)

    def score(name, model=tiny["job"], *extra):
        assert eval_mlm.main(["--model", str(model), "--pairs", pairs, "--output_dir", str(tmp_path / name),
                              *extra]) == 0
        return str(tmp_path / name)

    both = ["--validation_set", validation]
    pretrained, random_init = score("p", tiny["job"], *both), score("r", tiny["job"], "--random_init", *both)
    other = score("other", other_model, "--random_init", *both)
    no_validation = score("nv", tiny["job"], "--random_init")
    write_pairs(tmp_path / "pairs.jsonl", some_pairs(seed=5))  # the same file name, other pairs
    other_pairs = score("op", tiny["job"], "--random_init", *both)
    listing = tmp_path / "list.json"
    listing.write_text("[1, 2]")
    capsys.readouterr()

    def refused(a, b, *extra):
        assert quality_table.main(["--pretrained", a, "--random_init", b, *extra]) == 2
        captured = capsys.readouterr()
        assert not captured.out
        return one_error_line(captured.err)

    assert refused(random_init, pretrained) == (f"error: --pretrained {random_init}: scored with --random_init (fresh "
                                                "weights); give the results of the checkpoint's own weights")
    assert f"--random_init {pretrained}: scored the model's own weights" in refused(pretrained, pretrained)
    assert (f"the two results are of different models ({tiny['job']} and {other_model}); score one --model twice"
            in refused(pretrained, other))
    assert (f"only the pretrained results ({pretrained}) have a validation set score; score both with the same "
            "--validation_set" in refused(pretrained, no_validation))
    assert ("the two results scored different minimal pairs files (their sha256 differ); score both with the same "
            "--pairs" in refused(pretrained, other_pairs))
    assert f"{listing}: a JSON list, not the results.json of tools/eval_mlm.py" in refused(str(listing), random_init)
    assert quality_table.main(["--pretrained", pretrained, "--random_init", random_init]) == 0
    table = capsys.readouterr().out
    assert "pairs" in table and "    12  " in table
    # results with a bare NaN in them (an older eval_mlm wrote them): refused by name, no quality.json holds it
    good = (tmp_path / "r" / "results.json").read_text()
    older = json.loads(good)
    older["validation_set"]["perplexity"] = float("nan")
    (tmp_path / "r" / "results.json").write_text(json.dumps(older))
    output = tmp_path / "quality.json"
    assert (f"{tmp_path / 'r' / 'results.json'}: validation_set.perplexity is nan, not a finite number"
            in refused(pretrained, random_init, "--output", str(output)))
    assert not output.exists()
    # finite, but no score eval_mlm gives (an accuracy of 7.5, a quoted number): refused by name too
    for key, value, expected in (("accuracy", 7.5, "validation_set.accuracy is 7.5, expected a share in [0, 1]"),
                                 ("accuracy", "0.5", "validation_set.accuracy is '0.5', expected a share in [0, 1]")):
        edited = json.loads(good)
        edited["validation_set"][key] = value
        (tmp_path / "r" / "results.json").write_text(json.dumps(edited))
        assert expected in refused(pretrained, random_init), expected
    (tmp_path / "r" / "results.json").write_text(good)


def test_weights_are_read_weights_only_never_unpickled(tiny, tmp_path, capsys):
    """A model states file that only the full unpickler reads (an object beside the tensors) is
    refused with one line; nothing in it runs."""
    import argparse
    import shutil

    tag = tmp_path / "job" / "step3"
    shutil.copytree(tiny["tag"], tag)
    state = torch.load(tag / MODEL_STATES_FILE, weights_only=True)
    torch.save({**state, "args": argparse.Namespace(lr=1)}, tag / MODEL_STATES_FILE)
    pairs = write_pairs(tmp_path / "pairs.jsonl", some_pairs(2))
    line = _error_line(capsys, ["--model", str(tag), "--pairs", pairs, "--output_dir", str(tmp_path / "out")])
    assert "does not load with torch.load(weights_only=True)" in line and "not unpickled" in line


def strict_json(text):
    """json.loads that refuses NaN and Infinity, as strict parsers (and other languages) do."""
    def refuse(constant):
        raise AssertionError(f"{constant} in a results file")

    return json.loads(text, parse_constant=refuse)


def test_scores_that_are_not_finite_are_an_error_line_not_a_file(tiny, tmp_path, capsys):
    """Finite weights whose MLM head overflows score NaN: one error line naming the file and the
    key, exit 2, and an earlier run's files in --output_dir stay as they were (strict JSON)."""
    import shutil

    pairs = write_pairs(tmp_path / "pairs.jsonl", some_pairs(4))
    argv = ["--pairs", pairs, "--validation_set", os.path.join(tiny["root"], "nvidia", "128", "validation"),
            "--output_dir", str(tmp_path / "out")]
    assert eval_mlm.main(["--model", tiny["job"], *argv]) == 0
    capsys.readouterr()
    written = {name: (tmp_path / "out" / name).read_text() for name in ("results.json", "pair_scores.jsonl")}
    strict_json(written["results.json"])
    assert [strict_json(line)["pairID"] for line in written["pair_scores.jsonl"].splitlines()] == ["0", "0", "1", "1"]
    tag = tmp_path / "job" / "step3"
    shutil.copytree(tiny["tag"], tag)
    state = torch.load(tag / MODEL_STATES_FILE, weights_only=True)
    state["module"]["cls.predictions.transform.dense_act.weight"].fill_(1e38)  # finite, but overflows
    torch.save(state, tag / MODEL_STATES_FILE)
    assert eval_mlm.main(["--model", str(tag), *argv]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert f"{tmp_path / 'out' / 'pair_scores.jsonl'}:1: not written: pll_good is nan, not a finite number" in line
    assert {name: (tmp_path / "out" / name).read_text() for name in written} == written


def test_a_run_stopped_between_its_two_files_leaves_no_results_json_of_other_scores(tiny, tmp_path, monkeypatch):
    """Scoring again into a folder of earlier scores, stopped after pair_scores.jsonl and before
    results.json: the earlier results.json (which quality_table reads) is gone, not left beside pair
    scores it does not describe; the same command writes both."""
    pairs = write_pairs(tmp_path / "pairs.jsonl", some_pairs(4))
    argv = ["--pairs", pairs, "--output_dir", str(tmp_path / "out")]
    assert eval_mlm.main(["--model", tiny["job"], *argv, "--random_init"]) == 0
    real = eval_mlm.write_atomic

    class Killed(BaseException):
        pass

    def killed_after_the_first(path, text):
        if path.endswith("results.json"):
            raise Killed
        real(path, text)

    monkeypatch.setattr(eval_mlm, "write_atomic", killed_after_the_first)
    with pytest.raises(Killed):
        eval_mlm.main(["--model", tiny["job"], *argv])
    assert not (tmp_path / "out" / "results.json").exists()
    monkeypatch.undo()
    assert eval_mlm.main(["--model", tiny["job"], *argv]) == 0
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    rows = [json.loads(line) for line in (tmp_path / "out" / "pair_scores.jsonl").read_text().splitlines()]
    assert results["random_init"] is False and results["minimal_pairs"]["correct"] == sum(r["correct"] for r in rows)
