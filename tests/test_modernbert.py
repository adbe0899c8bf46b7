"""The modernbert architecture (turing/arch/modernbert/): the model against transformers' ModernBERT
logit by logit, its sliding window, unpadding, FlexAttention's block mask and FLOP count; then a
tiny modern config through the real program: it trains, validates, checkpoints and resumes bit
for bit mid-epoch (1 rank in process, 2 ranks through the launcher), exports to
ModernBertForMaskedLM with equal logits, is read back by --use_pretrain and fine-tuned by
finetune_glue; the options that do not apply are one error line."""
import argparse
import json
import os
import warnings
from types import SimpleNamespace

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

import deepspeed_train  # noqa: E402
from tests.launch import TINY_CFG, ds_config, expect_input_error, tiny_args, train_in_process  # noqa: E402
from tools import export_hf, finetune_glue  # noqa: E402
from turing.batch import Batch  # noqa: E402
from turing.checkpoint_files import load_checkpoint_state  # noqa: E402
from turing.arch import training_flops  # noqa: E402
from turing.flops import attended_pairs  # noqa: E402
from turing.arch.modernbert.hf import hf_to_modern, modern_to_hf  # noqa: E402
from turing.hf_folder import load_hf_folder  # noqa: E402
from turing.model_options import ModelOptions  # noqa: E402
from turing.arch import model_config_from_dict, pretraining_model  # noqa: E402
from turing.arch.modernbert.model import FULL, SLIDING, ModernConfig, ModernForPreTraining  # noqa: E402
from turing.pretrained import load_into, read_weights  # noqa: E402
from turing.tb_events import read_run  # noqa: E402
from turing.tokenization import BertTokenizer  # noqa: E402

try:  # only the tests against transformers' own ModernBERT need it (needs_transformers)
    import transformers  # noqa: E402
except ImportError:
    transformers = None
needs_transformers = pytest.mark.skipif(transformers is None, reason="compares with or exports to transformers")

JOB = "tiny_bert"
# The tiny model of the end-to-end tests: 3 layers (full, sliding, sliding), a window of +-8
# tokens (so 128-token sequences use it), every dropout on (so the resume restores RNG states).
TINY_MODERN = {"architecture": "modernbert", "vocab_size_or_config_json_file": 96, "hidden_size": 64,
               "num_hidden_layers": 3, "num_attention_heads": 2, "intermediate_size": 96, "local_attention": 16,
               "max_position_embeddings": 512, "embedding_dropout": 0.1, "attention_dropout": 0.1,
               "mlp_dropout": 0.1}


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def small_config(**overrides):
    """4 layers (full, sliding, sliding, full), window +-8, every bias on unless overridden."""
    values = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=4, num_attention_heads=2,
                  local_attention=16, max_position_embeddings=128, global_rope_theta=1000.0, local_rope_theta=100.0,
                  norm_bias=True, mlp_bias=True, attention_bias=True, classifier_bias=True)
    values.update(overrides)
    return ModernConfig(104, **values)


def padded_batch(length=48, rows=(48, 30, 17, 9), vocab=99, seed=1):
    """Rows of the given real lengths, padded at the end, 3 masked positions each."""
    g = torch.Generator().manual_seed(seed)
    mask = (torch.arange(length)[None] < torch.tensor(rows)[:, None]).long()
    ids = torch.randint(5, vocab, (len(rows), length), generator=g) * mask
    labels = torch.full_like(ids, -1)
    for row, n in enumerate(rows):
        positions = torch.randperm(n - 2, generator=g)[:3] + 1
        labels[row, positions] = ids[row, positions]
    zeros = torch.zeros(len(rows), dtype=torch.long)
    return Batch(zeros, ids, mask, torch.zeros_like(ids), zeros, labels)


def model_with_random_affines(config, options=None):
    torch.manual_seed(0)
    model = ModernForPreTraining(config, options).eval()
    with torch.no_grad():  # non-trivial biases and norm weights, so every parameter's role is compared
        for name, p in model.named_parameters():
            if "bias" in name or "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
    return model


