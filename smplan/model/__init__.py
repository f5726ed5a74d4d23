"""Model intake shared by the planner and the executor: where a model's repeated blocks
are (`structure`), and which parallel dimensions its file and modules can run
(`capabilities`). One rule on both sides, so the planner offers only what runs."""

from .capabilities import (
           CP_HOOK,
           ExpertBank,
           context_parallel_support_problem,
           expert_bank_problem,
           expert_banks,
           find_expert_banks,
           hf_config_fix,
           pipeline_problem,
           tensor_parallel_problem,
)
from .structure import Layout, find_layout

__all__ = ["CP_HOOK", "ExpertBank", "Layout", "context_parallel_support_problem", "expert_bank_problem",
           "expert_banks", "find_expert_banks", "find_layout", "hf_config_fix", "pipeline_problem",
           "tensor_parallel_problem"]
