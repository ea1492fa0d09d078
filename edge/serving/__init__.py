"""The serving core: admission, scheduling, batching and the engine loop, apart from the transport."""
