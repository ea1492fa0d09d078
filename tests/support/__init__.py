"""Helpers that tests of several folders share, imported as ``support.X`` (pytest puts tests/ on sys.path)."""
