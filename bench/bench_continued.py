"""Continued pretraining of a small stock BertForMaskedLM on a domain corpus: our trainer against a
Hugging Face `Trainer` with `DataCollatorForLanguageModeling` (what transformers' run_mlm.py
does), on the same model, data, batch, masking rate, learning rate and schedule.

Everything is made here, offline, in --work:
- general text: the demo's corpus and shards (scripts/prepare_demo_data.sh; or --general, any
  tools/prepare_data.py output) and its minimal pairs (tools/make_minimal_pairs.py from the
  documents it held out);
- the stock model: a BertForMaskedLM built by transformers from a small config (random weights,
  the demo's WordPiece vocab), pretrained --pretrain_steps on the demo shards by our trainer
  (`--use_pretrain`, the bert_postln block) and exported with tools/export_hf.py: a stock folder
  as a user would download one, trained on general English (made once per size; --pretrain_steps
  0 keeps the random weights);
- the domain: legal text shipped with the operating system (the licence texts of
  /usr/share/common-licenses and the /usr/share/doc/*/copyright files, one document each, up to
  --domain_mb), prepared by tools/prepare_data.py with the stock folder's tokenizer, 15% masked,
  a validation split held out by document.

Then the two side by side, at the same time, --threads each (on a shared machine both see the same
load; the figures while both ran are reported beside the whole runs', since the faster run ends
first and leaves the other more of the machine):
- ours: deepspeed_train.py (one rank) with configs/continued/'s recipe scaled to --batch: AdamW
  betas 0.9/0.98, eps 1e-6, weight decay 0.01, clipping 1.0, a 6% linear warmup and a linear
  decay to 0 (WSD, cooldown 0.94), fp32, the shards' static 15% masks;
- theirs: transformers' Trainer on the same training sequences (the shards' tokens with their
  masked positions restored) masked on the fly by DataCollatorForLanguageModeling at 15%
  (80/10/10), linear warmup 6% and linear decay, the same AdamW numbers.
Both save a checkpoint every --checkpoint_every steps; every checkpoint is scored afterwards on
the domain validation set's own masks by the same code (tools/eval_mlm.py's), so the curves are
comparable: samples/s of each (steps after the first, checkpoint writes included), and the
training time each needs to reach the same validation MLM loss (the worse of the two final
ones). Killed and restarted: each run again from scratch, SIGKILLed after step --kill_at, then
restarted the way each documents (ours: the same command with --auto_resume; theirs:
`trainer.train(resume_from_checkpoint=True)`) and stopped a few steps past the step it had
reached: the steps trained twice, whether the losses after the restart are the uninterrupted
run's, and for theirs whether its batches hold the same sequences and the same masks.

Quality before and after (tools/eval_mlm.py's scorers): domain validation MLM accuracy (95%
Wilson interval), domain held-out text with every token masked in turn (accuracy and
pseudo-perplexity, a 95% bootstrap interval over lines), general validation MLM accuracy (the
demo's validation set) and the minimal pairs (accuracy, 95% Wilson interval).

Prints a table and the JSON line it appends to --output.

    python bench/bench_continued.py                               # about 13 minutes on 2 cores
    python bench/bench_continued.py --steps 20 --checkpoint_every 5 --pretrain_steps 20 --domain_mb 0.2  # a look
"""
import argparse
import glob
import json
import logging
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from bench.common import append_json_lines, load_average, machine_description  # noqa: E402
from testkit.launcher import PROGRESS  # noqa: E402

logger = logging.getLogger("bench_continued")
MASKING = 0.15
AFTER = 5  # steps a restarted run trains past the step its killed run had reached, before it is stopped
SEQ, MAX_PRED = 128, 20
BETAS, EPS, WEIGHT_DECAY, CLIP, WARMUP = (0.9, 0.98), 1e-6, 0.01, 1.0, 0.06
DOMAIN_SOURCES = ("/usr/share/common-licenses/*", "/usr/share/doc/*/copyright")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = p.add_argument
    add("--work", default=os.path.join(REPO, "demo_run"), help="the demo data (made when missing); all else "
                                                               "under WORK/continued/")
    add("--general", default=None, help="general text: a tools/prepare_data.py output (vocab.txt, train/, "
                                         "validation/, its held-out documents); default WORK/nvidia, the demo's")
    add("--steps", type=int, default=150, help="optimizer steps of each continued run")
    add("--batch", type=int, default=32)
    add("--lr", type=float, default=5e-4, help="peak learning rate of both continued runs")
    add("--checkpoint_every", type=int, default=30)
    add("--kill_at", type=int, default=None, help="SIGKILL the restart runs after this step (default: 1.5 "
                                                  "checkpoint intervals)")
    add("--pretrain_steps", type=int, default=600, help="general pretraining of the stock model (our trainer; 0: "
                                                        "none, its random weights)")
    add("--pretrain_lr", type=float, default=1e-3)
    add("--layers", type=int, default=2)
    add("--hidden", type=int, default=128)
    add("--heads", type=int, default=2)
    add("--intermediate", type=int, default=512)
    add("--domain_mb", type=float, default=1.5, help="domain text taken, at most")
    add("--validation_sequences", type=int, default=512, help="validation sequences scored (each set's first)")
    add("--domain_text_tokens", type=int, default=4000, help="held-out domain tokens scored with every token masked")
    add("--pairs_per_kind", type=int, default=100, help="minimal pairs of each kind (4 kinds)")
    add("--threads", type=int, default=1, help="intra-op threads of each run (the two run side by side)")
    add("--seed", type=int, default=42)
    add("--output", default=os.path.join(REPO, "bench", "results", "continued.jsonl"))
    add("--hf_worker", nargs=2, metavar=("SETTINGS", "LOG"), help=argparse.SUPPRESS)  # the Trainer run, in a child
    return p.parse_args(argv)


