"""Bing numpy shards: both layouts, batch contents, dynamic masking, determinism, the provider's
picker and rank split, resume at a micro batch, the validation set and bad-shard errors."""
import logging
import os
from argparse import Namespace

import numpy as np
import pytest
import torch

import bing_bert_dataset_provider as provider_module
from bing_bert_dataset_provider import BingBertDatasetProvider, PretrainDataType, build_dataset_picker
from data_worker import DataExhaustedError
from turing.batch import BatchType, collate_batch
from turing.dataset import (BingPretrainDataset, BingShard, ShardFormatError, VocabIndex, epoch_sample_order,
                            main as dataset_main, open_validation_dataset, tokenize_shard, truncate_pair)
from turing.tokenization import load_vocab

# Special tokens deliberately not at bert-base's ids, so hard-coded ids would show.
VOCAB = ["[unused0]", "w0", "[PAD]", "[SEP]", "[UNK]", "[MASK]", "[CLS]"] + [f"w{i}" for i in range(1, 60)] \
    + ["##ing", "héllo", "日本", "a" * 17]
SPECIAL_NAMES = ("[CLS]", "[SEP]", "[PAD]", "[MASK]", "[UNK]")


def write_vocab(path):
    path.write_text("\n".join(VOCAB) + "\n", encoding="utf-8")
    return {t: i for i, t in enumerate(VOCAB)}


def make_instances(n, seed=0, max_len=12, oov=True):
    rng = np.random.default_rng(seed)
    words = [t for t in VOCAB if t not in SPECIAL_NAMES and not t.startswith("[unused")]
    if oov:
        words = words + ["zzz", "ünknown"]
    out = []
    for _ in range(n):
        a = [words[j] for j in rng.integers(len(words), size=int(rng.integers(1, max_len)))]
        b = [words[j] for j in rng.integers(len(words), size=int(rng.integers(1, max_len)))]
        out.append((a, b, int(rng.integers(2))))
    return out


def write_shard(folder, instances, layout="separator"):
    """A shard folder written by hand from (tokens_a, tokens_b, is_next) triples."""
    os.makedirs(folder, exist_ok=True)
    blobs, token_offsets, instance_token_offsets = [], [], [0]
    for a, b, _ in instances:
        toks = [t.encode("utf-8") for t in a + b]
        if layout == "separator":
            blobs.append(b"\x1f".join(toks))
        else:
            starts = np.cumsum([len(t) for t in toks])[:-1]
            token_offsets.extend(starts.tolist())
            instance_token_offsets.append(len(token_offsets))
            blobs.append(b"".join(toks))
    offsets = np.concatenate([[0], np.cumsum([len(x) for x in blobs])]).astype(np.int64)
    np.save(os.path.join(folder, "data.npy"), np.frombuffer(b"".join(blobs), dtype=np.uint8))
    np.save(os.path.join(folder, "instance_offsets.npy"), offsets)
    np.save(os.path.join(folder, "tokens_split.npy"), np.array([len(a) for a, _, _ in instances], np.int32))
    np.save(os.path.join(folder, "is_next.npy"), np.array([x for _, _, x in instances], np.int8))
    if layout == "offsets":
        np.save(os.path.join(folder, "instance_token_offsets.npy"), np.array(instance_token_offsets, np.int64))
        np.save(os.path.join(folder, "token_offsets.npy"), np.array(token_offsets, np.int32))
    return str(folder)


@pytest.fixture
def vocab(tmp_path):
    write_vocab(tmp_path / "vocab.txt")
    from turing.tokenization import load_vocab
    return load_vocab(str(tmp_path / "vocab.txt"))


def dataset_for(folder, vocab, seq=32, max_pred=20, seed=1, epoch=0):
    shard = tokenize_shard(BingShard(folder), VocabIndex(vocab))
    return BingPretrainDataset(shard, vocab, seq, max_pred, seed, epoch=epoch)


def test_both_layouts_decode_to_the_same_instances(tmp_path, vocab):
    instances = make_instances(40)
    sep = BingShard(write_shard(tmp_path / "sep", instances))
    off = BingShard(write_shard(tmp_path / "off", instances, "offsets"))
    assert (sep.layout, off.layout) == ("separator", "offsets")
    for i, expected in enumerate(instances):
        assert sep.instance(i) == off.instance(i) == (expected[0], expected[1], expected[2])
    index = VocabIndex(vocab)
    a, b = tokenize_shard(sep, index), tokenize_shard(off, index)
    np.testing.assert_array_equal(a.ids, b.ids)
    np.testing.assert_array_equal(a.first_token, b.first_token)
    expected_ids = [vocab.get(t, vocab["[UNK]"]) for x, y, _ in instances for t in x + y]
    assert a.ids.tolist() == expected_ids  # multi-byte, 17-byte and unknown tokens included
    assert vocab["[UNK]"] in expected_ids


