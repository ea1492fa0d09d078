"""Prometheus metrics: exposition, its cache, the HTTP endpoint and the textfile publisher."""
