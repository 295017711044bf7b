"""Helpers shared by the test modules, one module per theme. Test modules import from here only (never from another
test module or a conftest.py; tests/unit/test_test_layout.py checks it); fixtures shared by several files live in the
nearest common conftest.py. This package imports nothing itself, so importing one helper stays cheap."""
