"""Reference copy of the original Bing BERT pre-LN model, for parity tests and benchmarks.

Owns: an eager, deliberately plain re-statement of the computation in the original
DeepSpeedExamples `bing_bert/nvidia/modelingpreln.py` (its `BertForPreTrainingPreLN`), with
the same module tree and so the same `state_dict` keys as `turing.modeling`. It keeps the
original's way of computing things (three separate Q/K/V projections, explicit score matrix,
bias+gelu written out element by element, the MLM transform applied to every position and the
masked rows selected afterwards) because that is what our model is measured against.

Two deliberate differences from the original, neither of which changes the maths:
- the original scripts `bias_gelu` with `torch.jit.script` and divides by the constant
  1.41421; here it is a plain function dividing by sqrt(2) (TorchScript does not fuse on
  CPU, so the same element-wise ops run either way, and sqrt(2) is the exact erf GELU
  that the original model has);
- no transformer-kernel, sparse-attention or PLD branches: the parity tests cover the
  plain path only.
Not part of the library; nothing under `turing/` imports it.
"""
import logging
import math

import torch
from torch import nn
from torch.nn import CrossEntropyLoss

logger = logging.getLogger(__name__)

_SQRT2 = math.sqrt(2.0)


def bias_gelu(bias, y):
    x = bias + y
    return x * 0.5 * (1.0 + torch.erf(x / _SQRT2))


def bias_tanh(bias, y):
    return torch.tanh(bias + y)


class LinearActivation(nn.Module):
    """Linear layer whose bias add is fused with the activation (the original's layer)."""

    def __init__(self, in_features, out_features, act="gelu"):
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.biased_act_fn = {"gelu": bias_gelu, "tanh": bias_tanh}[act]
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.bias = nn.Parameter(torch.empty(out_features))
        self.reset_parameters()

    def reset_parameters(self):
        # The original is an nn.Module, not an nn.Linear, so init_bert_weights skips it and
        # it keeps nn.Linear's default (Kaiming-uniform) initialisation.
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        bound = 1 / math.sqrt(self.in_features)
        nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, x):
        return self.biased_act_fn(self.bias, nn.functional.linear(x, self.weight, None))


class BertEmbeddings(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=1e-12)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, input_ids, token_type_ids):
        seq_length = input_ids.size(1)
        position_ids = torch.arange(seq_length, dtype=torch.long, device=input_ids.device)
        position_ids = position_ids.unsqueeze(0).expand_as(input_ids)
        embeddings = (self.word_embeddings(input_ids) + self.position_embeddings(position_ids)
                      + self.token_type_embeddings(token_type_ids))
        return self.dropout(self.LayerNorm(embeddings))


class BertSelfAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.num_attention_heads = config.num_attention_heads
        self.attention_head_size = config.hidden_size // config.num_attention_heads
        self.all_head_size = self.num_attention_heads * self.attention_head_size
        self.query = nn.Linear(config.hidden_size, self.all_head_size)
        self.key = nn.Linear(config.hidden_size, self.all_head_size)
        self.value = nn.Linear(config.hidden_size, self.all_head_size)
        self.dropout = nn.Dropout(config.attention_probs_dropout_prob)
        self.softmax = nn.Softmax(dim=-1)

    def transpose_for_scores(self, x):
        new_shape = x.size()[:-1] + (self.num_attention_heads, self.attention_head_size)
        return x.view(*new_shape).permute(0, 2, 1, 3)  # (B, heads, L, d)

    def transpose_key_for_scores(self, x):
        new_shape = x.size()[:-1] + (self.num_attention_heads, self.attention_head_size)
        return x.view(*new_shape).permute(0, 2, 3, 1)  # (B, heads, d, L)

    def forward(self, hidden_states, attention_mask):
        query_layer = self.transpose_for_scores(self.query(hidden_states))
        key_layer = self.transpose_key_for_scores(self.key(hidden_states))
        value_layer = self.transpose_for_scores(self.value(hidden_states))

        attention_scores = torch.matmul(query_layer, key_layer)  # (B, heads, L, L)
        attention_scores = attention_scores / math.sqrt(self.attention_head_size)
        attention_scores = attention_scores + attention_mask
        attention_probs = self.dropout(self.softmax(attention_scores))

        context_layer = torch.matmul(attention_probs, value_layer)  # (B, heads, L, d)
        context_layer = context_layer.permute(0, 2, 1, 3).contiguous()
        new_shape = context_layer.size()[:-2] + (self.all_head_size,)
        return context_layer.view(*new_shape)


class BertSelfOutput(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.dense.bert_output_layer = True
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, hidden_states):
        return self.dropout(self.dense(hidden_states))


class BertAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.self = BertSelfAttention(config)
        self.output = BertSelfOutput(config)

    def forward(self, input_tensor, attention_mask):
        return self.output(self.self(input_tensor, attention_mask))


