"""The sections of docs/results.md and of README.md's generated tables and paragraphs, one
module per section, read by ``benchmarks/make_results.py`` (which assembles them).

:mod:`.common` holds the dataset paths and the number formats every section shares;
:mod:`.paper_a`, :mod:`.reproduction` and :mod:`.fixed_points` the paper-A sections (the
T_cross-mp tables, the caveats and what reproduces across machines, the fixed points and the
pre-registered forecast on fresh seeds); :mod:`.paper_b` the paper-B table and notes, built
from :mod:`.lm_ppl` (the PPL rise against budget, size and context), :mod:`.lm_interventions`
(the post-training arms) and :mod:`.tasks` (copying, passkey, bAbI and their learnability);
:mod:`.slim` the ``--slim`` copies of study datasets.
"""
