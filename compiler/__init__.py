"""ptc: compile recipes of signed task sums into edited dual encoders."""

__version__ = "0.1.0"
