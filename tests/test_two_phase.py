"""The original's recipe as shipped: the launch scripts' exact flags, the two-phase run (phase 2
re-warms once, a resumed phase 2 continues its warmup), and every script's configs read and
refused on this CPU machine with one line where they need CUDA.

The scripts are run for real with a stand-in `deepspeed` on PATH that records the command
line; the recorded flags then go to deepspeed_train.main in this process, with the tiny job
and DeepSpeed configs in place of the GPU ones (BERT-large, fp16).
"""
import json
import os
import subprocess

import pytest

import deepspeed_train
from tests.launch import REPO, TINY_CFG, TINY_DS
from testkit.synthetic import make_data_root
from turing.tb_events import read_run

SCRIPTS = os.path.join(REPO, "scripts")


@pytest.fixture(scope="module")
def two_phase_data(tmp_path_factory):
    """Tiny shards at seq 128 and 512: 4 Bing micro-batches of 16 per epoch at either length."""
    root = tmp_path_factory.mktemp("two_phase_data")
    make_data_root(str(root), seq_lengths=(128, 512), n_train=64, shards=2, n_valid=16)
    return root


def script_command(tmp_path, script, data, out, *extra, **env):
    """The deepspeed_train.py flags `scripts/<script> DATA OUT extra...` launches, as a list; the
    stand-in launcher records them instead of starting ranks."""
    stub = tmp_path / "bin"
    stub.mkdir(exist_ok=True)
    (stub / "deepspeed").write_text('#!/usr/bin/env bash\nprintf "%s\\n" "$PWD" "$@" > "$ARGV_FILE"\n')
    (stub / "deepspeed").chmod(0o755)
    record = tmp_path / "argv.txt"
    env = {**os.environ, "PATH": f"{stub}{os.pathsep}{os.environ['PATH']}", "ARGV_FILE": str(record),
           "HOSTFILE": "", "LAUNCHER_ARGS": "", "REQUIRE_CUDA": "0", **env}
    subprocess.run(["bash", os.path.join(SCRIPTS, script), str(data), str(out), *map(str, extra)],
                   env=env, check=True, capture_output=True, text=True)
    cwd, program, *flags = record.read_text().splitlines()
    assert cwd == REPO and program == "deepspeed_train.py"
    return flags


def flag(flags, name):
    return flags[flags.index(name) + 1]


def on_tiny_configs(flags, validation_prefix=None):
    """The same command with the tiny job and DeepSpeed configs (and the tiny validation folder)."""
    out = list(flags)
    out[out.index("--cf") + 1] = TINY_CFG
    out[out.index("--deepspeed_config") + 1] = TINY_DS
    if validation_prefix is not None:
        out[out.index("--validation_data_path_prefix") + 1] = str(validation_prefix)
    return out + ["--log_level", "warning"]


def learning_rates(out, job):
    """{global step: LR} of a job's TensorBoard runs (all sessions)."""
    return dict(read_run(os.path.join(out, "runs", job))[0]["Train/lr"])


def ee(step, lr, warmup_steps, offset):
    """The EE schedule during warmup, as the tiny config's numbers give it."""
    return lr * (step / warmup_steps) ** 2 + offset


