"""Signed updates on the device: the archive reader and the A/B installer."""
