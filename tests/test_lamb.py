"""turing.lamb: the portable LAMB against updates written out by hand, and inside a real
DeepSpeed engine on CPU."""
import math
import socket

import pytest
import torch

from turing.lamb import Lamb, LambConfigError, build_lamb_if_needed, find_lamb_coeffs


def reference_step(p, g, m, v, t, lr, wd, beta1=0.9, beta2=0.999, eps=1e-8, bias_correction=True,
                   max_coeff=10.0, min_coeff=0.01):
    """DeepSpeed's fused_lamb kernel, written out: returns (new p, new m, new v, trust ratio)."""
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    u = m / (torch.sqrt(v) + eps) + wd * p
    p_norm = math.sqrt(float((p * p).sum()))
    u_norm = math.sqrt(float((u * u).sum()))
    coeff = 1.0 if p_norm == 0 or u_norm == 0 else min(max(p_norm / u_norm, min_coeff), max_coeff)
    step_size = lr * math.sqrt(1 - beta2 ** t) / (1 - beta1 ** t) if bias_correction else lr
    return p - step_size * coeff * u, m, v, coeff


def two_params():
    # fp64 so the comparison with the written-out formula is exact to ~1e-12
    w = torch.tensor([[0.5, -1.0, 2.0], [0.25, 1.5, -0.75]], dtype=torch.float64, requires_grad=True)
    b = torch.tensor([0.1, -0.2], dtype=torch.float64, requires_grad=True)
    return w, b


GRADS = [
    (torch.tensor([[0.3, -0.1, 0.2], [0.05, -0.4, 0.1]], dtype=torch.float64),
     torch.tensor([0.02, -0.01], dtype=torch.float64)),
    (torch.tensor([[-0.2, 0.3, 0.1], [0.1, 0.2, -0.3]], dtype=torch.float64),
     torch.tensor([-0.03, 0.04], dtype=torch.float64)),
    (torch.tensor([[0.1, 0.1, -0.5], [-0.2, 0.05, 0.2]], dtype=torch.float64),
     torch.tensor([0.01, 0.02], dtype=torch.float64)),
]


def test_one_step_by_hand():
    # p = (3, 4), |p| = 5; g = (1, -1); no decay, no bias correction, eps 0:
    # m = 0.1 g, v = 0.001 g^2, u = m / sqrt(v) = sqrt(10) sign(g), |u| = sqrt(20),
    # ratio = 5 / sqrt(20) = sqrt(5)/2, step = 0.1 * sqrt(5)/2 * sqrt(10) = sqrt(2)/4.
    p = torch.tensor([3.0, 4.0], dtype=torch.float64, requires_grad=True)
    opt = Lamb([p], lr=0.1, eps=0.0, bias_correction=False)
    p.grad = torch.tensor([1.0, -1.0], dtype=torch.float64)
    opt.step()
    s = math.sqrt(2) / 4
    torch.testing.assert_close(p.detach(), torch.tensor([3.0 - s, 4.0 + s], dtype=torch.float64))
    assert opt.get_lamb_coeffs() == pytest.approx([math.sqrt(5) / 2])


