"""The architectures a job config's `bert_model_config.architecture` can name, one folder each
(turing/arch/NAME/: its model, config, fine-tuning head and Hugging Face adapter, gathered in an
`ArchSpec`, turing/arch/spec.py), and the registry that maps a name to its spec.

Owns: `ARCHITECTURES` (name -> ArchSpec), `DEFAULT_ARCHITECTURE` (the original's pre-LN BERT, what
a bert_model_config without "architecture" is: read here and nowhere else, `architecture_of`),
and what every caller builds through: `model_config_from_dict`, `pretraining_model` (with the
speed-ups of turing.speedups), `training_flops`, and `hf_spec` (the architecture that imports a
Hugging Face config.json). No code outside this registry branches on an architecture's name.

Adding an architecture: a folder turing/arch/NAME/ whose `__init__.py` builds `SPEC = ArchSpec(...)`
(docs/DESIGN.md, "How to add an architecture"), and its line below.
"""
from turing.arch import bert, bert_postln, distilbert, modernbert, roberta
from turing.errors import ConversionError
from turing.modeling import BertConfigError
from turing.speedups import apply_speedups

DEFAULT_ARCHITECTURE = "bert"
ARCHITECTURES = {spec.name: spec for spec in (
    bert.SPEC,
    modernbert.SPEC,
    bert_postln.SPEC,
    distilbert.SPEC,
    roberta.SPEC,
)}


def architecture_of(model_config):
    """The architecture a bert_model_config dict names (DEFAULT_ARCHITECTURE where it names none)."""
    return model_config.get("architecture", DEFAULT_ARCHITECTURE) if isinstance(model_config, dict) \
        else DEFAULT_ARCHITECTURE


def spec_of(name):
    """The ArchSpec of an architecture name; another name is one error line listing the known ones."""
    if name not in ARCHITECTURES:
        raise BertConfigError(f"bert_model_config: architecture {name!r} is not one of {', '.join(ARCHITECTURES)}")
    return ARCHITECTURES[name]


def model_config_from_dict(values):
    """The config of a `bert_model_config` dict, of the class its "architecture" names."""
    return spec_of(architecture_of(values)).config.from_dict(values)


def pretraining_model(config, options=None):
    """The pretraining model of `config`'s architecture, with the speed-ups of turing.speedups;
    `options`: ModelOptions or a command line."""
    return apply_speedups(spec_of(config.architecture).model(config, options))


def check_tokenizer(config, tokenizer, where):
    """Refuse, in one line naming `where`, a tokenizer `config`'s model cannot be trained with
    (RoBERTa: another pad id than its pad_token_id), before anything is trained."""
    spec_of(config.architecture).check_tokenizer(config, tokenizer.special, where)


def training_flops(config, seq_length, predictions):
    """FLOPs of training `config`'s model on one sequence of `seq_length` tokens with `predictions`
    masked ones (forward + backward; the formulas are derived in turing/flops.py)."""
    return spec_of(config.architecture).flops(config, seq_length, predictions)


def hf_imported():
    """What the registry imports from Hugging Face, for error lines: 'model_type (Class, ...), ...'."""
    return ", ".join(f"{'/'.join(spec.hf.model_types)} ({', '.join(spec.hf.classes)})"
                     for spec in ARCHITECTURES.values() if spec.hf is not None)


def hf_spec(model_type, where):
    """The ArchSpec whose Hugging Face adapter reads config.json's `model_type` (`where` names the
    folder in the one error line of another one)."""
    for spec in ARCHITECTURES.values():
        if spec.hf is not None and model_type in spec.hf.model_types:
            return spec
    raise ConversionError(f"{where}: config.json model_type {model_type!r} is not one this project imports: "
                          f"{hf_imported()}")
