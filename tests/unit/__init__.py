"""Fast, single-process tests: python -m pytest tests/unit."""
