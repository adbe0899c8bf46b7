"""The fine-tuning model of the BERT blocks (the pre-LN "bert" and the post-LN ones): the pooled
[CLS] output, dropout and a linear head, as transformers' BertForSequenceClassification."""
import torch.nn.functional as F
from torch import nn


class BertForSequenceClassification(nn.Module):
    """`bert` (our `BertModel`: embeddings, pre-LN encoder, pooler; or the bert_postln
    architecture's `PostLNModel`, as transformers' BertForSequenceClassification) + dropout + a linear head
    on the pooled [CLS] output; one output = regression (MSE), more = classes (cross-entropy).
    The head starts as the original's did: normal(0, initializer_range) weights, zero bias."""

    def __init__(self, bert, num_labels, dropout_prob, initializer_range):
        super().__init__()
        self.num_labels = num_labels
        self.bert = bert
        self.dropout = nn.Dropout(dropout_prob)
        self.classifier = nn.Linear(bert.embeddings.word_embeddings.embedding_dim, num_labels)
        nn.init.normal_(self.classifier.weight, 0.0, initializer_range)
        nn.init.zeros_(self.classifier.bias)

    def forward(self, input_ids, input_mask, segment_ids):
        """(B, L) ids -> (B, num_labels) logits, or (B,) scores for regression."""
        _, pooled = self.bert(input_ids, segment_ids, input_mask)
        logits = self.classifier(self.dropout(pooled))
        return logits.squeeze(-1) if self.num_labels == 1 else logits

    def loss(self, logits, labels):
        if self.num_labels == 1:
            return F.mse_loss(logits.float(), labels)
        return F.cross_entropy(logits.float(), labels)

    @staticmethod
    def predictions(logits):
        """Class indices, or the scores themselves for regression."""
        return logits.float() if logits.dim() == 1 else logits.argmax(-1)


def bert_classifier(pretraining, config, num_labels):
    """BERT's pooler + head on `pretraining.bert` (dropout hidden_dropout_prob)."""
    return BertForSequenceClassification(pretraining.bert, num_labels, config.hidden_dropout_prob,
                                         config.initializer_range)
