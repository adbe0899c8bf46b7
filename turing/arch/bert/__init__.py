"""The "bert" architecture, the default: the original's pre-LN BERT (`turing/modeling.py`, where
the original's users import it), its fine-tuning head (`classifier.py`) and its Hugging Face
adapter, RoBERTa-PreLayerNorm (`hf.py`)."""
from turing.arch.bert.classifier import bert_classifier
from turing.arch.bert.hf import ADAPTER
from turing.arch.spec import ArchSpec
from turing.flops import bert_training_flops
from turing.modeling import BertConfig, BertForPreTrainingPreLN

SPEC = ArchSpec(name="bert", config=BertConfig, model=BertForPreTrainingPreLN, classifier=bert_classifier,
                flops=bert_training_flops, hf=ADAPTER)
