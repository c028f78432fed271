"""Every list of names dynlab knows, in one torch-free module at the bottom of the package.

The command line, the studies, the figures, the report and the benchmark read their
names here; a registry that maps a name to code (:func:`dynlab.tracking.models.get_cell`,
:data:`dynlab.lm.models.mixers.MIXERS`, :data:`dynlab.lm.train.interventions.INTERVENTIONS`) registers
its built-ins from these lists, and tests/house/test_names.py checks that they agree.

A new built-in cell is one :class:`CellEntry` in :data:`CELLS` (its class in
:mod:`dynlab.tracking.models.cells`): the registry, the studies' ``--models``, the theory
table, the benchmark's kernel kind and the figures' colour all read it.  A user's cell
registered at run time with :func:`~dynlab.tracking.models.register_cell` needs none of it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = [
    "ABLATION_NONLINEARITIES",
    "BABI_KINDS",
    "CELLS",
    "CELL_NAMES",
    "CellEntry",
    "EXECUTORS",
    "FAMILIES",
    "FIGURE_FORMATS",
    "FIGURE_WIDTHS",
    "HF_EXPORT_ALLOWED",
    "HF_EXPORT_FILES",
    "HF_EXPORT_MARKER",
    "INTERVENTION_NAMES",
    "MIXER_NAMES",
    "NONLINEARITIES",
    "SOURCES",
    "TASK_INTERVENTION_NAMES",
    "TBTT",
    "TBTT_ON_TASKS",
    "THEORY",
    "THEORY_KINDS",
]

#: The two families of cells: the transition's Jacobian does not depend on the state
#: (affine) or does (state-dependent).
FAMILIES = ("affine", "state-dependent")

#: What theory says a cell can track at every length (paper A), from the narrowest.
THEORY_KINDS = ("none", "elementary abelian 2-groups", "abelian groups", "any group")


@dataclass(frozen=True)
class CellEntry:
    """A built-in recurrent cell.

    Attributes:
        name: its name (``--models``, ``ModelSpec.arch``).
        cls: its class's name in :mod:`dynlab.tracking.models.cells`.
        family: one of :data:`FAMILIES` (the family probe checks the class's declaration).
        theory: the groups it can track at every length, one of :data:`THEORY_KINDS`:
            input-independent or positive-diagonal transitions (mamba, linear-rnn) track
            none; a real diagonal in (−1, 1) (negative-mamba) the elementary abelian
            2-groups (C2, C2xC2, …); a complex diagonal (mamba3, aussm) the abelian groups;
            a token-dependent dense transition (token-gated-rnn) and the state-dependent
            cells (tanh-rnn, state-gated-rnn) any finite group.
        dense: its state update is a dense matrix product (the benchmark's ``gemm`` kind),
            else a diagonal one (``bandwidth``).
        color: its colour in the figures (affine cells blue to green, state-dependent red to orange).
    """

    name: str
    cls: str
    family: Literal["affine", "state-dependent"]
    theory: str
    dense: bool
    color: str


#: The built-in cells, in registry order.
CELLS: tuple[CellEntry, ...] = (
    CellEntry("mamba", "MambaCell", "affine", "none", False, "#08306b"),
    CellEntry("negative-mamba", "NegativeMambaCell", "affine", "elementary abelian 2-groups", False, "#2171b5"),
    CellEntry("mamba3", "Mamba3Cell", "affine", "abelian groups", False, "#6baed6"),
    CellEntry("aussm", "AUSSMCell", "affine", "abelian groups", False, "#41ab5d"),
    CellEntry("linear-rnn", "LinearRNNCell", "affine", "none", True, "#006d2c"),
    CellEntry("token-gated-rnn", "TokenGatedRNNCell", "affine", "any group", True, "#807dba"),
    CellEntry("tanh-rnn", "TanhRNNCell", "state-dependent", "any group", True, "#cb181d"),
    CellEntry("state-gated-rnn", "StateGatedRNNCell", "state-dependent", "any group", True, "#fd8d3c"),
)
#: The built-in cells' names, in registry order.
CELL_NAMES: tuple[str, ...] = tuple(c.name for c in CELLS)
#: Cell name -> what theory says it can track (:attr:`CellEntry.theory`).
THEORY: dict[str, str] = {c.name: c.theory for c in CELLS}

#: The LM mixers (:data:`dynlab.lm.models.mixers.MIXERS`).
MIXER_NAMES = ("mamba2", "mamba1", "gla")
#: The training precisions of the LM loop (:func:`dynlab.lm.train.engine.fit`, ``--precision``).
PRECISIONS = ("fp32", "bf16")
#: The initial-state interventions of the task studies (each sets the state a sequence starts from).
TASK_INTERVENTION_NAMES = ("zero", "random-noise", "fitted-noise", "state-passing")
#: Truncated backpropagation through time: trains across windows, so it is no initial-state
#: intervention of the task studies (their sequences are independent).
TBTT = "tbtt"
#: Every intervention of the LM studies (:data:`dynlab.lm.train.interventions.INTERVENTIONS`).
INTERVENTION_NAMES = (*TASK_INTERVENTION_NAMES, TBTT)
#: The rule, as the refusal of TBTT with a task (the task studies, ``lm post-train --task``) says it.
TBTT_ON_TASKS = ("intervention 'tbtt' needs consecutive chunks of one document; task samples are independent; "
                 f"allowed with a task: {', '.join(TASK_INTERVENTION_NAMES)}")
#: The bAbI-style task kinds (:class:`dynlab.lm.data.babi.BabiTask`, the babilong study's ``--kinds``).
BABI_KINDS = ("qa1", "qa2", "qa3", "qa6", "qa7")
#: The built-in texts of the LM studies (:mod:`dynlab.lm.data.corpus`); any UTF-8 file also works.
SOURCES = ("shakespeare",)
#: What ``dynlab lm export`` writes (``save_pretrained``, :func:`dynlab.lm.hub.export.export_hf`):
#: a folder holding only these (or nothing) may be written over.
HF_EXPORT_FILES = ("config.json", "generation_config.json", "model.safetensors", "model-*.safetensors",
                   "model.safetensors.index.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "README.md")
#: The hidden file that marks a folder ``lm export`` wrote (written first; a later export may replace the folder's files).
HF_EXPORT_MARKER = ".dynlab-export"
#: The export folder an ``lm export`` accepts, in the words of its refusal.
HF_EXPORT_ALLOWED = ("a new or empty folder, or one holding only an earlier export (config.json, model.safetensors, "
                     "tokenizer.json, README.md)")
#: The state nonlinearities φ (:func:`dynlab.tracking.models.nonlinearity.apply_phi`).
NONLINEARITIES = ("identity", "tanh", "relu", "maxmin", "groupsort", "layernorm", "sphere")
#: The φ of the nonlinearity study's ablation, in its order: all but the identity.
ABLATION_NONLINEARITIES = tuple(p for p in NONLINEARITIES if p != "identity")
#: The executors that run a study's work items (:func:`dynlab.executors.make_executor`).
EXECUTORS = ("inprocess", "dask")
#: The file formats ``dynlab figures --format`` writes (:func:`dynlab.figures.write_figures`).
FIGURE_FORMATS = ("png", "pdf", "svg")
#: The widths of a single panel, ``dynlab figures --width``: one column (3.4 in) or the page (7.2 in).
FIGURE_WIDTHS = ("column", "page")
