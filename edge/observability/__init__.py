"""What the runtime tells operators: metrics, telemetry, the request journal."""