class BertIntermediate(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.dense_act = LinearActivation(config.hidden_size, config.intermediate_size, act="gelu")

    def forward(self, hidden_states):
        return self.dense_act(hidden_states)


class BertOutput(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.dense = nn.Linear(config.intermediate_size, config.hidden_size)
        self.dense.bert_output_layer = True
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, hidden_states):
        return self.dropout(self.dense(hidden_states))


class BertLayer(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.attention = BertAttention(config)
        self.PreAttentionLayerNorm = nn.LayerNorm(config.hidden_size, eps=1e-12)
        self.PostAttentionLayerNorm = nn.LayerNorm(config.hidden_size, eps=1e-12)
        self.intermediate = BertIntermediate(config)
        self.output = BertOutput(config)

    def forward(self, hidden_states, attention_mask):
        attention_output = self.attention(self.PreAttentionLayerNorm(hidden_states), attention_mask)
        intermediate_input = hidden_states + attention_output
        intermediate_output = self.intermediate(self.PostAttentionLayerNorm(intermediate_input))
        return self.output(intermediate_output) + intermediate_input


class BertEncoder(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.FinalLayerNorm = nn.LayerNorm(config.hidden_size, eps=1e-12)
        self.layer = nn.ModuleList([BertLayer(config) for _ in range(config.num_hidden_layers)])

    def forward(self, hidden_states, attention_mask):
        for layer_module in self.layer:
            hidden_states = layer_module(hidden_states, attention_mask)
        return self.FinalLayerNorm(hidden_states)


class BertPooler(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.dense_act = LinearActivation(config.hidden_size, config.hidden_size, act="tanh")

    def forward(self, hidden_states):
        return self.dense_act(hidden_states[:, 0])


class BertPredictionHeadTransform(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.dense_act = LinearActivation(config.hidden_size, config.hidden_size, act="gelu")
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=1e-12)

    def forward(self, hidden_states):
        return self.LayerNorm(self.dense_act(hidden_states))


class BertLMPredictionHead(nn.Module):
    def __init__(self, config, bert_model_embedding_weights):
        super().__init__()
        self.transform = BertPredictionHeadTransform(config)
        self.decoder = nn.Linear(bert_model_embedding_weights.size(1),
                                 bert_model_embedding_weights.size(0), bias=False)
        self.decoder.weight = bert_model_embedding_weights
        self.bias = nn.Parameter(torch.zeros(bert_model_embedding_weights.size(0)))

    def forward(self, hidden_states, masked_token_indexes=None):
        # The original transforms every position, then keeps the masked rows.
        hidden_states = self.transform(hidden_states)
        if masked_token_indexes is not None:
            hidden_states = torch.index_select(
                hidden_states.view(-1, hidden_states.shape[-1]), 0, masked_token_indexes)
        return self.decoder(hidden_states) + self.bias


class BertPreTrainingHeads(nn.Module):
    def __init__(self, config, bert_model_embedding_weights):
        super().__init__()
        self.predictions = BertLMPredictionHead(config, bert_model_embedding_weights)
        self.seq_relationship = nn.Linear(config.hidden_size, 2)

    def forward(self, sequence_output, pooled_output, masked_token_indexes=None):
        prediction_scores = self.predictions(sequence_output, masked_token_indexes)
        return prediction_scores, self.seq_relationship(pooled_output)


class BertModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.embeddings = BertEmbeddings(config)
        self.encoder = BertEncoder(config)
        self.pooler = BertPooler(config)

    def forward(self, input_ids, token_type_ids, attention_mask):
        extended_attention_mask = attention_mask.unsqueeze(1).unsqueeze(2)  # (B, 1, 1, L)
        extended_attention_mask = extended_attention_mask.to(dtype=self.embeddings.word_embeddings.weight.dtype)
        extended_attention_mask = (1.0 - extended_attention_mask) * -10000.0
        embedding_output = self.embeddings(input_ids, token_type_ids)
        sequence_output = self.encoder(embedding_output, extended_attention_mask)
        return sequence_output, self.pooler(sequence_output)


class BertForPreTrainingPreLN(nn.Module):
    """forward(batch): batch = (batch_type, input_ids, input_mask, segment_ids, nsp_labels, mlm_labels)."""

    def __init__(self, config, args=None):
        super().__init__()
        self.config = config
        self.bert = BertModel(config)
        self.cls = BertPreTrainingHeads(config, self.bert.embeddings.word_embeddings.weight)
        self.apply(self.init_bert_weights)

    def init_bert_weights(self, module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            std = self.config.initializer_range
            if hasattr(module, "bert_output_layer"):
                std = self.config.initializer_range / math.sqrt(2.0 * self.config.num_hidden_layers)
            module.weight.data.normal_(mean=0.0, std=std)
        elif isinstance(module, nn.LayerNorm):
            module.bias.data.zero_()
            module.weight.data.fill_(1.0)
        if isinstance(module, nn.Linear) and module.bias is not None:
            module.bias.data.zero_()

    def forward(self, batch, **kwargs):
        input_ids, attention_mask, token_type_ids = batch[1], batch[2], batch[3]
        next_sentence_label, masked_lm_labels = batch[4], batch[5]
        sequence_output, pooled_output = self.bert(input_ids, token_type_ids, attention_mask)
        if masked_lm_labels is None or next_sentence_label is None:
            return self.cls(sequence_output, pooled_output)

        masked_token_indexes = torch.nonzero((masked_lm_labels + 1).view(-1)).view(-1)
        prediction_scores, seq_relationship_score = self.cls(
            sequence_output, pooled_output, masked_token_indexes)
        target = torch.index_select(masked_lm_labels.view(-1), 0, masked_token_indexes)
        loss_fct = CrossEntropyLoss(ignore_index=-1)
        masked_lm_loss = loss_fct(prediction_scores.view(-1, self.config.vocab_size), target)
        next_sentence_loss = loss_fct(seq_relationship_score.view(-1, 2), next_sentence_label.view(-1))
        return masked_lm_loss + next_sentence_loss
