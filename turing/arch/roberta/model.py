"""The RoBERTa family's block: `bert_model_config` with `"architecture": "roberta"`.

Owns `RobertaConfig` (that architecture's `bert_model_config`: the post-LN block's keys, as
transformers' RobertaConfig names them, and `pad_token_id`, `model_type`, `classifier_dropout`)
and `RobertaForPreTraining`, the block of RoBERTa (Liu et al. 2019), XLM-R and CamemBERT as
transformers' RobertaModel, XLMRobertaModel and CamembertModel compute it, so that a stock
`RobertaForMaskedLM`, `XLMRobertaForMaskedLM` or `CamembertForMaskedLM` (or the bare encoder)
continues pretraining here (`turing/arch/roberta/hf.py` imports one and writes it back as the
class of its `model_type`). Knows nothing of training.

The block is the post-LN BERT block of turing/arch/bert_postln/model.py (its encoder layers, MLM
transform and initialisation are reused as they are), with RoBERTa's differences:
- positions: transformers numbers them from the input ids, cumsum(input_ids != pad) * mask +
  pad_token_id, so a real token at index j (padding at the end, as in every batch here) has
  position pad_token_id + 1 + j. The position table is transformers' whole (same shape and
  key: its rows 0..pad_token_id are never read by a real token) and is read at pad_token_id + 1 + j.
  `max_position_embeddings` is, as everywhere in this project, the positions a sequence may use:
  the table has pad_token_id + 1 rows more (transformers' max_position_embeddings, 514 for
  roberta-base's 512). Outputs at pad positions differ from transformers' and are read by nothing.
  A pad id inside a sequence (an MLM replacement may draw one) is a token here, numbered by its
  index; transformers' count skips it and numbers the tokens after it one lower.
- one token type (type_vocab_size 1): the model reads token type 0 everywhere, as transformers does
  with the token type ids RoBERTa's tokenizers do not give, so the segment ids of our batches
  (0/1 for a sentence pair) are read by nothing.
- layer_norm_eps from the config (RoBERTa's 1e-5).
- no pooler and no next-sentence head (`nsp_head` false: the NSP term defaults off and is refused
  on): `.bert` returns (sequence output, None), as transformers' RobertaModel without its pooling layer.
- the MLM head (transformers' RobertaLMHead, our `cls.predictions`): dense, GELU (always the exact
  erf form, whatever hidden_act, as RobertaLMHead applies it; hidden_act is the feed-forward's),
  LayerNorm, the decoder tied to the word embeddings, plus a bias.
- initialisation as transformers': the post-LN block's (normal(0, initializer_range), zero biases,
  unit LayerNorms), and the word and position embeddings' rows pad_token_id zero.
Sentence pairs come out of tools/prepare_data.py as `<s> A </s> B </s>` (the tokenizer's cls and
sep: the shard format is BERT's for every architecture), not RoBERTa's `<s> A </s></s> B </s>`.

Parameter names are BertForPreTrainingPostLN's without the pooler and the NSP head, which are
transformers' under `bert.` (its `roberta.`) and `cls.predictions.` (its `lm_head.`), so the
mapping renames and drops and re-creates the vocab padding rows, nothing else. The forward,
`predict`, `encode` and `mlm_scores` are BertForPreTrainingPreLN's: the loss is the MLM term over
the masked rows only; `--unpad` runs the encoder on the real tokens (`turing.modeling.Unpadding`),
`--checkpoint_activations` recomputes each layer in backward. Refused (`refused_options`): what the
post-LN block refuses (progressive layer drop, DeepSpeed's transformer kernel, block-sparse attention).
"""
import torch
import torch.nn.functional as F
from torch import nn

from turing.arch.bert_postln.model import (BertForPreTrainingPostLN, PostLNConfig, PostLNEmbeddings, PostLNEncoder,
                                           PostLNPredictionHeadTransform)
from turing.errors import InputValueError
from turing.modeling import BertConfigError, BertLMPredictionHead, _extended_attention_mask

ARCHITECTURE = "roberta"
MODEL_TYPES = ("roberta", "xlm-roberta", "camembert")   # transformers' model types of this block
ROBERTA_LAYER_NORM_EPS = 1e-5


