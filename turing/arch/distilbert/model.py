"""The DistilBERT block: `bert_model_config` with `"architecture": "distilbert"`.

Owns `DistilConfig` (that architecture's `bert_model_config`: the post-LN BERT's keys, as
transformers' BertConfig names them, without `type_vocab_size`, plus `seq_classif_dropout`) and
`DistilForPreTraining`, the encoder of Sanh et al. 2019 as transformers' `DistilBertForMaskedLM`
computes it, so that a stock DistilBERT (distilbert-base-uncased, ...) continues pretraining here
(`turing/arch/distilbert/hf.py` imports one and writes one back). Knows nothing of training.

The block is the post-LN BERT's (turing/arch/bert_postln/model.py: its layers, encoder and MLM
transform, reused), with DistilBERT's differences, each exact against transformers in fp32:
- embeddings: word + learned absolute position (0..L-1), LayerNorm (eps 1e-12), dropout; no token
  type embeddings at all: the batches' segment ids are read by nothing. DistilBERT's
  `sinusoidal_pos_embds` is refused on import (hf.py): this block learns its position table;
- layer: `h = LN(x + Attn(x))`, then `LN(h + Dropout(FFN(h)))`: the attention output (`out_lin`)
  joins the residual without a dropout (BERT drops it out); attention dropout
  (`attention_probs_dropout_prob`, transformers' attention_dropout) is on the probabilities, the
  FFN's and the embeddings' is `hidden_dropout_prob` (its dropout); FFN = lin1, act
  (`hidden_act`, its activation; gelu the exact erf form), lin2;
- every LayerNorm's eps is 1e-12 (transformers fixes it; the config has no key for it);
- no pooler and no next-sentence head (`nsp_head` false: the job config's NSP term defaults off and
  is refused on): the MLM head alone, transform (dense, act, LayerNorm: transformers'
  vocab_transform, activation, vocab_layer_norm), then the decoder tied to the word embedding,
  plus a bias (vocab_projector);
- vocab: the word embedding (and the tied decoder) has the tokenizer's rows rounded up to a
  multiple of 8, as every architecture here (hf.py drops the padding rows on export);
- fine-tuning: pre_classifier, ReLU, dropout `seq_classif_dropout`, classifier on the first
  token (classifier.py).

Parameter names are the post-LN model's (transformers' BERT names: `bert.embeddings...`,
`bert.encoder.layer.N.attention.self.query`, `...attention.output.dense` for out_lin,
`...intermediate.dense` for ffn.lin1, `cls.predictions.transform.dense` for vocab_transform,
`cls.predictions.bias`; hf.py maps DistilBERT's onto them). The forward, `predict`, `encode` and
`mlm_scores` are the pre-LN model's (`BertForPreTrainingPreLN`; `predict` gives None for the NSP
scores): the loss is the MLM term over the masked rows; `--unpad` runs the encoder on the real
tokens (`turing.modeling.Unpadding`), `--checkpoint_activations` recomputes each layer in
backward. Refused (`refused_options`): the post-LN block's, for its reasons. Fresh weights start
as transformers' do: normal(0, initializer_range), zero biases, unit LayerNorms (its [PAD] row
of the word embedding, zero there, is not: the config does not know the pad id).
"""
from torch import nn

from turing.arch.bert_postln.model import BertForPreTrainingPostLN, PostLNEncoder, PostLNPredictionHeadTransform
from turing.errors import InputValueError
from turing.modeling import (LAYER_NORM_EPS, BertConfig, BertConfigError, BertLMPredictionHead,
                             _extended_attention_mask, config_values)

ARCHITECTURE = "distilbert"


