"""The post-LayerNorm BERT block: `bert_model_config` with `"architecture": "bert_postln"`.

Owns `PostLNConfig` (that architecture's `bert_model_config`: the original's keys and
`layer_norm_eps`, as transformers' BertConfig names them) and `BertForPreTrainingPostLN`, the
block of Devlin et al. 2019 as transformers' `BertModel` computes it, so that a stock
`BertForMaskedLM` or `BertForPreTraining` (bert-base-uncased, ...) continues pretraining here
(`turing/arch/bert_postln/hf.py` imports one and writes one back). Knows nothing of training.

The block, as transformers' BertModel (post-LN):
- embeddings: word + token type + learned absolute position, LayerNorm, dropout (our
  `BertEmbeddings`, with the config's eps);
- layer: `h = LN(x + Dropout(Attn(x)))`, then `LN(h + Dropout(FFN(h)))`, FFN = dense, act
  (`hidden_act`, exact erf GELU for "gelu"), dense; no final LayerNorm (the last layer's is it);
- attention: our `BertSelfAttention` (Q, K, V in one matmul, SDPA; padding an additive -10000,
  which gives the real positions transformers' outputs: a weight of exactly 0 in fp32);
- pooler: tanh(dense([CLS])); heads: the MLM transform (dense, act, LayerNorm), the decoder
  tied to the word embedding, plus a bias; the next-sentence head on the pooled output.
Every LayerNorm uses `layer_norm_eps` (transformers' default 1e-12, the original's).

Parameter names are transformers' BertForPreTraining's (`bert.embeddings...`,
`bert.encoder.layer.N.attention.self.query`, `...attention.output.LayerNorm`,
`...intermediate.dense`, `...output.dense`, `bert.pooler.dense`, `cls.predictions.transform.dense`,
`cls.predictions.bias`, `cls.seq_relationship`), so the mapping only drops and re-creates the
vocab padding rows. The forward, `predict`, `encode` and `mlm_scores` are the pre-LN model's
(`BertForPreTrainingPreLN`): the loss is the MLM term over the masked rows only, plus the NSP term
when the options' next_sentence_prediction is on; `--unpad` runs the encoder on the real tokens
(`turing.modeling.Unpadding`), `--checkpoint_activations` recomputes each layer in backward.
Refused (`refused_options`): progressive layer drop, DeepSpeed's transformer kernel and
block-sparse attention. Fresh weights (the pooler and NSP head a BertForMaskedLM lacks) start as
transformers' do: normal(0, initializer_range), zero biases, unit LayerNorms.
"""
import math

from torch import nn
from torch.utils.checkpoint import checkpoint

from turing.model_options import block_options
from turing.modeling import (_ACTIVATIONS, LAYER_NORM_EPS, BertConfig, BertConfigError, BertEmbeddings,
                             BertForPreTrainingPreLN, BertModel, BertPreTrainingHeads, BertSelfAttention,
                             MaskedLMLoss)

ARCHITECTURE = "bert_postln"


class PostLNConfig(BertConfig):
    """The original's `bert_model_config` keys and `layer_norm_eps`, with "architecture": "bert_postln"."""

    architecture = ARCHITECTURE
    FIELDS = BertConfig.FIELDS + ("layer_norm_eps",)

    def __init__(self, vocab_size, layer_norm_eps=LAYER_NORM_EPS, **values):
        if isinstance(vocab_size, str):
            raise BertConfigError(f"bert_model_config (architecture {self.architecture}): the vocab size must be "
                                  "an int")
        super().__init__(vocab_size, **values)
        if (isinstance(layer_norm_eps, bool) or not isinstance(layer_norm_eps, (int, float))
                or not 0 < layer_norm_eps < math.inf):
            raise BertConfigError(f"bert_model_config (architecture {self.architecture}): layer_norm_eps must be a "
                                  f"finite number > 0, got {layer_norm_eps!r}")
        self.layer_norm_eps = layer_norm_eps

    def to_dict(self):
        return {"architecture": self.architecture, **super().to_dict()}


def _layer_norm(config):
    return nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)


class PostLNEmbeddings(BertEmbeddings):
    """Our BertEmbeddings (word + token type + position, LayerNorm, dropout) with the config's eps."""

    def __init__(self, config):
        super().__init__(config)
        self.LayerNorm = _layer_norm(config)


class PostLNResidual(nn.Module):
    """LN(x + Dropout(dense(h))): how both sublayers end (transformers' BertSelfOutput and BertOutput)."""

    def __init__(self, config, in_features):
        super().__init__()
        self.dense = nn.Linear(in_features, config.hidden_size)
        self.LayerNorm = _layer_norm(config)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, hidden_states, input_tensor):
        return self.LayerNorm(self.dropout(self.dense(hidden_states)) + input_tensor)


class PostLNAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.self = BertSelfAttention(config)
        self.output = PostLNResidual(config, config.hidden_size)

    def forward(self, hidden_states, attention_mask, unpadding=None):
        return self.output(self.self(hidden_states, attention_mask, unpadding), hidden_states)