def test_batch_rows_are_cls_a_sep_b_sep_with_labels_put_back(tmp_path, vocab):
    instances = make_instances(30)
    seq = 32
    ds = dataset_for(write_shard(tmp_path / "s", instances), vocab, seq=seq)
    batch = ds.build_batch(list(range(30)))
    assert all(t.dtype == torch.int64 for t in batch)
    assert batch.batch_type.tolist() == [int(BatchType.PRETRAIN_BATCH)] * 30
    assert batch.next_sentence_labels.tolist() == [x for _, _, x in instances]
    ids = batch.input_ids.numpy()
    labels = batch.masked_lm_labels.numpy()
    restored = np.where(labels >= 0, labels, ids)
    for row, (a, b, _) in enumerate(instances):
        tokens = ["[CLS]"] + a + ["[SEP]"] + b + ["[SEP]"]
        n = len(tokens)
        assert restored[row, :n].tolist() == [vocab.get(t, vocab["[UNK]"]) for t in tokens]
        assert restored[row, n:].tolist() == [0] * (seq - n)
        assert batch.input_mask[row].tolist() == [1] * n + [0] * (seq - n)
        assert batch.segment_ids[row].tolist() == [0] * (len(a) + 2) + [1] * (len(b) + 1) + [0] * (seq - n)
        assert (labels[row, n:] == -1).all()


def test_long_pairs_are_truncated_longer_segment_first(tmp_path, vocab):
    # BERT's truncate_seq_pair drops from the longer segment, from B on ties.
    a, b = truncate_pair(np.array([20, 3, 5, 5, 2]), np.array([3, 20, 5, 4, 2]), 9)
    assert a.tolist() == [6, 3, 5, 5, 2] and b.tolist() == [3, 6, 4, 4, 2]
    instances = [([f"w{i}" for i in range(1, 21)], ["w30", "w31", "w32"], 0)]
    ds = dataset_for(write_shard(tmp_path / "s", instances), vocab, seq=12)
    batch = ds.build_batch([0])
    restored = torch.where(batch.masked_lm_labels >= 0, batch.masked_lm_labels, batch.input_ids)[0]
    expected = ["[CLS]"] + [f"w{i}" for i in range(1, 7)] + ["[SEP]", "w30", "w31", "w32", "[SEP]"]
    assert restored.tolist() == [vocab[t] for t in expected]
    assert batch.input_mask[0].tolist() == [1] * 12


def test_masking_statistics(tmp_path, vocab):
    instances = make_instances(1000, seed=3, max_len=30, oov=False)
    max_pred = 6
    ds = dataset_for(write_shard(tmp_path / "s", instances), vocab, seq=64, max_pred=max_pred)
    batch = ds.build_batch(list(range(len(instances))))
    ids, labels, mask = batch.input_ids.numpy(), batch.masked_lm_labels.numpy(), batch.input_mask.numpy()
    chosen = labels >= 0
    lengths = mask.sum(1)
    # Exactly n = min(max_pred, max(1, round(0.15 len))) predictions per row.
    expected_n = [min(max_pred, max(1, round(0.15 * n))) for n in lengths]
    assert chosen.sum(1).tolist() == expected_n
    assert (chosen.sum(1) == max_pred).any() and (chosen.sum(1) < max_pred).any()
    # Never [CLS], [SEP] or padding.
    assert not chosen[:, 0].any()
    rows = np.arange(len(ids))
    sep_a = np.array([len(a) + 1 for a, _, _ in instances])
    assert not chosen[rows, sep_a].any() and not chosen[rows, lengths - 1].any()
    assert not (chosen & (mask == 0)).any()
    assert not np.isin(labels[chosen], [vocab[t] for t in SPECIAL_NAMES]).any()
    total = chosen.sum()
    assert total > 2500
    as_mask = (ids[chosen] == vocab["[MASK]"]).mean()
    kept = (ids[chosen] == labels[chosen]).mean()
    changed = 1 - as_mask - kept
    assert 0.77 < as_mask < 0.83 and 0.08 < kept < 0.12 and 0.08 < changed < 0.12
    # Random replacements are drawn from the whole vocab.
    randoms = ids[chosen][(ids[chosen] != vocab["[MASK]"]) & (ids[chosen] != labels[chosen])]
    assert len(np.unique(randoms)) > len(VOCAB) // 2
    assert randoms.min() >= 0 and randoms.max() < len(VOCAB)


