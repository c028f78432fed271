"""Length evaluation and max-pass length."""

import numpy as np
import pytest
import torch

from dynlab.tracking.evaluate import evaluate_lengths, max_pass_length
from dynlab.tracking.groups import get_group
from dynlab.tracking.models import Tracker
from dynlab.tracking.task import WordProblem


def test_max_pass_length_cases():
    L = [10, 20, 40, 80]
    assert max_pass_length(L, [1.0, 0.95, 0.5, 0.99], 0.9) == (20, False)  # later recovery does not count
    assert max_pass_length(L, [0.5, 1.0, 1.0, 1.0], 0.9) == (0, False)
    assert max_pass_length(L, [1.0, 1.0, 0.9, 0.91], 0.9) == (80, True)  # censored
    assert max_pass_length([40, 10, 20], [0.1, 1.0, 1.0], 0.9) == (20, False)  # order-free
    with pytest.raises(ValueError):
        max_pass_length([1, 2], [1.0], 0.9)


def test_exact_tracker_is_perfect_to_length_2000(exact_s3):
    task = WordProblem(get_group("S3"))
    ev = evaluate_lengths(exact_s3, task, [1, 10, 500, 2000], 64, 32, 300, seed=0)
    assert np.all(ev.acc_final == 1.0) and np.all(ev.acc_all == 1.0)
    assert max_pass_length(ev.lengths, ev.acc_final, 0.9) == (2000, True)


class _ConstantIdentity(torch.nn.Module):
    """Predicts the identity element at every step; carries no state."""

    def __init__(self, n):
        super().__init__()
        self.n = n

    def init_state(self, batch, device=None):
        return torch.zeros(batch, 1)

    def forward(self, tokens, state=None, return_states=False):
        logits = torch.zeros(*tokens.shape, self.n)
        logits[..., 0] = 1.0
        return type("Out", (), {"logits": logits, "final_state": state})()

    def eval(self):
        return self


def test_accuracy_of_constant_predictor_equals_label_frequency():
    task = WordProblem(get_group("C6"))
    ev = evaluate_lengths(_ConstantIdentity(6), task, [3, 7, 30], 40, 16, 4, seed=5)
    # recompute independently: same generator stream, labels of whole sequences at once
    gen = torch.Generator().manual_seed(5)
    final, allsteps = np.zeros(3), np.zeros(3)
    done = 0
    while done < 40:
        b = min(16, 40 - done)
        label = torch.zeros(b, dtype=torch.long)
        labs = []
        t = 0
        while t < 30:
            tc = min(4, 30 - t)
            _, lab = task.sample(gen, b, tc, start=label)
            label = lab[:, -1]
            labs.append(lab)
            t += tc
        lab = torch.cat(labs, 1)
        for i, L in enumerate([3, 7, 30]):
            final[i] += (lab[:, L - 1] == 0).sum().item()
            allsteps[i] += (lab[:, :L] == 0).sum().item()
        done += b
    np.testing.assert_allclose(ev.acc_final, final / 40)
    np.testing.assert_allclose(ev.acc_all, allsteps / (40 * np.array([3, 7, 30])))


def test_chunk_size_does_not_change_results():
    torch.manual_seed(0)
    m = Tracker("tanh-rnn", 6, 6, hidden=8).double()
    task = WordProblem(get_group("S3"))
    a = evaluate_lengths(m, task, [5, 50, 120], 24, 8, 7, seed=1)
    b = evaluate_lengths(m, task, [5, 50, 120], 24, 8, 500, seed=1)
    np.testing.assert_array_equal(a.acc_final, b.acc_final)
    np.testing.assert_array_equal(a.acc_all, b.acc_all)
