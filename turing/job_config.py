"""The job config (--cf, `bert_config.json`) as typed sections, built once from the JSON after
turing.run_config has read and checked it for the run's sequence length, and read by attribute
everywhere else (the trainer, the providers, the checkpointer, the LR schedules): no code past the
parser looks a key up in the raw dict.

    name                      the run name (--job_name overrides it)
    bert_token_file           the tokenizer (a vocab.txt, a tokenizer.json, or a folder holding one)
    bert_model_file           pretrained weights (--use_pretrain)
    bert_model_config         the model sizes and architecture (turing.arch.model_config_from_dict)
    data.format               "nvidia" or "bing" (default: --use_nvidia_dataset's choice)
    data.mixed_seq_datasets   {seq: {dataset name: path under --data_path_prefix}}
    mixed_seq_training        {seq: the training section, TrainingSection}
    validation.path           the validation set under --validation_data_path_prefix
"""
import dataclasses
from typing import Optional, Tuple

from turing.arch import architecture_of
from turing.dataset import MASK_SPLIT, MASKED_SHARE
from turing.errors import InputValueError
from turing.lr_schedule import COOLDOWN_PROPORTION

def _key(default, meaning):
    """A field of a job config section, its meaning kept for the configuration reference
    (tools/config_reference.py)."""
    return dataclasses.field(default=default, metadata={"help": meaning})


# The job config's keys outside the training section, as the program reads them: key, type, meaning
# (the configuration reference, tools/config_reference.py, prints them with TrainingSection's).
JOB_KEYS = (
    ("name", "str", "the run name (--job_name overrides it): OUT/saved_models/NAME, OUT/runs/NAME"),
    ("bert_token_file", "path", "the tokenizer: a vocab.txt, a tokenizer.json, a folder holding one, or a model id "
                                "in the Hugging Face cache; taken from bert_model_file's folder where left out"),
    ("bert_model_file", "path", "--use_pretrain's trained model: a checkpoint, a state dict file, a Hugging Face "
                                "folder or a model id in the Hugging Face cache (as given, else under "
                                "--data_path_prefix)"),
    ("bert_model_config", "object", "the model: its architecture and sizes (below); taken from bert_model_file's "
                                    "config.json where left out"),
    ("data.format", "str", "nvidia or bing (default: --use_nvidia_dataset's choice)"),
    ("data.mixed_seq_datasets.<seq>", "object", "dataset name -> folder under --data_path_prefix for sequence length "
                                                "<seq>: pretrain_dataset (nvidia), wiki_pretrain_dataset and/or "
                                                "bc_pretrain_dataset (bing)"),
    ("mixed_seq_training.<seq>", "object", "the training section of sequence length <seq> (below)"),
    ("validation.path", "path", "the validation set under --validation_data_path_prefix"),
)


