"""parallel-planner: plan TP x PP x DP layouts for LLM serving and training."""

__version__ = "0.1.0"
