"""The data formats the program and the tools read: `DATA_FORMATS` (the job config's `data.format`
-> its provider class, bert_dataset_provider's interface) and `validation_format`, the format
whose files a validation folder holds. The trainer (deepspeed_train.py) and tools/eval_mlm.py both
read them here; a new format is one line in DATA_FORMATS (docs/DESIGN.md, "How to add")."""
from bing_bert_dataset_provider import BingBertDatasetProvider
from nvidia_bert_dataset_provider import NvidiaBertDatasetProvider
from turing.errors import InputError

DATA_FORMATS = {"nvidia": NvidiaBertDatasetProvider, "bing": BingBertDatasetProvider}


def validation_format(path, where):
    """The provider class of the first format that claims the validation folder `path`; a folder no
    format claims is one error line (`where`: how the user named the folder)."""
    claimed = [provider for provider in DATA_FORMATS.values() if provider.holds_validation_set(path)]
    if not claimed:
        raise InputError(f"{path}: holds no validation set of a known format (NVIDIA .hdf5 files, or Bing shard "
                         f"folders with data.npy); {where}")
    return claimed[0]
