"""The "roberta" architecture: the block of RoBERTa, XLM-R and CamemBERT (`model.py`: post-LN BERT with
RoBERTa's positions, one token type, no pooler or NSP head), its fine-tuning head (`classifier.py`)
and its Hugging Face adapter, RobertaForMaskedLM, XLMRobertaForMaskedLM and CamembertForMaskedLM
and their bare encoders (`hf.py`). Its FLOPs: the BERT count without the pooler and the NSP head."""
import functools

from turing.arch.roberta.classifier import roberta_classifier
from turing.arch.roberta.hf import ADAPTER
from turing.arch.roberta.model import ARCHITECTURE, RobertaConfig, RobertaForPreTraining
from turing.arch.spec import ArchSpec
from turing.flops import bert_training_flops
from turing.modeling import BertConfigError


def check_tokenizer(config, special, where):
    """A tokenizer padding with another id than pad_token_id is refused before training (the export
    would refuse it after)."""
    problem = config.pad_id_problem(special["pad"])
    if problem:
        raise BertConfigError(f"{where}: {problem}")


SPEC = ArchSpec(name=ARCHITECTURE, config=RobertaConfig, model=RobertaForPreTraining, classifier=roberta_classifier,
                flops=functools.partial(bert_training_flops, pooler=False), hf=ADAPTER, check_tokenizer=check_tokenizer)
