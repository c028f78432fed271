"""Word problems: labels against a brute-force product, order sensitivity, streaming."""

import torch

from dynlab.tracking.groups import get_group
from dynlab.tracking.task import WordProblem


def _brute_force_running_products(group, tokens):
    """Compose permutations directly (no Cayley table): g_t = x_t ∘ g_{t-1}."""
    index = {p: i for i, p in enumerate(group.elements)}
    out = []
    for row in tokens.tolist():
        g = tuple(range(group.degree))
        labels = []
        for x in row:
            perm = group.elements[x]
            g = tuple(perm[g[p]] for p in range(group.degree))
            labels.append(index[g])
        out.append(labels)
    return torch.tensor(out)


def test_labels_match_brute_force_on_s3_and_a4():
    for name in ("S3", "A4", "C6"):
        g = get_group(name)
        task = WordProblem(g)
        tokens, labels = task.sample(torch.Generator().manual_seed(1), 16, 25)
        assert torch.equal(labels, _brute_force_running_products(g, tokens))


def test_order_matters_on_s3_but_not_c6():
    s3 = WordProblem(get_group("S3"))
    c6 = WordProblem(get_group("C6"))
    # find two S3 elements that do not commute
    tab = s3.group.table
    a, b = next((a, b) for a in range(6) for b in range(6) if tab[a, b] != tab[b, a])
    ab = s3.labels(torch.tensor([[a, b]]))[0, -1]
    ba = s3.labels(torch.tensor([[b, a]]))[0, -1]
    assert ab != ba
    for a in range(6):
        for b in range(6):
            assert c6.labels(torch.tensor([[a, b]]))[0, -1] == c6.labels(torch.tensor([[b, a]]))[0, -1]


def test_continuing_from_start_equals_whole_sequence():
    task = WordProblem(get_group("S3"))
    tokens, labels = task.sample(torch.Generator().manual_seed(2), 8, 40)
    first = task.labels(tokens[:, :17])
    rest = task.labels(tokens[:, 17:], start=first[:, -1])
    assert torch.equal(torch.cat([first, rest], 1), labels)


def test_same_generator_seed_same_samples_no_global_state():
    task = WordProblem(get_group("C6"))
    a = task.sample(torch.Generator().manual_seed(3), 4, 10)
    torch.manual_seed(999)  # global seed must not matter
    b = task.sample(torch.Generator().manual_seed(3), 4, 10)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_state_preserving_words_multiply_to_identity():
    for name in ("S3", "A5", "C2xS3"):
        task = WordProblem(get_group(name))
        gen = torch.Generator().manual_seed(4)
        for words in (task.sample_identity_words(gen, 32, 7), task.palindrome_words(gen, 32, 5)):
            assert torch.all(task.labels(words)[:, -1] == task.group.identity)
            # and from any start state the word returns to that state
            start = torch.randint(0, task.n_tokens, (32,), generator=gen)
            assert torch.equal(task.labels(words, start=start)[:, -1], start)


def test_chunked_draws_equal_one_long_draw():
    task = WordProblem(get_group("S3"))
    tokens, labels = task.sample(torch.Generator().manual_seed(7), 5, 30)
    gen = torch.Generator().manual_seed(7)
    t1, l1 = task.sample(gen, 5, 11)
    t2, l2 = task.sample(gen, 5, 19, start=l1[:, -1])
    assert torch.equal(torch.cat([t1, t2], 1), tokens) and torch.equal(torch.cat([l1, l2], 1), labels)


def test_labels_refuse_element_indices_outside_the_group():
    import pytest as _pytest

    task = WordProblem(get_group("C6"))
    with _pytest.raises(ValueError, match=r"start must be element indices in \[0, 6\); got 6..6"):
        task.labels(torch.zeros(1, 1, dtype=torch.long), start=torch.tensor([6]))
    with _pytest.raises(ValueError, match=r"tokens must be element indices in \[0, 6\); got -1..0"):
        task.labels(torch.tensor([[0, -1]]))