def test_masking_is_a_function_of_seed_epoch_and_index(tmp_path, vocab):
    folder = write_shard(tmp_path / "s", make_instances(50, max_len=20))
    a = dataset_for(folder, vocab, seed=7, epoch=2)
    b = dataset_for(folder, vocab, seed=7, epoch=2)
    full = a.build_batch(list(range(50)))
    # Same sample, any batch composition or reading history, another dataset object: same masks.
    for _ in range(3):
        b.build_batch([3, 1, 4])
    part = b.build_batch([9, 5, 2])
    for row, index in enumerate([9, 5, 2]):
        for got, want in zip(part, full):
            assert torch.equal(got[row], want[index])
    assert torch.equal(a[5].input_ids, full.input_ids[5])
    a.set_epoch(3)
    other_epoch = a.build_batch(list(range(50)))
    assert not torch.equal(other_epoch.masked_lm_labels, full.masked_lm_labels)
    other_seed = dataset_for(folder, vocab, seed=8, epoch=2).build_batch(list(range(50)))
    assert not torch.equal(other_seed.masked_lm_labels, full.masked_lm_labels)


def test_epoch_sample_order_splits_ranks_evenly(vocab):
    orders = [epoch_sample_order(103, seed=5, epoch=1, rank=r, world=4) for r in range(4)]
    assert {len(o) for o in orders} == {25}
    flat = np.concatenate(orders)
    assert len(np.unique(flat)) == 100 and flat.max() < 103
    assert np.array_equal(orders[2], epoch_sample_order(103, seed=5, epoch=1, rank=2, world=4))
    assert not np.array_equal(orders[0], epoch_sample_order(103, seed=5, epoch=2, rank=0, world=4))


def test_dataset_picker_counts_and_runs():
    picker = build_dataset_picker({0: 5, 1: 3}, repeat=4, seed=1, epoch=0)
    assert len(picker) == 32 and picker.count(0) == 20 and picker.count(1) == 12
    runs = [picker[i:i + 4] for i in range(0, 32, 4)]
    assert all(len(set(r)) == 1 for r in runs)
    assert picker == build_dataset_picker({0: 5, 1: 3}, repeat=4, seed=1, epoch=0)
    others = [build_dataset_picker({0: 5, 1: 3}, repeat=4, seed=1, epoch=e) for e in range(1, 6)]
    assert any(o != picker for o in others)
    assert any(o != sorted(o) for o in others + [picker])  # interleaved, not one dataset after the other
    assert build_dataset_picker({0: 0, 1: 0}, repeat=4, seed=1, epoch=0) == []


def make_args(root, vocab_path, micro=4, grad_accum=2, refresh=1, async_worker=True, num_workers=0, seq=32):
    training = {"num_workers": num_workers}
    if async_worker:
        training["async_worker"] = True
    return Namespace(
        config={"data": {"datasets": {"wiki_pretrain_dataset": "wiki", "bc_pretrain_dataset": "bc"}},
                "training": training},
        vocab_file=str(vocab_path), data_path_prefix=str(root), train_micro_batch_size_per_gpu=micro,
        gradient_accumulation_steps=grad_accum, refresh_bucket_size=refresh, seed=11, local_rank=-1,
        max_seq_length=seq, max_predictions_per_seq=5)


@pytest.fixture
def data_root(tmp_path):
    write_vocab(tmp_path / "vocab.txt")
    for name, sizes in (("wiki", (70, 50)), ("bc", (37, 41))):
        for i, size in enumerate(sizes):
            write_shard(tmp_path / name / f"shard_{i:03d}", make_instances(size, seed=100 * len(name) + i),
                        "offsets" if i else "separator")
    return tmp_path


def read_epoch(provider, index, start_batch=0):
    refs, total = provider.get_shard(index, start_batch=start_batch)
    assert len(refs) == total
    batches = []
    for ref in refs:
        batches.append(provider.get_batch(ref))
        provider.prefetch_batch()
    provider.release_shard(index)
    return refs, batches


