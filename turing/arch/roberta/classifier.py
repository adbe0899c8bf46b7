"""The fine-tuning model of the roberta architecture, as transformers' RobertaForSequenceClassification."""
import torch
from torch import nn

from turing.arch.bert.classifier import BertForSequenceClassification


class RobertaClassificationHead(nn.Module):
    """dropout, dense, tanh, dropout, out_proj on the first token (<s>): transformers'
    RobertaClassificationHead, its parameter names; the dropout is classifier_dropout, else
    hidden_dropout_prob."""

    def __init__(self, config, num_labels):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        dropout = config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob
        self.dropout = nn.Dropout(dropout)
        self.out_proj = nn.Linear(config.hidden_size, num_labels)

    def forward(self, sequence_output):
        """(B, L, H) -> (B, num_labels)."""
        hidden = torch.tanh(self.dense(self.dropout(sequence_output[:, 0])))
        return self.out_proj(self.dropout(hidden))


class RobertaForSequenceClassification(BertForSequenceClassification):
    """`bert` (our roberta `RobertaModel`: no pooler) + a fresh RobertaClassificationHead, as
    transformers' RobertaForSequenceClassification; one output = regression (MSE), more = classes
    (cross-entropy). The head starts as transformers initialises it: normal(0, initializer_range)
    weights, zero biases. Segment ids are read by nothing (one token type)."""

    def __init__(self, bert, num_labels, config):
        nn.Module.__init__(self)
        self.num_labels = num_labels
        self.bert = bert
        self.classifier = RobertaClassificationHead(config, num_labels)
        for linear in (self.classifier.dense, self.classifier.out_proj):
            nn.init.normal_(linear.weight, 0.0, config.initializer_range)
            nn.init.zeros_(linear.bias)

    def forward(self, input_ids, input_mask, segment_ids):
        """(B, L) ids -> (B, num_labels) logits, or (B,) scores for regression."""
        sequence_output, _ = self.bert(input_ids, segment_ids, input_mask)
        logits = self.classifier(sequence_output)
        return logits.squeeze(-1) if self.num_labels == 1 else logits


def roberta_classifier(pretraining, config, num_labels):
    return RobertaForSequenceClassification(pretraining.bert, num_labels, config)
