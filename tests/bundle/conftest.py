"""Bundle tests: their fixture ``ort_bundle`` lives in tests/conftest.py, so that tests of other
directories (the cold-start benchmark's) share the one session-wide instance: a second
instance would take the cache's lock again and wait on its own process forever."""
