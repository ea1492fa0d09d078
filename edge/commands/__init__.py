"""Operator commands: selftest, trace, keys, top, doctor."""
