"""Never lose a run: exact resume (both providers, mid-epoch and at an epoch boundary),
interval checkpoints and pruning, incomplete checkpoints, non-finite losses."""
import os

import pytest
import torch

import deepspeed_train
from tests.launch import tiny_argv
from turing.checkpoint_files import COMPLETE_MARKER, complete_tags, resume_candidates
from turing.errors import InputError
from turing.modeling import BertForPreTrainingPreLN
from turing.tb_events import read_run


def train(data_root, out, provider, *extra):
    """Run the real entry point in-process; returns the run's per-step training losses."""
    deepspeed_train.main(tiny_argv(data_root, out, "--print_steps", 1, "--log_level", "warning", *extra,
                                   nvidia=provider == "nvidia"))
    return losses(out)


def losses(out):
    return read_run(os.path.join(out, "runs", "tiny_bert"))[0]["Train/Samples/train_loss"]


def tags(out):
    return sorted(os.listdir(os.path.join(out, "saved_models", "tiny_bert")))


# wiki and bc both read the two shards in the Bing config: twice the micro-batches per epoch
STEPS_PER_EPOCH = {"nvidia": 4, "bing": 8}


@pytest.fixture(scope="module")
def reference(data_root, tmp_path_factory):
    return {p: train(data_root, tmp_path_factory.mktemp(f"ref_{p}"), p) for p in ("nvidia", "bing")}


@pytest.mark.parametrize("provider", ["nvidia", "bing"])
def test_resume_mid_epoch_gives_identical_losses(provider, data_root, reference, tmp_path):
    assert len(reference[provider]) == 2 * STEPS_PER_EPOCH[provider]
    train(data_root, tmp_path, provider, "--max_steps", 3, "--checkpoint_every_steps", 2)
    assert "step2" in tags(tmp_path) and "step3" in tags(tmp_path)   # interval + the stop's own
    assert open(tmp_path / "saved_models" / "tiny_bert" / "latest").read() == "step3"
    train(data_root, tmp_path, provider, "--auto_resume")
    assert losses(tmp_path) == reference[provider]                   # bit for bit, (samples, loss)


@pytest.mark.parametrize("provider", ["nvidia", "bing"])
def test_resume_at_epoch_boundary_gives_identical_losses(provider, data_root, reference, tmp_path):
    steps = STEPS_PER_EPOCH[provider]
    train(data_root, tmp_path, provider, "--max_steps", steps)
    assert tags(tmp_path) == [f"epoch1_step{steps}", "latest"]
    train(data_root, tmp_path, provider, "--auto_resume")
    assert losses(tmp_path) == reference[provider]


def test_the_same_command_with_stop_at_step_ends_where_the_uninterrupted_run_ends(data_root, reference, tmp_path,
                                                                                  capsys):
    """--stop_at_step counts the global step over every session, so the command a user re-runs
    after a kill ends at the same step (--max_steps, the original's flag, counts since the restore:
    it would train that many again), and once there it has nothing to do."""
    command = ("--stop_at_step", 6, "--checkpoint_every_steps", 2, "--auto_resume")
    train(data_root, tmp_path, "nvidia", *command, "--max_steps", 3)    # a session that ended early
    assert losses(tmp_path) == reference["nvidia"][:3]
    assert train(data_root, tmp_path, "nvidia", *command) == reference["nvidia"][:6]
    assert open(tmp_path / "saved_models" / "tiny_bert" / "latest").read() == "step6"
    capsys.readouterr()
    train(data_root, tmp_path, "nvidia", *command)
    assert "Nothing to do: the run reached --stop_at_step 6 (global step 6)" in capsys.readouterr().err
    assert losses(tmp_path) == reference["nvidia"][:6]
    train(data_root, tmp_path, "nvidia", "--stop_at_step", 8, "--auto_resume")
    assert losses(tmp_path) == reference["nvidia"]                       # bit for bit, to the last step


def test_resume_from_an_older_interval_checkpoint(data_root, reference, tmp_path):
    first = tmp_path / "first"
    train(data_root, first, "nvidia", "--checkpoint_every_steps", 2, "--max_steps", 6)
    again = tmp_path / "again"
    rest = train(data_root, again, "nvidia", "--load_training_checkpoint", first / "saved_models" / "tiny_bert",
                 "--load_checkpoint_id", "step2")
    assert rest == reference["nvidia"][2:]


def test_auto_resume_without_checkpoint_starts_fresh(data_root, reference, tmp_path):
    assert train(data_root, tmp_path, "nvidia", "--auto_resume") == reference["nvidia"]


def test_keep_last_interval_checkpoints(data_root, tmp_path):
    train(data_root, tmp_path, "nvidia", "--checkpoint_every_steps", 1, "--keep_last_checkpoints", 2)
    # interval tags at steps 1-3 and 5-7 (epoch ends have their own); the newest two remain
    assert tags(tmp_path) == ["epoch1_step4", "epoch2_step8", "latest", "step6", "step7"]


