"""The fine-tuning model of the modernbert architecture, as transformers'
ModernBertForSequenceClassification."""
import math

from torch import nn

from turing.arch.bert.classifier import BertForSequenceClassification
from turing.arch.modernbert.model import ModernPredictionHead, trunc_normal_


class ModernForSequenceClassification(BertForSequenceClassification):
    """`bert` (our modernbert `ModernEncoder`) + pooling ([CLS], or the mean over real tokens:
    the config's classifier_pooling) + a fresh prediction head (dense, act, norm) + dropout
    (classifier_dropout) + a linear head, as transformers' ModernBertForSequenceClassification;
    the linear head starts at its init (truncated normal, std hidden_size ** -0.5, zero bias)."""

    def __init__(self, bert, num_labels, config):
        nn.Module.__init__(self)
        self.num_labels = num_labels
        self.pooling = config.classifier_pooling
        self.bert = bert
        self.head = ModernPredictionHead(config)
        out_std = config.initializer_range / math.sqrt(2.0 * config.num_hidden_layers)
        trunc_normal_(self.head.dense.weight, out_std, config.initializer_cutoff_factor)
        self.dropout = nn.Dropout(config.classifier_dropout)
        self.classifier = nn.Linear(config.hidden_size, num_labels)
        trunc_normal_(self.classifier.weight, config.hidden_size ** -0.5, config.initializer_cutoff_factor)
        nn.init.zeros_(self.classifier.bias)

    def forward(self, input_ids, input_mask, segment_ids):
        """(B, L) ids -> (B, num_labels) logits, or (B,) scores for regression (segment ids unread)."""
        sequence = self.bert(input_ids, input_mask)  # (B, L, H)
        if self.pooling == "cls":
            pooled = sequence[:, 0]
        else:
            weights = input_mask.to(sequence.dtype).unsqueeze(-1)
            pooled = (sequence * weights).sum(1) / weights.sum(1)
        logits = self.classifier(self.dropout(self.head(pooled)))
        return logits.squeeze(-1) if self.num_labels == 1 else logits


def modern_classifier(pretraining, config, num_labels):
    return ModernForSequenceClassification(pretraining.bert, num_labels, config)