@pytest.mark.parametrize("bias_correction", [True, False])
def test_three_steps_match_the_written_out_update(bias_correction):
    w, b = two_params()
    lr, wd = 0.05, 0.01
    opt = Lamb([{"params": [w], "weight_decay": wd}, {"params": [b], "weight_decay": 0.0}],
               lr=lr, bias_correction=bias_correction)
    ref = {"w": (w.detach().clone(), torch.zeros_like(w), torch.zeros_like(w)),
           "b": (b.detach().clone(), torch.zeros_like(b), torch.zeros_like(b))}
    for t, (gw, gb) in enumerate(GRADS, start=1):
        w.grad, b.grad = gw.clone(), gb.clone()
        opt.step()
        coeffs = []
        for name, g, decay in (("w", gw, wd), ("b", gb, 0.0)):
            p, m, v = ref[name]
            p, m, v, c = reference_step(p, g, m, v, t, lr, decay, bias_correction=bias_correction)
            ref[name] = (p, m, v)
            coeffs.append(c)
        torch.testing.assert_close(w.detach(), ref["w"][0], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(b.detach(), ref["b"][0], rtol=1e-12, atol=1e-12)
        assert opt.get_lamb_coeffs() == pytest.approx(coeffs, rel=1e-12)
    # the state DeepSpeed checkpoints: FusedLamb's names, step count per parameter
    assert opt.state[w]["step"] == 3
    torch.testing.assert_close(opt.state[w]["exp_avg"], ref["w"][1])
    torch.testing.assert_close(opt.state[b]["exp_avg_sq"], ref["b"][2])


def test_weight_decay_enters_the_update_and_its_norm():
    # Same gradients, with and without decay: the decayed update is m/(sqrt(v)+eps) + wd p.
    w1, _ = two_params()
    w2, _ = two_params()
    g = GRADS[0][0]
    for w, wd in ((w1, 0.0), (w2, 0.1)):
        opt = Lamb([w], lr=0.1, bias_correction=False, weight_decay=wd)
        w.grad = g.clone()
        opt.step()
    p0 = two_params()[0].detach()
    u0 = (0.1 * g) / (torch.sqrt(0.001 * g * g) + 1e-8)
    u1 = u0 + 0.1 * p0
    c0 = float(p0.norm() / u0.norm())
    c1 = float(p0.norm() / u1.norm())
    torch.testing.assert_close(w1.detach(), p0 - 0.1 * c0 * u0)
    torch.testing.assert_close(w2.detach(), p0 - 0.1 * c1 * u1)


def test_bias_correction_scales_the_step_not_the_trust_ratio():
    # FusedLamb folds bias correction into the step size: lr * sqrt(1 - b2^t) / (1 - b1^t).
    g = GRADS[0][0]
    moved, coeffs = [], []
    for bc in (True, False):
        w, _ = two_params()
        opt = Lamb([w], lr=0.01, bias_correction=bc, weight_decay=0.01)
        w.grad = g.clone()
        opt.step()
        moved.append(two_params()[0].detach() - w.detach())
        coeffs.append(opt.get_lamb_coeffs())
    assert coeffs[0] == pytest.approx(coeffs[1], rel=1e-12)
    torch.testing.assert_close(moved[0], moved[1] * math.sqrt(1 - 0.999) / (1 - 0.9))


@pytest.mark.parametrize("scale, bound", [(1e4, "max"), (1e-6, "min")])
def test_trust_ratio_is_clipped(scale, bound):
    # |p| / |u| is about 1e4 (or 1e-6): clipped to max_coeff (or min_coeff).
    w, _ = two_params()
    with torch.no_grad():
        w.mul_(scale)
    start = w.detach().clone()
    opt = Lamb([w], lr=0.1, bias_correction=False, max_coeff=0.3, min_coeff=0.02)
    g = GRADS[0][0]
    w.grad = g.clone()
    opt.step()
    expected = 0.3 if bound == "max" else 0.02
    assert opt.get_lamb_coeffs() == pytest.approx([expected])
    u = (0.1 * g) / (torch.sqrt(0.001 * g * g) + 1e-8)
    torch.testing.assert_close(w.detach(), start - 0.1 * expected * u)


def test_zero_norms_give_ratio_one():
    zero = torch.zeros(3, dtype=torch.float64, requires_grad=True)   # |p| = 0
    still = torch.ones(2, dtype=torch.float64, requires_grad=True)   # g = 0 and no decay: |u| = 0
    opt = Lamb([zero, still], lr=0.1, bias_correction=False, max_coeff=0.3)
    g = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)
    zero.grad, still.grad = g.clone(), torch.zeros(2, dtype=torch.float64)
    opt.step()
    assert opt.get_lamb_coeffs() == [1.0, 1.0]
    u = (0.1 * g) / (torch.sqrt(0.001 * g * g) + 1e-8)
    torch.testing.assert_close(zero.detach(), -0.1 * u)
    torch.testing.assert_close(still.detach(), torch.ones(2, dtype=torch.float64))


