"""timbench: controlled experiments on Training-Inference Mismatch (TIM) in LLM RL.

Data flows one way: task -> engine -> trainer -> metrics -> runner -> report.
"""

__version__ = "0.1.0"
