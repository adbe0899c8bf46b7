"""The "distilbert" architecture: DistilBERT's encoder as transformers' DistilBertForMaskedLM
computes it (`model.py`: the post-LN BERT block without token types, pooler or NSP head), its
fine-tuning head, transformers' DistilBertForSequenceClassification (`classifier.py`), and its
Hugging Face adapter (`hf.py`)."""
import functools

from turing.arch.distilbert.classifier import distil_classifier
from turing.arch.distilbert.hf import ADAPTER
from turing.arch.distilbert.model import ARCHITECTURE, DistilConfig, DistilForPreTraining
from turing.arch.spec import ArchSpec
from turing.flops import bert_training_flops

SPEC = ArchSpec(name=ARCHITECTURE, config=DistilConfig, model=DistilForPreTraining, classifier=distil_classifier,
                flops=functools.partial(bert_training_flops, pooler=False), hf=ADAPTER)
