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
from .inputs import (
           call_model,
           first_tensor,
           inputs_kind,
           is_one_tensor,
           sequence_length,
           tokens_per_sample,
)
from .loss import DEFAULT_LOSS, default_loss, loss_value_problem
from .structure import Layout, find_layout, tied_aliases, tied_groups

__all__ = ["CP_HOOK", "DEFAULT_LOSS", "ExpertBank", "Layout", "call_model", "context_parallel_support_problem",
           "default_loss", "loss_value_problem", "expert_bank_problem", "expert_banks", "find_expert_banks", "find_layout", "first_tensor",
           "hf_config_fix", "inputs_kind", "is_one_tensor", "pipeline_problem", "tensor_parallel_problem", "tied_aliases",
           "sequence_length", "tied_groups", "tokens_per_sample"]
