"""The "bert_postln" architecture: the post-LayerNorm BERT block as transformers' BertModel computes
it (`model.py`), so that a stock BertForMaskedLM or BertForPreTraining continues pretraining here
(`hf.py`); fine-tuned with BERT's pooler and head (turing/arch/bert/classifier.py)."""
from turing.arch.bert.classifier import bert_classifier
from turing.arch.bert_postln.hf import ADAPTER
from turing.arch.bert_postln.model import ARCHITECTURE, BertForPreTrainingPostLN, PostLNConfig
from turing.arch.spec import ArchSpec
from turing.flops import bert_training_flops

SPEC = ArchSpec(name=ARCHITECTURE, config=PostLNConfig, model=BertForPreTrainingPostLN, classifier=bert_classifier,
                flops=bert_training_flops, hf=ADAPTER)
