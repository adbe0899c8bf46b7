"""GLUE fine-tuning (tools/finetune_glue.py, turing/glue.py) and the probe suite
(tools/make_probe_tasks.py).

One tiny model (configs/tiny) is pretrained per module, through the real pipeline
(tools/prepare_data.py shards, deepspeed_train.main, a DeepSpeed checkpoint; 176 steps), on a
synthetic corpus of topic documents: every document draws its words from one of 8 topics of 3
words, so "do these two sentences come from the same document" (probe_samedoc) is a task that
pretraining's masked words and next sentences teach. The GLUE-layout files are tiny and made here.
"""
import json
import math
import os
import random
import signal

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

import deepspeed_train  # noqa: E402
from tests.launch import TINY_CFG, TINY_DS  # noqa: E402
from testkit.synthetic import SPECIALS  # noqa: E402
from tools import export_hf, finetune_glue, glue_table, make_probe_tasks, prepare_data  # noqa: E402
from turing.glue import TASKS, collapse, compute_metrics, majority_baseline, read_examples, task_score  # noqa: E402
from turing.checkpoint_files import load_checkpoint_state  # noqa: E402

TOPICS, WORDS_PER_TOPIC = 8, 3


def write_topic_corpus(path, n_docs=160, sentences=8, seed=0):
    """Documents of 8 sentences of 6-10 words, all drawn from the document's topic: one of
    TOPICS sets of made-up letter-only words. Returns the words (whole WordPiece tokens)."""
    syllables = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]
    words = sorted({a + b for a in syllables for b in syllables})
    random.Random(seed).shuffle(words)
    topics = [words[t * WORDS_PER_TOPIC:(t + 1) * WORDS_PER_TOPIC] for t in range(TOPICS)]
    rng = random.Random(seed)
    with open(path, "w") as f:
        for _ in range(n_docs):
            topic = topics[rng.randrange(TOPICS)]
            for _ in range(sentences):
                f.write(" ".join(rng.choice(topic) for _ in range(rng.randint(6, 10))) + "\n")
            f.write("\n")
    return [w for topic in topics for w in topic]


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    """{root, ckpt, corpus, probe, vocab, words}: a tiny BERT pretrained on the topic corpus,
    and the probe suite made from the same corpus."""
    root = tmp_path_factory.mktemp("topic_data")
    corpus = root / "corpus.txt"
    words = write_topic_corpus(corpus)
    vocab = root / "vocab.txt"
    vocab.write_text("\n".join(SPECIALS + words) + "\n")
    assert prepare_data.main(["--input", str(corpus), "--output_dir", str(root / "nvidia" / "128"),
                              "--format", "nvidia", "--vocab_file", str(vocab), "--max_seq_length", "128",
                              "--max_predictions_per_seq", "20", "--num_shards", "2", "--workers", "1",
                              "--validation_fraction", "0.05"]) == 0
    # The tiny model, 4 epochs of ~44 steps at lr 2e-3: next-sentence accuracy reaches ~0.65-0.75.
    job = json.loads(open(TINY_CFG).read())
    job["mixed_seq_training"]["128"].update(learning_rate=0.002, num_epochs=4)
    (root / "job.json").write_text(json.dumps(job))
    out = root / "out"
    deepspeed_train.main(["--cf", str(root / "job.json"), "--deepspeed", "--deepspeed_config", TINY_DS, "--output_dir", str(out),
                          "--data_path_prefix", str(root), "--max_seq_length", "128",
                          "--max_predictions_per_seq", "20", "--use_nvidia_dataset", "--print_steps", "10",
                          "--validation_data_path_prefix", str(root / "nvidia" / "128"), "--log_level", "warning",
                          "--unpad"])
    probe = root / "probe"
    assert make_probe_tasks.main(["--input", str(corpus), "--output_dir", str(probe), "--train_size", "400",
                                  "--dev_size", "200", "--dev_fraction", "0.25"]) == 0
    return {"root": root, "ckpt": str(out / "saved_models" / "tiny_bert"), "corpus": str(corpus),
            "probe": str(probe), "vocab": str(vocab), "words": words}



# ---------------------------------------------------------------------------------------------
# Tiny GLUE-layout data


def _sentence(rng, words, n=None):
    return " ".join(rng.choice(words) for _ in range(n or rng.randint(3, 8)))


def write_glue_dir(root, words, n_train=48, n_dev=16, seed=0):
    """SST-2 (single sentence, header), RTE (pair, header, string labels) and CoLA (no header)
    folders as in the GLUE download; the label follows the first word, so it is learnable."""
    rng = random.Random(seed)
    half = len(words) // 2

    def label_of(sentence):
        return int(words.index(sentence.split()[0]) < half)

    for folder in ("SST-2", "RTE", "CoLA"):
        os.makedirs(os.path.join(root, folder), exist_ok=True)
    for split, n in (("train", n_train), ("dev", n_dev)):
        sentences = [_sentence(rng, words) for _ in range(n)]
        seconds = [_sentence(rng, words) for _ in range(n)]
        with open(os.path.join(root, "SST-2", f"{split}.tsv"), "w") as f:
            f.write("sentence\tlabel\n")
            f.writelines(f"{s}\t{label_of(s)}\n" for s in sentences)
        with open(os.path.join(root, "RTE", f"{split}.tsv"), "w") as f:
            f.write("index\tsentence1\tsentence2\tlabel\n")
            f.writelines(f"{i}\t{a}\t{b}\t{('not_entailment', 'entailment')[label_of(b)]}\n"
                         for i, (a, b) in enumerate(zip(sentences, seconds)))
        with open(os.path.join(root, "CoLA", f"{split}.tsv"), "w") as f:
            f.writelines(f"src{i % 3}\t{label_of(s)}\t{'' if label_of(s) else '*'}\t{s}\n"
                         for i, s in enumerate(sentences))
    return root


@pytest.fixture(scope="module")
def glue_dir(pretrained, tmp_path_factory):
    return write_glue_dir(str(tmp_path_factory.mktemp("glue")), pretrained["words"])