def test_lamb_coeffs_follow_the_last_step_and_skip_params_without_grad():
    w, b = two_params()
    opt = Lamb([w, b], lr=0.01)
    assert opt.get_lamb_coeffs() == []
    w.grad, b.grad = GRADS[0][0].clone(), GRADS[0][1].clone()
    opt.step()
    first = opt.get_lamb_coeffs()
    assert len(first) == 2 and all(isinstance(c, float) for c in first)
    b.grad = None
    w.grad = GRADS[1][0].clone()
    opt.step()
    assert len(opt.get_lamb_coeffs()) == 1
    assert b not in opt.state or opt.state[b]["step"] == 1


def test_eps_inside_sqrt():
    p = torch.tensor([3.0, 4.0], dtype=torch.float64, requires_grad=True)
    opt = Lamb([p], lr=0.1, eps=1e-3, eps_inside_sqrt=True, bias_correction=False, max_coeff=100)
    g = torch.tensor([1.0, -1.0], dtype=torch.float64)
    p.grad = g.clone()
    opt.step()
    u = 0.1 * g / torch.sqrt(0.001 * g * g + 1e-3)
    c = 5.0 / float(u.norm())
    torch.testing.assert_close(p.detach(), torch.tensor([3.0, 4.0], dtype=torch.float64) - 0.1 * c * u)


def test_bf16_params_are_updated_through_fp32():
    w32, _ = two_params()
    w32 = w32.detach().float().requires_grad_()
    w16 = w32.detach().bfloat16().requires_grad_()
    opts = [Lamb([w], lr=0.01, weight_decay=0.01) for w in (w32, w16)]
    g = GRADS[0][0].float()
    for opt, w in zip(opts, (w32, w16)):
        w.grad = g.to(w.dtype)
        opt.step()
    assert w16.dtype == torch.bfloat16
    assert opts[1].state[w16]["exp_avg"].dtype == torch.float32
    start = two_params()[0].detach().bfloat16()
    assert not torch.equal(w16.detach(), start)        # a step of ~0.01 is visible in bf16
    torch.testing.assert_close(w16.float(), w32.detach(), rtol=1e-2, atol=1e-2)


def test_bad_arguments_are_refused():
    p = torch.zeros(2, requires_grad=True)
    with pytest.raises(LambConfigError, match="amsgrad"):
        Lamb([p], amsgrad=True)
    with pytest.raises(LambConfigError, match="min_coeff"):
        Lamb([p], min_coeff=1.0, max_coeff=0.5)


# ---------------------------------------------------------------------------------------------
# build_lamb_if_needed and a real DeepSpeed engine


DS_LAMB = {"train_micro_batch_size_per_gpu": 2,
           "optimizer": {"type": "Lamb", "params": {"lr": 0.05, "weight_decay": 0.01,
                                                    "bias_correction": False, "max_coeff": 0.3,
                                                    "min_coeff": 0.01, "betas": [0.9, 0.999]}}}


def test_build_lamb_on_cpu_removes_the_optimizer_entry():
    p = torch.zeros(2, requires_grad=True)
    opt, cfg = build_lamb_if_needed(DS_LAMB, [p])
    assert isinstance(opt, Lamb)
    assert "optimizer" not in cfg and cfg["train_micro_batch_size_per_gpu"] == 2
    assert "optimizer" in DS_LAMB                      # the caller's dict is left alone
    group = opt.param_groups[0]
    assert (group["lr"], group["max_coeff"], group["bias_correction"], group["betas"]) == \
        (0.05, 0.3, False, (0.9, 0.999))


