"""No checkpoint file runs code: a real checkpoint with an object added whose unpickling calls
os.system (as a crafted file would) is refused in one line, and the command never runs, on
--auto_resume, on --load_training_checkpoint, in a ZeRO optimizer-state file, on the way to
another number of ranks (the universal conversion) and in tools.export_hf. A file with a
harmless object beyond the weights-only allowlist loads only with --trust_checkpoint."""
import argparse
import os
import shutil

import pytest
import torch

from tests.launch import ds_config, expect_input_error, launch, tiny_args, train_in_process
from tools import export_hf
from turing.checkpoint_files import weights_only_loads

JOB = "tiny_bert"


class RunsCommand:
    """Unpickled, it runs `touch MARKER`: what a crafted checkpoint does."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def add_object(path, obj, key="extra"):
    saved = torch.load(path, map_location="cpu", weights_only=False)
    saved[key] = obj
    torch.save(saved, path)


@pytest.fixture(scope="module")
def trained(data_root, tmp_path_factory):
    """Two runs stopped at step 2 on 1 rank: a plain one (epoch1_step2, 2 steps an epoch) and one
    with ZeRO stage 2 (step2)."""
    root = tmp_path_factory.mktemp("trained")
    train_in_process(data_root, root / "plain", ds_config(root / "ds"), "--max_steps_per_epoch", 2, "--max_steps", 2)
    train_in_process(data_root, root / "zero2", ds_config(root / "ds_zero", zero_optimization={"stage": 2}),
                     "--max_steps", 2)
    return root


def crafted_copy(src, dst, file_name, marker):
    shutil.copytree(src, dst)
    tag = open(dst / "saved_models" / JOB / "latest").read().strip()
    add_object(dst / "saved_models" / JOB / tag / file_name, RunsCommand(marker))
    return dst / "saved_models" / JOB / tag


def test_auto_resume_refuses_a_checkpoint_that_would_run_code(trained, data_root, tmp_path, capsys):
    marker = tmp_path / "code_ran"
    folder = crafted_copy(trained / "plain", tmp_path / "out", "mp_rank_00_model_states.pt", marker)
    line = expect_input_error(capsys, train_in_process, data_root, tmp_path / "out", ds_config(tmp_path),
                              "--auto_resume", "--max_steps_per_epoch", 2)
    assert f"{folder}/mp_rank_00_model_states.pt: does not load with torch.load(weights_only=True)" in line
    assert "posix.system" in line and "--trust_checkpoint" in line
    assert not marker.exists()


def test_load_training_checkpoint_refuses_it_too(trained, data_root, tmp_path, capsys):
    marker = tmp_path / "code_ran"
    folder = crafted_copy(trained / "plain", tmp_path / "src", "mp_rank_00_model_states.pt", marker)
    line = expect_input_error(capsys, train_in_process, data_root, tmp_path / "out", ds_config(tmp_path),
                              "--load_training_checkpoint", str(folder.parent), "--load_checkpoint_id", folder.name)
    assert "does not load with torch.load(weights_only=True)" in line and not marker.exists()


def test_a_zero_optimizer_state_file_is_checked_too(trained, data_root, tmp_path, capsys):
    marker = tmp_path / "code_ran"
    folder = crafted_copy(trained / "zero2", tmp_path / "out", "zero_pp_rank_0_mp_rank_00_optim_states.pt", marker)
    ds = ds_config(tmp_path, zero_optimization={"stage": 2})
    line = expect_input_error(capsys, train_in_process, data_root, tmp_path / "out", ds, "--auto_resume")
    assert f"{folder}/zero_pp_rank_0_mp_rank_00_optim_states.pt: does not load" in line and not marker.exists()


def test_the_conversion_for_another_number_of_ranks_refuses_it(trained, data_root, tmp_path):
    """1 rank's ZeRO checkpoint resumed on 2 ranks goes through DeepSpeed's ds_to_universal,
    which unpickles in full: the file is refused before it runs."""
    marker = tmp_path / "code_ran"
    crafted_copy(trained / "zero2", tmp_path / "out", "zero_pp_rank_0_mp_rank_00_optim_states.pt", marker)
    ds = ds_config(tmp_path, zero_optimization={"stage": 2}, train_micro_batch_size_per_gpu=8)
    run = launch(tiny_args(data_root, tmp_path / "out", 128, "--deepspeed_config", ds, "--auto_resume"), num_ranks=2)
    assert run.returncode != 0 and "does not load with torch.load(weights_only=True)" in run.stderr
    assert not marker.exists() and not (tmp_path / "out" / "saved_models" / JOB / "universal").exists()


def test_export_refuses_it_unless_trusted(trained, tmp_path, capsys):
    marker = tmp_path / "code_ran"
    folder = crafted_copy(trained / "plain", tmp_path / "src", "mp_rank_00_model_states.pt", marker)
    assert export_hf.main(["--checkpoint_dir", str(folder), "--output_dir", str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err
    assert "does not load with torch.load(weights_only=True)" in err and "Traceback" not in err
    assert not marker.exists() and not (tmp_path / "hf").exists()


def test_trust_checkpoint_loads_a_harmless_object_beyond_the_allowlist(trained, data_root, tmp_path, capsys):
    """An argparse Namespace in the client state, as older DeepSpeed versions saved: refused by
    default, resumed and exported with --trust_checkpoint."""
    shutil.copytree(trained / "plain", tmp_path / "out")
    folder = tmp_path / "out" / "saved_models" / JOB / open(trained / "plain" / "saved_models" / JOB / "latest").read()
    add_object(folder / "mp_rank_00_model_states.pt", argparse.Namespace(lr=1.0), key="args")
    ds = ds_config(tmp_path)
    line = expect_input_error(capsys, train_in_process, data_root, tmp_path / "out", ds, "--auto_resume",
                              "--max_steps_per_epoch", 2)
    assert "argparse.Namespace" in line
    state = train_in_process(data_root, tmp_path / "out", ds, "--auto_resume", "--max_steps_per_epoch", 2,
                             "--max_steps", 1, "--trust_checkpoint")
    assert state.global_step == 3
    assert export_hf.main(["--checkpoint_dir", str(folder), "--output_dir", str(tmp_path / "hf"),
                           "--trust_checkpoint"]) == 0


def test_inside_weights_only_loads_even_a_full_unpickle_request_is_weights_only(tmp_path):
    """What DeepSpeed's readers run under: torch.load(weights_only=False) builds no object beyond
    the allowlist, so a file changed after the check cannot run code either."""
    marker = tmp_path / "code_ran"
    torch.save({"w": torch.ones(2), "extra": RunsCommand(marker)}, tmp_path / "f.pt")
    with weights_only_loads(), pytest.raises(Exception, match="posix.system"):
        torch.load(tmp_path / "f.pt", weights_only=False)
    assert not marker.exists() and "TORCH_FORCE_WEIGHTS_ONLY_LOAD" not in os.environ