def test_provider_epoch_picker_and_batches(data_root):
    provider = BingBertDatasetProvider(make_args(data_root, data_root / "vocab.txt", refresh=2))
    refs, batches = read_epoch(provider, 0)
    # 70 // 1 // 4 // 2 // 2 = 4 wiki entries, 37 // 16 = 2 bc entries, each 2 x 2 micro batches.
    assert refs.count(int(PretrainDataType.WIKIPEDIA)) == 16 and refs.count(int(PretrainDataType.BOOK_CORPUS)) == 8
    assert all(len(set(refs[i:i + 4])) == 1 for i in range(0, len(refs), 4))
    assert all(b.input_ids.shape == (4, 32) for b in batches)
    # Epoch 1 reads the second shard folder of each dataset: 50 // 16 = 3 and 41 // 16 = 2 entries.
    refs1, _ = read_epoch(provider, 1)
    assert len(refs1) == (3 + 2) * 4
    # Epoch 2 wraps around to the first folders again, with a new order and new masks.
    refs2, batches2 = read_epoch(provider, 2)
    assert len(refs2) == len(refs)
    assert not all(torch.equal(x.input_ids, y.input_ids) for x, y in zip(batches, batches2))
    provider.close()


def test_provider_worker_on_off_and_resume_give_the_same_batches(data_root):
    vocab_path = data_root / "vocab.txt"
    with_worker = BingBertDatasetProvider(make_args(data_root, vocab_path))
    refs, batches = read_epoch(with_worker, 0)
    assert with_worker.worker is None  # released
    refs_plain, plain = read_epoch(BingBertDatasetProvider(make_args(data_root, vocab_path, async_worker=False)), 0)
    assert refs == refs_plain
    for x, y in zip(batches, plain):
        assert all(torch.equal(a, b) for a, b in zip(x, y))
    # Starting at micro batch k yields exactly the rest of the uninterrupted epoch.
    k = 7
    refs_resumed, resumed = read_epoch(BingBertDatasetProvider(make_args(data_root, vocab_path)), 0, start_batch=k)
    assert refs_resumed == refs[k:]
    for x, y in zip(resumed, batches[k:]):
        assert all(torch.equal(a, b) for a, b in zip(x, y))


def _masking_shares(batches):
    ids = torch.cat([b.input_ids for b in batches]).numpy()
    labels = torch.cat([b.masked_lm_labels for b in batches]).numpy()
    used = torch.cat([b.input_mask for b in batches]).sum(1).numpy()
    chosen = labels >= 0
    as_mask = (ids[chosen] == VOCAB.index("[MASK]")).mean()
    kept = (ids[chosen] == labels[chosen]).mean()
    return chosen.sum(1), used, as_mask, kept


def test_masking_rate_and_split_come_from_the_training_config(data_root):
    args = make_args(data_root, data_root / "vocab.txt", async_worker=False)
    args.max_predictions_per_seq = 30
    args.config["training"].update(masked_lm_prob=0.3, mask_split=[0.5, 0.0, 0.5])
    provider = BingBertDatasetProvider(args)
    _, batches = read_epoch(provider, 0)
    provider.close()
    counts, used, as_mask, kept = _masking_shares(batches)
    assert counts.sum() > 300
    np.testing.assert_array_equal(counts, np.minimum(used - 3, np.maximum(1, np.rint(0.3 * used))))
    assert 0.42 < as_mask < 0.58 and as_mask + kept == pytest.approx(1.0)   # 50% [MASK], 50% kept, no random
    # The validation set keeps the original's 15% and 80/10/10, whatever the training masks.
    valid = open_validation_dataset(str(data_root / "wiki" / "shard_000"), load_vocab(str(data_root / "vocab.txt")),
                                    args)
    counts, used, as_mask, kept = _masking_shares([valid.build_batch(list(range(len(valid))))])
    np.testing.assert_array_equal(counts, np.minimum(used - 3, np.maximum(1, np.rint(0.15 * used))))
    assert as_mask + kept < 1.0


def test_provider_dataloader_workers_do_not_change_batches(data_root):
    vocab_path = data_root / "vocab.txt"
    _, in_process = read_epoch(BingBertDatasetProvider(make_args(data_root, vocab_path, async_worker=False)), 0)
    _, workers = read_epoch(BingBertDatasetProvider(make_args(data_root, vocab_path, num_workers=2)), 0)
    assert len(in_process) == len(workers) > 0
    for x, y in zip(in_process, workers):
        assert all(torch.equal(a, b) for a, b in zip(x, y))