def test_build_lamb_leaves_other_optimizers_and_cuda_to_deepspeed(monkeypatch):
    p = torch.zeros(2, requires_grad=True)
    adam = {"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}
    assert build_lamb_if_needed(adam, [p]) == (None, adam)

    import deepspeed.accelerator as acc

    class FakeCuda:
        def device_name(self, *a):
            return "cuda"
    monkeypatch.setattr(acc, "get_accelerator", lambda: FakeCuda())
    assert build_lamb_if_needed(DS_LAMB, [p]) == (None, DS_LAMB)


def test_build_lamb_reads_a_config_file_and_names_bad_keys(tmp_path):
    import json
    p = torch.zeros(2, requires_grad=True)
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(DS_LAMB))
    opt, cfg = build_lamb_if_needed(str(path), [p])
    assert isinstance(opt, Lamb) and "optimizer" not in cfg
    bad = {"optimizer": {"type": "lamb", "params": {"lr": 0.1, "max_coef": 1.0}}}
    with pytest.raises(LambConfigError, match="max_coef"):
        build_lamb_if_needed(bad, [p])
    clip = {"optimizer": {"type": "Lamb", "params": {"lr": 0.1, "max_grad_norm": 1.0}}}
    with pytest.raises(LambConfigError, match="gradient_clipping"):
        build_lamb_if_needed(clip, [p])
    with pytest.raises(FileNotFoundError, match="missing.json"):
        build_lamb_if_needed(str(tmp_path / "missing.json"), [p])


@pytest.fixture
def single_rank(monkeypatch):
    """Environment for a one-rank process group. The group stays up for the rest of the pytest
    process: DeepSpeed caches its groups, and a destroyed one breaks the next engine."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for k, v in dict(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                     MASTER_PORT=str(port)).items():
        monkeypatch.setenv(k, v)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_deepspeed_engine_trains_with_our_lamb(single_rank, precision):
    import deepspeed

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    x = torch.randn(16, 4)
    y = x @ torch.tensor([[0.5], [-0.4], [0.3], [0.6]]) + 0.2
    config = dict(DS_LAMB, optimizer=dict(DS_LAMB["optimizer"],
                                          params=dict(DS_LAMB["optimizer"]["params"], lr=0.1, max_coeff=10.0)))
    if precision == "bf16":
        config["bf16"] = {"enabled": True}
    optimizer, config = build_lamb_if_needed(config, model.parameters())
    engine, engine_opt, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    assert engine.basic_optimizer is optimizer
    if precision == "fp32":
        assert engine_opt is optimizer
    else:
        # DeepSpeed keeps fp32 masters per tensor for a client optimizer under bf16, so the
        # trust ratio stays per tensor; its wrapper runs one zero-gradient step at start.
        assert all(p.dtype == torch.float32 for g in optimizer.param_groups for p in g["params"])
    first = optimizer.param_groups[0]["params"][0]
    steps_at_start = optimizer.state[first]["step"] if first in optimizer.state else 0

    def loss_at(i):
        xb, yb = x[2 * i % 16: 2 * i % 16 + 2], y[2 * i % 16: 2 * i % 16 + 2]
        out = engine(xb.to(engine.device, next(engine.module.parameters()).dtype))
        return torch.nn.functional.mse_loss(out.float(), yb)

    def full_loss():
        with torch.no_grad():
            dtype = next(engine.module.parameters()).dtype
            return float(torch.nn.functional.mse_loss(engine(x.to(dtype)).float(), y))

    before = full_loss()
    for i in range(40):
        loss = loss_at(i)
        engine.backward(loss)
        engine.step()
    after = full_loss()
    assert after < 0.2 * before, (before, after)
    coeffs = find_lamb_coeffs(engine)
    assert len(coeffs) == 2 and all(0.01 - 1e-6 <= c <= 10.0 + 1e-5 for c in coeffs)
    assert optimizer.state[first]["step"] == steps_at_start + 40
