"""The study registry: one module per study, found by name (the protocol is :mod:`dynlab.study`)."""

from __future__ import annotations

from dynlab.errors import DynlabInputError
from dynlab.study import Study

__all__ = ["STUDIES", "get_study", "register_study"]

STUDIES: dict[str, Study] = {}


def register_study(study: Study) -> Study:
    STUDIES[study.name] = study
    return study


def get_study(name: str) -> Study:
    try:
        return STUDIES[name]
    except KeyError:
        raise DynlabInputError(f"unknown study {name!r}; allowed: {', '.join(STUDIES)}") from None


def _load_builtin() -> None:
    from dynlab.studies import babilong, copying, group_tracking, length_generalization, nonlinearity, passkey

    for module in (group_tracking, length_generalization, nonlinearity, copying, passkey, babilong):
        register_study(module.STUDY)


_load_builtin()
