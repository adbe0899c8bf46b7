"""What one architecture is, as the registry (turing/arch/__init__.py) holds it: `ArchSpec` (its
config class, pretraining model, fine-tuning head, FLOPs formula and Hugging Face adapter) and
`HFAdapter` (its weights in Hugging Face's classes, both ways). Each architecture's folder
(turing/arch/NAME/) builds one of each; nothing here knows a particular architecture.
"""
import dataclasses
from typing import Callable, Optional, Tuple


def _default_verify_length(config):
    return 32


def _any_tokenizer(config, special, where):
    return None


@dataclasses.dataclass(frozen=True)
class HFAdapter:
    """One architecture's weights in Hugging Face's classes (turing/arch/NAME/hf.py).

    Import: a folder whose config.json names one of `model_types` (and, where it lists
    architectures, one of `classes`) is read by `config_from_hf(config.json dict)` -> our config
    (vocab rows padded to a multiple of 8) and `from_hf(HF state dict, config.json dict)` -> (our
    state dict, our config). Our keys in `fresh_keys` may be absent from a folder (a pooler and a
    next-sentence head a masked-LM class lacks): they keep the model's fresh initialisation.
    Export: `to_hf(state dict, config, real vocab size, special ids)` -> (HF state dict,
    config.json dict), whose `architectures` names the transformers class the export writes (the
    class the weights came from where the architecture imports several), and `readme(config,
    fields)` -> the folder's README.md.
    `token_types`: the model reads token type ids (an export's tokenizer then returns them);
    `verify_length(config)`: the length of the padded batch an export is checked on."""
    model_types: Tuple[str, ...]
    classes: Tuple[str, ...]
    config_from_hf: Callable
    from_hf: Callable
    to_hf: Callable
    readme: Callable
    fresh_keys: Tuple[str, ...] = ()
    token_types: bool = True
    verify_length: Callable = _default_verify_length


@dataclasses.dataclass(frozen=True)
class ArchSpec:
    """An architecture: `bert_model_config.architecture` = `name`.

    config: its config class (`from_dict(bert_model_config)`, `to_dict()`, an `architecture`
      class attribute = name);
    model: its pretraining model class, `model(config, options)`: `forward(batch, **kwargs)` -> the
      loss, or with labels None (scores, nsp_scores or None); `predict`, `encode`, `mlm_scores`; the
      encoder at `.bert`; class attributes `architecture`, `refused_options` ({flag: why}) and
      `nsp_head` (turing.model_options reads them);
    classifier: (pretraining model, config, num_labels) -> the fine-tuning model on its encoder;
    flops: (config, seq_length, predictions) -> FLOPs of training on one sequence;
    hf: its HFAdapter;
    check_tokenizer: (config, the tokenizer's special ids {role: id}, where) raises one error line
      naming `where` if the model cannot be trained with that tokenizer (default: any fits)."""
    name: str
    config: type
    model: type
    classifier: Callable
    flops: Callable
    hf: Optional[HFAdapter] = None
    check_tokenizer: Callable = _any_tokenizer

    @property
    def nsp_head(self):
        """Its model has a next-sentence head (the job config's NSP term defaults on)."""
        return self.model.nsp_head

    @property
    def refused_options(self):
        return self.model.refused_options
