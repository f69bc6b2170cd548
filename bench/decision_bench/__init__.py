"""decision-bench: a seeded closed-loop workload for `/v1/systemone`, with A/B rounds between two servers.

The workload (states, questions) is a pure function of the seed, so two runs and two servers see the same requests."""

__version__ = "0.1.0"
