"""Standard-library helpers for the host: logging, sd_notify, readiness, L4T, ELF, socket directory, version."""
