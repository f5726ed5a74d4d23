"""Model profiling, the Plan contract, the cost and memory model and the ILP search."""

from .model_file import ModelFile, ModelFileError, load_model_file, parse_model_args
from .model_profile import BlockProfile, MatmulShape, ModelProfile, TPCollective
from .plan import Figures, Plan, PlanError, Stage, even_stages, parse_inline, plan_from_inline
from .profiler import ProfileError, profile_model

__all__ = [
    "BlockProfile",
    "Figures",
    "MatmulShape",
    "ModelFile",
    "ModelFileError",
    "ModelProfile",
    "Plan",
    "PlanError",
    "ProfileError",
    "Stage",
    "TPCollective",
    "even_stages",
    "load_model_file",
    "parse_inline",
    "parse_model_args",
    "plan_from_inline",
    "profile_model",
]
