"""Data formats behind deepspeed_train.DATA_FORMATS: a format added by one registry line is
trained on when the job config names it; an unknown name is one error line; the validation
set is opened once per run, not once per validation."""
import json

import deepspeed_train
from nvidia_bert_dataset_provider import NvidiaBertDatasetProvider
from tests.launch import TINY_CFG, ds_config, expect_input_error, train_in_process, train_losses


def job_config(tmp_path, data_format):
    config = json.load(open(TINY_CFG))
    config["data"]["format"] = data_format
    path = tmp_path / "job.json"
    path.write_text(json.dumps(config))
    return path


def test_a_registered_format_is_trained_on(data_root, tmp_path, monkeypatch):
    built = []

    class CopyOfNvidia(NvidiaBertDatasetProvider):  # a new format: its own provider class
        def __init__(self, args):
            built.append(args.max_seq_length)
            super().__init__(args)

    monkeypatch.setitem(deepspeed_train.DATA_FORMATS, "copy", CopyOfNvidia)  # ... and one registry line
    out = tmp_path / "out"
    train_in_process(data_root, out, ds_config(tmp_path), "--max_steps", 2, cf=job_config(tmp_path, "copy"),
                     nvidia=False)
    assert built == [128] and len(train_losses(out)) == 2


def test_an_unknown_format_is_one_error_line(data_root, tmp_path, capsys):
    line = expect_input_error(capsys, train_in_process, data_root, tmp_path / "out", ds_config(tmp_path),
                              cf=job_config(tmp_path, "parquet"))
    assert "data.format 'parquet' is not a known data format; expected one of nvidia, bing" in line


def test_the_validation_set_is_opened_once_per_run(data_root, tmp_path, monkeypatch):
    opened = []
    real = deepspeed_train.open_validation_set

    def counting(args):
        opened.append(args.max_seq_length)
        return real(args)

    monkeypatch.setattr(deepspeed_train, "open_validation_set", counting)
    out = tmp_path / "out"
    train_in_process(data_root, out, ds_config(tmp_path), "--validation_data_path_prefix",
                     data_root / "nvidia" / "128", "--validation_every_steps", 2)
    assert opened == [128]                       # 2 epochs x (1 in-epoch + 1 epoch-end) validations