class PostLNIntermediate(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.intermediate_size)
        self.act = _ACTIVATIONS[config.hidden_act]

    def forward(self, hidden_states):
        return self.act(self.dense(hidden_states))


class PostLNLayer(nn.Module):
    """h = LN(x + Dropout(Attn(x))), then LN(h + Dropout(FFN(h)))."""

    def __init__(self, config):
        super().__init__()
        self.attention = PostLNAttention(config)
        self.intermediate = PostLNIntermediate(config)
        self.output = PostLNResidual(config, config.intermediate_size)

    def forward(self, hidden_states, attention_mask, unpadding=None):
        attention_output = self.attention(hidden_states, attention_mask, unpadding)
        return self.output(self.intermediate(attention_output), attention_output)


class PostLNEncoder(nn.Module):
    """The layers (B, L, H) -> (B, L, H), or packed (T, H) -> (T, H) with `unpadding`."""

    uses_transformer_kernel = False

    def __init__(self, config, checkpoint_activations=False):
        super().__init__()
        self.layer = nn.ModuleList([PostLNLayer(config) for _ in range(config.num_hidden_layers)])
        self.checkpoint_activations = checkpoint_activations
        self.last_layers_run = 0  # as BertEncoder's (no layer is ever skipped here)

    def forward(self, hidden_states, attention_mask, pld_theta=None, unpadding=None):
        if pld_theta is not None:
            raise ValueError(f"progressive layer drop does not apply to the {ARCHITECTURE} block")
        for layer in self.layer:
            if self.checkpoint_activations and self.training:
                hidden_states = checkpoint(layer, hidden_states, attention_mask, unpadding, use_reentrant=False)
            else:
                hidden_states = layer(hidden_states, attention_mask, unpadding)
        self.last_layers_run = len(self.layer)
        return hidden_states


class PostLNPooler(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, hidden_states):
        return self.dense_pool(hidden_states[:, 0])  # (B, H) from [CLS]

    def dense_pool(self, first_tokens):
        return self.dense(first_tokens).tanh()


class PostLNModel(BertModel):
    """Embeddings, post-LN encoder, pooler (transformers' BertModel): `.bert` of the pretraining
    model and what fine-tuning sits on; BertModel's forward (-> sequence output, pooled output)."""

    def __init__(self, config, checkpoint_activations=False):
        nn.Module.__init__(self)
        self.embeddings = PostLNEmbeddings(config)
        self.encoder = PostLNEncoder(config, checkpoint_activations)
        self.pooler = PostLNPooler(config)


class PostLNPredictionHeadTransform(nn.Module):
    """dense, act, LayerNorm: the MLM head's transform (transformers' BertPredictionHeadTransform)."""

    def __init__(self, config):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.act = _ACTIVATIONS[config.hidden_act]
        self.LayerNorm = _layer_norm(config)

    def forward(self, hidden_states):
        return self.LayerNorm(self.act(self.dense(hidden_states)))


class BertForPreTrainingPostLN(BertForPreTrainingPreLN):
    """The post-LN BERT with its MLM and NSP heads; `forward(batch, **kwargs)`, `predict`, `encode`
    and `mlm_scores` as BertForPreTrainingPreLN's (the batch, the loss, the scores). `options`:
    ModelOptions or a command line; `refused_options` says what is refused."""

    architecture = ARCHITECTURE
    refused_options = {
        "deepspeed_transformer_kernel": "this build wires DeepSpeed's fused layer for the pre-LN block only",
        "deepspeed_sparse_attention": "its layouts are wired for the original pre-LN block only",
        "progressive_layer_drop": "skipping a layer needs the pre-LN block's identity path (Zhang & He 2020 "
                                  "switch BERT to pre-LN for it); the post-LN block has a LayerNorm on it",
    }
    nsp_head = True

    encoder_class = PostLNModel   # a variant of the block (turing/arch/roberta, distilbert) names its own

    def __init__(self, config, options=None):
        nn.Module.__init__(self)
        options = block_options(options, type(self))
        self.config = config
        self.bert = self.encoder_class(config, bool(options.checkpoint_activations))
        self.unpad = bool(options.unpad)
        self.next_sentence_prediction = bool(options.next_sentence_prediction)
        self.cls = self.heads(config, self.bert.embeddings.word_embeddings.weight)
        self.mlm_loss = MaskedLMLoss()
        self._init_weights()

    def heads(self, config, word_embedding_weight):
        """The MLM head (the decoder tied to `word_embedding_weight`) and the NSP head: `.cls`."""
        return BertPreTrainingHeads(config, word_embedding_weight, PostLNPredictionHeadTransform(config))

    def _init_weights(self):
        std = self.config.initializer_range
        for module in self.modules():
            if module is self.cls.predictions.decoder:
                continue  # tied: its weight is the word embedding, initialised there
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, 0.0, std)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
            elif isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)
