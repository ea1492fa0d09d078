"""Configuration: the EDGE_* registry, argument types, settings records."""
