"""Helpers shared by test files in several folders, imported as ``helpers.<module>``
(pytest puts ``tests/`` on ``sys.path`` for the root conftest.py).  Test files never
import one another: what two of them share lives here or in a conftest.py fixture."""