class RobertaConfig(PostLNConfig):
    """The post-LN block's `bert_model_config` keys with RoBERTa's defaults (one token type, LayerNorm
    eps 1e-5, 512 positions), and `pad_token_id` (the tokenizer's pad id, from which positions are
    numbered: an export refuses a tokenizer with another), `model_type` (the transformers family an
    export writes: MODEL_TYPES) and `classifier_dropout` (the fine-tuning head's; None:
    hidden_dropout_prob)."""

    architecture = ARCHITECTURE
    FIELDS = PostLNConfig.FIELDS + ("pad_token_id", "model_type", "classifier_dropout")

    def __init__(self, vocab_size, layer_norm_eps=ROBERTA_LAYER_NORM_EPS, type_vocab_size=1, pad_token_id=1,
                 model_type=MODEL_TYPES[0], classifier_dropout=None, **values):
        super().__init__(vocab_size, layer_norm_eps=layer_norm_eps, type_vocab_size=type_vocab_size, **values)
        where = f"bert_model_config (architecture {ARCHITECTURE})"
        if type_vocab_size != 1:
            raise BertConfigError(f"{where}: type_vocab_size must be 1, got {type_vocab_size!r}: RoBERTa models have "
                                  "one token type (their tokenizers give no token type ids)")
        if isinstance(pad_token_id, bool) or not isinstance(pad_token_id, int) or not 0 <= pad_token_id < vocab_size:
            raise BertConfigError(f"{where}: pad_token_id must be an id of the vocab (0 to {vocab_size - 1}), got "
                                  f"{pad_token_id!r}")
        if model_type not in MODEL_TYPES:
            raise BertConfigError(f"{where}: model_type must be one of {', '.join(MODEL_TYPES)}, got {model_type!r}")
        if classifier_dropout is not None and (isinstance(classifier_dropout, bool)
                                               or not isinstance(classifier_dropout, (int, float))
                                               or not 0.0 <= classifier_dropout < 1.0):
            raise BertConfigError(f"{where}: classifier_dropout must be null or in [0, 1), got {classifier_dropout!r}")
        self.pad_token_id = pad_token_id
        self.model_type = model_type
        self.classifier_dropout = classifier_dropout

    def pad_id_problem(self, pad_id):
        """Why a tokenizer padding with `pad_id` cannot feed this model, in words; None where it can.
        transformers numbers a RoBERTa's positions from the pad id it finds in the input, this model
        from pad_token_id: they must be one id, or the exported model reads other position rows."""
        if pad_id == self.pad_token_id:
            return None
        return (f"the tokenizer's pad id is {pad_id}, bert_model_config's pad_token_id {self.pad_token_id}: "
                "transformers numbers a RoBERTa's positions from the pad id of its input, the model numbers them "
                f"from pad_token_id; train with bert_model_config's pad_token_id set to {pad_id}")

    @property
    def first_position(self):
        """The row of the position table a sequence's first token reads (transformers' pad_token_id + 1)."""
        return self.pad_token_id + 1


class RobertaEmbeddings(PostLNEmbeddings):
    """word + token type 0 + position (the table read from row pad_token_id + 1 on), LayerNorm, dropout."""

    def __init__(self, config):
        super().__init__(config)
        self.first_position = config.first_position
        self.position_embeddings = nn.Embedding(config.max_position_embeddings + self.first_position,
                                                config.hidden_size)

    def forward(self, input_ids, token_type_ids, unpadding=None):
        """(B, L) ids -> (B, L, H); with `unpadding`, the kept tokens only: (T, H). `token_type_ids`
        are not read (one token type)."""
        seq_length = input_ids.size(1)
        usable = self.position_embeddings.num_embeddings - self.first_position
        if seq_length > usable:
            raise InputValueError(f"sequence length {seq_length} exceeds max_position_embeddings {usable} (the "
                                  f"position table's rows after pad_token_id {self.first_position - 1})")
        token_type = self.token_type_embeddings.weight[0]   # (H,), every token's
        if unpadding is not None:
            embeddings = (self.word_embeddings(unpadding.pack(input_ids)) + token_type
                          + self.position_embeddings(unpadding.positions + self.first_position))
        else:
            # a real token at index j reads row first_position + j: the slice, broadcast over B
            first = self.first_position
            embeddings = (self.word_embeddings(input_ids) + token_type
                          + self.position_embeddings.weight[first:first + seq_length])
        return self.dropout(self.LayerNorm(embeddings))


class RobertaModel(nn.Module):
    """Embeddings and the post-LN encoder, no pooler (transformers' RobertaModel without its pooling
    layer): `.bert` of the pretraining model and what fine-tuning sits on."""

    def __init__(self, config, checkpoint_activations=False):
        super().__init__()
        self.embeddings = RobertaEmbeddings(config)
        self.encoder = PostLNEncoder(config, checkpoint_activations)

    def forward(self, input_ids, token_type_ids, attention_mask, pld_theta=None, unpadding=None):
        """-> (sequence_output (B, L, H), None): BertModel's interface without a pooled output. With
        `unpadding` the encoder runs on the kept tokens only and sequence_output is packed: (T, H)."""
        embedding_output = self.embeddings(input_ids, token_type_ids, unpadding)
        mask = unpadding.mask if unpadding is not None else _extended_attention_mask(attention_mask,
                                                                                     embedding_output.dtype)
        return self.encoder(embedding_output, mask, pld_theta, unpadding), None


class RobertaLMTransform(PostLNPredictionHeadTransform):
    """dense, GELU, LayerNorm: transformers' RobertaLMHead before its decoder, GELU whatever hidden_act."""

    def __init__(self, config):
        super().__init__(config)
        self.act = F.gelu


class RobertaLMHead(nn.Module):
    """`predictions`, the MLM head (transform, decoder tied to the word embedding, bias); no NSP head:
    forward(sequence_output, pooled_output) -> (scores, None)."""

    def __init__(self, config, word_embedding_weight):
        super().__init__()
        self.predictions = BertLMPredictionHead(config, word_embedding_weight, RobertaLMTransform(config))

    def forward(self, sequence_output, pooled_output=None):
        return self.predictions(sequence_output), None


class RobertaForPreTraining(BertForPreTrainingPostLN):
    """The RoBERTa block with its MLM head; `forward(batch, **kwargs)` (the MLM loss; with labels None,
    (prediction_scores, None)), `predict`, `encode` and `mlm_scores` as BertForPreTrainingPreLN's.
    `options`: ModelOptions or a command line; `refused_options` (the post-LN block's) says what is refused."""

    architecture = ARCHITECTURE
    nsp_head = False

    encoder_class = RobertaModel

    def heads(self, config, word_embedding_weight):
        return RobertaLMHead(config, word_embedding_weight)   # no NSP head: block_options refuses the term

    def _init_weights(self):
        super()._init_weights()
        pad = self.config.pad_token_id
        with torch.no_grad():   # transformers zeroes an embedding's padding_idx row
            self.bert.embeddings.word_embeddings.weight[pad].zero_()
            self.bert.embeddings.position_embeddings.weight[pad].zero_()