class DistilConfig(BertConfig):
    """The post-LN BERT's `bert_model_config` keys without `type_vocab_size` (DistilBERT has no
    token types), plus `seq_classif_dropout` (the fine-tuning head's dropout, transformers' default
    0.2), with "architecture": "distilbert". Every LayerNorm's eps is 1e-12 (`layer_norm_eps`, a
    class attribute: not a key)."""

    architecture = ARCHITECTURE
    FIELDS = tuple(k for k in BertConfig.FIELDS if k != "type_vocab_size") + ("seq_classif_dropout",)
    layer_norm_eps = LAYER_NORM_EPS

    def __init__(self, vocab_size, seq_classif_dropout=0.2, **values):
        if isinstance(vocab_size, str):
            raise BertConfigError(f"bert_model_config (architecture {ARCHITECTURE}): the vocab size must be an int")
        unknown = sorted(set(values) - set(self.FIELDS))
        if unknown:
            raise BertConfigError(f"bert_model_config (architecture {ARCHITECTURE}): unknown key(s) {unknown}; "
                                  f"expected any of {list(self.FIELDS)}")
        super().__init__(vocab_size, **values)
        del self.type_vocab_size  # BertConfig checked the other values; this block has no token types
        if (isinstance(seq_classif_dropout, bool) or not isinstance(seq_classif_dropout, (int, float))
                or not 0.0 <= seq_classif_dropout < 1.0):
            raise BertConfigError(f"bert_model_config (architecture {ARCHITECTURE}): seq_classif_dropout must be "
                                  f"in [0, 1), got {seq_classif_dropout!r}")
        self.seq_classif_dropout = seq_classif_dropout

    @classmethod
    def from_dict(cls, json_object):
        """From `bert_model_config`: `vocab_size_or_config_json_file` (or `vocab_size`), "architecture":
        "distilbert", and any of FIELDS; `type_vocab_size` is refused, saying why."""
        values, vocab_size = config_values(json_object, ARCHITECTURE)
        if "type_vocab_size" in values:
            raise BertConfigError(f"bert_model_config (architecture {ARCHITECTURE}): key 'type_vocab_size' is the "
                                  "original BERT's; DistilBERT has no token type embeddings, leave it out")
        return cls(vocab_size, **values)

    def to_dict(self):
        return {"architecture": ARCHITECTURE, **super().to_dict()}


class DistilEmbeddings(nn.Module):
    """word + position (0..L-1), LayerNorm, dropout: no token type table."""

    def __init__(self, config):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, input_ids, unpadding=None):
        """(B, L) ids -> (B, L, H); with `unpadding`, the kept tokens only: (T, H)."""
        seq_length = input_ids.size(1)
        if seq_length > self.position_embeddings.num_embeddings:
            raise InputValueError(f"sequence length {seq_length} exceeds max_position_embeddings "
                                  f"{self.position_embeddings.num_embeddings}")
        if unpadding is not None:
            embeddings = self.word_embeddings(unpadding.pack(input_ids)) + self.position_embeddings(unpadding.positions)
        else:  # positions 0..L-1 are the same for every row: the table's slice, broadcast over B
            embeddings = self.word_embeddings(input_ids) + self.position_embeddings.weight[:seq_length]
        return self.dropout(self.LayerNorm(embeddings))


class DistilModel(nn.Module):
    """Embeddings and the post-LN encoder, no pooler (transformers' DistilBertModel): `.bert` of the
    pretraining model and what fine-tuning sits on. forward(ids, segment ids (unread), mask) ->
    (sequence output, None: no pooled output), the pair BertModel's forward gives."""

    def __init__(self, config, checkpoint_activations=False):
        super().__init__()
        self.embeddings = DistilEmbeddings(config)
        self.encoder = PostLNEncoder(config, checkpoint_activations)
        for layer in self.encoder.layer:
            # DistilBERT adds out_lin's output to the residual as it is (BERT drops it out first)
            layer.attention.output.dropout = nn.Identity()

    def forward(self, input_ids, token_type_ids, attention_mask, pld_theta=None, unpadding=None):
        """-> (sequence_output (B, L, H), or packed (T, H) with `unpadding`; None)."""
        embedding_output = self.embeddings(input_ids, unpadding)
        mask = unpadding.mask if unpadding is not None else _extended_attention_mask(attention_mask,
                                                                                     embedding_output.dtype)
        return self.encoder(embedding_output, mask, pld_theta, unpadding), None


class DistilMLMHead(nn.Module):
    """The MLM head alone (`.predictions`: transform, tied decoder, bias); forward(sequence, pooled)
    -> (scores, None), the pair BERT's heads give, without NSP scores."""

    def __init__(self, config, word_embedding_weight):
        super().__init__()
        self.predictions = BertLMPredictionHead(config, word_embedding_weight, PostLNPredictionHeadTransform(config))

    def forward(self, sequence_output, pooled_output):
        return self.predictions(sequence_output), None


class DistilForPreTraining(BertForPreTrainingPostLN):
    """DistilBERT with its MLM head; `forward(batch, **kwargs)` -> the MLM loss (or, labels None,
    (scores, None)), `predict`, `encode` and `mlm_scores` as BertForPreTrainingPreLN's. `options`:
    ModelOptions or a command line (where it does not say, next-sentence prediction is off: there
    is no NSP head); `refused_options` (the post-LN block's) says what else is refused."""

    architecture = ARCHITECTURE
    nsp_head = False

    encoder_class = DistilModel

    def heads(self, config, word_embedding_weight):
        return DistilMLMHead(config, word_embedding_weight)   # no NSP head: block_options refuses the term
