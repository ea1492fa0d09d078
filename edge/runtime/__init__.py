"""The boot path around edge.boot: stages, timeline, engine chain, snapshot point, fallback, launch."""
