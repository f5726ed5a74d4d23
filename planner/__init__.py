"""Model profiling, the Plan contract, the cost and memory model and the ILP search."""

from .closed_form import estimate_from_costs
from .cost_model import blocks_problem, estimate, plan_costs
from .explain import TIE_SHARE
from .model_file import ModelFile, ModelFileError, load_model_file, parse_model_args
from .model_profile import BlockProfile, MatmulShape, ModelProfile, TPCollective
from .plan import Figures, Plan, PlanError, Stage, even_stages, parse_inline, plan_from_inline
from .profiler import ProfileError, profile_model
from .search import NoFeasiblePlan, plan_search, search

__all__ = [
    "TIE_SHARE",
    "BlockProfile",
    "Figures",
    "NoFeasiblePlan",
    "MatmulShape",
    "ModelFile",
    "ModelFileError",
    "ModelProfile",
    "Plan",
    "PlanError",
    "ProfileError",
    "Stage",
    "TPCollective",
    "blocks_problem",
    "estimate",
    "estimate_from_costs",
    "even_stages",
    "load_model_file",
    "parse_inline",
    "parse_model_args",
    "plan_costs",
    "plan_from_inline",
    "plan_search",
    "profile_model",
    "search",
]
