"""The two papers' packages are shaped alike: dynlab/tracking/ (paper A) and dynlab/lm/ (paper B)
hold the same rooms, each a module or a sub-package of that name, so that "where is paper B's
X?" is answered by where paper A's X is.  A room one paper has and the other lacks is named
here, with why, or the test fails."""

from __future__ import annotations

from pathlib import Path

from helpers.paths import REPO

#: The rooms both papers hold: the run spec, the models, the training engine, evaluation,
#: the analysis, one run, the study dataset, its figure panels and its report tables.
ROOMS = {"spec", "models", "train", "evaluate", "analysis", "run", "dataset", "figures", "report"}

#: The rooms one paper holds alone, each with what it is.
OWN = {
    "tracking": {"groups": "the finite groups (paper B has no groups)",
                 "task": "the word-problem sampler (paper B's texts and tasks: lm/data/)",
                 "selection": "the studies' group selection and the order the analysis allows"},
    "lm": {"data": "the corpus, tokenizers, token files, loaders and tasks (paper A's task: tracking/task.py)",
           "results": "a run's stored result (paper A's: tracking/run.py, with the run)",
           "hub": "checkpoints in, Hugging Face folders out (paper A's trackers are not LMs)"},
}


def rooms(package: Path) -> set[str]:
    """The modules and sub-packages directly in ``package`` (``__init__`` and caches left out)."""
    return {p.stem for p in package.iterdir()
            if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").is_file()}


def test_both_papers_hold_the_same_rooms():
    for paper, own in OWN.items():
        found = rooms(REPO / "dynlab" / paper)
        assert found - set(own) == ROOMS, (f"dynlab/{paper}/ has {sorted(found - set(own) - ROOMS)} beyond the shared "
                                           f"rooms and lacks {sorted(ROOMS - found)}: give the other paper the room too, "
                                           "or name it in OWN with why")
        assert set(own) <= found, f"OWN names rooms dynlab/{paper}/ no longer has: {sorted(set(own) - found)}"


def test_the_room_check_can_fail(tmp_path):
    (tmp_path / "spec.py").write_text("")
    (tmp_path / "train").mkdir()
    (tmp_path / "train" / "__init__.py").write_text("")
    (tmp_path / "notes").mkdir()  # a folder without __init__.py is no room
    (tmp_path / "__init__.py").write_text("")
    assert rooms(tmp_path) == {"spec", "train"}
