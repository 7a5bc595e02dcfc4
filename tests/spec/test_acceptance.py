"""Greedy and speculative-sampling acceptance (Leviathan et al., 2023)."""

from __future__ import annotations

import pytest
import torch

from services.common.errors import InvalidArgument
from services.decode.spec.acceptance import greedy_accept, sample_from, speculative_accept

CHI2_DF4_P001 = 18.467  # chi-square critical value, 4 degrees of freedom, alpha = 0.001
P0 = torch.tensor([0.40, 0.30, 0.15, 0.10, 0.05])
P1 = torch.tensor([0.05, 0.10, 0.15, 0.30, 0.40])
Q = torch.tensor([0.10, 0.20, 0.30, 0.20, 0.20])
N = 40_000


def _onehot_logits(best: list[list[int]], V: int = 6) -> torch.Tensor:
    return torch.nn.functional.one_hot(torch.tensor(best), V).float()


def test_greedy_all_accepted_gives_k_tokens_with_bonus():
    tokens = torch.tensor([[9 % 6, 1, 2, 3]])
    v = greedy_accept(tokens, torch.tensor([4]), _onehot_logits([[1, 2, 3, 4]]), k_max=4)
    assert v.accepted.tolist() == [3] and v.bonus.tolist() == [4]  # x1..x3 + bonus = 4


def test_greedy_first_mismatch_gives_correction():
    tokens = torch.tensor([[0, 1, 5, 3], [0, 4, 2, 3], [0, 1, 2, 0]])
    logits = _onehot_logits([[1, 2, 3, 4], [1, 2, 3, 4], [1, 2, 3, 4]])
    v = greedy_accept(tokens, torch.tensor([4, 4, 2]), logits, k_max=4)
    assert v.accepted.tolist() == [1, 0, 1]
    assert v.bonus.tolist() == [2, 1, 2]  # row 2: K_r = 2, its one draft accepted → bonus


def test_greedy_ignores_padding_columns():
    tokens = torch.tensor([[0, 1, 2, 3]])
    v = greedy_accept(tokens, torch.tensor([1]), _onehot_logits([[1, 2, 3, 4]]), k_max=4)
    assert v.accepted.tolist() == [0] and v.bonus.tolist() == [1]


def _chi2(samples: torch.Tensor, p: torch.Tensor) -> float:
    counts = torch.bincount(samples, minlength=p.numel()).double()
    expected = p.double() * samples.numel()
    return float(((counts - expected) ** 2 / expected).sum())


def _round(seed: int):
    """N one-proposal rounds (K = 2) with p_0 = P0, p_1 = P1, draft x_1 ~ Q."""
    g = torch.Generator().manual_seed(seed)
    x1 = torch.multinomial(Q.expand(N, -1), 1, replacement=True, generator=g).view(-1)
    tokens = torch.stack([torch.zeros(N, dtype=torch.int64), x1], dim=1)
    target = torch.stack([P0, P1]).expand(N, -1, -1)
    v = speculative_accept(tokens, torch.full((N,), 2), target, Q.expand(N, 1, -1),
                           torch.Generator().manual_seed(seed + 1), k_max=2)
    return x1, v


def test_speculative_sampling_reproduces_target_and_wrong_rules_fail():
    x1, v = _round(seed=123)
    first = torch.where(v.accepted == 1, x1, v.bonus)
    assert _chi2(first, P0) < CHI2_DF4_P001
    bonus = v.bonus[v.accepted == 1]  # all accepted → bonus drawn from p_1
    assert bonus.numel() > N // 2 and _chi2(bonus, P1) < CHI2_DF4_P001
    # Negative checks: the same bound rejects wrong rules on the same draws.
    assert _chi2(x1, P0) > 10 * CHI2_DF4_P001  # "always accept"
    u = torch.rand(N, generator=torch.Generator().manual_seed(7))
    from_p = torch.where(v.accepted == 1, x1, sample_from(P0.expand(N, -1), u))
    assert _chi2(from_p, P0) > 10 * CHI2_DF4_P001  # resample from p, not the residual
    assert _chi2(bonus, P0) > 10 * CHI2_DF4_P001  # bonus from the wrong query


def test_speculative_sampling_deterministic_and_per_request_invariant():
    a, b = _round(seed=5), _round(seed=5)
    assert torch.equal(a[1].accepted, b[1].accepted) and torch.equal(a[1].bonus, b[1].bonus)
    target = torch.softmax(torch.randn(3, 4, 7, generator=torch.Generator().manual_seed(1)), -1)
    draft = torch.softmax(torch.randn(3, 3, 7, generator=torch.Generator().manual_seed(2)), -1)
    tokens = torch.randint(0, 7, (3, 4), generator=torch.Generator().manual_seed(3))
    kr = torch.tensor([4, 2, 3])
    gens = [torch.Generator().manual_seed(s) for s in (10, 11, 12)]
    batch = speculative_accept(tokens, kr, target, draft, gens, k_max=4)
    alone = speculative_accept(tokens[1:2], kr[1:2], target[1:2], draft[1:2],
                               [torch.Generator().manual_seed(11)], k_max=4)
    assert batch.accepted[1] == alone.accepted[0] and batch.bonus[1] == alone.bonus[0]
    assert bool((batch.accepted <= kr - 1).all())


def test_acceptance_rejects_bad_input():
    tokens = torch.zeros(2, 3, dtype=torch.int64)
    logits = torch.zeros(2, 3, 5)
    with pytest.raises(InvalidArgument, match="K=3 must be <= k_max=2"):
        greedy_accept(tokens, torch.tensor([3, 3]), logits, k_max=2)
    with pytest.raises(InvalidArgument, match=r"num_queries=\[4, 1\] must be in 1\.\.3"):
        greedy_accept(tokens, torch.tensor([4, 1]), logits, k_max=4)
    with pytest.raises(InvalidArgument, match=r"target\.shape"):
        greedy_accept(tokens, torch.tensor([3, 1]), logits[:, :2], k_max=4)
    with pytest.raises(InvalidArgument, match=r"draft_probs\.shape"):
        speculative_accept(tokens, torch.tensor([3, 1]), logits, torch.zeros(2, 3, 5),
                           torch.Generator(), k_max=4)
    with pytest.raises(InvalidArgument, match=r"len\(generators\)=1 must be B=2"):
        speculative_accept(tokens, torch.tensor([3, 1]), logits + 0.2, torch.zeros(2, 2, 5),
                           [torch.Generator()], k_max=4)
