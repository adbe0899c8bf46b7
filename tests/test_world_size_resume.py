"""Resuming inside an epoch on another batch layout: another number of ranks (2 -> 1, 1 -> 2),
micro batch or accumulation, the global batch kept. Every sample of the interrupted epoch is trained
exactly once (recorded per micro batch, both providers); the global step, sample count and LR
schedule continue."""
import collections
import json
import os

import pytest

import bing_bert_dataset_provider
import deepspeed_train
import nvidia_bert_dataset_provider
from bert_dataset_provider import EpochPlan
from tests.launch import launch, progress, tiny_args, tiny_argv
from testkit.launcher import TINY_CFG, TINY_DS
from turing.job_config import TrainingSection
from turing.lr_schedule import lr_factor
from turing.tb_events import read_run


def open_provider(kind, data_root, layout, rank, monkeypatch):
    """The provider of `kind` as rank `rank` of `layout` (ranks, micro batch, accumulation) sees it."""
    for module in (nvidia_bert_dataset_provider, bing_bert_dataset_provider):
        monkeypatch.setattr(module, "get_rank_and_world", lambda: (rank, layout.world))
    args = deepspeed_train.construct_arguments(tiny_argv(data_root, "unused", nvidia=kind == "nvidia"))
    args.train_micro_batch_size_per_gpu, args.gradient_accumulation_steps = layout.micro_batch, layout.grad_accum
    return deepspeed_train.build_provider(args)


def samples_per_rank(kind, data_root, layout, monkeypatch, start_batch=0, plan=None):
    """[rank] -> the samples (their masked tokens and labels) of each micro batch rank `rank` runs in
    epoch 0 from `start_batch` on, cut to the shortest rank's count as the step loop does."""
    ranks = []
    for rank in range(layout.world):
        provider = open_provider(kind, data_root, layout, rank, monkeypatch)
        try:
            refs, _ = provider.get_shard(0, start_batch=start_batch, **({"plan": plan} if plan else {}))
            micro_batches = []
            for ref in refs:                                       # as the step loop drives it
                b = provider.get_batch(ref)
                provider.prefetch_batch()
                micro_batches.append([(b.input_ids[i].numpy().tobytes(), b.masked_lm_labels[i].numpy().tobytes())
                                      for i in range(len(b.input_ids))])
            ranks.append(micro_batches)
        finally:
            provider.close()
    count = min(len(r) for r in ranks)
    assert all(len(micro) == layout.micro_batch for r in ranks for micro in r)
    return [r[:count] for r in ranks]


@pytest.mark.parametrize("kind", ["nvidia", "bing"])
@pytest.mark.parametrize("before, after", [((2, 16, 1), (1, 16, 2)), ((1, 32, 1), (2, 16, 1)),
                                           ((2, 16, 1), (2, 8, 2)), ((1, 16, 2), (2, 8, 2))],
                         ids=["2to1", "1to2", "micro_and_accum", "1to2_accum"])
def test_every_sample_of_the_interrupted_epoch_once(kind, before, after, data_root, monkeypatch):
    before, after = EpochPlan(*before), EpochPlan(*after)
    epoch = samples_per_rank(kind, data_root, before, monkeypatch)    # the uninterrupted epoch
    steps = len(epoch[0]) // before.grad_accum
    assert steps >= 2
    done = 1                                                          # optimizer steps before the stop
    trained = [s for r in epoch for micro in r[:done * before.grad_accum] for s in micro]
    resumed = samples_per_rank(kind, data_root, after, monkeypatch, start_batch=done * after.grad_accum,
                               plan=before)
    assert len(resumed[0]) == (steps - done) * after.grad_accum       # the same number of steps left
    # step by step, the same samples as the uninterrupted run's step
    for step in range(steps - done):
        theirs = [s for r in epoch for micro in r[(done + step) * before.grad_accum:(done + step + 1) *
                                                   before.grad_accum] for s in micro]
        ours = [s for r in resumed for micro in r[step * after.grad_accum:(step + 1) * after.grad_accum]
                for s in micro]
        assert collections.Counter(ours) == collections.Counter(theirs)
    trained += [s for r in resumed for micro in r for s in micro]
    everything = collections.Counter(s for r in epoch for micro in r for s in micro)
    assert collections.Counter(trained) == everything                 # each once: none repeated, none skipped


def lr_at(step):
    """The tiny job config's learning rate at optimizer step `step` (LE schedule)."""
    training = TrainingSection.from_dict(json.load(open(TINY_CFG))["mixed_seq_training"]["128"])
    return training.learning_rate * lr_factor("LE", step, training)


def in_process(data_root, out, ds, *extra, nvidia=True):
    """A one-rank run in this process; returns the scalars of the job's TensorBoard folder."""
    deepspeed_train.main(tiny_argv(data_root, out, "--print_steps", 1, "--log_level", "warning", *extra, ds=ds,
                                   nvidia=nvidia))
    values, _ = read_run(os.path.join(out, "runs", "tiny_bert"))
    return values


def tags(out):
    return sorted(os.listdir(os.path.join(out, "saved_models", "tiny_bert")))


def test_two_ranks_resumed_on_one(data_root, tmp_path):
    """NVIDIA shards: 2 ranks x micro 16 stop after 2 of the epoch's 4 steps; one rank x micro 16 x
    accumulation 2 finishes the epoch (its 2 steps read the other rank's shard too) and runs the next."""
    first = launch(tiny_args(data_root, tmp_path, 128, "--print_steps", 1, "--max_steps", 2), num_ranks=2)
    assert first.returncode == 0, first.stderr[-3000:]
    values = in_process(data_root, tmp_path, accum2(tmp_path), "--auto_resume")
    steps = [s for s, _ in values["Train/lr"]]         # both runs' (one TensorBoard folder)
    assert steps == [1, 2, 3, 4, 5, 6]                 # epoch 1's last 2 steps, then epoch 2 on one shard
    assert [v for _, v in values["Train/lr"]] == pytest.approx([lr_at(s - 1) for s in steps])
    assert [s for s, _ in values["Train/Samples/lr"]] == [32, 64, 96, 128, 160, 192]
    assert tags(tmp_path) == ["epoch1_step4", "epoch2_step6", "latest", "step2"]


def accum2(tmp_path):
    """The tiny DeepSpeed config with gradient accumulation 2: one rank, the global batch of two."""
    ds = tmp_path / "accum2.json"
    ds.write_text(json.dumps({**json.load(open(TINY_DS)), "gradient_accumulation_steps": 2}))
    return ds


def test_one_rank_resumed_on_two(data_root, tmp_path):
    """Bing shards: one rank x micro 16 x accumulation 2 stops after 1 of the epoch's 4 steps; two
    ranks x micro 16 finish it and run the next epoch."""
    in_process(data_root, tmp_path, accum2(tmp_path), "--max_steps", 1, nvidia=False)
    run = launch(tiny_args(data_root, tmp_path, 128, "--print_steps", 1, "--auto_resume", nvidia=False), num_ranks=2)
    assert run.returncode == 0, run.stderr[-3000:]
    rows = progress(run.stdout + run.stderr)
    assert [r[0] for r in rows] == list(range(2, 9))
    assert [r[2] for r in rows] == pytest.approx([lr_at(s - 1) for s in range(2, 9)], rel=1e-5)
    assert [r[3] for r in rows] == [32 * s for s in range(2, 9)]
    assert tags(tmp_path) == ["epoch1_step4", "epoch2_step8", "latest", "step1"]
