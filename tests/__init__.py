"""The test suite. Its shared helpers (tests.helpers) are registered here, before anything imports them, for pytest's
assertion rewriting: the checks they run report the compared values on failure, as in a test module."""

import pytest

pytest.register_assert_rewrite("tests.helpers")
