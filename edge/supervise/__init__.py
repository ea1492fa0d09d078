"""The host's supervisor of the bundle under runc for systemd (``edge-supervise``): standard library and edge.system only."""