def test_provider_ranks_get_disjoint_samples_and_equal_steps(data_root, monkeypatch):
    seen = []
    for rank in range(3):
        monkeypatch.setattr(provider_module, "get_rank_and_world", lambda rank=rank: (rank, 3))
        provider = BingBertDatasetProvider(make_args(data_root, data_root / "vocab.txt", micro=2, grad_accum=1))
        refs, batches = read_epoch(provider, 0)
        # wiki 70 // 3 // 2 = 11 entries, bc 37 // 3 // 2 = 6: equal on every rank.
        assert len(refs) == 17
        wiki_rows = [b for r, b in zip(refs, batches) if r == int(PretrainDataType.WIKIPEDIA)]
        restored = torch.cat([torch.where(b.masked_lm_labels >= 0, b.masked_lm_labels, b.input_ids)
                              for b in wiki_rows])
        seen.append({tuple(row.tolist()) for row in restored})
    assert all(len(s) == 22 for s in seen)
    assert not (seen[0] & seen[1]) and not (seen[1] & seen[2]) and not (seen[0] & seen[2])


def test_provider_prefetch_shard_gives_the_same_epoch(data_root):
    vocab_path = data_root / "vocab.txt"
    provider = BingBertDatasetProvider(make_args(data_root, vocab_path, async_worker=False))
    provider.get_shard(0)
    provider.prefetch_shard(1)
    provider.release_shard(0)
    refs, batches = read_epoch(provider, 1)
    refs_direct, direct = read_epoch(BingBertDatasetProvider(make_args(data_root, vocab_path, async_worker=False)), 1)
    assert refs == refs_direct
    assert all(torch.equal(x.input_ids, y.input_ids) for x, y in zip(batches, direct))


def test_running_out_of_data_is_an_explicit_error(data_root):
    for async_worker in (False, True):
        provider = BingBertDatasetProvider(make_args(data_root, data_root / "vocab.txt", async_worker=async_worker))
        refs, _ = provider.get_shard(0)
        for ref in refs:
            provider.get_batch(ref)
            provider.prefetch_batch()
        with pytest.raises(DataExhaustedError):
            provider.get_batch(refs[-1])
        provider.release_shard(0)


def test_provider_config_errors(data_root, tmp_path):
    args = make_args(data_root, data_root / "vocab.txt")
    args.config["data"]["datasets"]["wiki_pretrain_dataset"] = "nowhere"
    with pytest.raises(FileNotFoundError, match="nowhere"):
        BingBertDatasetProvider(args)
    args = make_args(data_root, data_root / "vocab.txt", micro=64)
    with pytest.raises(ValueError, match="world x micro x grad_accum"):
        BingBertDatasetProvider(args).get_shard(0)
    args = make_args(data_root, data_root / "vocab.txt")
    args.config["data"]["datasets"] = {"pretrain_dataset": "x"}
    with pytest.raises(ValueError, match="wiki_pretrain_dataset"):
        BingBertDatasetProvider(args)


