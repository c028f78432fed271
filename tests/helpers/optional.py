"""Optional test dependencies: skip without them, or fail where CI requires them."""

from __future__ import annotations

import os

import pytest

#: Set to 1 (CI does, .ci/run) to make a test that needs ``transformers`` fail when it does
#: not import, instead of skipping: CI must run those tests.
REQUIRE_TRANSFORMERS_ENV = "DYNLAB_REQUIRE_TRANSFORMERS"


def need_transformers():
    """``transformers``, imported; without it the test skips, or fails when
    ``DYNLAB_REQUIRE_TRANSFORMERS=1`` (as ``DYNLAB_REQUIRE_MAMBA_REF=1`` does for the
    mamba-ssm references)."""
    try:
        import transformers
    except ImportError as exc:
        msg = f"transformers does not import ({exc}); pip install 'dynlab[test]'"
        if os.environ.get(REQUIRE_TRANSFORMERS_ENV) == "1":
            pytest.fail(f"{msg}; {REQUIRE_TRANSFORMERS_ENV}=1 requires it", pytrace=False)
        pytest.skip(msg, allow_module_level=True)
    return transformers
