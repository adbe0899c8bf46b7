"""The "modernbert" architecture: the ModernBERT-style encoder (`model.py`: RoPE, GeGLU, no biases,
global and sliding-window attention), its fine-tuning head (`classifier.py`) and its Hugging Face
adapter, ModernBertForMaskedLM (`hf.py`)."""
from turing.arch.modernbert.classifier import modern_classifier
from turing.arch.modernbert.hf import ADAPTER
from turing.arch.modernbert.model import ARCHITECTURE, ModernConfig, ModernForPreTraining
from turing.arch.spec import ArchSpec
from turing.flops import modern_training_flops

SPEC = ArchSpec(name=ARCHITECTURE, config=ModernConfig, model=ModernForPreTraining, classifier=modern_classifier,
                flops=modern_training_flops, hf=ADAPTER)
