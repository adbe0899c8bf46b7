"""The fine-tuning model of the distilbert architecture, as transformers'
DistilBertForSequenceClassification."""
import torch.nn.functional as F
from torch import nn

from turing.arch.bert.classifier import BertForSequenceClassification


class DistilForSequenceClassification(BertForSequenceClassification):
    """`bert` (our distilbert `DistilModel`: no pooler) + on the first token's final hidden state a
    fresh pre_classifier (dense), ReLU, dropout (`seq_classif_dropout`) and a linear classifier, as
    transformers' DistilBertForSequenceClassification; both dense layers start at its init:
    normal(0, initializer_range) weights, zero biases. Loss and predictions are BERT's head's."""

    def __init__(self, bert, num_labels, config):
        nn.Module.__init__(self)
        self.num_labels = num_labels
        self.bert = bert
        self.pre_classifier = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout = nn.Dropout(config.seq_classif_dropout)
        self.classifier = nn.Linear(config.hidden_size, num_labels)
        for linear in (self.pre_classifier, self.classifier):
            nn.init.normal_(linear.weight, 0.0, config.initializer_range)
            nn.init.zeros_(linear.bias)

    def forward(self, input_ids, input_mask, segment_ids):
        """(B, L) ids -> (B, num_labels) logits, or (B,) scores for regression (segment ids unread)."""
        sequence, _ = self.bert(input_ids, segment_ids, input_mask)  # (B, L, H)
        logits = self.classifier(self.dropout(F.relu(self.pre_classifier(sequence[:, 0]))))
        return logits.squeeze(-1) if self.num_labels == 1 else logits


def distil_classifier(pretraining, config, num_labels):
    return DistilForSequenceClassification(pretraining.bert, num_labels, config)
