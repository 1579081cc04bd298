"""agentlab: a notebook-first workbench for training tool-using LLM agents with GRPO.

Importing the package does nothing but define things; heavy libraries (torch, transformers, trl, vllm,
unsloth) are imported inside the functions that need them.
"""

__version__ = "0.1.0"
