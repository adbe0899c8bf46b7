"""Every bench script runs, typed as bench/README.md types it, at a tiny size: a bench no test runs
rots (bench_data.py crashed on a changed Settings for weeks). Each checks that the bench got
to its figures, not the figures themselves (speed is measured by the benches, not by tests)."""
import json
import os
import subprocess
import sys

import pytest

from testkit.launcher import REPO, TINY_CFG, launch_env
from turing.tb_events import read_run


def bench(tmp_path, script, *args, timeout=300):
    done = subprocess.run([sys.executable, os.path.join("bench", script), *map(str, args)], cwd=REPO,
                          env=launch_env(), capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    return done.stdout


def json_lines(path):
    return [json.loads(line) for line in open(path)]


def test_bench_data(tmp_path):
    out = bench(tmp_path, "bench_data.py", "--seq", 64, "--batch", 8, "--samples", 128, "--rounds", 1,
                "--baseline_batches", 2, "--vocab_size", 200, "--step_ms", 1, "--overlap_batches", 4,
                "--output", tmp_path / "data.jsonl")
    assert "speed-up" in out and {r["provider"] for r in json_lines(tmp_path / "data.jsonl")} == {"nvidia", "bing"}


def test_bench_model(tmp_path):
    out = bench(tmp_path, "bench_model.py", "--layers", 1, "--hidden", 32, "--heads", 2, "--intermediate", 64,
                "--vocab", 128, "--rounds", 1, "--steps", 1, "--batch", 2, "--seq", 32, "--memory", "off",
                "--models", "ours,reference")
    assert "speed-up ours/reference" in out


def test_bench_e2e(tmp_path):
    out = bench(tmp_path, "bench_e2e.py", "--steps", 20, "--providers", "nvidia", "--batch", 4, "--vocab_words", 200,
                "--model_config", TINY_CFG, "--output", tmp_path / "e2e.jsonl")
    (record,) = json_lines(tmp_path / "e2e.jsonl")
    assert "nvidia" in out and record["provider"] == "nvidia" and record["windows"]
    assert all(w["samples_per_s"] > 0 for w in record["windows"])


def test_bench_resume(tmp_path):
    bench(tmp_path, "bench_resume.py", "--work", tmp_path / "work", "--rounds", 1, "--early", 1, "--late", 3,
          "--samples", 128, "--providers", "nvidia", "--output", tmp_path / "resume.jsonl")
    (result,) = json_lines(tmp_path / "resume.jsonl")
    assert result["nvidia"]["early"]["median_s"] > 0 and result["nvidia"]["late"]["median_s"] > 0


def test_bench_prepare(tmp_path):
    bench(tmp_path, "bench_prepare.py", "--work", tmp_path / "work", "--mb", 0.2, "--vocab_mb", 0.2, "--layouts",
          "jsonl", "--workers", 1, "--output", tmp_path / "prepare.jsonl")
    (record,) = json_lines(tmp_path / "prepare.jsonl")
    assert record["layout"] == "jsonl" and record["text_mb_per_s"] > 0
    bench(tmp_path, "bench_prepare.py", "--work", tmp_path / "work", "--mb", 0.2, "--scaling", "--layouts", "jsonl",
          "--workers", 1, 2, "--formats", "bing", "--output", tmp_path / "scaling.jsonl")
    one, two = json_lines(tmp_path / "scaling.jsonl")
    assert (one["workers"], two["workers"], one["speedup"]) == (1, 2, 1.0)
    assert two["reader_cpu_s"] >= 0 and two["text_mb_per_cpu_s"] > 0
    bench(tmp_path, "bench_prepare.py", "--work", tmp_path / "work", "--mb", 0.2, "--scaling", "--layouts", "jsonl",
          "--workers", 1, 2, "--pin", "--filter_sets", "quality", "--output", tmp_path / "pinned.jsonl")
    one, two = json_lines(tmp_path / "pinned.jsonl")
    assert (one["cores"], two["cores"]) == (1, min(2, os.cpu_count())) and one["pinned"] and two["pinned"]


def test_bench_prepare_filters(tmp_path):
    out = bench(tmp_path, "bench_prepare_filters.py", "--work", tmp_path / "work", "--documents", 40, "--copies", 2, "--rounds", 1,
                "--libraries", "rensa", "--configs", "14x8", "--per_language", 5, "--output", tmp_path / "f.jsonl")
    records = json_lines(tmp_path / "f.jsonl")
    assert {r["bench"] for r in records} >= {"near_dedup", "stage_cost", "stage_alone"} and "| all on |" in out
    assert next(r for r in records if r["bench"] == "near_dedup")["planted"] == 16


@pytest.mark.parametrize("script", sorted(f for f in os.listdir(os.path.join(REPO, "bench")) if f.startswith("bench_")))
def test_every_bench_has_its_smoke_test(script):
    assert f"test_{script[:-3]}" in globals(), f"bench/{script} has no smoke test here"


def test_bench_quality(tmp_path):
    """The demo data made as the bench makes it, with a few minimal pairs (the bench's 1,000 take
    a minute to score), one recipe for a few seconds of training."""
    work = tmp_path / "work"
    subprocess.run(["bash", os.path.join(REPO, "scripts", "prepare_demo_data.sh"), str(work)], cwd=REPO, check=True,
                   capture_output=True)
    subprocess.run([sys.executable, "-m", "tools.make_minimal_pairs", "--heldout", str(work / "nvidia"), "--output",
                    str(work / "minimal_pairs.jsonl"), "--pairs_per_kind", "5"],
                   cwd=REPO, check=True, capture_output=True)
    out = bench(tmp_path, "bench_quality.py", "--work", work, "--recipes", "demo", "--minutes", 0.05,
                "--output", tmp_path / "quality.jsonl")
    (record,) = json_lines(tmp_path / "quality.jsonl")
    assert record["recipe"] == "demo" and "| demo |" in out


@pytest.mark.skipif(not os.path.isdir("/usr/share/common-licenses"), reason="the domain is the system's licence texts")
def test_bench_continued(tmp_path):
    """A general set made here (synthetic documents, a 300-token vocab), a 1-layer stock model
    with random weights, 6 steps of each trainer, killed after step 3 and restarted."""
    from testkit.corpora import synthetic_documents, write_text_docs
    from tools import prepare_data

    write_text_docs(str(tmp_path / "general.txt"), synthetic_documents(80))
    assert prepare_data.main(["--input", str(tmp_path / "general.txt"), "--input_format", "text_docs", "--output_dir",
                              str(tmp_path / "general"), "--build_vocab", "300", "--validation_fraction", "0.2"]) == 0
    out = bench(tmp_path, "bench_continued.py", "--work", tmp_path / "work", "--general", tmp_path / "general",
                "--layers", 1, "--hidden", 32, "--heads", 2, "--intermediate", 64, "--pretrain_steps", 0, "--steps", 6,
                "--batch", 8, "--checkpoint_every", 2, "--kill_at", 3, "--domain_mb", 0.1, "--pairs_per_kind", 2,
                "--domain_text_tokens", 100, "--validation_sequences", 16, "--output", tmp_path / "continued.jsonl")
    (record,) = json_lines(tmp_path / "continued.jsonl")
    assert "samples/s: ours" in out and "| stock |" in out
    assert all(record["samples_per_s"][who] > 0 for who in ("ours", "hf"))
    assert [[step for step, _, _ in record["curves"][who]] for who in ("ours", "hf")] == [[0, 2, 4, 6]] * 2
    assert record["curves"]["ours"][0] == record["curves"]["hf"][0]           # both start from the stock model
    ours, hf = record["restart"]["ours"], record["restart"]["hf"]
    for who in (ours, hf):    # killed after step 3 or later, resumed from its last checkpoint, run to the end
        assert 2 <= who["resumed_from_step"] <= who["killed_after_step"] < 6 and who["last_step_compared"] == 6
        assert who["steps_trained_twice"] == who["killed_after_step"] - who["resumed_from_step"]
    assert ours["losses_equal_uninterrupted"] and isinstance(hf["same_masks_after_restart"], bool)
    assert set(record["quality"]) == {"stock", "ours", "hf"}


def test_bench_train_gpu(tmp_path):
    """The prepared GPU job's pipeline with --tiny on the CPU: data made there, one run through
    the launcher read back from its TensorBoard scalars, the pure step beside it."""
    # a deadline far beyond the tiny runs' need (about a minute): the smoke test must not depend on
    # how busy the machine is (the job's own deadline is for the GPU machine's budget)
    out = bench(tmp_path, "bench_train_gpu.py", "--out", tmp_path / "gpu", "--tiny", "--minutes", 30, timeout=1900)
    (record,) = json_lines(tmp_path / "gpu" / "train_gpu.jsonl")
    assert record["exit_code"] == 0 and "fp32_adamw_tiny" in out
    # its figures are the runs' own: the trainer's windows after the first (TensorBoard; one here), the pure
    # step's line of bench_model.py, and their ratio
    name = record["run"]
    scalars = read_run(str(tmp_path / "gpu" / name / "runs" / name))[0]
    windows = {tag: [v for _, v in scalars[tag]] for tag in ("Train/samples_per_s", "Train/MFU")}
    assert [len(v) for v in windows.values()] == [2, 2]                  # 40 steps, a progress line every 20
    assert (record["samples_per_s"], record["mfu"]) == (windows["Train/samples_per_s"][1], windows["Train/MFU"][1])
    assert 0 < record["mfu"] <= 1
    (pure,) = json_lines(tmp_path / "gpu" / f"model_{name}.jsonl")
    assert record["pure_step_samples_per_s"] == pure["samples_per_s"]
    assert record["trainer_over_pure_step"] == round(record["samples_per_s"] / record["pure_step_samples_per_s"], 3)


def test_bench_finetune(tmp_path):
    """A general set made here (synthetic documents, a 300-token vocab), a 1-layer stock model with
    random weights, one probe task of 48 examples, one seed, one epoch of each stack."""
    from testkit.corpora import synthetic_documents, write_text_docs
    from tools import prepare_data

    write_text_docs(str(tmp_path / "general.txt"), synthetic_documents(80))
    assert prepare_data.main(["--input", str(tmp_path / "general.txt"), "--input_format", "text_docs", "--output_dir",
                              str(tmp_path / "general"), "--build_vocab", "300", "--validation_fraction", "0.2"]) == 0
    out = bench(tmp_path, "bench_finetune.py", "--tiny", "--work", tmp_path / "work", "--general", tmp_path / "general",
                "--output", tmp_path / "finetune.jsonl")
    (record,) = json_lines(tmp_path / "finetune.jsonl")
    (task,) = record["tasks"]
    assert task["task"] == "probe_swap" and "| probe_swap (accuracy) |" in out
    # both stacks trained on the very same files, with the same seeds, as many steps each
    assert task["same_files"] and task["seeds"] == {"ours": [0], "hf": [0]}
    assert task["steps_per_seed"] == -(-task["train_examples"] // 16)          # one epoch of batches of 16
    assert task["same_tokens"]["examples"] == task["train_examples"] + task["dev_examples"]
    for who in ("ours", "hf"):
        score = task["score"][who]
        assert len(score["scores"]) == 1 and all(0 <= x <= 1 for x in [*score["scores"], *score["interval"]])
        assert 0 <= score["accuracy"] <= 1
        assert task["samples_per_s"][who] > 0
    assert task["samples_per_s"]["ours_over_hf"] > 0