FAST = ["--seeds", "1", "--epochs", "1", "--max_seq_length", "32", "--batch_size", "16"]


def finetune(model, task, data_dir, out, *extra):
    return finetune_glue.main(["--model", str(model), "--task", task, "--data_dir", str(data_dir),
                               "--output_dir", str(out), *FAST, *[str(x) for x in extra]])


def read_predictions(path):
    with open(path) as f:
        lines = f.read().splitlines()
    assert lines[0] == "index\tprediction"
    rows = [line.split("\t") for line in lines[1:]]
    assert [int(i) for i, _ in rows] == list(range(len(rows)))
    return [p for _, p in rows]


def train_losses(out, task, seed=0):
    from turing.tb_events import read_run

    values, _ = read_run(os.path.join(out, "runs", task, f"seed{seed}"))
    return [v for _, v in values["Train/loss"]]


# ---------------------------------------------------------------------------------------------
# Metrics


def test_metrics_equal_hand_computed_values():
    cola, mrpc, stsb, rte = TASKS["cola"], TASKS["mrpc"], TASKS["stsb"], TASKS["rte"]
    assert compute_metrics(rte, [1, 0, 1, 1], [1, 0, 0, 1]) == {"accuracy": 0.75}
    # TP 2, FP 1, FN 1, TN 1: F1 = 2/3; accuracy 3/5; MCC = (2*1 - 1*1) / sqrt(3*3*2*2) = 1/6
    m = compute_metrics(mrpc, [1, 1, 0, 1, 0], [1, 0, 0, 1, 1])
    assert m["f1"] == pytest.approx(2 / 3) and m["accuracy"] == pytest.approx(0.6)
    assert task_score(mrpc, m) == pytest.approx((2 / 3 + 0.6) / 2)
    assert compute_metrics(cola, [1, 1, 0, 1, 0], [1, 0, 0, 1, 1])["mcc"] == pytest.approx(1 / 6)
    # x = 1..4, y = (1, 3, 2, 10): Pearson 13 / sqrt(5 * 50); Spearman on ranks (1, 3, 2, 4): 0.8
    m = compute_metrics(stsb, [1.0, 2.0, 3.0, 4.0], [1.0, 3.0, 2.0, 10.0])
    assert m["pearson"] == pytest.approx(13 / np.sqrt(250)) and m["spearman"] == pytest.approx(0.8)
    # the majority class of the training labels, scored on dev
    assert majority_baseline(rte, [1, 1, 0], [1, 0, 0, 1]) == pytest.approx(0.5)
    assert majority_baseline(mrpc, [1, 1, 0], [1, 0, 0, 1]) == pytest.approx((2 / 3 + 0.5) / 2)
    assert majority_baseline(cola, [0, 0, 1], [1, 0, 0, 1]) == 0.0
    assert majority_baseline(stsb, [1.0, 2.0], [1.0, 2.0, 5.0]) == 0.0  # a constant correlates with nothing


# ---------------------------------------------------------------------------------------------
# The runner


def test_three_layouts_task_all(pretrained, glue_dir, tmp_path, capsys):
    out = tmp_path / "all"
    assert finetune(pretrained["ckpt"], "all", glue_dir, out) == 0
    results = json.loads((out / "results.json").read_text())
    assert set(results) == {"sst2", "rte", "cola", "average"}
    assert results["average"] == pytest.approx(np.mean([results[t]["score"] for t in ("sst2", "rte", "cola")]))
    for name, folder, labels in (("sst2", "SST-2", {"0", "1"}), ("rte", "RTE", {"entailment", "not_entailment"}),
                                 ("cola", "CoLA", {"0", "1"})):
        entry, task = results[name], TASKS[name]
        assert entry["task"] == name and entry["metric"] == task.metric_name and len(entry["scores"]) == 1
        assert entry["model"] == os.path.abspath(pretrained["ckpt"])
        predictions = read_predictions(out / folder / "dev_predictions.tsv")
        assert set(predictions) <= labels
        gold = [e.label for e in read_examples(os.path.join(glue_dir, folder, "dev.tsv"), task)]
        assert len(predictions) == len(gold) == entry["dev_examples"] == 16
        recomputed = compute_metrics(task, [task.labels.index(p) for p in predictions], gold)
        assert task_score(task, recomputed) == pytest.approx(entry["score"])
        assert entry["majority_baseline"] == pytest.approx(majority_baseline(
            task, [e.label for e in read_examples(os.path.join(glue_dir, folder, "train.tsv"), task)], gold))
        assert train_losses(out / folder, name)  # TensorBoard logs
    table = capsys.readouterr().out
    assert "average" in table and "sst2" in table and "cola" in table


def test_single_task_median_of_seeds(pretrained, glue_dir, tmp_path):
    out = tmp_path / "sst2"
    assert finetune(pretrained["ckpt"], "SST-2", os.path.join(glue_dir, "SST-2"), out, "--seeds", "3",
                    "--epochs", "2", "--lr", "1e-3") == 0
    entry = json.loads((out / "results.json").read_text())
    assert entry["task"] == "sst2" and entry["seeds"] == [0, 1, 2] and len(entry["scores"]) == 3
    assert entry["settings"]["lr"] == 1e-3 and "lr_sweep" not in entry  # one learning rate: no sweep
    assert entry["score"] == sorted(entry["scores"])[1]
    assert entry["scores"][entry["median_seed"]] == entry["score"]
    predictions = read_predictions(out / "dev_predictions.tsv")
    gold = [e.label for e in read_examples(os.path.join(glue_dir, "SST-2", "dev.tsv"), TASKS["sst2"])]
    assert len(predictions) == len(gold) == entry["dev_examples"]
    assert np.mean([int(p) == g for p, g in zip(predictions, gold)]) == pytest.approx(entry["score"])


def test_bf16_on_cpu(pretrained, glue_dir, tmp_path):
    out = tmp_path / "bf16"
    assert finetune(pretrained["ckpt"], "rte", os.path.join(glue_dir, "RTE"), out, "--bf16") == 0
    entry = json.loads((out / "results.json").read_text())
    assert entry["settings"]["bf16"] and np.isfinite(train_losses(out, "rte")).all()