# ---------------------------------------------------------------------------------------------
# The model


@needs_transformers
@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
def test_logits_equal_transformers_modernbert(implementation):
    config = small_config()
    assert config.layer_types == [FULL, SLIDING, SLIDING, FULL]
    ours = model_with_random_affines(config)
    hf_state, hf_config = modern_to_hf(ours.state_dict(), config, 99, pad_token_id=0, cls_token_id=2, sep_token_id=3)
    assert hf_config["rope_parameters"] == {FULL: {"rope_type": "default", "rope_theta": 1000.0},
                                            SLIDING: {"rope_type": "default", "rope_theta": 100.0}}
    hf = transformers.ModernBertForMaskedLM(transformers.ModernBertConfig(**hf_config,
                                                                          attn_implementation=implementation))
    result = hf.load_state_dict({k: v.float() for k, v in hf_state.items()}, strict=True)
    assert not result.missing_keys and not result.unexpected_keys
    batch = padded_batch()  # 48 tokens: past the +-8 window
    with torch.no_grad():
        scores, nsp = ours.predict(batch.input_ids, batch.segment_ids, batch.input_mask)
        theirs = hf.eval()(input_ids=batch.input_ids, attention_mask=batch.input_mask).logits
    real = batch.input_mask.bool()
    assert nsp is None and scores.shape == (4, 48, 104)
    assert (scores[..., :99][real] - theirs[real]).abs().max() <= 1e-5
    back, back_config = hf_to_modern(hf_state, hf_config)
    assert back_config.to_dict() == config.to_dict()
    assert all(torch.equal(back[k][:99], v[:99]) for k, v in ours.state_dict().items())


def test_a_sliding_window_query_sees_half_the_window_on_each_side():
    config = small_config(num_hidden_layers=1, layer_types=[SLIDING], local_attention=10)
    model = model_with_random_affines(config)
    ids, mask = torch.randint(5, 99, (1, 32)), torch.ones(1, 32, dtype=torch.long)
    changed = ids.clone()
    changed[0, 16] = (ids[0, 16] + 1 - 5) % 94 + 5
    with torch.no_grad():
        moved = (model.bert(changed, mask) - model.bert(ids, mask)).abs().amax(-1)[0]
    assert [i for i in range(32) if moved[i] > 0] == list(range(11, 22))  # |i - 16| <= 5


def test_unpad_gives_the_padded_models_loss_and_grads():
    config = small_config(norm_bias=False, mlp_bias=False, attention_bias=False, classifier_bias=False)
    padded = model_with_random_affines(config)
    unpadded = ModernForPreTraining(config, argparse.Namespace(unpad=True, checkpoint_activations=True)).eval()
    unpadded.load_state_dict(padded.state_dict())
    batch = padded_batch(length=64, rows=(40, 30, 17, 9))  # padding only: the unpadded encoder sees fewer tokens
    losses = []
    for model in (padded, unpadded):
        loss = model(batch)
        loss.backward()
        losses.append(loss)
    assert torch.allclose(losses[0], losses[1], atol=1e-6, rtol=0)
    for (name, p), q in zip(padded.named_parameters(), unpadded.parameters()):
        assert torch.allclose(p.grad, q.grad, atol=1e-6, rtol=1e-4), name


def test_flex_attention_block_mask_gives_the_dense_band_s_scores():
    """FlexAttention runs on CPU eagerly, for inference only: the same scores as the dense mask."""
    model = model_with_random_affines(small_config())
    batch = padded_batch()
    scores = []
    for flex in (True, False):
        model.bert.flex_attention = flex
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # eager FlexAttention warns that it is not compiled
            scores.append(model.predict(batch.input_ids, None, batch.input_mask)[0])
    real = batch.input_mask.bool()
    assert (scores[0][real] - scores[1][real]).abs().max() <= 1e-5