def run(cmd, env, log_path=None):
    """Run a child to the end; its output to log_path; a failure is one line naming the log."""
    with open(log_path or os.devnull, "w") as log:
        done = subprocess.run([str(c) for c in cmd], cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    if done.returncode:
        raise SystemExit(f"error: {' '.join(map(str, cmd[:4]))} ... failed (exit code {done.returncode}); see "
                         f"{log_path}")


def child_env(threads):
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                                             "MASTER_PORT")}
    # passive OpenMP waits: the two runs (and whatever else shares the machine) do not spin on
    # each other's cores (bench/README.md, Machine and method)
    env.update(PYTHONUNBUFFERED="1", OMP_NUM_THREADS=str(threads), OMP_WAIT_POLICY="PASSIVE", HF_HUB_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    return env


# ---------------------------------------------------------------------------------------------
# Data and the stock model


def general_data(work, general, pairs_per_kind, env):
    """The general set (the demo's, made when missing) and its minimal pairs file."""
    if general is None:
        general = os.path.join(work, "nvidia")
        if not os.path.isfile(os.path.join(general, "vocab.txt")):
            run(["bash", os.path.join(REPO, "scripts", "prepare_demo_data.sh"), work], env,
                os.path.join(work, "continued", "prepare_demo_data.log"))
    pairs = os.path.join(work, "continued", f"minimal_pairs_{pairs_per_kind}.jsonl")
    if not os.path.isfile(pairs):
        run([sys.executable, "-m", "tools.make_minimal_pairs", "--heldout", general, "--output", pairs,
             "--pairs_per_kind", pairs_per_kind], env, os.path.join(work, "continued", "pairs.log"))
    return general, pairs


def write_json(path, content):
    with open(path, "w") as f:
        json.dump(content, f, indent=2)
    return path


def job_config(path, name, model_folder, train, steps, lr, epochs=1):
    """A job config of the continued recipe (configs/continued/bert_base.json's training section):
    a schedule of `steps` steps over `epochs` epochs of `train` (under --data_path_prefix)."""
    return write_json(path, {
        "name": name, "bert_model_file": model_folder,
        "data": {"format": "nvidia", "mixed_seq_datasets": {str(SEQ): {"pretrain_dataset": train}}},
        "mixed_seq_training": {str(SEQ): {
            "num_epochs": epochs, "learning_rate": lr, "warmup_proportion": WARMUP, "cooldown_proportion": 1 - WARMUP,
            "cooldown_shape": "linear", "total_training_steps": steps, "weight_decay": WEIGHT_DECAY,
            "num_workers": 0}}})


def ds_config(path, batch, lr):
    return write_json(path, {
        "train_micro_batch_size_per_gpu": batch, "gradient_accumulation_steps": 1, "steps_per_print": 10 ** 6,
        "optimizer": {"type": "AdamW", "params": {"lr": lr, "weight_decay": WEIGHT_DECAY, "betas": list(BETAS),
                                                  "eps": EPS, "torch_adam": True}},
        "gradient_clipping": CLIP})


def trainer_cmd(work, out, cf, ds, *extra):
    """Our trainer on one rank from the job config's folder."""
    return [sys.executable, os.path.join(REPO, "deepspeed_train.py"), "--cf", cf, "--deepspeed", "--deepspeed_config",
            ds, "--output_dir", out, "--data_path_prefix", work, "--max_seq_length", SEQ, "--max_predictions_per_seq",
            MAX_PRED, "--use_pretrain", "--lr_schedule", "WSD", *extra]


def stock_model(args, work, general, env):
    """WORK/continued/stock_SIZES: a BertForMaskedLM folder pretrained on the general set (made
    once for these sizes and that set)."""
    import torch
    import transformers

    base = os.path.join(work, "continued")
    sizes = (f"{os.path.basename(general)}_L{args.layers}_H{args.hidden}_A{args.heads}_I{args.intermediate}"
             f"_s{args.pretrain_steps}")
    stock = os.path.join(base, f"stock_{sizes}")
    if os.path.isfile(os.path.join(stock, "model.safetensors")) and args.pretrain_steps:
        return stock
    init = os.path.join(base, f"init_{sizes}")
    shutil.rmtree(init, ignore_errors=True)
    vocab = os.path.join(general, "vocab.txt")
    with open(vocab, encoding="utf-8") as f:
        vocab_size = sum(1 for _ in f)
    torch.manual_seed(args.seed)
    config = transformers.BertConfig(vocab_size=vocab_size, hidden_size=args.hidden, num_hidden_layers=args.layers,
                                     num_attention_heads=args.heads, intermediate_size=args.intermediate,
                                     max_position_embeddings=SEQ, pad_token_id=0)
    transformers.BertForMaskedLM(config).save_pretrained(init, safe_serialization=True)
    shutil.copy(vocab, os.path.join(init, "vocab.txt"))
    write_json(os.path.join(init, "tokenizer_config.json"), {"do_lower_case": True})
    if not args.pretrain_steps:   # the smoke test's: the random weights are the stock model
        return init
    out = os.path.join(base, f"pretrain_{sizes}")
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    # as many epochs as it takes (an epoch of NVIDIA shards on one rank is one shard), cut by --max_steps
    cf = job_config(os.path.join(out, "job.json"), "stock_pretrain", init, "train", args.pretrain_steps,
                    args.pretrain_lr, epochs=10 ** 4)
    ds = ds_config(os.path.join(out, "ds.json"), args.batch, args.pretrain_lr)
    logger.info("pretraining the stock model on %s (%d steps)", general, args.pretrain_steps)
    run(trainer_cmd(general, out, cf, ds, "--max_steps", args.pretrain_steps, "--print_steps", 50), env,
        os.path.join(out, "train.log"))
    run([sys.executable, "-m", "tools.export_hf", "--checkpoint_dir",
         os.path.join(out, "saved_models", "stock_pretrain"), "--output_dir", stock], env, os.path.join(out, "export.log"))
    return stock


def domain_documents(path, max_mb, max_chars=10000):
    """The licence texts, one document a line (text_docs), whitespace joined, each cut at
    max_chars (so that no few licences fill the corpus), in path order, up to max_mb; returns
    (documents, MB)."""
    files = sorted(f for pattern in DOMAIN_SOURCES for f in glob.glob(pattern) if os.path.isfile(f))
    written, docs = 0, 0
    with open(path, "w", encoding="utf-8") as out:
        for name in files:
            try:
                text = " ".join(open(name, encoding="utf-8").read().split())[:max_chars]
            except (UnicodeDecodeError, OSError):
                continue
            if len(text.split()) < 50:
                continue
            if written + len(text) > max_mb * 1e6:
                break
            out.write(text + "\n")
            written, docs = written + len(text) + 1, docs + 1
    if not docs:
        raise SystemExit(f"error: no licence text found under {', '.join(DOMAIN_SOURCES)}")
    return docs, written / 1e6


def domain_data(args, work, stock, env):
    base = os.path.join(work, "continued")
    out = os.path.join(base, f"domain_{args.domain_mb}")
    corpus = os.path.join(base, f"domain_{args.domain_mb}.txt")
    docs, mb = domain_documents(corpus, args.domain_mb)
    if not os.path.isdir(os.path.join(out, "validation")):
        run([sys.executable, "-m", "tools.prepare_data", "--input", corpus, "--input_format", "text_docs",
             "--output_dir", out, "--format", "nvidia", "--tokenizer", stock, "--max_seq_length", SEQ,
             "--max_predictions_per_seq", MAX_PRED, "--masked_lm_prob", MASKING,
             "--validation_fraction", max(0.1, 5 / docs),   # a few documents at least, however few there are
             "--num_shards", 1, "--workers", 2, "--overwrite"], env, os.path.join(base, "prepare_domain.log"))
    return {"folder": out, "documents": docs, "mb": round(mb, 2), "sources": list(DOMAIN_SOURCES)}


def heldout_text(folder, path, max_tokens, tokenize):
    """Held-out domain sentences, one a line, up to max_tokens (the documents prepare_data held out)."""
    lines, tokens = [], 0
    with open(os.path.join(folder, "heldout.jsonl"), encoding="utf-8") as f:
        for record in map(json.loads, f):
            for sentence in record["sentences"]:
                n = len(tokenize(sentence))
                if 3 <= n <= SEQ - 2:
                    lines.append(sentence)
                    tokens += n
                if tokens >= max_tokens:
                    break
            if tokens >= max_tokens:
                break
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    return path


def training_sequences(train_folder):
    """The shards' sequences with their masked positions restored: (input_ids, token_type_ids) lists."""
    import h5py
    import numpy as np

    sequences = []
    for path in sorted(glob.glob(os.path.join(train_folder, "*.hdf5"))):
        with h5py.File(path, "r") as f:
            ids, mask, segments = (np.asarray(f[k], dtype=np.int64) for k in ("input_ids", "input_mask", "segment_ids"))
            positions, labels = np.asarray(f["masked_lm_positions"]), np.asarray(f["masked_lm_ids"])
        rows = np.arange(len(ids))[:, None].repeat(positions.shape[1], 1)
        real = positions > 0        # position 0 is [CLS]: the padding of the position lists
        ids[rows[real], positions[real]] = labels[real]
        for row in range(len(ids)):
            n = int(mask[row].sum())
            sequences.append((ids[row, :n].tolist(), segments[row, :n].tolist()))
    return sequences


# ---------------------------------------------------------------------------------------------
# The two trainers


def ours_losses(out, job, batch):
    """[(step, wall time, loss)] of the training losses our run (all its sessions, the later one's
    where two logged a step) logged to TensorBoard."""
    from turing.tb_events import iter_events

    rows = {}
    for path in sorted(glob.glob(os.path.join(out, "runs", job, "**", "events.out.tfevents.*"), recursive=True)):
        for event in iter_events(path):
            for value in event.summary.value:
                if value.tag == "Train/Samples/train_loss":
                    rows[event.step] = (event.wall_time, value.simple_value)
    return [(samples // batch, *rows[samples]) for samples in sorted(rows)]


def hf_steps(log, start=0):
    """The Hugging Face run's step records (step, time, loss, data and masks fingerprints) from
    line `start` of its log on."""
    return [json.loads(line) for line in open(log).read().splitlines()[start:]] if os.path.isfile(log) else []


def hf_losses(log, start=0):
    """[(step, time, loss)] of hf_steps, the later record where a step was logged twice."""
    rows = {r["step"]: (r["time"], r["loss"]) for r in hf_steps(log, start)}
    return [(s, *rows[s]) for s in sorted(rows)]


def fingerprint(tensor):
    import hashlib

    return hashlib.sha256(tensor.cpu().numpy().tobytes()).hexdigest()[:16]


def hf_worker(settings_path, log):
    """The Hugging Face run (in a child process): Trainer + DataCollatorForLanguageModeling."""
    import torch
    import transformers

    s = json.load(open(settings_path))
    torch.set_num_threads(s["threads"])
    sequences = training_sequences(s["train"])
    dataset = [{"input_ids": ids, "token_type_ids": types} for ids, types in sequences]
    tokenizer = transformers.BertTokenizerFast(vocab_file=os.path.join(s["stock"], "vocab.txt"), do_lower_case=True)
    collator = transformers.DataCollatorForLanguageModeling(tokenizer, mlm=True, mlm_probability=MASKING)
    model = transformers.BertForMaskedLM.from_pretrained(s["stock"])
    seen = []

    class Recording(transformers.Trainer):
        def compute_loss(self, model, inputs, *a, **k):
            loss = super().compute_loss(model, inputs, *a, **k)
            labels = inputs["labels"]
            tokens = torch.where(labels != -100, labels, inputs["input_ids"])   # the sequences as in the data
            seen.append({"loss": float(loss.detach()[0] if isinstance(loss, tuple) else loss.detach()),
                         "data": fingerprint(tokens), "masks": fingerprint(inputs["input_ids"])})
            return loss

    class StepLog(transformers.TrainerCallback):
        def on_step_end(self, targs, state, control, **kwargs):
            with open(log, "a") as f:
                f.write(json.dumps({"step": state.global_step, "time": time.time(), **seen[-1]}) + "\n")

    targs = transformers.TrainingArguments(
        output_dir=s["out"], max_steps=s["steps"], per_device_train_batch_size=s["batch"], learning_rate=s["lr"],
        lr_scheduler_type="linear", warmup_steps=round(WARMUP * s["steps"]), adam_beta1=BETAS[0], adam_beta2=BETAS[1],
        adam_epsilon=EPS, weight_decay=WEIGHT_DECAY, max_grad_norm=CLIP, save_strategy="steps",
        save_steps=s["checkpoint_every"], logging_steps=10 ** 6, report_to=[], seed=s["seed"], use_cpu=True,
        dataloader_num_workers=0, disable_tqdm=True)
    trainer = Recording(model=model, args=targs, train_dataset=dataset, data_collator=collator,
                        processing_class=tokenizer, callbacks=[StepLog()])
    trainer.train(resume_from_checkpoint=s["resume"])


def start_ours(work, out, cf, ds, args, env, log):
    # one epoch cut at --steps: --max_steps_per_epoch counts the epoch's steps (--max_steps those since
    # the restore), so the same command after a kill ends where the uninterrupted run does
    cmd = trainer_cmd(work, out, cf, ds, "--max_steps_per_epoch", args.steps, "--checkpoint_every_steps",
                      args.checkpoint_every, "--print_steps", 1, "--auto_resume", "--seed", args.seed)
    return subprocess.Popen([str(c) for c in cmd], cwd=REPO, env=env, stdout=open(log, "w"),
                            stderr=subprocess.STDOUT, start_new_session=True)


def start_hf(settings, out, env, resume):
    path = write_json(os.path.join(out, "settings.json"), {**settings, "out": out, "resume": resume})
    return subprocess.Popen([sys.executable, os.path.abspath(__file__), "--hf_worker", path,
                             os.path.join(out, "steps.jsonl")], cwd=REPO, env=env,
                            stdout=open(os.path.join(out, "run.log"), "a"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def finish(proc, what, log):
    if proc.wait():
        raise SystemExit(f"error: the {what} run failed (exit code {proc.returncode}); see {log}")


def kill_all_after(procs, watch, step, allow_end=False):
    """SIGKILL each run's process group once it has logged `step` (or, allow_end, take its end);
    returns {name: last step logged}."""
    killed, deadline = {}, time.time() + 3600
    while len(killed) < len(procs):
        for name, proc in procs.items():
            if name in killed:
                continue
            rows = watch[name]()
            if rows and rows[-1][0] >= step:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                killed[name] = watch[name]()[-1][0]
            elif proc.poll() is not None and allow_end and proc.returncode == 0:
                killed[name] = rows[-1][0] if rows else None
            elif proc.poll() is not None:
                raise SystemExit(f"error: the {name} run ended before step {step} (exit code {proc.returncode})")
        if time.time() > deadline:
            raise SystemExit(f"error: the runs did not reach step {step} in an hour")
        time.sleep(0.05)
    return killed


def speed(rows, batch):
    """samples/s over the steps after the first, and the training seconds at each step."""
    t0 = rows[0][1]
    elapsed = {step: t - t0 for step, t, _ in rows}
    return (len(rows) - 1) * batch / elapsed[rows[-1][0]], elapsed


def speed_while_both_ran(rows, other, batch):
    """samples/s over the steps logged while the other run was training too."""
    lo, hi = max(rows[0][1], other[0][1]), min(rows[-1][1], other[-1][1])
    inside = [t for _, t, _ in rows if lo <= t <= hi]
    return (len(inside) - 1) * batch / (inside[-1] - inside[0]) if len(inside) > 1 else None


def restart_record(rows_after, resumed_from, reference, killed_at):
    """What a kill cost: the steps trained twice and whether the restarted run's losses are the
    uninterrupted run's (max |difference| too). Ours are compared as both runs printed them (6
    decimals: a killed run's TensorBoard file may not be flushed), theirs as the step's float."""
    ref = {step: loss for step, _, loss in reference}
    after = [(step, loss) for step, _, loss in rows_after if step > resumed_from]
    diffs = [abs(loss - ref[step]) for step, loss in after]
    return {"killed_after_step": killed_at, "resumed_from_step": resumed_from,
            "steps_trained_twice": killed_at - resumed_from, "last_step_compared": after[-1][0] if after else None,
            "steps_after_restart": len(after), "losses_equal_uninterrupted": bool(diffs) and max(diffs) == 0.0,
            "max_loss_difference": max(diffs) if diffs else None}


# ---------------------------------------------------------------------------------------------
# Scoring (tools/eval_mlm.py's scorers, in this process)


def validation_subset(scorer, path, most):
    """The validation set's first `most` sequences (all where it has fewer), its own masks."""
    from torch.utils.data import Subset

    from tools import eval_mlm

    dataset = eval_mlm.open_validation_set(scorer, path, SEQ, MAX_PRED, 42)
    return Subset(dataset, range(min(most, len(dataset))))


def validation_curve(checkpoints, validation, vocab_file, most):
    """[(step, validation MLM loss, accuracy)] of each (step, folder), on the set's own masks."""
    from tools import eval_mlm

    curve, dataset = [], None
    for step, folder in checkpoints:
        scorer = eval_mlm.load_scorer(folder, vocab_file)
        dataset = dataset or validation_subset(scorer, validation, most)
        r = eval_mlm.score_validation_set(scorer, validation, dataset)
        curve.append((step, r["loss"], r["accuracy"]))
    return curve


def time_to_loss(curve, elapsed, target):
    """Training seconds at which the curve first reaches `target` (linear between checkpoints)."""
    previous = None
    for step, loss, _ in curve:
        if loss <= target:
            if previous is None or step not in elapsed:
                return elapsed.get(step, 0.0)
            (s0, l0), t1 = previous, elapsed[step]
            t0 = elapsed.get(s0, 0.0)
            return t0 + (t1 - t0) * (l0 - target) / (l0 - loss) if l0 > loss else t1
        previous = (step, loss)
    return None


def bootstrap_pseudo_perplexity(line_lp, line_n, rounds=1000, seed=0):
    import numpy as np

    lp, n = np.asarray(line_lp), np.asarray(line_n)
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(lp), size=(rounds, len(lp)))
    values = np.exp(-lp[picks].sum(1) / n[picks].sum(1))
    return [float(np.percentile(values, 2.5)), float(np.percentile(values, 97.5))]


def quality(folder, vocab_file, domain_validation, general_validation, domain_text, pairs, most):
    """Before/after scores of one model folder."""
    from tools import eval_mlm

    scorer = eval_mlm.load_scorer(folder, vocab_file)
    out = {}
    for name, path in (("domain_validation", domain_validation), ("general_validation", general_validation)):
        r = eval_mlm.score_validation_set(scorer, path, validation_subset(scorer, path, most))
        correct = round(r["accuracy"] * r["masked_tokens"])
        out[name] = {"accuracy": r["accuracy"], "interval": eval_mlm.wilson_interval(correct, r["masked_tokens"]),
                     "loss": r["loss"], "masked_tokens": r["masked_tokens"]}
    lines, windows, _ = eval_mlm.text_windows(scorer, domain_text)
    log_probs, hits = eval_mlm.token_scores(scorer, windows)
    tokens = sum(len(w) for w in windows)
    line_lp, line_n = [float(lp.sum()) for lp in log_probs], [len(w) for w in windows]
    out["domain_text"] = {"lines": len(lines), "tokens": tokens, "accuracy": float(sum(h.sum() for h in hits)) / tokens,
                          "pseudo_perplexity": math.exp(-sum(line_lp) / tokens),
                          "pseudo_perplexity_interval": bootstrap_pseudo_perplexity(line_lp, line_n)}
    summary, _ = eval_mlm.score_pairs(scorer, eval_mlm.read_pairs(pairs))
    out["minimal_pairs"] = {"pairs": summary["pairs"], "accuracy": summary["accuracy"], "interval": summary["ci95"]}
    return out


# ---------------------------------------------------------------------------------------------
# The bench


def tag_step(tag):
    match = re.search(r"step(\d+)$", tag)
    return int(match.group(1)) if match else None


def our_checkpoints(out, job):
    folder = os.path.join(out, "saved_models", job)
    return sorted((tag_step(t), os.path.join(folder, t)) for t in os.listdir(folder) if tag_step(t) is not None
                  and os.path.isdir(os.path.join(folder, t)))


def hf_checkpoints(out):
    return sorted((int(d.split("-")[1]), os.path.join(out, d)) for d in os.listdir(out) if d.startswith("checkpoint-"))


def hf_checkpoint_complete(path):
    """Whether the Trainer finished writing this checkpoint: trainer_state.json is its last file
    (transformers' _save_checkpoint writes it after the weights, optimizer and RNG states; it
    writes no completion marker)."""
    try:
        with open(os.path.join(path, "trainer_state.json")) as f:
            json.load(f)
        return True
    except (OSError, ValueError):
        return False


def restart_hf(settings, out, env, complete):
    """The Trainer's restart as its users type it, trainer.train(resume_from_checkpoint=True),
    which takes the newest checkpoint folder. Where the kill cut that folder short, that start
    fails (it reads the missing trainer_state.json), is run to see it, and the restart is then
    the one a user makes next: resume_from_checkpoint= the newest complete checkpoint's path
    (none: from the stock model). Returns (the started process, how it was restarted)."""
    checkpoints = hf_checkpoints(out)
    newest = checkpoints[-1][1] if checkpoints else None
    if newest is None or hf_checkpoint_complete(newest):
        return start_hf(settings, out, env, True), "trainer.train(resume_from_checkpoint=True)"
    first = start_hf(settings, out, env, True)
    if first.wait() == 0:
        return first, "trainer.train(resume_from_checkpoint=True), although the kill had cut its newest checkpoint short"
    error = ([line for line in open(os.path.join(out, "run.log")).read().splitlines() if line.strip()] or ["?"])[-1]
    fallback = complete[-1][1] if complete else False
    how = (f"trainer.train(resume_from_checkpoint=True) failed on {os.path.basename(newest)}, which the kill had cut "
           f"short ({error[:160]}); then resume_from_checkpoint="
           + (os.path.basename(fallback) if fallback else "False (no complete checkpoint: from the start)"))
    return start_hf(settings, out, env, fallback), how


def fresh(folder):
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    return folder


def main(argv=None):
    args = parse_args(argv)
    if args.hf_worker:
        return hf_worker(*args.hf_worker)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    import transformers

    kill_at = args.kill_at or args.checkpoint_every * 3 // 2
    if args.steps % args.checkpoint_every:
        raise SystemExit(f"error: --steps {args.steps} must be a multiple of --checkpoint_every "
                         f"({args.checkpoint_every}), so that both runs have a checkpoint at their last step")
    if not args.checkpoint_every <= kill_at < args.steps:
        raise SystemExit(f"error: --kill_at {kill_at} must be at least --checkpoint_every ({args.checkpoint_every}) "
                         f"and below --steps ({args.steps}), so that a checkpoint is there to restart from")
    work = os.path.abspath(args.work)
    base = os.path.join(work, "continued")
    os.makedirs(base, exist_ok=True)
    env = child_env(args.threads)
    load_start = load_average()
    started = time.time()
    general, pairs = general_data(work, args.general and os.path.abspath(args.general), args.pairs_per_kind, env)
    stock = stock_model(args, work, general, child_env(2))   # alone on the machine's cores
    domain = domain_data(args, work, stock, env)
    samples = sum(1 for _ in training_sequences(os.path.join(domain["folder"], "train")))
    if samples < args.steps * args.batch:
        raise SystemExit(f"error: the domain training set has {samples} sequences, fewer than --steps x --batch "
                         f"({args.steps * args.batch}); give more --domain_mb or fewer --steps")
    vocab = os.path.join(stock, "vocab.txt")
    tokenizer = transformers.BertTokenizerFast(vocab_file=vocab, do_lower_case=True)
    text = heldout_text(domain["folder"], os.path.join(base, "domain_heldout.txt"), args.domain_text_tokens,
                        tokenizer.tokenize)
    train_rel = os.path.relpath(os.path.join(domain["folder"], "train"), work)
    runs = os.path.join(base, "runs")
    fresh(runs)
    cf = job_config(os.path.join(runs, "job.json"), "continued", stock, train_rel, args.steps, args.lr)
    ds = ds_config(os.path.join(runs, "ds.json"), args.batch, args.lr)
    hf_settings = {"stock": stock, "train": os.path.join(domain["folder"], "train"), "steps": args.steps,
                   "batch": args.batch, "lr": args.lr, "checkpoint_every": args.checkpoint_every,
                   "seed": args.seed, "threads": args.threads}

    logger.info("ours and the Hugging Face Trainer side by side: %d steps of %d, %d thread(s) each", args.steps,
                args.batch, args.threads)
    ours_out, hf_out = fresh(os.path.join(runs, "ours")), fresh(os.path.join(runs, "hf"))
    ours_proc = start_ours(work, ours_out, cf, ds, args, env, os.path.join(ours_out, "run.log"))
    hf_proc = start_hf(hf_settings, hf_out, env, False)
    finish(ours_proc, "ours", ours_out)
    finish(hf_proc, "Hugging Face", hf_out)
    ours_rows, hf_rows = ours_losses(ours_out, "continued", args.batch), hf_losses(os.path.join(hf_out, "steps.jsonl"))
    for what, rows in (("ours", ours_rows), ("Hugging Face", hf_rows)):
        if [r[0] for r in rows] != list(range(1, args.steps + 1)):
            raise SystemExit(f"error: the {what} run logged steps {[r[0] for r in rows][:5]}..., not 1..{args.steps}")
    ours_speed, ours_elapsed = speed(ours_rows, args.batch)
    hf_speed, hf_elapsed = speed(hf_rows, args.batch)
    both = {"ours": speed_while_both_ran(ours_rows, hf_rows, args.batch),
            "hf": speed_while_both_ran(hf_rows, ours_rows, args.batch)}
    both["ours_over_hf"] = both["ours"] / both["hf"] if both["ours"] and both["hf"] else None

    logger.info("both again, killed after step %d and restarted", kill_at)
    ours_kill, hf_kill = fresh(os.path.join(runs, "ours_killed")), fresh(os.path.join(runs, "hf_killed"))
    ours_log, hf_log = os.path.join(ours_kill, "killed.log"), os.path.join(hf_kill, "steps.jsonl")
    procs = {"ours": start_ours(work, ours_kill, cf, ds, args, env, ours_log),
             "hf": start_hf(hf_settings, hf_kill, env, False)}
    watch = {"ours": lambda: ours_progress(ours_log), "hf": lambda: hf_losses(hf_log)}
    killed = kill_all_after(procs, watch, kill_at)
    from turing.checkpoint_files import complete_tags

    hf_complete = [(step, path) for step, path in hf_checkpoints(hf_kill) if hf_checkpoint_complete(path)]
    resumed_from = {"ours": max([tag_step(t) for t in complete_tags(os.path.join(ours_kill, "saved_models",
                                                                                 "continued"))], default=0),
                    "hf": hf_complete[-1][0] if hf_complete else 0}
    hf_before = len(open(hf_log).read().splitlines())
    restarted_log = os.path.join(ours_kill, "restarted.log")
    hf_proc, hf_how = restart_hf(hf_settings, hf_kill, env, hf_complete)
    procs = {"ours": start_ours(work, ours_kill, cf, ds, args, env, restarted_log), "hf": hf_proc}
    watch = {"ours": lambda: ours_progress(restarted_log),
             "hf": lambda: hf_losses(hf_log, hf_before)}
    # each restarted run is stopped AFTER steps past the step it had reached (or ends first)
    kill_all_after(procs, watch, max(killed.values()) + AFTER, allow_end=True)
    reference = {"ours": ours_progress(os.path.join(ours_out, "run.log")), "hf": hf_rows}
    restarts = {who: {**restart_record(watch[who](), resumed_from[who], reference[who], killed[who]), "how": how}
                for who, how in (("ours", "the same command, with --auto_resume"), ("hf", hf_how))}
    uninterrupted = {r["step"]: r for r in hf_steps(os.path.join(hf_out, "steps.jsonl"))}
    restarted = [r for r in hf_steps(hf_log, hf_before) if r["step"] > resumed_from["hf"]]
    restarts["hf"].update({f"same_{key}_after_restart": all(r[field] == uninterrupted[r["step"]][field]
                                                            for r in restarted)
                           for key, field in (("sequences", "data"), ("masks", "masks"))})

    logger.info("scoring the checkpoints")
    domain_val = os.path.join(domain["folder"], "validation")
    ours_curve, hf_curve = (validation_curve([(0, stock)] + checkpoints, domain_val, vocab, args.validation_sequences)
                            for checkpoints in (our_checkpoints(ours_out, "continued"), hf_checkpoints(hf_out)))
    target = max(ours_curve[-1][1], hf_curve[-1][1])
    ours_time, hf_time = time_to_loss(ours_curve, ours_elapsed, target), time_to_loss(hf_curve, hf_elapsed, target)
    general_val = os.path.join(general, "validation")
    scores = {name: quality(folder, vocab, domain_val, general_val, text, pairs, args.validation_sequences)
              for name, folder in
              (("stock", stock), ("ours", our_checkpoints(ours_out, "continued")[-1][1]),
               ("hf", hf_checkpoints(hf_out)[-1][1]))}
    record = {"bench": "continued", "time": time.strftime("%Y-%m-%d %H:%M:%S"), "machine": machine_description(),
              "transformers": transformers.__version__, "settings": {k: v for k, v in vars(args).items()
                                                                      if k not in ("hf_worker", "output", "work")},
              "kill_at": kill_at, "domain": domain, "stock": stock, "training_sequences": samples,
              "samples_per_s": {"ours": ours_speed, "hf": hf_speed, "ours_over_hf": ours_speed / hf_speed},
              "samples_per_s_while_both_ran": both,
              "curves": {"ours": ours_curve, "hf": hf_curve}, "target_loss": target,
              "seconds_to_target": {"ours": ours_time, "hf": hf_time,
                                    "hf_over_ours": hf_time / ours_time if ours_time and hf_time else None},
              "restart": restarts, "quality": scores, "loadavg_start": load_start, "loadavg_end": load_average(),
              "wall_minutes": round((time.time() - started) / 60, 1)}
    print("\n".join(report(record)))
    append_json_lines(args.output, [record])
    print(json.dumps(record))
    return 0


def ours_progress(log):
    """[(step, None, loss)] of the progress lines in our run's log (to watch it while it runs)."""
    return [(int(m.group(1)), None, float(m.group(2))) for m in PROGRESS.finditer(open(log).read())] \
        if os.path.isfile(log) else []


def report(r):
    sp, st, q = r["samples_per_s"], r["seconds_to_target"], r["quality"]

    def secs(x):
        return "not reached" if x is None else f"{x:.1f} s"

    def acc(e):
        return f"{100 * e['accuracy']:.1f} [{100 * e['interval'][0]:.1f}, {100 * e['interval'][1]:.1f}]"
    both = r["samples_per_s_while_both_ran"]
    lines = [f"samples/s: ours {sp['ours']:.1f}, Hugging Face Trainer {sp['hf']:.1f}, ratio {sp['ours_over_hf']:.2f}x"
             + (f" (while both ran: {both['ours']:.1f} and {both['hf']:.1f}, {both['ours_over_hf']:.2f}x)"
                if both["ours_over_hf"] else ""),
             f"training time to validation MLM loss {r['target_loss']:.3f}: ours {secs(st['ours'])}, "
             f"Hugging Face {secs(st['hf'])}"]
    for who, x in r["restart"].items():
        lines.append(f"killed after step {x['killed_after_step']}, restarted ({x['how']}): {who} resumed from step "
                     f"{x['resumed_from_step']} ({x['steps_trained_twice']} steps trained twice), losses after it "
                     f"{'equal to' if x['losses_equal_uninterrupted'] else 'differ from'} the uninterrupted run's "
                     f"(max |diff| {x['max_loss_difference']})")
    lines.append("| model | domain val. MLM acc. % [95%] (loss) | domain text acc. % | domain pseudo-ppl [95%] | "
                 "general val. MLM acc. % [95%] (loss) | minimal pairs % [95%] |")
    lines.append("|---|---|---|---|---|---|")
    for name in ("stock", "ours", "hf"):
        s = q[name]
        lo, hi = s["domain_text"]["pseudo_perplexity_interval"]
        lines.append(f"| {name} | {acc(s['domain_validation'])} ({s['domain_validation']['loss']:.3f}) | "
                     f"{100 * s['domain_text']['accuracy']:.1f} | "
                     f"{s['domain_text']['pseudo_perplexity']:.1f} [{lo:.1f}, {hi:.1f}] | "
                     f"{acc(s['general_validation'])} ({s['general_validation']['loss']:.3f}) | "
                     f"{acc(s['minimal_pairs'])} |")
    return lines


if __name__ == "__main__":
    sys.exit(main())
