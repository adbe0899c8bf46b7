"""Which parameters take weight decay: none of the biases and LayerNorms (the original's rule), in
two optimizer groups, the decayed one first (positional optimizer states rely on the order)."""

NO_DECAY_NAMES = ("bias", "LayerNorm.bias", "LayerNorm.weight",
                  # the modernbert block's LayerNorms (turing/arch/modernbert/model.py: norm, attn_norm, final_norm, ...)
                  "norm.weight",
                  # DeepSpeed transformer-kernel names
                  "attn_nw", "attn_nb", "norm_w", "norm_b", "attn_qkvb", "attn_ob", "inter_b", "output_b")


def is_no_decay(name):
    return any(part in name for part in NO_DECAY_NAMES)


def decay_groups(named_parameters, weight_decay):
    """[{decayed params, weight_decay}, {the others, 0.0}] of (name, parameter) pairs, in their order."""
    named = list(named_parameters)
    return [{"params": [p for n, p in named if not is_no_decay(n)], "weight_decay": weight_decay},
            {"params": [p for n, p in named if is_no_decay(n)], "weight_decay": 0.0}]
