"""Scoring a model on a validation set: the sums the trainer's Validator and tools/eval_mlm.py both
add up, batch by batch (`batch_totals`), and the scores made of them (`scores_of`), with
the two averages of the loss side by side:

- `loss`, the mean over batches of each batch's pretraining loss (the MLM cross-entropy averaged
  over that batch's masked tokens, plus the NSP term where it is on): the original's
  `Validation/Loss`, kept as it was computed so that its curves compare with the original's. It
  depends on how the set is cut into batches (a short last batch weighs as much as a full one).
- `token_loss`, the MLM cross-entropy summed over every masked token of the set and divided by
  their number: what perplexity (`exp(token_loss)`) is made of, independent of the batching.

MLM accuracy is over the masked tokens, NSP accuracy over the sequences. The sums are float64 so
that they add up over ranks (the trainer all-reduces them) without rounding. How the scores at the
masked positions are computed is the caller's (the trainer through its engine, eval_mlm on the
masked rows alone); what is done with them is this module's.
"""
import math

import torch
import torch.nn.functional as F

from turing.modeling import pretraining_loss

# the sums, in this order
FIELDS = ("loss", "batches", "token_loss", "mlm_correct", "masked_tokens", "nsp_correct", "sequences")


def batch_totals(mlm_scores, labels, sequences, nsp_scores=None, next_sentence_labels=None):
    """(len(FIELDS),) float64 sums of one batch. `mlm_scores` (N, V): the scores at its N masked
    positions, `labels` (N,) their tokens; `sequences`: how many sequences the batch holds;
    `nsp_scores` (B, 2) and `next_sentence_labels` (B,) where the NSP term is on (else None)."""
    device = mlm_scores.device
    token_loss = F.cross_entropy(mlm_scores.float(), labels, reduction="sum")
    loss = pretraining_loss(token_loss / torch.tensor(len(labels), device=device).clamp(min=1),
                            None if nsp_scores is None else nsp_scores.float(), next_sentence_labels)
    nsp_correct = 0 if nsp_scores is None else (nsp_scores.argmax(-1) == next_sentence_labels.reshape(-1)).sum()
    values = (loss, 1, token_loss, (mlm_scores.argmax(-1) == labels).sum(), len(labels), nsp_correct, sequences)
    return torch.stack([torch.as_tensor(v, device=device).double() for v in values])


def scores_of(totals, next_sentence_prediction=True):
    """{"loss", "token_loss", "perplexity", "mlm_accuracy", "nsp_accuracy", "masked_tokens",
    "sequences"} of the summed totals (a FIELDS tensor: batch_totals added up, over ranks too);
    nsp_accuracy None where the NSP term is off (its head, if any, is not trained)."""
    sums = dict(zip(FIELDS, totals.tolist()))
    token_loss = sums["token_loss"] / max(sums["masked_tokens"], 1)
    return {"loss": sums["loss"] / max(sums["batches"], 1), "token_loss": token_loss,
            "perplexity": math.exp(token_loss),
            "mlm_accuracy": sums["mlm_correct"] / max(sums["masked_tokens"], 1),
            "nsp_accuracy": sums["nsp_correct"] / max(sums["sequences"], 1) if next_sentence_prediction else None,
            "masked_tokens": int(sums["masked_tokens"]), "sequences": int(sums["sequences"])}