def test_three_model_sources_give_the_same_run(pretrained, glue_dir, tmp_path):
    """Our checkpoint folder, its tag folder and a state dict file train identically; a Hugging
    Face export (no pooler) trains like the state dict without the pooler (fresh pooler, same seed)."""
    pytest.importorskip("transformers", reason="the export needs transformers")
    data = os.path.join(glue_dir, "SST-2")
    state, _, _ = load_checkpoint_state(pretrained["ckpt"])
    torch.save(state, tmp_path / "full.pt")
    torch.save({k: v for k, v in state.items() if ".pooler." not in k}, tmp_path / "no_pooler.pt")
    hf = tmp_path / "hf"
    assert export_hf.main(["--checkpoint_dir", pretrained["ckpt"], "--output_dir", str(hf)]) == 0
    tag = os.path.join(pretrained["ckpt"], open(os.path.join(pretrained["ckpt"], "latest")).read().strip())
    cf = ["--cf", TINY_CFG, "--vocab_file", pretrained["vocab"]]
    runs = {"job": (pretrained["ckpt"],), "tag": (tag,), "full": (tmp_path / "full.pt", *cf),
            "no_pooler": (tmp_path / "no_pooler.pt", *cf), "hf": (hf,),
            "random": (pretrained["ckpt"], "--random_init")}
    losses = {}
    for name, (model, *extra) in runs.items():
        assert finetune(model, "sst2", data, tmp_path / f"out_{name}", *extra) == 0, name
        losses[name] = train_losses(tmp_path / f"out_{name}", "sst2")
    assert losses["job"] == losses["tag"] == losses["full"]
    assert losses["hf"] == pytest.approx(losses["no_pooler"], abs=1e-5)
    assert losses["full"] != pytest.approx(losses["no_pooler"], abs=1e-5)  # the pooler was loaded
    assert losses["full"] != pytest.approx(losses["random"], abs=1e-3)


# ---------------------------------------------------------------------------------------------
# Bad input: one line, exit code 2, nothing written


def _error_line(capsys):
    """The one error line (log lines may come before it), with no traceback."""
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "Traceback" not in err, err
    return errors[0]


def test_errors(pretrained, glue_dir, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "results.json").write_text('{"earlier": "run"}')  # kept: bad input stops before --overwrite clears
    sst2 = os.path.join(glue_dir, "SST-2")

    assert finetune(tmp_path / "nowhere", "sst2", sst2, out, "--overwrite") == 2
    assert "nowhere: not found" in _error_line(capsys)
    assert finetune(pretrained["ckpt"], "sst2", tmp_path / "no_data", out, "--overwrite") == 2
    assert "no_data: folder not found" in _error_line(capsys)
    assert finetune(pretrained["ckpt"], "sst5", sst2, out, "--overwrite") == 2
    assert "--task sst5: unknown task" in _error_line(capsys)
    assert finetune(pretrained["ckpt"], "all", tmp_path, out, "--overwrite") == 2
    assert "no task folder found" in _error_line(capsys)

    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "dev.tsv").write_text(open(os.path.join(sst2, "dev.tsv")).read())
    lines = open(os.path.join(sst2, "train.tsv")).read().splitlines()
    lines[5] = lines[5].replace("\t", " ")
    (bad / "train.tsv").write_text("\n".join(lines) + "\n")
    assert finetune(pretrained["ckpt"], "sst2", bad, out, "--overwrite") == 2
    assert f"{bad / 'train.tsv'}:6: expected 2 tab-separated fields, found 1" in _error_line(capsys)
    lines[5] = "some words\tpositive"
    (bad / "train.tsv").write_text("\n".join(lines) + "\n")
    assert finetune(pretrained["ckpt"], "sst2", bad, out, "--overwrite") == 2
    assert f"{bad / 'train.tsv'}:6: label 'positive' is not one of 0, 1" in _error_line(capsys)

    # sizes that do not fit: a vocab 16 tokens longer, a config with a narrower feed-forward layer
    vocab = tmp_path / "vocab.txt"
    vocab.write_text(open(pretrained["vocab"]).read() + "".join(f"extra{i}\n" for i in range(16)))
    assert finetune(pretrained["ckpt"], "sst2", sst2, out, "--overwrite", "--vocab_file", vocab) == 2
    line = _error_line(capsys)
    assert "shapes differ" in line and "word_embeddings" in line
    cf = json.loads(open(TINY_CFG).read())
    cf["bert_model_config"]["intermediate_size"] = 128
    (tmp_path / "cf.json").write_text(json.dumps(cf))
    state, _, _ = load_checkpoint_state(pretrained["ckpt"])
    torch.save(state, tmp_path / "model.pt")
    assert finetune(tmp_path / "model.pt", "sst2", sst2, out, "--overwrite", "--cf", tmp_path / "cf.json",
                    "--vocab_file", pretrained["vocab"]) == 2
    line = _error_line(capsys)
    assert "model.pt: shapes differ" in line and "intermediate" in line
    assert finetune(tmp_path / "model.pt", "sst2", sst2, out, "--overwrite") == 2  # no config beside it
    assert "no bert_model_config" in _error_line(capsys)

    assert (out / "results.json").read_text() == '{"earlier": "run"}'
    assert sorted(os.listdir(out)) == ["results.json"]
    # without --overwrite the folder is refused first, before the data and weights are read
    assert finetune(pretrained["ckpt"], "sst2", bad, out) == 2
    assert (f"--output_dir {out} holds a results.json finetune_glue did not write ({out / 'results.json'}), not "
            "those of sst2" in _error_line(capsys))

    for lr in ("inf", "nan", "0", "1e-4,1e400"):
        assert finetune(pretrained["ckpt"], "sst2", sst2, tmp_path / "lr", "--lr", lr) == 2
        assert f"--lr {lr.split(',')[-1]}: must be a positive finite number" in _error_line(capsys)
    assert not (tmp_path / "lr").exists()


