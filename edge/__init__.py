"""edge: an inference runtime for NVIDIA Jetson appliances."""

__version__ = "0.1.0"