def test_incomplete_checkpoint_falls_back_to_previous(tmp_path, caplog):
    path = tmp_path / "ckpts"
    for tag in ("step2", "step4"):
        (path / tag).mkdir(parents=True)
        torch.save({}, path / tag / "mp_rank_00_model_states.pt")
        (path / tag / COMPLETE_MARKER).write_text("{}")
    (path / "step6").mkdir()
    (path / "step6" / "mp_rank_00_model_states.pt").write_bytes(b"half written")
    (path / "latest").write_text("step6")
    assert complete_tags(str(path)) == ["step2", "step4"]
    assert resume_candidates(str(path), "latest") == ["step4", "step2"]
    assert "incomplete" in caplog.text and "Resuming from" in caplog.text and "step4" in caplog.text
    with pytest.raises(InputError, match="checkpoint tag 'step9' not found.*step2, step4, step6"):
        resume_candidates(str(path), "step9")


def _poisoned_forward(bad_calls):
    """The model's forward, returning NaN on the listed (1-based) micro-batch calls."""
    original = BertForPreTrainingPreLN.forward
    calls = {"n": 0}

    def forward(self, batch, **kwargs):
        calls["n"] += 1
        loss = original(self, batch, **kwargs)
        return loss * float("nan") if calls["n"] in bad_calls else loss
    return forward


def _module_weights(folder):
    state = torch.load(os.path.join(folder, "mp_rank_00_model_states.pt"), map_location="cpu", weights_only=False)
    return state["module"]


def test_nonfinite_loss_skips_step_then_stops_with_last_good_state(data_root, reference, tmp_path, monkeypatch):
    good = tmp_path / "good"
    train(data_root, good, "nvidia", "--checkpoint_every_steps", 2, "--max_steps", 2)
    monkeypatch.setattr(BertForPreTrainingPreLN, "forward", _poisoned_forward(bad_calls=set(range(3, 100))))
    bad = tmp_path / "bad"
    with pytest.raises(SystemExit) as stop:
        train(data_root, bad, "nvidia", "--max_nonfinite_steps", 3)
    assert stop.value.code == 3
    # steps 3-4 of epoch 1 skipped (epoch checkpoint at global step 2), the first of epoch 2 too
    assert tags(bad) == ["epoch1_step2", "latest", "step2"]
    before, after = _module_weights(good / "saved_models" / "tiny_bert" / "step2"), \
        _module_weights(bad / "saved_models" / "tiny_bert" / "step2")
    assert all(torch.equal(before[k], after[k]) for k in before)      # skipped steps moved nothing
    scalars = read_run(os.path.join(bad, "runs", "tiny_bert"))[0]
    assert [v for _, v in scalars["Train/nonfinite_steps"]] == [1, 2, 3]
    assert losses(bad) == reference["nvidia"][:2]


def test_single_nonfinite_step_is_skipped_and_training_goes_on(data_root, tmp_path, monkeypatch):
    monkeypatch.setattr(BertForPreTrainingPreLN, "forward", _poisoned_forward(bad_calls={2}))
    run = train(data_root, tmp_path, "nvidia")
    assert len(run) == 7                       # 8 micro-batches, one step skipped
    assert all(v == v for _, v in run)         # no NaN reached the logged losses


def test_no_checkpoint_is_written_from_nonfinite_weights(data_root, tmp_path, capsys):
    """An LR offset too large for fp32 (1e39) makes every weight infinite in one step while that
    step's loss is still finite: the interval checkpoint after it is not written, the run stops
    (exit 3) naming the newest checkpoint, whose weights are finite, and a resume from there
    trains on finite weights."""
    train(data_root, tmp_path, "nvidia", "--max_steps", 2, "--checkpoint_every_steps", 1)
    with pytest.raises(SystemExit) as stop:
        train(data_root, tmp_path, "nvidia", "--auto_resume", "--checkpoint_every_steps", 1, "--lr_offset", "1e39")
    assert stop.value.code == 3
    err = capsys.readouterr().err
    assert "parameters are not finite at global step 3" in err and "checkpoint step3 not written" in err
    assert "the newest checkpoint, step2, holds finite weights" in err
    assert tags(tmp_path) == ["latest", "step1", "step2"]
    assert open(tmp_path / "saved_models" / "tiny_bert" / "latest").read() == "step2"
    weights = _module_weights(tmp_path / "saved_models" / "tiny_bert" / "step2")
    assert all(torch.isfinite(v).all() for v in weights.values() if v.is_floating_point())
    train(data_root, tmp_path, "nvidia", "--auto_resume", "--max_steps", 1)
    assert all(v == v for _, v in losses(tmp_path))


def test_a_checkpoint_whose_run_state_cannot_be_a_position_is_passed_over(data_root, tmp_path, capsys):
    """A client state saying step -1000 (or nan seconds of training) would train at a negative LR
    (or never let --max_train_hours stop the run): that checkpoint is passed over with a warning,
    as a damaged one is, and the run resumes from the one before it."""
    train(data_root, tmp_path, "nvidia", "--max_steps", 2, "--checkpoint_every_steps", 1)
    states = tmp_path / "saved_models" / "tiny_bert" / "step2" / "mp_rank_00_model_states.pt"
    saved = torch.load(states, weights_only=False)
    saved["last_global_step"] = -1000
    torch.save(saved, states)
    capsys.readouterr()
    train(data_root, tmp_path, "nvidia", "--auto_resume", "--max_steps", 1)
    err = capsys.readouterr().err
    assert "step2 cannot be loaded (its client state holds last_global_step -1000: expected a whole number >= 0)" in err
    assert "step1 instead of step2" in err
    assert tags(tmp_path)[-1] == "step2" and "step-999" not in "".join(tags(tmp_path))