@dataclasses.dataclass(frozen=True)
class TrainingSection:
    """mixed_seq_training.<seq>: the schedule and the recipe switches of one sequence length.
    Defaults are the original's recipe; the first four the parser requires of a job config (None
    only in a hand-built section that does not train, a provider's test, say)."""
    num_epochs: Optional[int] = _key(None, "epochs of this sequence length (required)")
    learning_rate: Optional[float] = _key(None, "peak learning rate (required)")
    warmup_proportion: Optional[float] = _key(None, "share of total_training_steps the warmup takes (required)")
    total_training_steps: Optional[int] = _key(None, "the schedule's length in optimizer steps (required)")
    decay_rate: Optional[float] = _key(None, "LE, EE: LR x decay_rate ** ((step - warmup steps) / decay_step)")
    decay_step: Optional[float] = _key(None, "LE, EE: steps per decay_rate factor")
    num_workers: int = _key(0, "DataLoader workers per rank")
    async_worker: bool = _key(False, "the Bing provider's AsyncWorker (true/false)")
    weight_decay: float = _key(0.01, "AdamW/LAMB weight decay (biases and LayerNorms: none)")
    masked_lm_prob: float = _key(MASKED_SHARE, "the Bing provider's dynamic masking: share of tokens masked")
    mask_split: Tuple[float, float, float] = _key(tuple(MASK_SPLIT), "[mask, random, keep] shares of the masked tokens")
    next_sentence_prediction: Optional[bool] = _key(None, "the NSP term, true or false (left out: on where the "
                                                          "architecture has an NSP head; the run's choice is "
                                                          "turing.run_config.check_recipe's)")
    cooldown_proportion: float = _key(COOLDOWN_PROPORTION, "WSD, budget: share of the run the final decay takes")
    cooldown_shape: str = _key("linear", "WSD, budget: the decay's shape")

    @classmethod
    def from_dict(cls, section, where="job config mixed_seq_training.<seq>"):
        """The section of a JSON dict (its values checked by turing.run_config); keys it does not
        know are ignored here. `where` names the section in errors."""
        known = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in section.items() if k in known}
        if not isinstance(values.get("async_worker", False), bool):  # "present = on" in the original: say it
            raise InputValueError(f"{where}.async_worker: expected true or false, got {values['async_worker']!r}")
        if "mask_split" in values:
            values["mask_split"] = tuple(values["mask_split"])
        return cls(**values)


@dataclasses.dataclass(frozen=True)
class JobConfig:
    """The job config of one run, for its sequence length."""
    name: Optional[str]
    bert_token_file: str
    bert_model_file: str
    bert_model_config: dict          # as written: turing.arch.model_config_from_dict builds the config
    data_format: Optional[str]
    datasets: dict                   # data.mixed_seq_datasets.<seq>: dataset name -> path
    training: TrainingSection
    validation_path: Optional[str]
    raw: Optional[dict] = dataclasses.field(default=None, repr=False, compare=False)   # the JSON it was read from

    @property
    def architecture(self):
        return architecture_of(self.bert_model_config)

    @classmethod
    def from_resolved(cls, config, seq="<seq>"):
        """The JobConfig of a job config whose `training` and `data.datasets` are this sequence
        length's (`seq`) entries (as turing.run_config.complete_arguments leaves `args.config`)."""
        model = config.get("bert_model_config") or {}
        validation = config.get("validation")
        return cls(name=config.get("name"), bert_token_file=config.get("bert_token_file", ""),
                   bert_model_file=config.get("bert_model_file") or "", bert_model_config=model,
                   data_format=(config.get("data") or {}).get("format"),
                   datasets=dict((config.get("data") or {}).get("datasets") or {}),
                   training=TrainingSection.from_dict(config.get("training") or {},
                                                      f"job config mixed_seq_training.{seq}"),
                   validation_path=validation.get("path") if isinstance(validation, dict) else None, raw=config)


def job_config_of(args):
    """The JobConfig of a run's settings: the RunConfig's, or, for the original's `args` (which
    construct_arguments gives one too) and hand-built ones, made from `args.config`."""
    job = getattr(args, "job", None)
    return job if job is not None else JobConfig.from_resolved(args.config, getattr(args, "max_seq_length", "<seq>"))


def bert_model_config_of(args):
    """bert_model_config of a run's settings (None where there is none): the typed job config's,
    or that of a hand-built `args` holding only a `config` dict (the original's BertMultiTask(args))."""
    job = getattr(args, "job", None)
    if job is not None:
        return job.bert_model_config
    return (getattr(args, "config", None) or {}).get("bert_model_config")


def config_vocab_size(model_config):
    """The vocab size a bert_model_config dict gives (under either of its names), or None: the
    model's rows with a tokenizer.json where larger than its ids (Tokenizer.rows)."""
    value = (model_config or {}).get("vocab_size", (model_config or {}).get("vocab_size_or_config_json_file"))
    return value if isinstance(value, int) else None