# ---------------------------------------------------------------------------------------------
# The probe suite


def _rows(path):
    with open(path) as f:
        return [line.split("\t") for line in f.read().splitlines()[1:]]


def test_probe_tasks_killed_while_moving_in_leave_no_part_of_a_suite_the_same_command_keeps(pretrained, tmp_path):
    """SIGKILLed between moving one task folder in and the next: the same command clears the
    half-installed suite (finetune_glue --task all would read one task as the whole suite) and the
    staging folder, and writes the suite whole."""
    import subprocess
    import sys
    import time

    from tests.launch import REPO
    from tests.test_tool_errors import SLOW_RENAMES

    argv = ["--input", pretrained["corpus"], "--train_size", "400", "--dev_size", "200", "--dev_fraction", "0.25"]
    out = tmp_path / "probe"
    child = subprocess.Popen([sys.executable, "-c", SLOW_RENAMES, "tools.make_probe_tasks", *argv, "--output_dir",
                              str(out)], cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    names = ("probe_swap", "probe_samedoc", "probe_order")
    while not any((out / name).exists() for name in names):     # the first task folder moved in
        assert time.time() < deadline and child.poll() is None
        time.sleep(0.01)
    child.send_signal(signal.SIGKILL)
    child.wait()
    assert sum((out / name).exists() for name in names) < 3     # part of the suite, the rest still staged
    assert make_probe_tasks.main([*argv, "--output_dir", str(out)]) == 0
    assert sorted(os.listdir(out)) == ["probe_order", "probe_samedoc", "probe_swap"]
    for name in os.listdir(out):
        for split in ("train", "dev"):
            assert (out / name / f"{split}.tsv").read_text() == \
                open(os.path.join(pretrained["probe"], name, f"{split}.tsv")).read(), (name, split)


def test_probe_suite_layout_split_and_determinism(pretrained, tmp_path, capsys):
    probe = pretrained["probe"]
    again = tmp_path / "again"
    assert make_probe_tasks.main(["--input", pretrained["corpus"], "--output_dir", str(again), "--train_size", "400",
                                  "--dev_size", "200", "--dev_fraction", "0.25"]) == 0
    other = tmp_path / "other"
    assert make_probe_tasks.main(["--input", pretrained["corpus"], "--output_dir", str(other), "--seed", "1",
                                  "--train_size", "400", "--dev_size", "200", "--dev_fraction", "0.25"]) == 0
    corpus = [s for s in open(pretrained["corpus"]).read().splitlines() if s]
    for name in ("probe_swap", "probe_samedoc", "probe_order"):
        task = TASKS[name]
        for split in ("train", "dev"):
            path = os.path.join(probe, name, f"{split}.tsv")
            assert open(path).read() == (again / name / f"{split}.tsv").read_text()  # same seed, same files
            assert open(path).read() != (other / name / f"{split}.tsv").read_text()
            examples = read_examples(path, task)  # the runner reads it
            counts = np.bincount([e.label for e in examples])
            assert counts[0] == counts[1] and len(examples) == (400 if split == "train" else 200)
        train = {s for row in _rows(os.path.join(probe, name, "train.tsv")) for s in row}
        dev = [s for row in _rows(os.path.join(probe, name, "dev.tsv")) for s in row]
        assert not (train & set(dev) & set(corpus))  # no dev sentence is seen in training
    # "1": a corpus sentence; "0": a corpus sentence with two inner words swapped
    by_length = {}
    for s in corpus:
        by_length.setdefault(len(s.split()), []).append(s.split())
    for sentence, label in _rows(os.path.join(probe, "probe_swap", "dev.tsv"))[:50]:
        words = sentence.split()
        if label == "1":
            assert sentence in corpus
        else:
            assert any(len(diff := [i for i, (a, b) in enumerate(zip(words, s)) if a != b]) == 2
                       and 0 < diff[0] and diff[1] < len(words) - 1 and words[diff[0]] == s[diff[1]]
                       and words[diff[1]] == s[diff[0]] for s in by_length[len(words)])
    # same-document pairs: both sentences of one document
    docs = [set(d.splitlines()) for d in open(pretrained["corpus"]).read().split("\n\n")]
    for _, a, b, label in _rows(os.path.join(probe, "probe_samedoc", "dev.tsv"))[:50]:
        assert any(a in d and b in d for d in docs) == (label == "same")

    (tmp_path / "small.txt").write_text("one two three four five six\n\nseven eight nine ten eleven twelve\n")
    assert make_probe_tasks.main(["--input", str(tmp_path / "small.txt"), "--output_dir", str(tmp_path / "p")]) == 2
    assert "has 2 document(s); the probe tasks need at least 4" in _error_line(capsys)


def test_pretrained_beats_random_init_on_a_probe(pretrained, tmp_path, capsys):
    """Pretraining saw which words share documents (next-sentence prediction on topic documents);
    a model fine-tuned from it tells same-document pairs apart far better than one fine-tuned
    from a random start with the same data, steps and seed."""
    data = os.path.join(pretrained["probe"], "probe_samedoc")
    common = ["--epochs", "3", "--lr", "1e-3", "--batch_size", "32"]
    assert finetune(pretrained["ckpt"], "probe_samedoc", data, tmp_path / "pretrained", *common) == 0
    assert finetune(pretrained["ckpt"], "probe_samedoc", data, tmp_path / "random", *common, "--random_init") == 0
    capsys.readouterr()
    entries = {name: json.loads((tmp_path / name / "results.json").read_text()) for name in ("pretrained", "random")}
    scores = {name: entry["score"] for name, entry in entries.items()}
    assert scores["pretrained"] >= scores["random"] + 0.2, scores
    assert glue_table.main([f"pretrained={tmp_path / 'pretrained'}", f"random init={tmp_path / 'random'}"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[:4] == ["task", "metric", "pretrained", "random"]
    # a run that predicted one class for every dev example is starred (the random start often is)
    assert table[1].split()[2:4] == [f"{100 * entries[name]['score']:.1f}" + ("*" if entries[name]["collapsed"][0] else "")
                                     for name in ("pretrained", "random")]


def write_stsb(folder, scores):
    """An STS-B folder (header layout) whose training scores are `scores` as written."""
    os.makedirs(folder, exist_ok=True)
    for split, values in (("train", scores), ("dev", ["0.5", "2", "4.25", "3"])):
        with open(os.path.join(folder, f"{split}.tsv"), "w") as f:
            f.write("index\tsentence1\tsentence2\tscore\n")
            f.writelines(f"{i}\tsome words here\tother words there\t{v}\n" for i, v in enumerate(values))
    return folder


@pytest.mark.parametrize("label", ["nan", "1e400", "-inf"])
def test_non_finite_regression_labels_are_refused(pretrained, tmp_path, capsys, label):
    data = write_stsb(str(tmp_path / "STS-B"), ["1.0", "2.5", label, "4.0"])
    assert finetune(pretrained["ckpt"], "stsb", data, tmp_path / "out") == 2
    assert f"{os.path.join(data, 'train.tsv')}:4: label '{label}' is not a finite number" in _error_line(capsys)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("label", ["1e39", "-0.5", "5.01"])
def test_regression_labels_off_the_similarity_scale_are_refused(pretrained, tmp_path, capsys, label):
    """1e39 is finite, and infinite in float32: the loss was inf, blamed on --lr."""
    data = write_stsb(str(tmp_path / "STS-B"), ["1.0", "2.5", label, "4.0"])
    assert finetune(pretrained["ckpt"], "stsb", data, tmp_path / "out") == 2
    assert (f"{os.path.join(data, 'train.tsv')}:4: label '{label}' is outside STS-B's similarity scale [0, 5]"
            in _error_line(capsys))
    assert not (tmp_path / "out").exists()


def test_undecodable_and_cr_only_tsv_name_the_file(pretrained, glue_dir, tmp_path, capsys):
    sst2 = os.path.join(glue_dir, "SST-2")
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "dev.tsv").write_text(open(os.path.join(sst2, "dev.tsv")).read())
    lines = open(os.path.join(sst2, "train.tsv"), "rb").read().split(b"\n")
    lines[3] = lines[3].replace(b" ", b" caf\xe9 ", 1)  # Latin-1, not UTF-8
    (bad / "train.tsv").write_bytes(b"\n".join(lines))
    assert finetune(pretrained["ckpt"], "sst2", bad, tmp_path / "out") == 2
    assert f"{bad / 'train.tsv'}:4: not UTF-8 text (byte 0xe9" in _error_line(capsys)
    # an old-Mac file: every line ends in CR only, so the whole file is one line
    (bad / "train.tsv").write_bytes(open(os.path.join(sst2, "train.tsv"), "rb").read().replace(b"\n", b"\r"))
    assert finetune(pretrained["ckpt"], "sst2", bad, tmp_path / "out") == 2
    line = _error_line(capsys)
    assert f"{bad / 'train.tsv'}: lines end in a carriage return only" in line and len(line) < 300, line
    # a header of many long columns: the error quotes a few of them, cut short
    (bad / "train.tsv").write_text("\t".join(f"column{i}" + "x" * 200 for i in range(50)) + "\n")
    assert finetune(pretrained["ckpt"], "sst2", bad, tmp_path / "out") == 2
    line = _error_line(capsys)
    assert "header has no column 'sentence'" in line and "(50 in all)" in line and len(line) < 800, line


def test_task_all_finds_folders_in_any_case(pretrained, glue_dir, tmp_path, capsys):
    data = tmp_path / "data"
    for src, dst in (("CoLA", "cola"), ("SST-2", "Sst-2"), ("SST-2", "my_task")):
        (data / dst).mkdir(parents=True)
        for split in ("train", "dev"):
            (data / dst / f"{split}.tsv").write_text(open(os.path.join(glue_dir, src, f"{split}.tsv")).read())
    assert finetune(pretrained["ckpt"], "all", data, tmp_path / "out") == 0
    assert set(json.loads((tmp_path / "out" / "results.json").read_text())) == {"cola", "sst2", "average"}
    err = capsys.readouterr().err
    assert "skipping my_task: not a task name" in err, err
    (data / "CoLA").mkdir()
    assert finetune(pretrained["ckpt"], "all", data, tmp_path / "out2") == 2
    assert "2 folders for cola (CoLA, cola)" in _error_line(capsys)


@pytest.mark.parametrize("cut", ["empty", "truncated"])
def test_damaged_hf_export_is_one_line(pretrained, glue_dir, tmp_path, capsys, cut):
    hf = tmp_path / "hf"
    assert export_hf.main(["--checkpoint_dir", pretrained["ckpt"], "--output_dir", str(hf)]) == 0
    weights = hf / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(b"" if cut == "empty" else data[:len(data) // 2])
    capsys.readouterr()
    assert finetune(hf, "sst2", os.path.join(glue_dir, "SST-2"), tmp_path / "out") == 2
    size = 0 if cut == "empty" else len(data) // 2
    assert f"{weights}: not a complete safetensors file ({size} bytes" in _error_line(capsys)
    assert not (tmp_path / "out").exists()


def results_entry(task, score, **extra):
    """A results.json entry as tools/finetune_glue.py writes it (the fields glue_table reads)."""
    return {"task": task, "metric": TASKS[task].metric_name, "score": score, "scores": [score],
            "majority_baseline": 0.5, **extra}


def test_glue_table_columns_of_same_named_folders(tmp_path, capsys):
    for run, tasks in (("A", {"sst2": 0.61, "rte": 0.52}), ("B", {"sst2": 0.73, "cola": 0.1})):
        (tmp_path / run / "glue").mkdir(parents=True)
        document = {task: results_entry(task, score) for task, score in tasks.items()}
        (tmp_path / run / "glue" / "results.json").write_text(json.dumps(document))
    assert glue_table.main([str(tmp_path / "A" / "glue"), str(tmp_path / "B" / "glue" / "results.json")]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = [line.split() for line in lines[:-1]]
    assert rows[0] == ["task", "metric", "A/glue", "B/glue", "majority"]
    # the average compares like with like: the one task both runs have, and it says so
    assert {row[0]: row[-3:-1] for row in rows[1:]} == {"sst2": ["61.0", "73.0"], "rte": ["52.0", "-"],
                                                      "cola": ["-", "10.0"], "average": ["61.0", "73.0"]}
    assert rows[-1][:3] == ["average", "of", "1"]
    assert lines[-1] == ("average: over the 1 of 3 tasks every column has; left out: rte (only in A/glue), "
                         "cola (only in B/glue)")
    # a name given twice is refused, not merged
    assert glue_table.main([f"x={tmp_path / 'A' / 'glue'}", f"x={tmp_path / 'B' / 'glue'}"]) == 2
    assert "two columns named 'x'" in _error_line(capsys)


@pytest.mark.parametrize("document, expected", [
    ([1, 2], "a JSON list, not a results.json of tools/finetune_glue.py"),
    ({"sst2": {"task": "sst2", "metric": "accuracy", "score": 0.5}}, "the entry of sst2 has no 'scores'"),
    ({"task": "sst2", "metric": "accuracy", "score": "high", "scores": [0.5], "majority_baseline": 0.5},
     "'score' of sst2 is a str, not a number"),
    ({"average": 0.5}, "no task results in it"),
], ids=["list", "no_scores", "string_score", "no_tasks"])
def test_glue_table_on_a_foreign_results_file_is_one_line(tmp_path, capsys, document, expected):
    (tmp_path / "results.json").write_text(json.dumps(document))
    assert glue_table.main([str(tmp_path)]) == 2
    assert f"{tmp_path / 'results.json'}: {expected}" in _error_line(capsys)


def test_reused_output_dir_is_refused_or_cleared(pretrained, glue_dir, tmp_path, capsys):
    out = tmp_path / "out"
    assert finetune(pretrained["ckpt"], "all", glue_dir, out) == 0
    first = (out / "results.json").read_text()
    capsys.readouterr()
    assert finetune(pretrained["ckpt"], "all", glue_dir, out, "--lr", "1e-3") == 2
    line = _error_line(capsys)
    assert (f"--output_dir {out}: cola was fine-tuned there with other settings (lr [4e-05] (now [0.001]))" in line
            and "--overwrite" in line)
    assert (out / "results.json").read_text() == first
    (out / "notes.txt").write_text("mine")
    assert finetune(pretrained["ckpt"], "all", glue_dir, out) == 2
    assert f"--output_dir {out} holds files finetune_glue did not write for this run (notes.txt)" in _error_line(capsys)
    assert finetune(pretrained["ckpt"], "all", glue_dir, out, "--lr", "1e-3", "--overwrite") == 0
    err = capsys.readouterr().err
    assert "--overwrite: removed the earlier results in" in err and "SST-2/dev_predictions.tsv" in err, err
    assert "left in place, not written by finetune_glue: notes.txt" in err
    assert json.loads((out / "results.json").read_text())["sst2"]["settings"]["lr"] == 1e-3
    assert (out / "notes.txt").read_text() == "mine"
    # one run's TensorBoard events per seed, not two runs' curves in one folder
    for folder, task in (("SST-2", "sst2"), ("RTE", "rte"), ("CoLA", "cola")):
        assert len(os.listdir(out / folder / "runs" / task / "seed0")) == 1
        assert json.loads((out / folder / "results.json").read_text())["task"] == task


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_keeps_the_finished_tasks_and_nothing_else(pretrained, glue_dir, tmp_path, capsys, monkeypatch,
                                                             signum):
    """Ctrl-C (or SIGTERM) while sst2 trains, after cola finished: one line, cola's results on disk,
    no sst2 results, and glue_table shows cola and says the run stopped."""
    real_predict, calls = finetune_glue.predict, []

    def predict(model, loader, device, bf16):  # call 1: cola's dev set; call 2: sst2's, trained
        calls.append(1)
        if len(calls) == 2:
            signal.raise_signal(signum)
        return real_predict(model, loader, device, bf16)

    def not_handled(signum, frame):
        raise AssertionError(f"{signal.Signals(signum).name} reached the test: finetune_glue did not handle it")

    monkeypatch.setattr(finetune_glue, "predict", predict)
    previous = signal.signal(signum, not_handled)  # a clean failure, not a killed or interrupted session
    try:
        out = tmp_path / "out"
        assert finetune(pretrained["ckpt"], "all", glue_dir, out) == 128 + signum
    finally:
        signal.signal(signum, previous)
    err = capsys.readouterr().err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert err.splitlines()[-1] == (f"finetune_glue: stopped by {signal.Signals(signum).name}; finished cola (results "
                                    f"in {out / 'results.json'}); no results for sst2, rte; the same command "
                                    "continues the run")
    results = json.loads((out / "results.json").read_text())
    assert set(results) == {"cola", "average", "unfinished"} and results["unfinished"] == ["sst2", "rte"]
    assert json.loads((out / "CoLA" / "results.json").read_text())["task"] == "cola"
    assert not (out / "SST-2" / "results.json").exists() and not (out / "SST-2" / "dev_predictions.tsv").exists()
    assert not (out / "RTE").exists()
    assert glue_table.main([str(out)]) == 0
    table = capsys.readouterr().out.splitlines()
    assert [row.split()[0] for row in table[1:-1]] == ["cola"] and table[-1] == "out: the run stopped before sst2, rte"


def test_the_same_command_continues_a_stopped_run(pretrained, glue_dir, tmp_path, capsys, monkeypatch):
    """Ctrl-C while sst2 trains, after cola finished; the same command again: cola's results kept
    (not trained again), sst2 and rte run, one run's TensorBoard events each. Another setting, or
    another model, is refused naming the task and what differs."""
    real_predict, real_run_task, calls, trained = finetune_glue.predict, finetune_glue.run_task, [], []

    def predict(model, loader, device, bf16):  # call 1: cola's dev set; call 2: sst2's, trained
        calls.append(1)
        if len(calls) == 2:
            signal.raise_signal(signal.SIGINT)
        return real_predict(model, loader, device, bf16)

    def run_task(args, source, data, out_dir, device):
        trained.append(data.task.name)
        return real_run_task(args, source, data, out_dir, device)

    monkeypatch.setattr(finetune_glue, "predict", predict)
    monkeypatch.setattr(finetune_glue, "run_task", run_task)
    out = tmp_path / "out"
    assert finetune(pretrained["ckpt"], "all", glue_dir, out) == 128 + signal.SIGINT
    cola = (out / "CoLA" / "results.json").read_text()
    assert (out / "SST-2" / "runs").is_dir() and trained == ["cola", "sst2"]
    capsys.readouterr()
    assert finetune(pretrained["ckpt"], "all", glue_dir, out) == 0
    assert trained == ["cola", "sst2", "sst2", "rte"]
    assert "cola: finished by an earlier run of this command, kept" in capsys.readouterr().err
    assert (out / "CoLA" / "results.json").read_text() == cola
    results = json.loads((out / "results.json").read_text())
    assert set(results) == {"cola", "sst2", "rte", "average"}
    assert results["average"] == pytest.approx(np.mean([results[t]["score"] for t in ("cola", "sst2", "rte")]))
    assert len(os.listdir(out / "SST-2" / "runs" / "sst2" / "seed0")) == 1
    assert finetune(pretrained["ckpt"], "all", glue_dir, out, "--epochs", "2") == 2
    line = _error_line(capsys)
    assert f"--output_dir {out}: cola was fine-tuned there with other settings (epochs 1 (now 2))" in line
    assert finetune(pretrained["ckpt"], "all", glue_dir, out, "--random_init") == 2
    assert "cola was fine-tuned there with other settings (random_init False (now True))" in _error_line(capsys)
    assert trained == ["cola", "sst2", "sst2", "rte"] and (out / "CoLA" / "results.json").read_text() == cola


def test_a_non_finite_loss_stops_without_results(pretrained, glue_dir, tmp_path, capsys):
    out = tmp_path / "out"
    assert finetune(pretrained["ckpt"], "sst2", os.path.join(glue_dir, "SST-2"), out, "--lr", "1e10",
                    "--epochs", "2") == 3
    line = _error_line(capsys)
    assert "sst2 seed 0: the loss is nan at step" in line and "lower --lr" in line and "no results for sst2" in line
    assert not (out / "results.json").exists() and not (out / "dev_predictions.tsv").exists()


def learning_rates(total_steps, lr=1e-3):
    """The LR of each optimizer step of make_optimizer's schedule, as the optimizer applies it."""
    model = torch.nn.Linear(2, 2)
    optimizer, scheduler = finetune_glue.make_optimizer(model, lr, total_steps)
    lrs = []
    for _ in range(total_steps):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return lrs


@pytest.mark.parametrize("total_steps", [1, 2, 3, 10, 25])
def test_every_fine_tuning_step_trains_at_a_learning_rate_above_zero(total_steps):
    lrs = learning_rates(total_steps)
    assert len(lrs) == total_steps and min(lrs) > 0 and max(lrs) == pytest.approx(1e-3)
    warmup = max(1, math.ceil(0.1 * total_steps))
    assert lrs[:warmup] == sorted(lrs[:warmup]) and lrs[warmup - 1:] == sorted(lrs[warmup - 1:], reverse=True)


def test_a_one_step_fine_tune_trains_at_the_peak_learning_rate(pretrained, glue_dir, tmp_path):
    """48 training examples in one batch, one epoch: its one step at --lr (it was at 0), as logged."""
    from turing.tb_events import read_run

    out = tmp_path / "out"
    assert finetune(pretrained["ckpt"], "sst2", os.path.join(glue_dir, "SST-2"), out, "--batch_size", "64",
                    "--lr", "3e-4") == 0
    scalars, _ = read_run(os.path.join(out, "runs", "sst2", "seed0"))
    assert scalars["Train/lr"] == [(1, pytest.approx(3e-4))]


def test_fine_tune_log_line_says_each_metric_once(pretrained, glue_dir, tmp_path, capsys):
    assert finetune(pretrained["ckpt"], "sst2", os.path.join(glue_dir, "SST-2"), tmp_path / "out") == 0
    entry = json.loads((tmp_path / "out" / "results.json").read_text())
    lines = [line for line in capsys.readouterr().err.splitlines() if "sst2 seed 0:" in line]
    assert len(lines) == 1 and f"sst2 seed 0: accuracy {entry['score']:.4f} in " in lines[0], lines
    assert lines[0].count("accuracy") == 1


def test_collapse_is_named_for_a_constant_predictor_not_for_a_working_one(pretrained, glue_dir, tmp_path, capsys):
    """Trained on labels that are all "1", the model predicts "1" for every dev example: a warning
    says so with its likely causes, results.json marks the run, the table stars its score. The
    same model on learnable labels (400 examples) is not marked."""
    sst2 = os.path.join(glue_dir, "SST-2")
    one_label = tmp_path / "one_label"
    one_label.mkdir()
    (one_label / "dev.tsv").write_text(open(os.path.join(sst2, "dev.tsv")).read())
    lines = open(os.path.join(sst2, "train.tsv")).read().splitlines()
    (one_label / "train.tsv").write_text("\n".join([lines[0]] + [line.rsplit("\t", 1)[0] + "\t1" for line in lines[1:]]))
    common = ["--lr", "1e-3", "--epochs", "4"]
    assert finetune(pretrained["ckpt"], "sst2", one_label, tmp_path / "constant", *common) == 0
    captured = capsys.readouterr()
    warnings = [line for line in captured.err.splitlines() if "every prediction is" in line]
    assert len(warnings) == 1 and "sst2 seed 0, dev.tsv: every prediction is '1'" in warnings[0], captured.err
    assert "learning rate too low" in warnings[0] and "--lr 1e-4,3e-4,1e-3" in warnings[0] and "--epochs" in warnings[0]
    entry = json.loads((tmp_path / "constant" / "results.json").read_text())
    assert entry["collapsed"] == [True] and set(read_predictions(tmp_path / "constant" / "dev_predictions.tsv")) == {"1"}
    table = captured.out.splitlines()
    assert table[1].split()[2] == f"{100 * entry['score']:.1f}*" and table[2].startswith("* the run predicted one class")

    learnable = write_glue_dir(str(tmp_path / "learnable"), pretrained["words"], n_train=400, n_dev=64)
    assert finetune(pretrained["ckpt"], "sst2", os.path.join(learnable, "SST-2"), tmp_path / "working", "--lr", "1e-3",
                    "--epochs", "3") == 0
    captured = capsys.readouterr()
    assert "every prediction is" not in captured.err and "*" not in captured.out
    entry = json.loads((tmp_path / "working" / "results.json").read_text())
    assert entry["collapsed"] == [False] and entry["score"] > entry["majority_baseline"] + 0.2, entry
    assert len(set(read_predictions(tmp_path / "working" / "dev_predictions.tsv"))) == 2


def test_collapse_of_regression_scores():
    stsb = TASKS["stsb"]
    gold = [0.5, 2.0, 4.25, 3.0]
    assert collapse(stsb, [2.4, 2.4, 2.4, 2.4], gold).startswith("a near constant (2.400")
    assert collapse(stsb, [2.401, 2.402, 2.4, 2.403], gold)  # std 0.001 against the labels' 1.3
    assert collapse(stsb, [1.0, 2.1, 3.9, 2.7], gold) is None
    assert collapse(TASKS["rte"], [1, 1, 1], [0, 1, 0]) == "'not_entailment'"
    assert collapse(TASKS["rte"], [1, 0, 1], [0, 1, 0]) is None


def test_lr_sweep_picks_by_held_out_training_examples_not_dev(pretrained, tmp_path, capsys):
    """The dev labels are the training rule inverted: the learning rate that learns the rule scores
    best on held-out training examples and worst on dev. The sweep picks it, so it never looked
    at the dev set; it says which it picked and records the sweep."""
    data = os.path.join(write_glue_dir(str(tmp_path / "glue"), pretrained["words"], n_train=400, n_dev=64), "SST-2")
    lines = open(os.path.join(data, "dev.tsv")).read().splitlines()
    with open(os.path.join(data, "dev.tsv"), "w") as f:
        f.write("\n".join([lines[0]] + [f"{s}\t{1 - int(label)}" for s, label in (line.split("\t") for line in lines[1:])]))
    assert finetune(pretrained["ckpt"], "sst2", data, tmp_path / "out", "--lr", "1e-6,1e-3", "--epochs", "4") == 0
    entry = json.loads((tmp_path / "out" / "results.json").read_text())
    sweep = entry["lr_sweep"]
    assert sweep["picked"] == entry["settings"]["lr"] == 1e-3 and sweep["candidates"] == [1e-6, 1e-3]
    assert sweep["held_out_examples"] == 100 and sweep["trained_on"] == 300
    low, high = sweep["held_out_scores"]
    assert high > 0.9 and high > low + 0.3, sweep
    assert entry["score"] < 0.2  # on the inverted dev set: a pick by dev score would have taken 1e-6
    err = capsys.readouterr().err
    assert "sst2: picked --lr 0.001 (accuracy on 100 held-out training examples, trained on the other 300" in err, err
    assert sorted(os.listdir(tmp_path / "out" / "runs" / "sst2" / "lr_sweep")) == ["lr0.001", "lr1e-06"]


def _tree(folder):
    """{relative path: bytes} of every file under folder."""
    return {os.path.relpath(os.path.join(d, f), folder): open(os.path.join(d, f), "rb").read()
            for d, _, files in os.walk(folder) for f in files}


def test_probe_tasks_into_an_earlier_set(pretrained, tmp_path, capsys):
    """An earlier probe set is refused without --overwrite, replaced whole (and named) with it, and
    a run that fails leaves it as it was, never a mix of two sets."""
    out = tmp_path / "probe"
    small = ["--input", pretrained["corpus"], "--output_dir", str(out), "--train_size", "40", "--dev_size", "20"]
    assert make_probe_tasks.main(small) == 0
    earlier = _tree(out)
    capsys.readouterr()
    bigger = small[:4] + ["--train_size", "60", "--dev_size", "30"]
    assert make_probe_tasks.main(bigger) == 2
    line = _error_line(capsys)
    assert f"--output_dir {out} is not empty (probe_order, probe_samedoc, probe_swap)" in line and "--overwrite" in line
    assert _tree(out) == earlier

    # a corpus with no two usable sentences in a row: probe_swap and probe_samedoc can be made, probe_order not
    gappy = tmp_path / "gappy.txt"
    gappy.write_text("\n\n".join("\n".join(f"word{d} long sentence number {i} of this document" if i % 2 else "too short"
                                           for i in range(8)) for d in range(12)) + "\n")
    assert make_probe_tasks.main(["--input", str(gappy), "--output_dir", str(out), "--overwrite"]) == 2
    assert "too little text for probe_order" in _error_line(capsys)
    assert _tree(out) == earlier and sorted(os.listdir(out)) == ["probe_order", "probe_samedoc", "probe_swap"]

    (out / "notes.txt").write_text("mine")
    assert make_probe_tasks.main(bigger + ["--overwrite"]) == 0
    err = capsys.readouterr().err
    assert "--overwrite: replaced the earlier probe_swap (40 train, 20 dev); probe_samedoc (40 train, 20 dev)" in err, err
    assert "left in place, not written by make_probe_tasks: notes.txt" in err
    assert len(read_examples(str(out / "probe_order" / "train.tsv"), TASKS["probe_order"])) == 60
    assert sorted(os.listdir(out)) == ["notes.txt", "probe_order", "probe_samedoc", "probe_swap"]