@pytest.mark.parametrize("length, local_attention", [(16, 32), (40, 16)])
def test_flops_equal_torchs_counter(length, local_attention):
    """Within the window (s <= local_attention / 2 + 1) the count is torch's; past it, torch counts
    also the pairs outside the band, which the dense CPU mask computes and the count leaves out."""
    config = ModernConfig(96, hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=2,
                          local_attention=local_attention, max_position_embeddings=64)
    model = ModernForPreTraining(config)
    batch_size, predictions = 2, 5
    ids = torch.randint(5, 96, (batch_size, length))
    labels = torch.full_like(ids, -1)
    labels[:, 1:1 + predictions] = ids[:, 1:1 + predictions]
    zeros = torch.zeros(batch_size, dtype=torch.long)
    batch = Batch(zeros, ids, torch.ones_like(ids), torch.zeros_like(ids), zeros, labels)
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        model(batch).backward()
    ours = training_flops(config, length, predictions)
    outside = length * length - attended_pairs(length, local_attention // 2)
    assert counter.get_total_flops() == batch_size * (ours + 3 * 2 * 4 * 32 * outside)  # 2 sliding layers
    assert (outside == 0) == (length <= local_attention // 2 + 1)
    # by hand: s=3, w=1 sees 7 of 9 pairs; GeGLU is 3 matmuls of h x i per token
    assert attended_pairs(3, 1) == 7 and attended_pairs(3, 5) == 9
    one_layer = ModernConfig(10, hidden_size=4, intermediate_size=8, num_hidden_layers=1, num_attention_heads=2,
                             max_position_embeddings=8)
    assert training_flops(one_layer, 3, 2) == 3 * (8 * 3 * 16 + 6 * 3 * 4 * 8 + 4 * 4 * 9 + 2 * (32 + 80))


def test_progressive_layer_drop_applies():
    torch.manual_seed(0)
    model = ModernForPreTraining(small_config(num_hidden_layers=4)).train()
    batch = padded_batch()
    torch.manual_seed(5)
    plain = model(batch)
    torch.manual_seed(5)
    assert torch.equal(model(batch, progressive_layer_drop=True, pld_theta=1.0), plain)
    runs = []
    for _ in range(40):
        model(batch, progressive_layer_drop=True, pld_theta=0.2)
        runs.append(model.bert.last_layers_run)
    assert min(runs) >= 1 and max(runs) <= 4 and min(runs) < 4


def test_config_keys_and_refused_options():
    config = model_config_from_dict(TINY_MODERN)
    assert isinstance(config, ModernConfig) and config.layer_types == [FULL, SLIDING, SLIDING]
    assert model_config_from_dict({"vocab_size_or_config_json_file": 96}).architecture == "bert"  # the default
    with pytest.raises(ValueError, match="'hidden_act' is the original BERT's; use hidden_activation"):
        model_config_from_dict({**TINY_MODERN, "hidden_act": "gelu"})
    with pytest.raises(ValueError, match="architecture 'albert' is not one of bert, modernbert"):
        model_config_from_dict({**TINY_MODERN, "architecture": "albert"})
    for key, value in (("global_rope_theta", float("inf")), ("norm_eps", float("nan")), ("local_rope_theta", 0)):
        with pytest.raises(ValueError, match=f"{key} must be a finite number > 0, got {value!r}"):
            model_config_from_dict({**TINY_MODERN, key: value})
    modern = ModelOptions(next_sentence_prediction=False)
    for flag in ("deepspeed_transformer_kernel", "deepspeed_sparse_attention"):
        with pytest.raises(ValueError, match=f"--{flag} does not apply to bert_model_config.architecture"):
            ModernForPreTraining(config, SimpleNamespace(**{flag: True}))
    with pytest.raises(ValueError, match="has no next-sentence head"):
        ModernForPreTraining(config, ModelOptions())  # the original's default: NSP on
    assert isinstance(pretraining_model(config, modern), ModernForPreTraining)


def modern_job(folder, **training):
    job = json.load(open(TINY_CFG))
    job["bert_model_config"] = dict(TINY_MODERN)
    job["mixed_seq_training"]["128"].update(training)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "modern.json"
    path.write_text(json.dumps(job))
    return path


@pytest.mark.parametrize("flag, training, expected", [
    ("--deepspeed_transformer_kernel", {}, "--deepspeed_transformer_kernel does not apply to bert_model_config."
                                           "architecture 'modernbert'"),
    ("--deepspeed_sparse_attention", {}, "--deepspeed_sparse_attention does not apply"),
    (None, {"next_sentence_prediction": True}, "next_sentence_prediction is true, but bert_model_config.architecture "
                                              "'modernbert' has no next-sentence head"),
])
def test_refused_options_are_one_error_line(flag, training, expected, data_root, tmp_path, capsys):
    line = expect_input_error(capsys, train_in_process, data_root, tmp_path / "out", ds_config(tmp_path),
                              *([flag] if flag else []), cf=modern_job(tmp_path, **training))
    assert expected in line, line


# ---------------------------------------------------------------------------------------------
# Through the program


@pytest.fixture(scope="module")
def modern_run(data_root, tmp_path_factory):
    """The tiny modern config, 2 epochs of 4 steps (NVIDIA shards), validated each epoch, a
    checkpoint every 2 steps."""
    root = tmp_path_factory.mktemp("modern_run")
    cf, ds = modern_job(root), ds_config(root / "ds")
    out = root / "out"
    state = train_in_process(data_root, out, ds, "--checkpoint_every_steps", 2, "--validation_data_path_prefix",
                             data_root / "nvidia" / "128", cf=cf)
    assert state.global_step == 8
    return {"root": root, "cf": cf, "ds": ds, "out": out, "ckpt": out / "saved_models" / JOB}


def losses(out):
    """[(samples seen, training loss)] of every step a run logged."""
    return read_run(os.path.join(out, "runs", JOB))[0]["Train/Samples/train_loss"]


def test_trains_validates_and_resumes_mid_epoch_bit_for_bit(modern_run, data_root, tmp_path):
    from tests.test_eval_mlm import direct_validation_scores
    from tools import eval_mlm

    scalars, _ = read_run(str(modern_run["out"] / "runs" / JOB))
    accuracy = [v for _, v in scalars["Validation/MLM_accuracy"]]
    # each epoch's validation: the accuracy of the weights saved at its end, at the hdf5 file's masks
    (hdf5,) = (data_root / "nvidia" / "128" / "validation").iterdir()
    direct = [direct_validation_scores(eval_mlm.load_scorer(str(modern_run["ckpt"] / tag)).model, hdf5, 96)[1]
              for tag in ("epoch1_step4", "epoch2_step8")]
    assert len(accuracy) == 2 and accuracy == pytest.approx(direct, rel=1e-6) and min(direct) > 0  # (float32 events)
    whole = losses(modern_run["out"])
    assert [samples for samples, _ in whole] == [16 * step for step in range(1, 9)] and whole[-1][1] < whole[0][1]
    assert "Validation/NSP_accuracy" not in scalars  # no NSP head, no NSP accuracy
    # from step 2 (inside epoch 1) in a new output folder: the same six (samples, loss) as the uninterrupted run
    train_in_process(data_root, tmp_path / "out", modern_run["ds"], "--load_training_checkpoint", modern_run["ckpt"],
                     "--load_checkpoint_id", "step2", cf=modern_run["cf"])
    assert losses(tmp_path / "out") == whole[2:]


# Run by the launcher on every rank: the training script's main twice in one process, as the
# in-process tests do on one rank (one launcher start instead of two: the tests' time goes there).
TWO_RUNS = """import json, sys
sys.path.insert(0, {repo!r})
import deepspeed_train
for argv in json.loads(sys.argv[-1]):
    deepspeed_train.main(argv)
"""


def test_two_ranks_resume_mid_epoch_bit_for_bit(data_root, tmp_path):
    """Bing shards on 2 ranks through the launcher (4 steps an epoch): a run stopped at step 3
    with a checkpoint at step 2, then one resumed from step 2 in another folder: the same step 3."""
    import subprocess

    from testkit.launcher import REPO, launch_env, launcher_cmd

    cf, first, second = modern_job(tmp_path), tmp_path / "first", tmp_path / "second"
    script = tmp_path / "two_runs.py"
    script.write_text(TWO_RUNS.format(repo=REPO))
    runs = [tiny_args(data_root, first, 128, "--cf", cf, "--print_steps", 1, "--max_steps", 3,
                      "--checkpoint_every_steps", 2, nvidia=False),
            tiny_args(data_root, second, 128, "--cf", cf, "--print_steps", 1, "--max_steps", 1,
                      "--load_training_checkpoint", first / "saved_models" / JOB, "--load_checkpoint_id", "step2",
                      nvidia=False)]
    for argv in runs:  # tiny_args names the tiny config first; the later --cf wins
        assert argv.count("--cf") == 2
    run = subprocess.run(launcher_cmd(2) + [str(script), json.dumps(runs)], cwd=REPO, env=launch_env(),
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert [samples for samples, _ in losses(first)] == [32, 64, 96]  # 2 ranks x 16
    assert losses(second) == losses(first)[2:]


@needs_transformers
def test_export_is_a_stock_modernbert_with_our_logits_read_back_by_use_pretrain(modern_run, tmp_path):
    folder = tmp_path / "hf"
    assert export_hf.main(["--checkpoint_dir", str(modern_run["ckpt"]), "--output_dir", str(folder)]) == 0
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["ModernBertForMaskedLM"] and config["layer_types"] == [FULL, SLIDING, SLIDING]
    assert "auto_map" not in config  # no remote code
    hf = transformers.AutoModelForMaskedLM.from_pretrained(str(folder)).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder))
    encoded = tokenizer(["w1 w2 w3 " * 20, "W4 w5"], padding=True, return_tensors="pt")
    assert set(encoded) == {"input_ids", "attention_mask"}  # no token types
    ours_tokens = BertTokenizer(str(folder / "vocab.txt"))
    assert encoded["input_ids"][1, :4].tolist() == ours_tokens.convert_tokens_to_ids(["[CLS]", "w4", "w5", "[SEP]"])

    state, job_config, _ = load_checkpoint_state(str(modern_run["ckpt"]))
    ours_config = model_config_from_dict(job_config["bert_model_config"])
    ours = ModernForPreTraining(ours_config).eval()
    ours.load_state_dict(state, strict=True)
    with torch.no_grad():
        scores, _ = ours.predict(encoded["input_ids"], None, encoded["attention_mask"])
        theirs = hf(**encoded).logits
    real = encoded["attention_mask"].bool()
    assert encoded["input_ids"].shape[1] > 2 * 8 + 1  # longer than the window
    assert (scores[real] - theirs[real]).abs().max() <= 1e-4

    # --use_pretrain's reader (turing.pretrained): the export is read back into the model the script builds
    fresh = ModernForPreTraining(ours_config)
    load_into(fresh, read_weights(str(folder)), str(folder))
    assert all(torch.equal(fresh.state_dict()[k], v) for k, v in state.items())
    assert isinstance(load_hf_folder(str(folder))[1], ModernConfig)


def write_sst2(folder, n_train=16, n_dev=8):
    """An SST-2-layout task whose label is whether the first word is w1."""
    folder.mkdir(parents=True)
    for split, n in (("train", n_train), ("dev", n_dev)):
        lines = [f"w{1 + i % 2} w5 w6 w{7 + i}\t{int(i % 2 == 0)}" for i in range(n)]
        (folder / f"{split}.tsv").write_text("sentence\tlabel\n" + "\n".join(lines) + "\n")


def fine_tune_one_epoch(model, tmp_path):
    """tools/finetune_glue.py on `model` (any --model): one seed, one epoch of write_sst2's 16
    examples (one step); its results.json, whose SST-2 score is checked to be the dev accuracy of
    the predictions written beside it."""
    write_sst2(tmp_path / "SST-2")
    out = tmp_path / "glue"
    assert finetune_glue.main(["--model", str(model), "--task", "sst2", "--data_dir", str(tmp_path / "SST-2"),
                               "--output_dir", str(out), "--seeds", "1", "--epochs", "1", "--max_seq_length", "16",
                               "--batch_size", "16", "--lr", "1e-3", "--log_level", "warning"]) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["task"] == "sst2" and len(results["seeds"]) == 1
    gold, predictions = ([line.split("\t")[1] for line in path.read_text().splitlines()[1:]]
                         for path in (tmp_path / "SST-2" / "dev.tsv", out / "dev_predictions.tsv"))
    assert len(predictions) == len(gold) == 8
    assert results["score"] == sum(p == g for p, g in zip(predictions, gold)) / len(gold)
    return results


@needs_transformers
@pytest.mark.parametrize("source", ["checkpoint", "export"])
def test_finetune_glue_fine_tunes_a_step(source, modern_run, tmp_path):
    model = modern_run["ckpt"]
    if source == "export":
        model = tmp_path / "hf"
        assert export_hf.main(["--checkpoint_dir", str(modern_run["ckpt"]), "--output_dir", str(model),
                               "--no_verify"]) == 0
    fine_tune_one_epoch(model, tmp_path)


@pytest.mark.parametrize("name, sizes", [("modernbert_base", (22, 768, 1152, 12)),
                                         ("modernbert_large", (28, 1024, 2624, 16))])
def test_shipped_configs_are_the_published_sizes_with_30_percent_masking(name, sizes):
    from testkit.launcher import REPO

    job = json.load(open(os.path.join(REPO, "configs", f"{name}.json")))
    config = model_config_from_dict(job["bert_model_config"])
    assert (config.num_hidden_layers, config.hidden_size, config.intermediate_size,
            config.num_attention_heads) == sizes
    assert config.layer_types.count(FULL) == -(-sizes[0] // 3) and config.local_attention == 128
    for training in job["mixed_seq_training"].values():
        assert training["masked_lm_prob"] == 0.3 and training["next_sentence_prediction"] is False
    demo, modern = (json.load(open(os.path.join(REPO, "configs", d, "bert_config.json")))
                    for d in ("demo", "demo_modern"))
    assert modern["mixed_seq_training"] == demo["mixed_seq_training"] and modern["data"] == demo["data"]
    assert model_config_from_dict(modern["bert_model_config"]).hidden_size == demo["bert_model_config"]["hidden_size"]


def test_eval_mlm_scores_the_modern_block_as_a_direct_computation(modern_run, tmp_path):
    """tools/eval_mlm.py on a modernbert checkpoint: each pseudo-log-likelihood equals the
    unbatched loop (each token masked in turn, one forward each) of the model the checkpoint holds."""
    from tests.test_eval_mlm import direct_pll
    from tools import eval_mlm
    scorer = eval_mlm.load_scorer(str(modern_run["ckpt"]))
    assert isinstance(scorer.model, ModernForPreTraining)
    ids = scorer.tokenizer.encode_batch(["w1 w2 w3", "w4 w5 w6 w7 w8 w9 w10 w11 w12 w13 w14 w15 w16 w17 w18 w19 w20"])
    batched = eval_mlm.pseudo_log_likelihoods(scorer, ids, batch_tokens=40)
    for sentence, got in zip(ids, batched, strict=True):
        assert got == pytest.approx(direct_pll(scorer.model, sentence, scorer.special, scorer.vocab_real), abs=1e-4)
    random_twin = eval_mlm.load_scorer(str(modern_run["ckpt"]), random_init=True)
    assert not torch.equal(random_twin.model.bert.layers[0].mlp.Wi.weight, scorer.model.bert.layers[0].mlp.Wi.weight)