@pytest.mark.parametrize("damage, message", [
    (lambda f: os.remove(f / "is_next.npy"), "is_next.npy is missing"),
    (lambda f: np.save(f / "is_next.npy", np.zeros(3, np.int8)), "is_next.npy has 3 entries; expected 20"),
    (lambda f: np.save(f / "instance_offsets.npy", np.arange(21) * 2),
     "instance_offsets.npy .* must start at 0 and end"),
    (lambda f: np.save(f / "tokens_split.npy", np.full(20, 50)), "instance 0 has 50 tokens in segment A"),
    (lambda f: np.save(f / "data.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True), "without pickle"),
    (lambda f: np.save(f / "data.npy", np.zeros(5, np.float32)), "data.npy has dtype float32; expected uint8"),
    (lambda f: np.save(f / "token_offsets.npy", np.zeros(3, np.int32)), "instance_token_offsets.npy .* end at 3"),
])
def test_bad_shard_folder_names_the_file(tmp_path, vocab, damage, message):
    folder = tmp_path / "shard"
    write_shard(folder, make_instances(20), "offsets")
    damage(folder)
    with pytest.raises(ShardFormatError, match=message) as err:
        tokenize_shard(BingShard(str(folder)), VocabIndex(vocab))
    assert str(folder) in str(err.value)


def test_empty_token_in_separator_layout_is_reported(tmp_path, vocab):
    folder = write_shard(tmp_path / "s", [(["w1", "", "w2"], ["w3"], 0)])
    with pytest.raises(ShardFormatError, match="instance 0 has an empty"):
        tokenize_shard(BingShard(folder), VocabIndex(vocab))


def test_validation_dataset_is_fixed_and_collates(tmp_path, vocab):
    for i in range(2):
        write_shard(tmp_path / "valid" / f"shard_{i}", make_instances(10, seed=50 + i), "offsets" if i else "separator")
    args = Namespace(seed=3, max_seq_length=32, max_predictions_per_seq=5)
    first = open_validation_dataset(str(tmp_path / "valid"), vocab, args)
    second = open_validation_dataset(str(tmp_path / "valid"), vocab, args)
    assert len(first) == 20
    loader = torch.utils.data.DataLoader(first, batch_size=6, collate_fn=collate_batch)
    batches = list(loader)
    assert [b.input_ids.shape[0] for b in batches] == [6, 6, 6, 2]
    assert torch.equal(batches[2].masked_lm_labels[1], second[13].masked_lm_labels)
    single = open_validation_dataset(str(tmp_path / "valid" / "shard_1"), vocab, args)
    assert len(single) == 10
    with pytest.raises(FileNotFoundError, match="nowhere"):
        open_validation_dataset(str(tmp_path / "nowhere"), vocab, args)


def test_main_prints_decoded_samples(tmp_path, vocab, capsys):
    folder = write_shard(tmp_path / "s", [(["w1", "héllo"], ["w2"], 1)])
    assert dataset_main([folder, "--vocab", str(tmp_path / "vocab.txt"), "--max_seq_length", "16"]) == 0
    out = capsys.readouterr().out
    assert "is_next=1  A: w1 héllo  |  B: w2" in out and "[CLS]" in out
    assert dataset_main([str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_launcher_two_ranks_with_the_bing_provider_and_async_worker(tmp_path):
    """deepspeed_train.py without --use_nvidia_dataset: both ranks finish epoch 1 together, and
    --max_steps ends epoch 2 midway while the worker still holds prefetched batches."""
    from tests.launch import launch, progress, tiny_args
    from testkit.synthetic import make_data_root

    # 2 shard folders per dataset x 64 samples; 2 ranks x micro 16: 2 + 2 micro batches per epoch.
    root = make_data_root(str(tmp_path / "data"), seq_lengths=(128,), n_train=128, shards=2, n_valid=16)
    result = launch(tiny_args(root, tmp_path / "out", 128, "--print_steps", 1, "--max_steps", 6,
                              "--validation_data_path_prefix", os.path.join(root, "bing", "128"), nvidia=False),
                    num_ranks=2)
    log = result.stdout + result.stderr
    assert result.returncode == 0, log[-3000:]
    rows = progress(log)
    assert [r[0] for r in rows] == list(range(1, 7))
    assert rows[-1][3] == 6 * 2 * 16
    assert rows[-1][1] < rows[0][1]
    assert "WIKIPEDIA shard_001" in log and "BOOK_CORPUS shard_001" in log
    assert log.count("Validation at step") == 2   # after epoch 1, and once at the --max_steps end
    assert "did not stop" not in log
    saved = os.listdir(tmp_path / "out" / "saved_models" / "tiny_bert")
    assert {"epoch1_step4", "step6"} <= set(saved)   # the stop's checkpoint keeps the position in epoch 2


def test_two_datasets_naming_one_folder_are_warned_about(data_root, caplog):
    """Both of a job config's datasets on one folder train each sample twice an epoch (as the
    demo config once did, unseen): the provider says so."""
    args = make_args(data_root, data_root / "vocab.txt")
    args.config["data"]["datasets"]["bc_pretrain_dataset"] = "wiki/../wiki"
    with caplog.at_level(logging.WARNING):
        BingBertDatasetProvider(args).close()
    assert "wiki_pretrain_dataset and bc_pretrain_dataset all name" in caplog.text
    assert "every sample of it is trained 2 times an epoch" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        BingBertDatasetProvider(make_args(data_root, data_root / "vocab.txt")).close()
    assert "all name" not in caplog.text