@pytest.mark.parametrize("job_names", ["scripts", "one"])
def test_two_phase_scripts_rewarm_phase_2_once_and_resume_its_warmup(two_phase_data, tmp_path, job_names):
    """README's two commands with one OUT, on the tiny config: phase 2 starts a fresh warmup from
    phase 1's checkpoint, and re-running phase 2's command after a stop continues that warmup.
    `one`: both phases under one job name (one checkpoint folder), decided by the phase alone."""
    out = tmp_path / "out"
    env = {"TRANSFORMER_KERNEL": "0", "LOAD_EPOCH": "2"}
    if job_names == "one":
        env.update(JOB_NAME="tiny_both_phases", PHASE1_JOB="tiny_both_phases")
    phase1 = script_command(tmp_path, "ds_train_bert_bsz64k_seq128.sh", two_phase_data, out, **env)
    assert flag(phase1, "--lr_offset") == "10e-4" and flag(phase1, "--cf") == "bert_config.json"
    deepspeed_train.main(on_tiny_configs(phase1))
    job1 = flag(phase1, "--job_name")
    assert job1 == ("lamb_64k_seq128" if job_names == "scripts" else "tiny_both_phases")
    phase1_steps = 8                                   # 2 epochs x 4 micro-batches of 16
    lr1 = learning_rates(out, job1)
    assert lr1[1] == pytest.approx(1e-3) and lr1[2] == pytest.approx(ee(1, 5e-3, 10, 1e-3))

    # Phase 2, stopped after its first step, then the same command again.
    phase2 = script_command(tmp_path, "ds_train_bert_bsz32k_seq512.sh", two_phase_data, out, "--max_steps", 1, **env)
    assert flag(phase2, "--load_checkpoint_id") == f"epoch2_step{phase1_steps}" and "--rewarmup" in phase2
    assert flag(phase2, "--deepspeed_config") == "configs/ds_config_seq512.json"
    validation = two_phase_data / "bing" / "512"
    assert deepspeed_train.main(on_tiny_configs(phase2, validation)).global_step == phase1_steps + 1
    phase2 = script_command(tmp_path, "ds_train_bert_bsz32k_seq512.sh", two_phase_data, out, **env)
    state = deepspeed_train.main(on_tiny_configs(phase2, validation))
    job2 = flag(phase2, "--job_name")
    assert job2 == ("lamb_32k_chkpt2_seq512" if job_names == "scripts" else "tiny_both_phases")

    # Phase 2 runs epoch 3 of 3 from its start: 4 steps, the LR warmup begun anew at step 8 and
    # continued across the stop (0, then the schedule's next values), never phase 1's LR.
    assert state.epoch == 3 and state.global_step == phase1_steps + 4
    lr2 = learning_rates(out, job2)
    assert [lr2[phase1_steps + k] for k in range(1, 5)] == pytest.approx(
        [ee(k, 1e-3, 20, 0.0) for k in range(4)], rel=1e-6, abs=1e-12)
    assert os.path.isdir(out / "saved_models" / job2 / f"epoch3_step{phase1_steps + 4}")


def _data_like_the_originals(root, tiny):
    """A DATA folder laid out as the original configs expect, made of the tiny data."""
    for name in ("bert-large-uncased-vocab.txt", "bert-base-uncased-vocab.txt"):
        (root / "vocab").mkdir(parents=True, exist_ok=True)
        (root / "vocab" / name).write_text((tiny / "vocab.txt").read_text())
    for seq in ("128", "512"):
        (root / "bnorick_format" / seq).mkdir(parents=True)
        (root / "bnorick_format" / seq / "wiki_pretrain").symlink_to(tiny / "bing" / seq / "wiki")
        (root / "bnorick_format" / seq / "bookcorpus_pretrain").symlink_to(tiny / "bing" / seq / "bc")
        (root / "data").mkdir(exist_ok=True)
        (root / "data" / seq).symlink_to(tiny / "nvidia" / seq / "train")
    (root / "validation_set").symlink_to(tiny / "bing" / "512" / "validation")


# script -> (job name, phase-1 job and epoch it starts from or None, what needs CUDA)
ORIGINAL_SCRIPTS = {
    "ds_train_bert_bsz64k_seq128.sh": ("lamb_64k_seq128", None, "--deepspeed_transformer_kernel needs a CUDA GPU"),
    "ds_train_bert_bsz32k_seq512.sh": ("lamb_32k_chkpt150_seq512", ("lamb_64k_seq128", 150),
                                       "--deepspeed_transformer_kernel needs a CUDA GPU"),
    "ds_train_bert_nvidia_data_bsz64k_seq128.sh": ("lamb_nvidia_data_64k_seq128", None,
                                                   "--deepspeed_transformer_kernel needs a CUDA GPU"),
    "ds_train_bert_nvidia_data_bsz32k_seq512.sh": ("lamb_nvidia_data_32k_chkpt16_seq512",
                                                   ("lamb_nvidia_data_64k_seq128", 16),
                                                   "--deepspeed_transformer_kernel needs a CUDA GPU"),
    "ds_sa_train_bert_bsz64k_seq128.sh": ("lamb_64k_seq128", None, "fp16 needs a CUDA GPU"),
    "ds_train_bert_progressive_layer_drop_bsz4k_seq128.sh": ("adam_4k_seq128_progressive_layer_drop", None,
                                                             "fp16 needs a CUDA GPU"),
    "ds_train_bert_onebitadam_bsz4k_seq128.sh": ("onebit_adam_4k_seq128_nccl", None,
                                                 "--deepspeed_transformer_kernel needs a CUDA GPU"),
    "ds_train_bert_onebitlamb_bsz64k_seq128.sh": ("onebit_lamb_64k_seq128_nccl", None,
                                                  "--deepspeed_transformer_kernel needs a CUDA GPU"),
    "ds_train_bert_onebitlamb_bsz32k_seq512.sh": ("onebit_lamb_32k_chkpt150_seq512_nccl",
                                                  ("onebit_lamb_64k_seq128_nccl", 150),
                                                  "--deepspeed_transformer_kernel needs a CUDA GPU"),
    "ds_train_bert_01adam_bsz4k_seq128.sh": ("01adam_bsz4k_seq128_nccl", None, "'ZeroOneAdam' needs CUDA and cupy"),
    "ds_train_bert_01adam_bsz4k_seq512.sh": ("01adam_bsz4k_seq512_nccl", None, "'ZeroOneAdam' needs CUDA and cupy"),
}


def test_every_original_script_reads_its_configs_and_refuses_cuda_work_in_one_line(
        two_phase_data, tmp_path, capsys):
    shipped = sorted(f for f in os.listdir(SCRIPTS) if f.startswith("ds_"))
    assert shipped == sorted(ORIGINAL_SCRIPTS)
    data = tmp_path / "data"
    _data_like_the_originals(data, two_phase_data)
    out = tmp_path / "out"
    (out / "saved_models" / "01adam_bsz4k_seq128_nccl" / "epoch233_step152511").mkdir(parents=True)
    for script, (job, phase1, needs) in ORIGINAL_SCRIPTS.items():
        if phase1:
            (out / "saved_models" / phase1[0] / f"epoch{phase1[1]}_step7038").mkdir(parents=True)
        flags = script_command(tmp_path, script, data, out)
        assert flag(flags, "--job_name") == job and "--auto_resume" in flags, script
        if phase1:
            assert flag(flags, "--load_checkpoint_id") == f"epoch{phase1[1]}_step7038" and "--rewarmup" in flags
        with pytest.raises(SystemExit) as refused:
            deepspeed_train.main(flags + ["--log_level", "error"])
        err = capsys.readouterr().err
        lines = [line for line in err.splitlines() if line.startswith("error: ")]
        assert refused.value.code == 2 and len(lines) == 1 and needs in lines[0], (script, err)
        assert "Traceback" not in err, script


def test_recipe_values_are_the_originals():
    """The numbers the README's recipe rests on (the original's bert_large_lamb.json and
    deepspeed_bsz{64k,32k}_lamb_config_seq{128,512}.json)."""
    job = json.load(open(os.path.join(REPO, "bert_config.json")))
    assert [job["mixed_seq_training"][s]["num_epochs"] for s in ("128", "512")] == [150, 160]
    assert [job["mixed_seq_training"][s]["learning_rate"] for s in ("128", "512")] == [11e-3, 2e-3]
    phase1 = json.load(open(os.path.join(REPO, "ds_config.json")))
    phase2 = json.load(open(os.path.join(REPO, "configs", "ds_config_seq512.json")))
    assert (phase1["train_batch_size"], phase1["train_micro_batch_size_per_gpu"]) == (65536, 64)
    assert (phase2["train_batch_size"], phase2["train_micro_batch_size_per_gpu"]) == (32768, 16)
    assert phase1["sparse_attention"]["mode"] == "fixed" and "sparse_attention" not in phase2


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="the no-CUDA message is for machines without one")
@pytest.mark.parametrize("script", ["ds_train_bert_bsz64k_seq128.sh", "gpu_check.sh"])
def test_a_cuda_only_script_says_so_first_on_a_machine_without_one(tmp_path, script):
    """Before any data, vocab or nvidia-smi error: one line, exit 2."""
    done = subprocess.run(["bash", os.path.join(SCRIPTS, script), str(tmp_path / "no_data"), str(tmp_path / "out")],
                          capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "CUDA" in lines[0], done.stderr
    assert not (tmp_path / "out").exists()
